"""``geoserve sweep`` end to end on a small topology: points run on the virtual runtime,
the ablation re-runs carry ``project_peers: false`` into the run itself, and the report
has a table per load plus the ablation table, reading both variants' own summaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from services.common.topology import ROOT


def test_sweep_runs_points_and_the_peer_projection_ablation(tmp_path: Path) -> None:
    out, doc = tmp_path / "points", tmp_path / "doc" / "results.md"
    cmd = [sys.executable, "-m", "services.cli", "sweep", "--topology", "topologies/small.yaml",
           "--rates", "20", "--policies", "ilp", "--duration", "6", "--warmup", "1",
           "--jobs", "1", "--out", str(out), "--doc", str(doc), "--wall-check", ""]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "3 to run" in proc.stdout  # round-robin and ilp, then ilp with own dispatches only

    on = json.loads((out / "small_ilp_20.json").read_text())
    off = json.loads((out / "small_ilp_20_own-only.json").read_text())
    assert not (out / "small_round-robin_20_own-only.json").exists()
    assert on["point"]["project_peers"] is True and off["point"]["project_peers"] is False
    # the setting reached every region's scheduler of the run, not just the label
    assert {r["project_peers"] for r in on["config"]["regions"]} == {True}
    assert {r["project_peers"] for r in off["config"]["regions"]} == {False}
    for s in (on, off):
        rq = s["requests"]
        assert rq["emitted"] > 0
        assert rq["emitted"] == rq["completed"] + rq["rejected"] + rq["failed"]

    text = doc.read_text()
    assert "## 20 req/s" in text and "## Peer projection on and off" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| 20 req/s") and "| ilp |" in ln]
    assert len(rows) == 1, text
    viol = rows[0].split("|")[4].strip()
    assert viol == (f"{on['slo']['violation_ratio'] * 100:.1f} / "
                    f"{off['slo']['violation_ratio'] * 100:.1f}")
    assert (doc.parent / "img").is_dir()

    # --report-only rebuilds the same report from the stored points without running any
    again = subprocess.run(cmd + ["--report-only"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert doc.read_text() == text
