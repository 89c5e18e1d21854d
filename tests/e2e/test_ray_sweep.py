"""`geoserve sweep --executor ray` on a real Ray cluster: a head and two worker nodes.

The cluster runs in a network namespace of its own (``ip netns``, loopback only), so its
nodes talk over 127.0.0.1 and nothing leaves the machine: on a host with a network
interface Ray would otherwise advertise that interface's address instead of loopback.
The sweep's driver runs in the namespace too; the test kills, from outside, the worker
process of one running point (``ray::sweep_point``) with SIGKILL, and checks that

* the sweep still exits 0 with every point written exactly once (Ray re-ran the killed
  point),
* each point's summary equals the local executor's for the same points
  (``--deterministic``: solver time not charged; the run's wall time left out),
* progress lines say points done / running / left.

Needs root (network namespaces); CI runs as root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.sweep.run import deterministic_view

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
PORT = 6379  # inside the namespace: no clash with anything on the host
SWEEP = ["--topology", "topologies/small.yaml", "--rates", "24,48",
         "--policies", "round-robin,greedy-a0.5", "--duration", "200", "--warmup", "5",
         "--deterministic", "--no-ablation", "--wall-check", ""]
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}


def _sh(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n" \
                                 f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


def _netns_pids(ns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


@pytest.fixture(scope="module")
def ray_netns() -> Iterator[str]:
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.fail("the Ray cluster test needs root and iproute2 (network namespaces)")
    assert Path(RAY).exists(), f"{RAY} is missing: `make venv` installs ray (dev extras)"
    ns = f"geoserve-ray-{os.getpid()}"
    tmp = tempfile.mkdtemp(prefix="gsray", dir="/tmp")  # short: Ray's socket paths
    _sh(["ip", "netns", "add", ns])
    try:
        _sh(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        inns = ["ip", "netns", "exec", ns]
        _sh([*inns, RAY, "start", "--head", "--port", str(PORT), "--num-cpus", "0",
             "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", tmp],
            timeout=120)
        for _ in range(2):
            _sh([*inns, RAY, "start", "--address", f"127.0.0.1:{PORT}", "--num-cpus", "1",
                 "--disable-usage-stats"], timeout=120)
        deadline = time.monotonic() + 60
        while True:
            st = subprocess.run([*inns, RAY, "status", "--address", f"127.0.0.1:{PORT}"],
                                env=ENV, capture_output=True, text=True, timeout=60)
            if re.search(r"/2\.0 CPU", st.stdout):
                break
            assert time.monotonic() < deadline, f"two worker nodes did not join:\n{st.stdout}"
            time.sleep(1)
        yield ns
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _netns_pids(ns):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(2 if sig == signal.SIGTERM else 0.5)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _summaries(folder: Path) -> dict[str, dict]:
    return {p.name: deterministic_view(json.loads(p.read_text()))
            for p in sorted(folder.glob("*.json"))}


def test_ray_sweep_equals_local_and_survives_a_killed_worker(ray_netns, tmp_path):
    geoserve = [sys.executable, "-m", "services.cli", "sweep"]
    _sh([*geoserve, *SWEEP, "--executor", "local", "--jobs", "2", "--out",
         str(tmp_path / "local"), "--doc", str(tmp_path / "local.md")], timeout=300)
    local = _summaries(tmp_path / "local")
    assert len(local) == 4  # round-robin and greedy at 24 and 48 req/s

    log = tmp_path / "ray.log"
    with log.open("w") as fh:
        sweep = subprocess.Popen(
            ["ip", "netns", "exec", ray_netns, *geoserve, *SWEEP, "--executor", "ray",
             "--address", f"127.0.0.1:{PORT}", "--out", str(tmp_path / "ray"),
             "--doc", str(tmp_path / "ray.md")],
            cwd=ROOT, env=ENV, stdout=fh, stderr=subprocess.STDOUT)
    killed = None
    deadline = time.monotonic() + 240
    try:
        while sweep.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            if killed is None:
                running = subprocess.run(["pgrep", "-f", "^ray::sweep_point"],
                                         capture_output=True, text=True).stdout.split()
                ours = sorted({int(p) for p in running} & _netns_pids(ray_netns))
                if ours:
                    killed = ours[0]
                    os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    out = log.read_text()
    print(out[-2500:])
    assert sweep.returncode == 0, out[-3000:]
    assert killed is not None, "no running point was seen to kill"
    assert "4 to run on Ray (3 nodes, 2 CPUs)" in out
    progress = re.findall(r"\[done (\d+)/4 \| running (\d+) \| left (\d+)\]", out)
    assert [int(d) for d, _, _ in progress] == [1, 2, 3, 4]  # one line per point
    assert progress[-1] == ("4", "0", "0")
    assert all(int(d) + int(r) + int(lf) == 4 and int(r) <= 2 for d, r, lf in progress)
    ray = _summaries(tmp_path / "ray")
    assert sorted(ray) == sorted(local)  # every point once: none lost, none extra
    for name in local:
        assert ray[name] == local[name], name
