"""The load generator's `--wait-ready`: it starts the load only once every server it
talks to reports SERVING, and names the ones that never did."""

from __future__ import annotations

import subprocess
import sys
import time

from services.config.topology import ROOT
from services.runner.local import free_port
from tests.integration.test_request_identity import TOPOLOGY as ONE_DC
from tests.procs import service


def _loadgen(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.loadgen", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_wait_ready_names_the_servers_that_never_answered(tmp_path):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    proc = _loadgen("--topology", "topologies/small.yaml", "--schedulers",
                    f"eu-north={dead}", "--wait-ready", "1.5", "--duration", "2",
                    "--out", str(tmp_path / "out"))
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert f"not ready after 1.5 s: scheduler eu-north ({dead})" in proc.stderr
    assert took >= 1.5
    assert not (tmp_path / "out" / "summary.json").exists()  # no load was started


def test_wait_ready_refuses_a_bad_value():
    proc = _loadgen("--topology", "topologies/small.yaml", "--schedulers",
                    "eu-north=127.0.0.1:1", "--wait-ready", "nan")
    assert proc.returncode == 2
    assert "--wait-ready: expected 0..3600 s, got nan" in proc.stderr


def test_wait_ready_passes_once_the_servers_serve(tmp_path):
    topo = tmp_path / "one.yaml"
    topo.write_text(ONE_DC)
    with service("services.datacenter", "--topology", str(topo), "--dc", "eu-a") as (_, dc):
        with service("services.scheduler", "--topology", str(topo), "--region", "eu-north",
                     "--dcs", f"eu-a={dc}") as (_, sch):
            proc = _loadgen("--topology", str(topo), "--schedulers", f"eu-north={sch}",
                            "--dcs", f"eu-a={dc}", "--wait-ready", "10", "--duration", "3",
                            "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "loadgen: 2 servers ready" in proc.stdout
    assert (tmp_path / "out" / "summary.json").exists()
