"""``geoserve sweep`` end to end on a small topology: points run on the virtual runtime,
the ablation re-runs carry ``project_peers: false`` into the run itself, and the report
has a table per load plus the ablation table, reading both variants' own summaries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from services.config.topology import ROOT


def test_sweep_runs_points_and_the_peer_projection_ablation(tmp_path: Path) -> None:
    out, doc = tmp_path / "points", tmp_path / "doc" / "results.md"
    doc.parent.mkdir()
    (doc.parent / "results-notes.md").write_text("## Hand-written notes\n\nmarker 7f3a\n")
    (doc.parent / "other-notes.md").write_text("not for this report\n")
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
    # plots are named after the report, so reports in one folder keep their own
    assert {p.name for p in (doc.parent / "img").iterdir()} == {
        f"results_{n}.png" for n in ("saving_vs_violation", "ttft_high", "overhead",
                                     "peer_projection")}
    assert "![results_peer_projection.png](img/results_peer_projection.png)" in text
    # the notes written by hand beside the report (NAME-notes.md) close it, others do not
    assert text.endswith("## Hand-written notes\n\nmarker 7f3a\n")
    assert "not for this report" not in text

    # --report-only rebuilds the same report from the stored points without running any
    again = subprocess.run(cmd + ["--report-only"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert doc.read_text() == text


def test_sweep_over_seeds_reports_means_and_spread(tmp_path: Path) -> None:
    out, doc = tmp_path / "points", tmp_path / "doc" / "results.md"
    cmd = [sys.executable, "-m", "services.cli", "sweep", "--topology", "topologies/small.yaml",
           "--rates", "20", "--policies", "greedy-a0", "--duration", "6", "--warmup", "1",
           "--jobs", "2", "--out", str(out), "--doc", str(doc), "--wall-check", "",
           "--seeds", "1,2", "--no-ablation"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    runs = {(lb, seed): json.loads((out / f"small_{lb}_20{sfx}.json").read_text())
            for lb in ("round-robin", "greedy-a0") for seed, sfx in ((1, ""), (2, "_s2"))}
    assert {s["config"]["load"]["seed"] for s in runs.values()} == {1, 2}
    assert not list(out.glob("*own-only*"))

    text = doc.read_text()
    assert "seeds 1, 2" in text and "--seeds 1,2" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| greedy-a0 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    carbon = (runs[("greedy-a0", 1)]["carbon_g"]["total"]
              + runs[("greedy-a0", 2)]["carbon_g"]["total"]) / 2
    assert cells[1] == f"{carbon:.0f}"
    # saving: mean of the two per-seed savings, each against round-robin of its seed
    per_seed = [1 - runs[("greedy-a0", k)]["carbon_g"]["total"]
                / runs[("round-robin", k)]["carbon_g"]["total"] for k in (1, 2)]
    mean = sum(per_seed) / 2
    sd = abs(per_seed[0] - per_seed[1]) / 2 ** 0.5
    assert cells[2] == f"{mean * 100:.1f} ± {sd * 100:.1f}"
    assert " ± " in cells[3]


def test_sweep_rejects_bad_seeds(tmp_path: Path) -> None:
    for bad in ("1,x", "2,2"):
        proc = subprocess.run(
            [sys.executable, "-m", "services.cli", "sweep", "--seeds", bad, "--out",
             str(tmp_path / "p"), "--doc", str(tmp_path / "d.md"), "--wall-check", ""],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "--seeds" in proc.stderr and bad in proc.stderr
        assert not (tmp_path / "p").exists()


def test_sweep_rejects_an_address_without_ray_and_bad_jobs(tmp_path: Path) -> None:
    for args, flag in ((["--address", "127.0.0.1:6379"], "--address"), (["--jobs", "0"],
                                                                       "--jobs")):
        proc = subprocess.run(
            [sys.executable, "-m", "services.cli", "sweep", *args, "--out",
             str(tmp_path / "p"), "--doc", str(tmp_path / "d.md"), "--wall-check", ""],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert f"geoserve: error: {flag}:" in proc.stderr
        assert not (tmp_path / "p").exists()


def test_deterministic_points_have_their_own_key_and_equal_summaries_twice() -> None:
    from services.sweep.run import Point, deterministic_view, run_point

    charged = Point("topologies/small.yaml", "greedy-a0.5", "greedy", {"alpha": 0.5}, 20.0,
                    8.0, 2.0)
    det = Point("topologies/small.yaml", "greedy-a0.5", "greedy", {"alpha": 0.5}, 20.0, 8.0,
                2.0, charge_solver_time=False)
    assert det.key == charged.key + "_det"
    a, b = run_point(det), run_point(det)
    assert a["emulation"]["wall_s"] > 0 and b["emulation"]["wall_s"] > 0
    assert deterministic_view(a) == deterministic_view(b)
    assert "wall_s" not in deterministic_view(a)["emulation"]
    assert a["config"]["charge_solver_time"] is False


def test_local_executor_progress_counts_done_running_left(tmp_path: Path, capsys) -> None:
    from services.sweep.run import Point, run_sweep

    points = [Point("topologies/small.yaml", "round-robin", "round-robin", {}, r, 5.0, 1.0,
                    charge_solver_time=False) for r in (8.0, 16.0, 24.0)]
    run_sweep(points, tmp_path / "out", jobs=2)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  [done")]
    counts = [tuple(int(x) for x in re.findall(
        r"done (\d+)/3 \| running (\d+) \| left (\d+)", ln)[0]) for ln in lines]
    # (done, running, left): two workers, three points
    assert counts == [(1, 2, 0), (2, 1, 0), (3, 0, 0)]
    assert len(list((tmp_path / "out").glob("*.json"))) == 3
    again = run_sweep(points, tmp_path / "out")  # every point reused, none re-run
    assert "0 to run" in capsys.readouterr().out
    assert [s["point"]["rate_rps"] for s in again] == [8.0, 16.0, 24.0]
