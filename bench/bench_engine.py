"""Engine benchmarks (issue: foundation).

1. Virtual mode: engine steps per CPU-second for a 32-engine DC (4 nodes x 8 A100,
   Llama-3.1-8B TP1) under CNN-DailyMail-like load at 30 % and 80 % of capacity.
2. Wall mode, k = 1: wake-up lateness p50/p99 of the same DC as a real service process,
   loaded over gRPC at 30 % and 80 % of capacity.

Capacity is measured first in virtual mode: the completion rate of a saturated DC.
Usage: python bench/bench_engine.py [--wall-seconds 20] [--skip-wall]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.config.calibration import load_calibration  # noqa: E402
from services.datacenter.dc import Datacenter, DcConfig  # noqa: E402
from services.datacenter.driver import DcDriver  # noqa: E402
from services.datacenter.engine import EngineRequest, Finished  # noqa: E402
from services.model.carbon import ConstantCI  # noqa: E402
from services.runtime.vclock import VirtualClock  # noqa: E402

SETUP = "a100-40gb/llama-3.1-8b-tp1"


def lengths(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    isl = np.clip(rng.lognormal(np.log(841) - 0.125, 0.5, n), 16, 6000).astype(int)
    osl = np.clip(rng.lognormal(np.log(71) - 0.125, 0.5, n), 1, 1000).astype(int)
    return isl, osl


def run_virtual(rate: float, duration: float, seed: int = 1) -> dict[str, float]:
    cal = load_calibration(SETUP)
    clock = VirtualClock()
    dc = Datacenter(DcConfig("bench", nodes=4, gpus_per_node=8), cal, ConstantCI(300.0))
    done = 0

    def on_events(idx, events):
        nonlocal done
        done += sum(isinstance(ev, Finished) for ev in events)

    rt = DcDriver(dc, clock, on_events)
    rng = np.random.default_rng(seed)
    n = int(rate * duration)
    t = np.cumsum(rng.exponential(1 / rate, n))
    isl, osl = lengths(rng, n)
    for i in range(n):
        clock.call_at(float(t[i]), lambda i=i: rt.submit(
            EngineRequest(str(i), int(isl[i]), int(osl[i]), clock.now()), cal.model))
    c0 = time.process_time()
    clock.run(until=duration)
    cpu = time.process_time() - c0
    steps = sum(e.steps for e in dc.engines)
    return {"rate_rps": rate, "emulated_s": duration, "steps": steps, "cpu_s": cpu,
            "steps_per_cpu_s": steps / cpu, "completed_rps": done / duration,
            "emulated_s_per_cpu_s": duration / cpu,
            "mean_batch": float(np.mean([len(e.running) for e in dc.engines]))}


async def _drive(address: str, rate: float, seconds: float, seed: int) -> None:
    import grpc
    from geoserve.v1 import common_pb2 as pb
    from geoserve.v1 import datacenter_pb2 as dpb
    from geoserve.v1 import datacenter_pb2_grpc as dg

    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    gaps = rng.exponential(1 / rate, n)
    isl, osl = lengths(rng, n)
    loop = asyncio.get_running_loop()

    async def gen():
        t = loop.time()
        for i in range(n):
            t += gaps[i]
            d = t - loop.time()
            if d > 0:
                await asyncio.sleep(d)
            yield dpb.SubmitRequest(request=pb.Request(
                id=str(i), model="llama-3.1-8b", isl_tokens=int(isl[i]), osl_tokens=int(osl[i])))

    async with grpc.aio.insecure_channel(address) as ch:
        stub = dg.DatacenterStub(ch)
        async for _ in stub.SubmitStream(gen(), timeout=seconds * 10 + 60):
            pass


def run_wall(rate: float, seconds: float) -> dict[str, float]:
    import grpc
    from geoserve.v1 import datacenter_pb2 as dpb
    from geoserve.v1 import datacenter_pb2_grpc as dg

    from tests.procs import service

    with service("services.datacenter", "--dc", "bench", "--nodes", "4",
                 "--gpus-per-node", "8") as (_, addr):
        c0 = time.time()
        asyncio.run(_drive(addr, rate, seconds, 3))
        wall = time.time() - c0

        async def state():
            async with grpc.aio.insecure_channel(addr) as ch:
                return await dg.DatacenterStub(ch).GetState(dpb.GetStateRequest(), timeout=5)

        s = asyncio.run(state()).state
    return {"rate_rps": rate, "wall_s": wall, "completed": s.completed,
            "lateness_ms_p50": s.lateness_s_p50 * 1e3, "lateness_ms_p99": s.lateness_s_p99 * 1e3,
            "lateness_ms_max": s.lateness_s_max * 1e3, "faithful": s.faithful}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wall-seconds", type=float, default=20.0)
    ap.add_argument("--skip-wall", action="store_true")
    args = ap.parse_args()
    sat = run_virtual(600.0, 30.0)
    capacity = sat["completed_rps"]
    print(f"capacity of the 32-engine DC (virtual, saturated at 600 req/s): {capacity:.1f} req/s")
    out: dict[str, object] = {"capacity_rps": capacity, "virtual": [], "wall": []}
    for frac in (0.3, 0.8):
        r = run_virtual(frac * capacity, 120.0)
        out["virtual"].append({"load": frac, **r})  # type: ignore[union-attr]
        print(f"virtual {int(frac*100)}%: {r['steps']} steps in {r['cpu_s']:.2f} CPU-s -> "
              f"{r['steps_per_cpu_s']:.0f} steps/CPU-s, {r['emulated_s_per_cpu_s']:.1f} "
              f"emulated s per CPU-s, mean batch {r['mean_batch']:.1f}")
    if not args.skip_wall:
        for frac in (0.3, 0.8):
            w = run_wall(frac * capacity, args.wall_seconds)
            out["wall"].append({"load": frac, **w})  # type: ignore[union-attr]
            print(f"wall k=1 {int(frac*100)}%: lateness p50 {w['lateness_ms_p50']:.3f} ms, "
                  f"p99 {w['lateness_ms_p99']:.3f} ms, max {w['lateness_ms_max']:.1f} ms, "
                  f"faithful={w['faithful']}, completed {w['completed']}")
    print(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
