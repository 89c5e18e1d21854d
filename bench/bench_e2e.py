"""End-to-end benchmarks (issue: geo-distributed emulation).

1. Wall runtime (`geoserve run`, every service its own process on loopback): for a
   topology and dilation k, a ladder of arrival rates; a rate is *sustained* when the run
   stays faithful (p99 wake-up lateness within bound, no resyncs beyond 0.1 %) and every
   request completes. Reports the highest sustained rate.
2. Virtual runtime: emulated seconds per wall second for base.yaml at 1200, 2400 and
   4000 req/s (round-robin).

Usage: python bench/bench_e2e.py [--part wall|virtual|all] [--topology small]
       [--rates 12,24,36] [--dilations 1,4] [--duration 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.config.topology import ROOT, load_topology  # noqa: E402
from services.sim.runtime import SimRun  # noqa: E402


def wall_ladder(topology: str, rates: list[float], dilation: float, duration: float) -> dict:
    best = None
    rows = []
    for rate in rates:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "services.cli", "run", "--topology", topology,
                 "--rate", str(rate), "--duration", str(duration), "--dilation", str(dilation),
                 "--out", str(out)],
                cwd=ROOT, capture_output=True, text=True, timeout=duration * dilation * 6 + 300,
            )
            wall = time.monotonic() - t0
            if proc.returncode != 0 or not (out / "summary.json").exists():
                rows.append({"rate": rate, "error": proc.stderr[-500:]})
                print(f"  {topology} k={dilation} {rate:g} req/s: run failed", flush=True)
                break
            s = json.loads((out / "summary.json").read_text())
        rq = s["requests"]
        ok = s["emulation"]["faithful"] and rq["completed"] == rq["emitted"]
        row = {"rate": rate, "faithful": s["emulation"]["faithful"],
               "lateness_ms_p99": s["emulation"]["lateness_s_p99"] * 1e3,
               "completed": rq["completed"], "emitted": rq["emitted"],
               "slo_violation": s["slo"]["violation_ratio"], "wall_s": wall, "sustained": ok}
        rows.append(row)
        print(f"  {topology} k={dilation} {rate:g} req/s: faithful={row['faithful']} "
              f"p99 lateness {row['lateness_ms_p99']:.2f} ms, completed {rq['completed']}/"
              f"{rq['emitted']}, SLO viol {row['slo_violation'] * 100:.1f} % "
              f"({wall:.0f} s wall)", flush=True)
        if not ok:
            break
        best = rate
    return {"topology": topology, "dilation": dilation, "max_sustained_rps": best, "runs": rows}


def virtual_speed(rates: list[float], duration: float) -> list[dict]:
    out = []
    for rate in rates:
        topo = load_topology("base").with_overrides(rate_rps=rate, duration_s=duration,
                                                    warmup_s=0)
        run = SimRun(topo)
        t0 = time.monotonic()
        s = run.run()
        wall = time.monotonic() - t0
        r = {"rate": rate, "emulated_s": s["emulation"]["emulated_s"], "wall_s": wall,
             "emulated_per_wall": s["emulation"]["emulated_s"] / wall,
             "requests": s["requests"]["emitted"], "requests_per_wall_s":
             s["requests"]["emitted"] / wall}
        out.append(r)
        print(f"  virtual base.yaml {rate:g} req/s: {r['emulated_s']:.1f} emulated s in "
              f"{wall:.1f} s wall = {r['emulated_per_wall']:.2f} emulated s / wall s "
              f"({r['requests_per_wall_s']:.0f} requests / wall s)", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all", choices=["wall", "virtual", "all"])
    ap.add_argument("--topology", default="small")
    ap.add_argument("--rates", default="")
    ap.add_argument("--dilations", default="1,4")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--virtual-duration", type=float, default=20.0)
    args = ap.parse_args()
    result: dict[str, object] = {}
    if args.part in ("wall", "all"):
        default = {"small": "12,24,36,48,60,72", "base": "50,100,200,400,800"}
        rates = [float(x) for x in (args.rates or default.get(args.topology, "10")).split(",")]
        result["wall"] = []
        for k in (float(x) for x in args.dilations.split(",")):
            print(f"wall runtime, {args.topology}, dilation {k:g}:", flush=True)
            r = wall_ladder(args.topology, rates, k, args.duration)
            result["wall"].append(r)  # type: ignore[attr-defined]
            print(f"=> highest sustained rate: {r['max_sustained_rps']} req/s", flush=True)
    if args.part in ("virtual", "all"):
        print("virtual runtime speed:", flush=True)
        result["virtual"] = virtual_speed([1200, 2400, 4000], args.virtual_duration)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
