"""The wall runtime (processes, gRPC, sleeps) and the virtual runtime agree on small.yaml."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.common.topology import ROOT, load_topology
from services.sim.runtime import SimRun


# greedy's routing follows the snapshots, whose phase differs between the runtimes: a
# longer run averages that out
@pytest.mark.parametrize(("policy", "duration"), [("round-robin", 30), ("greedy", 60)])
def test_wall_and_virtual_agree_at_light_load(tmp_path, policy, duration):
    topo = load_topology("small").with_overrides(policy=policy, duration_s=duration)
    sim = SimRun(topo).run()
    out = tmp_path / "wall"
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "run", "--topology", "small", "--policy", policy,
         "--duration", str(duration), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wall = json.loads((out / "summary.json").read_text())
    for s in (sim, wall):
        rq = s["requests"]
        assert rq["emitted"] == rq["completed"] + rq["rejected"] + rq["failed"]
    assert wall["requests"]["emitted"] == sim["requests"]["emitted"]
    assert wall["requests"]["completed"] == sim["requests"]["completed"]
    assert wall["ttft_s"]["p50"] == pytest.approx(sim["ttft_s"]["p50"], rel=0.05)
    assert wall["tpot_s"]["p50"] == pytest.approx(sim["tpot_s"]["p50"], rel=0.05)
    assert wall["carbon_g"]["total"] == pytest.approx(sim["carbon_g"]["total"], rel=0.02)
    assert wall["emulation"]["faithful"]
