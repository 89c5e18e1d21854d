"""The compose deployment for real: image build, ``docker compose up``, a load, teardown.

Runs once with each compose CLI the deployment supports: Compose v2 (``docker compose``)
and Debian's ``docker-compose`` (v1.29). Starts a Docker engine when none runs
(``deploy/setup-docker.sh``: installs docker.io, docker-compose, the Compose v2 plugin
and debootstrap where missing; skips only when Docker cannot be had at all), builds the
image offline (``deploy/build-image.sh --offline --prometheus``: a
debootstrap base reused when present, a host wheelhouse, a local Prometheus image from
the Debian package), brings up the committed ``docker-compose.yml`` (topology small,
a 20 s load, Prometheus, no Grafana) under a project of its own, and checks that

* the load generator exits 0 and its ``summary.json`` accounts for every request, with
  completed requests;
* Prometheus, queried from the host on its published loopback port, scraped every
  GeoServe container (``up`` reached 1 for each job; the long-running ones are up now);
* ``geoserve swap-scheduler`` replaces a region's scheduler (same network alias, new
  policy) and the new container is healthy;
* ``down`` leaves no container, network or volume of the project behind.

The Compose v2 run is over mutual TLS (``docker-compose.tls.yml`` on top, certificates
from ``geoserve tls-certs``): its load completes as above, every health check passes over
TLS, and a client inside a DC's container without a certificate is refused.

`test_compose_faults_lose_no_request` runs the fault suite (``bench/bench_chaos.py
--compose``) against the deployment: DC, scheduler and provisioner containers killed or
frozen during a load, every request still in exactly one recorded state.

Set ``GEOSERVE_COMPOSE_ONLINE=1`` to build from the pinned registry images instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from services.config.topology import load_topology
from services.deploy.compose import TLS_OVERRIDE, UID, env_key
from services.deploy.compose import geoserve_services as compose_services
from services.deploy.tls import make_certs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_chaos import compose_chaos_run  # noqa: E402

pytestmark = [pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies/small.yaml"
LOAD_S = 20
LOCAL_PROMETHEUS = "geoserve/prometheus:local"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sh(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


COMPOSE_CLIS = {
    # id: (command, the major version it must report)
    "compose-v2": (["docker", "compose"], 2),
    "docker-compose-v1": (["docker-compose"], 1),
}


def _compose_cmd(cli: str) -> list[str]:
    """The command of compose CLI `cli`, after checking it is the major version it names."""
    cmd, major = COMPOSE_CLIS[cli]
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is not installed (deploy/setup-docker.sh installs it)")
    out = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{' '.join(cmd)} version exited {out.returncode}: {out.stderr}"
    m = re.search(r"version v?(\d+)\.(\d+)\.(\d+)", out.stdout)
    assert m, f"{' '.join(cmd)} version printed no version: {out.stdout!r}"
    assert int(m.group(1)) == major, f"{' '.join(cmd)} is {m.group(0)}, expected v{major}"
    print(f"{' '.join(cmd)}: {m.group(0)}")
    return cmd


def _container(project: str, service: str) -> dict:
    ids = _sh(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}",
               "--filter", f"label=com.docker.compose.service={service}"], 30).stdout.split()
    assert len(ids) == 1, f"{service}: {ids}"
    return json.loads(_sh(["docker", "inspect", ids[0]], 30).stdout)[0]


def _prom(port: int, query: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.parametrize("cli", list(COMPOSE_CLIS))
def test_compose_up_load_scrape_swap_down(docker_engine, tmp_path, cli):
    compose_cmd = _compose_cmd(cli)
    t_start = time.monotonic()
    online = os.environ.get("GEOSERVE_COMPOSE_ONLINE") == "1"
    build = ["bash", "deploy/build-image.sh"] + ([] if online else ["--offline", "--prometheus"])
    _sh(build, timeout=540)
    t_built = time.monotonic()
    print(f"images built in {t_built - t_start:.0f} s")

    project = f"geoservetest{os.getpid()}"
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)  # the load generator runs as uid 10001
    prom_port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    env.update({
        "COMPOSE_PROJECT_NAME": project,
        "RESULTS_DIR": str(results),
        "PROMETHEUS_PORT": str(prom_port),
        "LOADGEN_ARGS": f"--duration {LOAD_S}",
    })
    if not online:
        env["PROMETHEUS_IMAGE"] = LOCAL_PROMETHEUS
    topo = load_topology(TOPOLOGY)
    tls = cli == "compose-v2"  # one CLI's run is over mutual TLS, the other's plaintext
    files = [ROOT / "docker-compose.yml", *([ROOT / TLS_OVERRIDE] if tls else [])]
    if tls:
        certs = tmp_path / "tls"
        make_certs(certs, compose_services(topo))
        if os.geteuid() == 0:  # the services run as uid 10001 and read the key
            os.chown(certs / "key.pem", UID, UID)
        else:
            (certs / "key.pem").chmod(0o644)
        env["GEOSERVE_TLS_DIR"] = str(certs)
    compose = [*compose_cmd, "-p", project, *(a for f in files for a in ("-f", str(f)))]
    geoserve_services = ([f"dc-{d.name}" for d in topo.dcs]
                         + [f"scheduler-{r.name}" for r in topo.regions]
                         + ["provisioner", "loadgen"])
    try:
        _sh([*compose, "config", "-q"], 60, env)
        _sh([*compose, "up", "-d"], 300, env)
        t_up = time.monotonic()
        print(f"compose up (healthy start order) in {t_up - t_built:.0f} s")

        deadline = time.monotonic() + LOAD_S + 180
        while True:
            state = _container(project, "loadgen")["State"]
            if state["Status"] == "exited":
                break
            assert time.monotonic() < deadline, "the load generator did not finish"
            time.sleep(2)
        logs = _sh([*compose, "logs", "--no-color", "loadgen"], 60, env).stdout
        assert state["ExitCode"] == 0, logs[-3000:]
        print(f"load run finished in {time.monotonic() - t_up:.0f} s")

        summary = json.loads((results / "summary.json").read_text())
        rq = summary["requests"]
        assert rq["emitted"] == rq["completed"] + rq["rejected"] + rq["failed"], rq
        assert rq["emitted"] > 0 and rq["completed"] > 0, rq
        assert (results / "records.csv").stat().st_size > 0
        assert summary["energy_j"]["total"] > 0
        assert set(summary["carbon_g"]["per_dc"]) == {d.name for d in topo.dcs}

        if tls:
            dc_id = _container(project, f"dc-{topo.dcs[0].name}")["Id"]
            env_vars = _container(project, f"dc-{topo.dcs[0].name}")["Config"]["Env"]
            assert "GEOSERVE_TLS_CA=/run/geoserve-tls/ca.pem" in env_vars
            probe = ["python", "-m", "services.runtime.healthprobe", "--timeout", "3"]
            with_cert = _sh(["docker", "exec", dc_id, *probe], 60, check=False)
            assert with_cert.returncode == 0, with_cert.stderr
            no_cert = _sh(["docker", "exec", "-e", "GEOSERVE_TLS_CERT=", "-e",
                           "GEOSERVE_TLS_KEY=", "-e", "GEOSERVE_TLS_CA=", dc_id, *probe], 60,
                          check=False)
            assert no_cert.returncode == 1, (no_cert.stdout, no_cert.stderr)
            print(f"mTLS: probe with the certificate exit 0; without: exit 1 "
                  f"({no_cert.stderr.strip()[:160]})")

        # Prometheus scraped every container while it ran
        ever = {r["metric"]["job"]: float(r["value"][1])
                for r in _prom(prom_port, "max_over_time(up[10m])")}
        assert set(geoserve_services) <= set(ever), ever
        assert all(ever[s] == 1.0 for s in geoserve_services), ever
        now = {r["metric"]["job"]: float(r["value"][1]) for r in _prom(prom_port, "up")}
        assert all(now[s] == 1.0 for s in geoserve_services if s != "loadgen"), now
        # ... and got GeoServe's own metrics from each
        url = (f"http://127.0.0.1:{prom_port}/api/v1/series?" + urllib.parse.urlencode(
            {"match[]": '{__name__=~"geoserve_.+"}', "start": f"{time.time() - 900:.0f}"}))
        with urllib.request.urlopen(url, timeout=10) as r:
            jobs = {s["job"] for s in json.load(r)["data"]}
        assert set(geoserve_services) <= jobs, jobs

        # Grafana stayed out (its profile was not enabled)
        assert not _sh(["docker", "ps", "-aq", "--filter",
                        f"label=com.docker.compose.project={project}", "--filter",
                        "label=com.docker.compose.service=grafana"], 30).stdout.strip()

        # swap one region's scheduler: same alias and command, new policy, healthy
        region = topo.regions[0].name
        before = _container(project, f"scheduler-{region}")
        image = before["Config"]["Image"]
        swap = _sh([sys.executable, "-m", "services.cli", "swap-scheduler", "--region", region,
                    "--image", image, "--policy", "greedy", "--project", project,
                    "--file", str(ROOT / "docker-compose.yml"), "--timeout", "90"], 150, env)
        if tls:  # the new container keeps the certificates
            assert any(m["Destination"] == "/run/geoserve-tls"
                       for m in _container(project, f"scheduler-{region}")["Mounts"])
        after = _container(project, f"scheduler-{region}")
        assert after["Id"] != before["Id"] and after["Name"] == before["Name"]
        assert after["State"]["Health"]["Status"] == "healthy", swap.stdout
        assert "GEOSERVE_POLICY=greedy" in after["Config"]["Env"]
        assert after["Config"]["Cmd"] == before["Config"]["Cmd"]
        nets = after["NetworkSettings"]["Networks"]
        assert any(f"scheduler-{region}" in (n.get("Aliases") or []) for n in nets.values())
        print(f"scheduler swapped in {time.monotonic() - t_up:.0f} s after up")
    except BaseException:
        tail = _sh([*compose, "logs", "--no-color", "--tail", "40"], 60, env, check=False)
        print(tail.stdout[-8000:])
        raise
    finally:
        _sh([*compose, "down", "-v", "--remove-orphans", "-t", "20"], 180, env, check=False)
        left = _sh(["docker", "ps", "-aq", "--filter",
                    f"label=com.docker.compose.project={project}"], 30).stdout.split()
        nets = _sh(["docker", "network", "ls", "-q", "--filter",
                    f"label=com.docker.compose.project={project}"], 30).stdout.split()
        vols = _sh(["docker", "volume", "ls", "-q", "--filter",
                    f"label=com.docker.compose.project={project}"], 30).stdout.split()
        print(f"compose test ({cli}) took {time.monotonic() - t_start:.0f} s in all")
    assert not left, f"containers left behind: {left}"
    assert not nets, f"networks left behind: {nets}"
    assert not vols, f"volumes left behind: {vols}"


@pytest.mark.parametrize("seed", [5])
def test_compose_faults_lose_no_request(docker_engine, tmp_path, seed):
    """The fault suite on compose: random DC, scheduler and provisioner containers killed or
    frozen during a 20 s load; every request ends in one recorded state, with a reason
    when it did not complete. Uses the image the test above built (Compose v2)."""
    compose_cmd = _compose_cmd("compose-v2")
    if not _sh(["docker", "images", "-q", "geoserve/geoserve:0.1.0"], 30).stdout.strip():
        _sh(["bash", "deploy/build-image.sh", "--offline", "--prometheus"], timeout=540)
    env = {**os.environ, "PROMETHEUS_PORT": str(_free_port()),
           "PROMETHEUS_IMAGE": LOCAL_PROMETHEUS}
    t0 = time.monotonic()
    r = compose_chaos_run(compose_cmd, duration=20.0, rate=10.0, faults=3, seed=seed,
                          out=tmp_path / "results", env=env)
    for f in r["faults"]:
        print(f"  t={f['t_s']:6.2f} s  {f['action']:4s}  {f['victim']}")
    print(f"compose chaos: {r['requests']} reasons {dict(r['reasons'])} "
          f"in {time.monotonic() - t0:.0f} s")
    assert len(r["faults"]) == 3
    assert not r["problems"], r
    rq = r["requests"]
    assert rq["emitted"] == 200 and rq["completed"] > 0


def _dotenv(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


@pytest.mark.parametrize("cli", list(COMPOSE_CLIS))
def test_compose_config_takes_scheduler_swaps_from_env_and_override(docker_engine, tmp_path,
                                                                    cli):
    """Both CLIs resolve the per-region scheduler knobs documented in deploy/README.md:
    shell/.env variables and an override file (no engine needed, only the CLI)."""
    compose_cmd = _compose_cmd(cli)
    topo = load_topology(TOPOLOGY)
    region, other = topo.regions[0].name, topo.regions[1].name
    key = env_key(region)
    dotenv = _dotenv(ROOT / ".env")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMPOSE_", "SCHEDULER_IMAGE_", "POLICY_"))}
    base = [*compose_cmd, "-f", str(ROOT / "docker-compose.yml")]

    def resolved(args: list[str], extra: dict[str, str]) -> dict:
        out = _sh([*args, "config"], 60, {**env, **extra})
        doc = yaml.safe_load(out.stdout)
        assert isinstance(doc, dict) and "services" in doc, out.stdout[:500]
        return dict(doc["services"])

    plain = resolved(base, {})
    assert plain[f"scheduler-{region}"]["image"] == dotenv[f"SCHEDULER_IMAGE_{key}"]

    swapped = resolved(base, {f"SCHEDULER_IMAGE_{key}": "example.org/my-scheduler:1.0",
                              f"POLICY_{key}": "greedy",
                              f"POLICY_CONFIG_{key}": "alpha=0.5"})
    s = swapped[f"scheduler-{region}"]
    assert s["image"] == "example.org/my-scheduler:1.0"
    assert s["environment"]["GEOSERVE_POLICY"] == "greedy"
    assert s["environment"]["GEOSERVE_POLICY_CONFIG"] == "alpha=0.5"
    assert swapped[f"scheduler-{other}"] == plain[f"scheduler-{other}"]

    # .env beside the compose file is read too (the shell was cleared of these above)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "docker-compose.yml").write_text((ROOT / "docker-compose.yml").read_text())
    (proj / ".env").write_text((ROOT / ".env").read_text().replace(
        f"\nPOLICY_{key}=\n", f"\nPOLICY_{key}=facility-milp\n"))
    from_file = resolved([*compose_cmd, "-f", str(proj / "docker-compose.yml")], {})
    assert from_file[f"scheduler-{region}"]["environment"]["GEOSERVE_POLICY"] == "facility-milp"
    assert from_file[f"scheduler-{other}"]["environment"]["GEOSERVE_POLICY"] == ""

    override = tmp_path / "docker-compose.override.yml"
    override.write_text(
        "services:\n"
        f"  scheduler-{region}:\n"
        "    image: example.org/my-scheduler:2.0\n"
        "    healthcheck:\n"
        '      test: ["CMD", "/bin/grpc_health_probe", "-addr=127.0.0.1:50051"]\n')
    over = resolved([*base, "-f", str(override)], {})
    s = over[f"scheduler-{region}"]
    assert s["image"] == "example.org/my-scheduler:2.0"
    assert s["healthcheck"]["test"] == ["CMD", "/bin/grpc_health_probe",
                                        "-addr=127.0.0.1:50051"]
    # the rest of the service (command, addresses, start order) comes from the base file
    assert s["command"] == plain[f"scheduler-{region}"]["command"]
    assert s["environment"] == plain[f"scheduler-{region}"]["environment"]
    assert set(s["depends_on"]) == set(plain[f"scheduler-{region}"]["depends_on"])
    assert over[f"scheduler-{other}"] == plain[f"scheduler-{other}"]

    # the mutual-TLS override adds the certificates to every GeoServe service and keeps
    # each one's own mounts (the CLIs merge volumes by their path in the container)
    with_tls = resolved([*base, "-f", str(ROOT / TLS_OVERRIDE)],
                        {"GEOSERVE_TLS_DIR": str(tmp_path)})

    def targets(svc: dict) -> set[str]:
        return {v["target"] if isinstance(v, dict) else v.split(":")[1]
                for v in svc.get("volumes") or []}

    for name in compose_services(topo):
        s = with_tls[name]
        assert s["environment"]["GEOSERVE_TLS_KEY"] == "/run/geoserve-tls/key.pem", name
        assert targets(s) == targets(plain[name]) | {"/run/geoserve-tls"}, name
    assert {"/results", "/run/geoserve"} <= targets(with_tls["loadgen"])
    assert with_tls["prometheus"] == plain["prometheus"]
