"""Scheduling-policy overheads (prints figures; not a pass/fail test).

* greedy / moer / least-loaded / round-robin: per-request decision time (one-request
  windows on a 4 x 4 topology), p50 / p99;
* ilp, iterative-ilp, facility-milp, green-llm: per-window build + solve time at 300
  requests x 16 DCs, p50 / p99, solver time alone, limit hits and MIP gaps (facility);
* OSL predictor: single-request inference time.

Usage: ``.venv/bin/python bench/bench_policies.py [--windows 40] [--requests 2000]``.
Loads: the synthetic topology at low (0.3), high (0.9) and saturated (0.97) per-engine load,
with 32 engines per DC (paper 1) and, to make capacity bind, 4 engines per DC.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from services.scheduler.osl import OslPredictor
from services.scheduler.policies import get_policy
from services.scheduler.policies.synthetic import SyntheticShape, make_requests, make_snapshot


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def bench_per_request(n: int, seed: int) -> None:
    print(f"\n== per-request decision time ({n} requests, 16 DCs)")
    rng = np.random.default_rng(seed)
    snap = make_snapshot(rng, SyntheticShape(load=0.6))
    reqs = make_requests(rng, n)
    for name, cfg in (("greedy", {"alpha": 0.5}), ("moer", {}), ("least-loaded", {}),
                      ("round-robin", {})):  # fmt: skip
        p = get_policy(name, **cfg)
        p.decide([reqs[0]], snap, "region-0", 0.0)  # warm the calibration cache
        ts = []
        for r in reqs:
            t0 = time.perf_counter()
            p.decide([r], snap, "region-0", 0.0)
            ts.append(time.perf_counter() - t0)
        print(f"{name:14s} p50 {pct(ts, 50) * 1e3:7.3f} ms   p99 {pct(ts, 99) * 1e3:7.3f} ms")


def bench_windows(windows: int, seed: int) -> None:
    for engines in (32, 4):
        for load in (0.3, 0.9, 0.97):
            print(f"\n== window of 300 requests x 16 DCs, {engines} engines/DC, load {load}")
            rng = np.random.default_rng(seed)
            cases = [
                (make_snapshot(rng, SyntheticShape(load=load, engines=engines), seq=i),
                 make_requests(rng, 300))
                for i in range(windows)
            ]  # fmt: skip
            for name in ("ilp", "iterative-ilp", "facility-milp", "green-llm"):
                p = get_policy(name, clock=time.perf_counter)
                p.decide(cases[0][1][:5], cases[0][0], "region-0", 0.0)  # warm-up
                total, solve, iters, gaps = [], [], [], []
                limit = fb = 0
                for s, reqs in cases:
                    t0 = time.perf_counter()
                    d = p.decide(reqs, s, "region-0", 0.0)
                    total.append(time.perf_counter() - t0)
                    solve.append(d.solve_s)
                    iters.append(d.iterations)
                    limit += int(d.limit_hit)
                    fb += d.n_fallback
                    if d.limit_hit and d.mip_gap is not None:
                        gaps.append(d.mip_gap)
                gap_txt = (f" gap mean {np.mean(gaps):.2e} max {np.max(gaps):.2e}"
                           if gaps else "")  # fmt: skip
                print(f"{name:14s} total p50 {pct(total, 50) * 1e3:7.1f} ms p99 "
                      f"{pct(total, 99) * 1e3:7.1f} ms | solve p50 {pct(solve, 50) * 1e3:7.1f} "
                      f"p99 {pct(solve, 99) * 1e3:7.1f} ms | iters {np.mean(iters):.1f} | "
                      f"limit hits {limit}/{len(cases)}{gap_txt} | fallbacks {fb}")  # fmt: skip


def bench_osl(n: int) -> None:
    print(f"\n== OSL predictor ({n} single-request predictions)")
    pred = OslPredictor.load()
    rng = np.random.default_rng(0)
    isl = rng.integers(1, 8000, n).tolist()
    ts = []
    for x in isl:
        t0 = time.perf_counter()
        pred.median_tokens(x, "llama-3.1-8b", "sharegpt")
        ts.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    pred.predict(isl, ["llama-3.1-8b"] * n, ["sharegpt"] * n)
    batch = (time.perf_counter() - t0) / n
    print(f"predict_one p50 {pct(ts, 50) * 1e6:.1f} us  p99 {pct(ts, 99) * 1e6:.1f} us; "
          f"batched {batch * 1e6:.2f} us/request")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    bench_per_request(args.requests, args.seed)
    bench_osl(args.requests)
    bench_windows(args.windows, args.seed)


if __name__ == "__main__":
    main()
