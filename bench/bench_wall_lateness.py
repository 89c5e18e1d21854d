"""Where does the wall runtime's wake-up lateness come from? (figures, not a test)

Runs `geoserve run --topology base` with ``GEOSERVE_TRACE_DIR`` set: every DC process
writes each wake-up (a step or decode run's planned end and how late the process woke up)
and each provisioner poll's arrival (GetState), in its own emulated seconds. For each
wake-up this reports how long after the DC's latest poll it was due, and splits the
lateness into wake-ups due within ``--near-ms`` of a poll (when the provisioner's poll,
the 16 DCs' answers and the 4 schedulers' snapshot handling compete for the cores) and
the others.

Usage: .venv/bin/python bench/bench_wall_lateness.py [--rates 2,50] [--duration 30]
       [--modes sync,async] [--near-ms 30] [--json bench/results/wall_lateness.json]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _run(rate: float, duration: float, mode: str, near_s: float) -> dict[str, Any]:
    topo = "base"
    variant = ROOT / "topologies" / f".bench-lateness-{mode}.yaml"
    if mode != "sync":
        text = (ROOT / "topologies" / "base.yaml").read_text()
        variant.write_text(text.replace("mode: sync", f"mode: {mode}"))
        topo = str(variant)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace"
            out = Path(tmp) / "run"
            proc = subprocess.run(
                [sys.executable, "-m", "services.cli", "run", "--topology", topo, "--rate",
                 str(rate), "--duration", str(duration), "--out", str(out)],
                cwd=ROOT, env={**os.environ, "GEOSERVE_TRACE_DIR": str(trace)},
                capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"geoserve run failed ({proc.returncode}):\n{proc.stdout[-2000:]}")
            wakes, since = [], []
            for f in sorted(trace.glob("*.trace.csv")):
                polls: list[float] = []
                rows = list(csv.DictReader(f.open()))
                polls = sorted(float(r["time_s"]) for r in rows if r["kind"] == "poll")
                for r in rows:
                    if r["kind"] != "wake":
                        continue
                    t, late = float(r["time_s"]), float(r["lateness_s"])
                    k = bisect.bisect_right(polls, t) - 1
                    wakes.append(late)
                    since.append(t - polls[k] if k >= 0 else np.inf)
    finally:
        variant.unlink(missing_ok=True)
    lat, age = np.asarray(wakes), np.asarray(since)
    near = age <= near_s

    def q(x: np.ndarray, p: float) -> float:
        return float(np.percentile(x, p) * 1e3) if x.size else float("nan")

    big = lat > 0.002
    row = {
        "rate": rate, "mode": mode, "wakeups": int(lat.size),
        "p50_ms": q(lat, 50), "p99_ms": q(lat, 99), "max_ms": q(lat, 100),
        "near_poll_share": float(near.mean()) if lat.size else float("nan"),
        "near_p99_ms": q(lat[near], 99), "other_p99_ms": q(lat[~near], 99),
        "late_2ms": int(big.sum()),
        "late_2ms_near_poll_share": float(near[big].mean()) if big.any() else float("nan"),
    }
    print(f"{mode:5s} {rate:6g} req/s: {row['wakeups']} wake-ups, lateness p50 "
          f"{row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} max {row['max_ms']:.2f} ms | within "
          f"{near_s * 1e3:.0f} ms of a poll: {row['near_poll_share']:.0%} of wake-ups, p99 "
          f"{row['near_p99_ms']:.2f} ms; others p99 {row['other_p99_ms']:.2f} ms | > 2 ms: "
          f"{row['late_2ms']} ({row['late_2ms_near_poll_share']:.0%} near a poll)", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="2,50")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--near-ms", type=float, default=30.0)
    ap.add_argument("--json", default="bench/results/wall_lateness.json")
    args = ap.parse_args()
    rows = [_run(float(r), args.duration, m, args.near_ms / 1e3)
            for m in args.modes.split(",") if m for r in args.rates.split(",") if r]
    p = ROOT / args.json
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"command": "python bench/bench_wall_lateness.py "
                             + " ".join(sys.argv[1:]), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
