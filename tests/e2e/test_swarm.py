"""The deployment as a Docker Swarm stack, for real: ``docker stack deploy`` of the
committed ``docker-stack.yml`` (small.yaml) on the engine `make test` starts.

Joins the engine to a single-node swarm when it is not in one (``docker swarm init
--advertise-addr 127.0.0.1``; left again afterwards), builds the image offline, deploys
the stack with a 20 s load and checks that

* the load generator's task completes and its ``summary.json`` accounts for every
  request, all completed (no faults here);
* Prometheus (queried inside its container: the stack publishes no port) scraped every
  task: each GeoServe job was up, at the task's own address on the stack network;
* ``docker service update --image`` swaps a region's scheduler (new image and policy,
  the new task healthy, the old one shut down);
* ``docker stack rm`` and removing the stack's volume leave no service, container,
  network or volume of the stack behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from services.config.topology import load_topology

pytestmark = [pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
STACK = f"gsswarm{os.getpid()}"
LABEL = f"label=com.docker.stack.namespace={STACK}"
LOAD_S = 20
SWAPPED = "geoserve/geoserve:swarm-swap-test"


def _sh(cmd: list[str], timeout: float = 60, env: dict[str, str] | None = None,
        check: bool = True) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def _tasks(service: str) -> list[dict]:
    out = _sh(["docker", "service", "ps", "--no-trunc", "--format", "{{json .}}",
               f"{STACK}_{service}"])
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _container(service: str) -> dict:
    ids = _sh(["docker", "ps", "-q", "--filter",
               f"label=com.docker.swarm.service.name={STACK}_{service}"]).split()
    assert len(ids) == 1, f"{service}: running containers {ids}"
    return dict(json.loads(_sh(["docker", "inspect", ids[0]]))[0])


def _left() -> dict[str, list[str]]:
    return {kind: _sh(["docker", kind, "ls", "-q", "--filter", LABEL]).split()
            for kind in ("service", "network", "volume")} | {
        "container": _sh(["docker", "ps", "-aq", "--filter", LABEL]).split()}


@pytest.fixture()
def swarm(docker_engine):
    state = _sh(["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"]).strip()
    joined = state == "inactive"
    if joined:
        _sh(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"])
    try:
        yield
    finally:
        if joined:
            _sh(["docker", "swarm", "leave", "--force"], check=False)


def test_stack_deploy_load_scrape_swap_rm(swarm, tmp_path):
    t0 = time.monotonic()
    _sh(["bash", "deploy/build-image.sh", "--offline", "--prometheus"], timeout=540)
    topo = load_topology(ROOT / "topologies/small.yaml")
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)  # the load generator runs as uid 10001
    env = {**os.environ, "RESULTS_DIR": str(results), "LOADGEN_ARGS": f"--duration {LOAD_S}",
           "PROMETHEUS_IMAGE": "geoserve/prometheus:local"}
    servers = ([f"dc-{d.name}" for d in topo.dcs]
               + [f"scheduler-{r.name}" for r in topo.regions] + ["provisioner"])
    region = topo.regions[0].name
    try:
        _sh(["docker", "stack", "deploy", "--resolve-image", "never", "-c",
             "docker-stack.yml", STACK], 120, env)
        deadline = time.monotonic() + LOAD_S + 240
        while True:
            states = [t["CurrentState"] for t in _tasks("loadgen")]
            if states and states[0].startswith(("Complete", "Failed", "Rejected")):
                break
            assert time.monotonic() < deadline, f"the load generator did not finish: {states}"
            time.sleep(2)
        logs = _sh(["docker", "service", "logs", "--raw", f"{STACK}_loadgen"], 60)
        assert states[0].startswith("Complete"), logs[-3000:]
        assert "servers ready" in logs  # it waited for the servers, as no start order exists
        print(f"stack load finished {time.monotonic() - t0:.0f} s after the start")

        summary = json.loads((results / "summary.json").read_text())
        rq = summary["requests"]
        assert rq["emitted"] == rq["completed"] + rq["rejected"] + rq["failed"], rq
        assert rq["emitted"] == LOAD_S * 12 and rq["completed"] == rq["emitted"], rq
        assert set(summary["carbon_g"]["per_dc"]) == {d.name for d in topo.dcs}

        # every task scraped, at its own address (tasks.<service> DNS discovery)
        prom = _container("prometheus")["Id"]
        query = ("import json, urllib.request; print(json.dumps(json.load(urllib.request."
                 "urlopen('http://127.0.0.1:9090/api/v1/query?query=max_over_time%28up"
                 "%5B10m%5D%29'))['data']['result']))")
        got = json.loads(_sh(["docker", "exec", prom, "python3", "-c", query]))
        up = {(r["metric"]["job"], r["metric"]["instance"]): float(r["value"][1]) for r in got}
        for name in servers:
            nets = _container(name)["NetworkSettings"]["Networks"]
            ip = nets[f"{STACK}_default"]["IPAddress"]
            assert up.get((name, f"{ip}:9100")) == 1.0, (name, ip, up)
        assert any(job == "loadgen" and v == 1.0 for (job, _), v in up.items()), up

        # swap a scheduler: new image and policy, healthy, the old task shut down
        _sh(["docker", "tag", "geoserve/geoserve:0.1.0", SWAPPED])
        _sh(["docker", "service", "update", "--quiet", "--detach=false", "--no-resolve-image",
             "--image", SWAPPED, "--env-add", "GEOSERVE_POLICY=greedy",
             f"{STACK}_scheduler-{region}"], 180)
        deadline = time.monotonic() + 90
        while True:
            c = _container(f"scheduler-{region}")
            if c["State"].get("Health", {}).get("Status") == "healthy":
                break
            assert time.monotonic() < deadline, c["State"]
            time.sleep(1)
        assert c["Config"]["Image"] == SWAPPED
        assert "GEOSERVE_POLICY=greedy" in c["Config"]["Env"]
        tasks = _tasks(f"scheduler-{region}")
        assert [t["DesiredState"] for t in tasks] == ["Running", "Shutdown"], tasks
        print(f"scheduler swapped {time.monotonic() - t0:.0f} s after the start")
    except BaseException:
        for svc in [*servers, "loadgen"]:
            tail = _sh(["docker", "service", "logs", "--raw", "--tail", "15",
                        f"{STACK}_{svc}"], 60, check=False)
            print(f"--- {svc}\n{tail}")
        raise
    finally:
        _sh(["docker", "stack", "rm", STACK], 120, check=False)
        deadline = time.monotonic() + 90
        while _sh(["docker", "ps", "-aq", "--filter", LABEL]).split() or _sh(
                ["docker", "network", "ls", "-q", "--filter", LABEL]).split():
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        for vol in _sh(["docker", "volume", "ls", "-q", "--filter", LABEL]).split():
            _sh(["docker", "volume", "rm", vol], 60, check=False)
        _sh(["docker", "rmi", SWAPPED], 60, check=False)
        print(f"swarm test took {time.monotonic() - t0:.0f} s in all")
    left = _left()
    assert not any(left.values()), f"left behind: {left}"
