"""The Docker Swarm stack file (`geoserve stack`) and its Prometheus config, as data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.config.topology import load_topology
from services.deploy import compose, stack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small():
    return load_topology(ROOT / "topologies/small.yaml")


def test_committed_stack_and_prometheus_config_are_current(small):
    assert (ROOT / stack.STACK_FILE).read_text() == stack.render_stack(small, ROOT), (
        "docker-stack.yml is stale: run `geoserve stack`")
    assert (ROOT / "deploy/prometheus" / stack.PROMETHEUS_SWARM).read_text() == (
        stack.render_prometheus_swarm(small)), "prometheus-swarm.yml is stale: `geoserve stack`"


def test_cli_writes_the_same_files(tmp_path):
    from services.cli import main

    out = tmp_path / "docker-stack.yml"
    assert main(["stack", "--topology", "small", "--out", str(out), "--prometheus-dir",
                 str(tmp_path)]) == 0
    assert out.read_text() == (ROOT / stack.STACK_FILE).read_text()


def test_stack_is_the_compose_deployment_in_swarm_form(small):
    comp = compose.compose_model(small, ROOT)["services"]
    doc = yaml.safe_load(stack.render_stack(small, ROOT))
    assert doc["version"].startswith("3.")
    svcs = doc["services"]
    assert set(svcs) == set(comp) - {"grafana"}  # the compose profile stays out
    for name, svc in svcs.items():
        for key in ("depends_on", "profiles", "ports"):  # format 3 / no published port
            assert key not in svc, (name, key)
        assert svc["deploy"]["endpoint_mode"] == "dnsrr", name
        for key in ("image", "command", "volumes", "healthcheck"):
            assert svc.get(key) == comp[name].get(key) or name == "prometheus", (name, key)
    lg = svcs["loadgen"]
    assert lg["deploy"]["restart_policy"] == {"condition": "none"}
    assert lg["environment"] == {**comp["loadgen"]["environment"],
                                 "GEOSERVE_WAIT_READY_S": str(stack.WAIT_READY_S)}
    assert "--config.file=/etc/prometheus/prometheus-swarm.yml" in svcs["prometheus"]["command"]
    assert "restart_policy" not in svcs["dc-eu-nl"]["deploy"]  # servers restart as usual


def test_swarm_prometheus_discovers_every_task_of_every_service(small):
    cfg = yaml.safe_load(stack.render_prometheus_swarm(small))
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    geoserve = {n for n in compose.compose_model(small, ROOT)["services"]
                if n not in ("prometheus", "grafana")}
    assert set(jobs) == geoserve
    for name, job in jobs.items():
        assert "static_configs" not in job
        assert job["dns_sd_configs"] == [{"names": [f"tasks.{name}"], "type": "A",
                                          "port": 9100, "refresh_interval": "5s"}]
