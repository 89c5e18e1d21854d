"""Compose generator, .env, entrypoint, health probe and swap-scheduler argument checks.

No Docker engine needed: the compose file is checked as data (anchors resolved), the
entrypoint runs under /bin/sh with a stand-in ``python`` that prints its arguments, and the
health probe talks to a real gRPC health server on loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.config.topology import load_topology
from services.deploy import compose, swap
from services.model.errors import InvalidInput
from services.runtime.healthprobe import probe

ROOT = Path(__file__).resolve().parents[2]
SMALL = "topologies/small.yaml"
GEOSERVE_KINDS = ("dc-", "scheduler-", "provisioner", "loadgen", "carm")


@pytest.fixture(scope="module")
def small():
    return load_topology(ROOT / SMALL)


@pytest.fixture(scope="module")
def model(small):
    return compose.compose_model(small, ROOT)


def _is_geoserve(name: str) -> bool:
    return name.startswith(GEOSERVE_KINDS)


# ---------------------------------------------------------------- committed files


def test_committed_compose_file_is_current(small):
    committed = (ROOT / "docker-compose.yml").read_text()
    assert committed == compose.render_compose(small, ROOT), (
        "docker-compose.yml is stale: run `geoserve compose --topology topologies/small.yaml`")


def test_committed_env_is_current(small):
    assert (ROOT / ".env").read_text() == compose.render_env(small), (
        ".env is stale: run `geoserve compose --topology topologies/small.yaml`")


def test_cli_writes_the_same_files(tmp_path):
    from services.cli import main

    out = tmp_path / "docker-compose.yml"
    assert main(["compose", "--topology", "small", "--out", str(out)]) == 0
    assert out.read_text() == (ROOT / "docker-compose.yml").read_text()
    assert (tmp_path / ".env").read_text() == (ROOT / ".env").read_text()
    assert (tmp_path / compose.TLS_OVERRIDE).read_text() == (
        ROOT / compose.TLS_OVERRIDE).read_text()


def test_committed_tls_override_is_current(small):
    assert (ROOT / compose.TLS_OVERRIDE).read_text() == compose.render_tls_override(small), (
        "docker-compose.tls.yml is stale: run `geoserve compose --topology "
        "topologies/small.yaml`")


def test_tls_override_covers_every_geoserve_service_and_nothing_else(small, model):
    over = yaml.safe_load(compose.render_tls_override(small))
    expected = {n for n in model["services"] if n.startswith(GEOSERVE_KINDS)}
    assert set(over["services"]) == expected
    assert expected == {"dc-eu-nl", "dc-eu-lt", "dc-us-pjm", "dc-us-nyiso", "provisioner",
                        "scheduler-eu-north", "scheduler-us-east", "loadgen"}
    for name, svc in over["services"].items():
        env = svc["environment"]
        assert {env[f"GEOSERVE_TLS_{k}"] for k in ("CERT", "KEY", "CA")} == {
            "/run/geoserve-tls/cert.pem", "/run/geoserve-tls/key.pem",
            "/run/geoserve-tls/ca.pem"}, name
        assert svc["volumes"] == ["${GEOSERVE_TLS_DIR:-./tls}:/run/geoserve-tls:ro"], name
        # the base file reads the same variables, so the override's values reach the process
        assert model["services"][name]["environment"]["GEOSERVE_TLS_CERT"] == (
            "${GEOSERVE_TLS_CERT:-}")


# ---------------------------------------------------------------- services


def test_one_service_per_process_plus_observability(small, model):
    expected = ({f"dc-{d.name}" for d in small.dcs}
                | {f"scheduler-{r.name}" for r in small.regions}
                | {"provisioner", "loadgen", "prometheus", "grafana"})
    assert set(model["services"]) == expected


def test_no_container_name_anywhere(model):
    text = (ROOT / "docker-compose.yml").read_text()
    assert "container_name" not in text
    assert all("container_name" not in s for s in model["services"].values())


def test_shared_settings_come_from_x_anchors(model):
    text = (ROOT / "docker-compose.yml").read_text()
    assert "x-geoserve: &geoserve" in text and "x-geoserve-env: &geoserve-env" in text
    for name, svc in model["services"].items():
        if _is_geoserve(name):
            assert f"  {name}:\n    <<: *geoserve\n" in text
            assert svc["image"].startswith("${")
            assert svc["stop_grace_period"] == "15s"
            env = svc["environment"]
            assert env["PORT"] == str(compose.GRPC_PORT)
            assert env["METRICS_PORT"] == "9100"
            assert env["GEOSERVE_EPOCH_FILE"].startswith(compose.EPOCH_DIR)
            assert f"epoch:{compose.EPOCH_DIR}" in svc["volumes"]
            assert svc["command"][1:3] == ["--topology", SMALL]


def test_grpc_health_checks_and_loadgen_has_none(model):
    for name, svc in model["services"].items():
        if name == "loadgen":
            assert svc["healthcheck"] == {"disable": True}
        elif _is_geoserve(name):
            hc = svc["healthcheck"]
            assert hc["test"] == ["CMD", "python", "-m", "services.runtime.healthprobe"]
            assert hc["start_period"] and hc["retries"] >= 1
        else:  # prometheus, grafana: HTTP readiness
            assert svc["healthcheck"]["test"][:2] == ["CMD", "wget"]


def _healthy_deps(svc):
    deps = svc.get("depends_on", {})
    assert all(v == {"condition": "service_healthy"} for v in deps.values()), deps
    return set(deps)


def test_start_order_waits_for_healthy_tiers(small, model):
    svcs = model["services"]
    dcs = {f"dc-{d.name}" for d in small.dcs}
    assert all(not svcs[d].get("depends_on") for d in dcs)
    assert _healthy_deps(svcs["provisioner"]) == dcs
    for r in small.regions:
        own = {f"dc-{d.name}" for d in r.dcs}
        assert _healthy_deps(svcs[f"scheduler-{r.name}"]) == {"provisioner"} | own
    scheds = {f"scheduler-{r.name}" for r in small.regions}
    assert _healthy_deps(svcs["loadgen"]) == dcs | scheds
    assert _healthy_deps(svcs["grafana"]) == {"prometheus"}


def test_addresses_follow_the_topology(small, model):
    svcs = model["services"]

    def names(addrs: str) -> dict[str, str]:
        return dict(item.split("=", 1) for item in addrs.split(","))

    for r in small.regions:
        env = svcs[f"scheduler-{r.name}"]["environment"]
        assert env["GEOSERVE_REGION"] == r.name
        assert names(env["DC_ADDRS"]) == {d.name: f"dc-{d.name}:50051" for d in r.dcs}
        assert names(env["PEER_ADDRS"]) == {o.name: f"scheduler-{o.name}:50051"
                                            for o in small.regions if o.name != r.name}
        assert env["PROVISIONER_ADDR"] == "provisioner:50051"
        key = r.name.replace("-", "_").upper()
        assert svcs[f"scheduler-{r.name}"]["image"] == (
            f"${{SCHEDULER_IMAGE_{key}:-{compose.IMAGE}}}")
        assert env["GEOSERVE_POLICY"] == f"${{POLICY_{key}:-}}"
    all_dcs = {d.name: f"dc-{d.name}:50051" for d in small.dcs}
    assert names(svcs["provisioner"]["environment"]["DC_ADDRS"]) == all_dcs
    lg = svcs["loadgen"]
    assert names(lg["environment"]["DC_ADDRS"]) == all_dcs
    assert lg["environment"]["GEOSERVE_OUT"] == "/results"
    assert "${RESULTS_DIR:-./results}:/results" in lg["volumes"]


def test_profiles_only_on_optional_parts(model):
    for name, svc in model["services"].items():
        if name == "grafana":
            assert svc["profiles"] == ["grafana"]
        else:
            assert "profiles" not in svc, name


def test_only_observability_ports_are_published_on_loopback(model):
    for name, svc in model["services"].items():
        if name in ("prometheus", "grafana"):
            assert all(p.startswith("127.0.0.1:${") for p in svc["ports"])
        else:
            assert "ports" not in svc, name


def test_prometheus_scrapes_every_geoserve_service(small, model):
    from services.deploy.prometheus import compose_targets

    geoserve = {n for n in model["services"] if _is_geoserve(n)}
    targets = compose_targets(small)
    hosts = {t.rsplit(":", 1)[0] for ts in targets.values() for t in ts}
    assert hosts == geoserve
    assert all(t.endswith(":9100") for ts in targets.values() for t in ts)
    cfg = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"] for j in cfg["scrape_configs"]}
    assert geoserve <= jobs


def test_env_defines_every_variable_the_file_uses(small):
    import re

    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))
    env = dict(line.split("=", 1) for line in compose.render_env(small).splitlines()
               if line and not line.startswith("#"))
    # defined in .env or intentionally left to the user (a secret)
    assert used - set(env) <= {"GRAFANA_ADMIN_PASSWORD"}
    for r in small.regions:
        assert env[compose.scheduler_image_var(r.name)] == compose.IMAGE
        assert env[compose.policy_var(r.name)] == ""


def test_bigger_topology_and_external_topology_file(tmp_path):
    base = load_topology(ROOT / "topologies/base.yaml")
    m = compose.compose_model(base, ROOT)
    assert sum(n.startswith("dc-") for n in m["services"]) == len(base.dcs)
    assert sum(n.startswith("scheduler-") for n in m["services"]) == len(base.regions)

    ext = tmp_path / "mine.yaml"
    ext.write_text((ROOT / SMALL).read_text())
    mt = compose.compose_model(load_topology(ext), tmp_path)
    dc = mt["services"]["dc-eu-nl"]
    assert dc["command"][1:3] == ["--topology", compose.TOPOLOGY_MOUNT]
    assert f"./mine.yaml:{compose.TOPOLOGY_MOUNT}:ro" in dc["volumes"]
    assert f"./mine.yaml:{compose.TOPOLOGY_MOUNT}:ro" in mt["services"]["loadgen"]["volumes"]


def test_carm_section_adds_the_carm_service_before_the_provisioner(tmp_path, small):
    assert "carm" not in compose.compose_model(small, ROOT)["services"]
    raw = yaml.safe_load((ROOT / SMALL).read_text())
    raw["carm"] = {"slot_s": 10, "horizon_slots": 3, "renewables": {"pv_peak_w": 2000.0}}
    path = tmp_path / "with-carm.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    m = compose.compose_model(load_topology(path), tmp_path)
    svcs = m["services"]
    dcs = {n for n in svcs if n.startswith("dc-")}
    assert svcs["carm"]["command"][0] == "carm"
    assert _healthy_deps(svcs["carm"]) == dcs
    assert _healthy_deps(svcs["provisioner"]) == dcs | {"carm"}
    assert svcs["carm"]["environment"]["DC_ADDRS"] == (
        svcs["provisioner"]["environment"]["DC_ADDRS"])
    assert svcs["carm"]["healthcheck"]["test"][-1] == "services.runtime.healthprobe"
    tls = yaml.safe_load(compose.render_tls_override(load_topology(path)))
    assert "carm" in tls["services"] and "prometheus" not in tls["services"]


def test_env_key():
    assert compose.env_key("eu-north") == "EU_NORTH"
    assert compose.env_key("sa.east-1") == "SA_EAST_1"


# ---------------------------------------------------------------- swap-scheduler checks


def test_swap_unknown_region_names_it_and_the_known_ones():
    with pytest.raises(InvalidInput) as exc:
        swap.validate(compose_file=ROOT / "docker-compose.yml", region="mars",
                      image="geoserve/geoserve:0.1.0")
    msg = str(exc.value)
    assert "'mars'" in msg and "scheduler-mars" in msg
    assert "eu-north" in msg and "us-east" in msg
    assert exc.value.field == "--region"


def test_swap_cli_unknown_region_exits_2_with_the_name():
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "swap-scheduler", "--region", "atlantis",
         "--image", "x:1", "--file", str(ROOT / "docker-compose.yml")],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown region 'atlantis'" in proc.stderr


def test_swap_unknown_policy_and_bad_arguments():
    f = ROOT / "docker-compose.yml"
    with pytest.raises(InvalidInput, match="unknown policy 'nope'") as exc:
        swap.validate(compose_file=f, region="eu-north", image="i:1", policy="nope")
    assert "greedy" in str(exc.value)  # lists the registry's policies
    req = swap.validate(compose_file=f, region="eu-north", image="i:1", policy="nope",
                        any_policy=True)
    assert req.policy == "nope"
    with pytest.raises(InvalidInput, match="--image"):
        swap.validate(compose_file=f, region="eu-north", image="bad image")
    with pytest.raises(InvalidInput, match="--policy-config"):
        swap.validate(compose_file=f, region="eu-north", image="i:1", policy_config="alpha")
    with pytest.raises(InvalidInput, match="cannot read compose file"):
        swap.validate(compose_file=f.with_name("missing.yml"), region="eu-north", image="i")


def test_swap_valid_request_and_project_name(tmp_path):
    f = tmp_path / "My.Project" / "docker-compose.yml"
    f.parent.mkdir()
    f.write_text((ROOT / "docker-compose.yml").read_text())
    req = swap.validate(compose_file=f, region="us-east", image="me/sched:2",
                        policy="greedy", policy_config="alpha=0.5")
    assert (req.project, req.service, req.image, req.policy, req.policy_config) == (
        "myproject", "scheduler-us-east", "me/sched:2", "greedy", "alpha=0.5")
    assert swap.validate(compose_file=f, region="us-east", image="i",
                         project="Run_7").project == "run_7"


# ---------------------------------------------------------------- entrypoint


@pytest.fixture()
def entry_env(tmp_path):
    """PATH with a stand-in `python` that prints its arguments, one per line."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub = bindir / "python"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    stub.chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return env


def _entry(env, *args, **extra):
    proc = subprocess.run(["/bin/sh", str(ROOT / "deploy/entrypoint.sh"), *args],
                          env={**env, **extra}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_entrypoint_shares_one_epoch_through_the_file(entry_env, tmp_path):
    f = str(tmp_path / "run" / "epoch")
    a = _entry(entry_env, "datacenter", "--dc", "x", GEOSERVE_EPOCH_FILE=f)
    b = _entry(entry_env, "scheduler", GEOSERVE_EPOCH_FILE=f)
    assert a[:4] == ["-m", "services.datacenter", "--dc", "x"]
    assert a[4] == "--epoch" and b[:3] == ["-m", "services.scheduler", "--epoch"]
    assert a[5] == b[3] == Path(f).read_text().strip()
    assert float(a[5]) > 1.6e9
    assert not [p for p in Path(f).parent.iterdir() if p.name != "epoch"]  # no temp left


def test_entrypoint_env_and_flags_win(entry_env, tmp_path):
    f = str(tmp_path / "epoch")
    out = _entry(entry_env, "loadgen", GEOSERVE_EPOCH="123.5", GEOSERVE_EPOCH_FILE=f,
                 GEOSERVE_DILATION="4", GEOSERVE_EXTRA_ARGS="--duration 20  --rate 6")
    assert out == ["-m", "services.loadgen", "--epoch", "123.5", "--dilation", "4",
                   "--duration", "20", "--rate", "6"]
    assert not os.path.exists(f)
    out = _entry(entry_env, "provisioner", "--epoch=7", "--dilation", "2",
                 GEOSERVE_EPOCH="123.5", GEOSERVE_DILATION="4")
    assert out == ["-m", "services.provisioner", "--epoch=7", "--dilation", "2"]


def test_entrypoint_dispatch(entry_env):
    assert _entry(entry_env, "healthprobe", "h:1") == ["-m", "services.runtime.healthprobe",
                                                      "h:1"]
    assert _entry(entry_env, "python", "-V") == ["-V"]          # any other command
    assert "datacenter|scheduler|provisioner|loadgen|carm" in "\n".join(
        _entry(entry_env, "--help"))


# ---------------------------------------------------------------- health probe


def test_healthprobe_against_a_real_health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        addr = f"127.0.0.1:{port}"
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert probe(addr, timeout_s=5) == (True, "SERVING")
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert probe(addr, timeout_s=5) == (False, "NOT_SERVING")
        ok, why = probe(addr, service="geoserve.v1.Nope", timeout_s=5)
        assert not ok and why.startswith("NOT_FOUND")
        cli = [sys.executable, "-m", "services.runtime.healthprobe"]
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert subprocess.run([*cli, addr], cwd=ROOT, timeout=30).returncode == 0
        env = {**os.environ, "PORT": str(port)}
        assert subprocess.run(cli, cwd=ROOT, env=env, timeout=30).returncode == 0
    finally:
        server.stop(None)
    dead = subprocess.run([*cli, addr, "--timeout", "0.5"], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
    assert dead.returncode == 1 and addr in dead.stderr


def test_base_image_pinned_alike_in_dockerfile_env_and_build_script():
    """One pinned base: the Dockerfile's default, .env and build-image.sh's fallback."""
    import re

    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    arg = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)
    assert arg, "deploy/Dockerfile: no ARG BASE_IMAGE=... line"
    env = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines()
               if line and not line.startswith("#"))
    script = re.search(r"env_value GEOSERVE_BASE_IMAGE (\S+)\)",
                       (ROOT / "deploy/build-image.sh").read_text())
    assert script, "deploy/build-image.sh: no GEOSERVE_BASE_IMAGE fallback"
    assert arg.group(1) == env["GEOSERVE_BASE_IMAGE"] == script.group(1) == compose.BASE_IMAGE
    # a version tag, not a floating one (python:3.11-slim would follow every patch release)
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", arg.group(1))
