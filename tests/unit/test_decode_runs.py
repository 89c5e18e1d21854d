"""Decode runs: an engine that plans up to N decode steps at once behaves as one that
plans them one by one.

The reference is the same engine with ``max_run_steps=1`` (step by step, the engine the
rule tests in test_engine_rules.py check against the formulas). Both are driven by the
shared `EngineDriver` on a virtual clock with the same arrivals; every request's terminal
facts, the engines' counters sampled during the run (mid-run included), the energy and
the preemptions must be equal -- exactly, since a run sums the same step times in the same
order. Workloads cover light load (long runs), heavy load with KV preemption (runs fall
back to single steps), late-waiting arrivals, and a GPU clock change in the middle of runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from services.config.calibration import Calibration
from services.datacenter.dc import Datacenter, DcConfig
from services.datacenter.driver import DcDriver, EngineDriver
from services.datacenter.engine import (
    Engine,
    EngineConfig,
    EngineEvent,
    EngineRequest,
    Finished,
    FinishedRequest,
    TokenGaps,
)
from services.model.carbon import ConstantCI
from services.runtime.metrics import TPOT_BUCKETS
from services.runtime.vclock import VirtualClock


def _workload(seed: int, n: int, rate: float, isl: tuple[int, int], osl: tuple[int, int]
              ) -> list[tuple[float, int, int]]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return [(float(t[i]), int(rng.integers(*isl)), int(rng.integers(*osl))) for i in range(n)]


def _run_engines(cal: Calibration, items: Sequence[tuple[float, int, int]], n_engines: int,
                 run_steps: int, poll_s: float) -> dict[str, Any]:
    clock = VirtualClock(0.0)
    cfg = EngineConfig(max_queue=len(items) + 1, max_run_steps=run_steps)
    engines = [Engine(cal, f"e{i}", cfg, 0.0) for i in range(n_engines)]
    for e in engines:
        e.token_gaps = TokenGaps(TPOT_BUCKETS)
    done: dict[str, FinishedRequest] = {}
    first: dict[str, float] = {}

    def sink(i: int, events: Sequence[EngineEvent]) -> None:
        for ev in events:
            if isinstance(ev, Finished):
                done[ev.request_id] = ev.finished
            else:
                first[ev.request_id] = ev.time_s

    driver = EngineDriver(engines, clock, sink)

    def arrive(k: int) -> None:
        t, isl, osl = items[k]
        engines[k % n_engines].enqueue(EngineRequest(str(k), isl, osl, clock.now()), clock.now())
        driver.kick(k % n_engines)

    samples: list[tuple[Any, ...]] = []

    def poll() -> None:
        now = clock.now()
        for e in engines:
            c = e.counters(now)
            samples.append((now, e.name, c.running, c.waiting, c.queue_tokens, c.kv_tokens,
                            c.kv_occupancy_ratio, c.steps, e.active_energy_j(now)))
        if len(done) < len(items):
            clock.call_at(now + poll_s, poll)

    for k, (t, _, _) in enumerate(items):
        clock.call_at(t, arrive, k)
    clock.call_at(poll_s / 2, poll)
    clock.run()
    end = clock.now()
    return {
        "finished": done, "first": first, "samples": samples,
        "active_j": [e.energy.active_j for e in engines],
        "idle_j": [e.idle_energy_j(end) for e in engines],
        "preemptions": sum(e.preemptions for e in engines),
        "steps": sum(e.steps for e in engines),
        "prompt_tokens": sum(e.prompt_tokens for e in engines),
        "generation_tokens": sum(e.generation_tokens for e in engines),
        "gap_counts": sum(e.token_gaps.counts for e in engines if e.token_gaps),
        "gap_count": sum(e.token_gaps.count for e in engines if e.token_gaps),
        "gap_sum": sum(e.token_gaps.sum for e in engines if e.token_gaps),
    }


@pytest.mark.parametrize(
    "seed,n,rate,isl,osl,engines",
    [
        (1, 300, 20.0, (20, 400), (5, 300), 2),       # light: long runs between events
        (2, 200, 400.0, (2000, 4000), (1500, 3000), 1),  # heavy: KV preemption
        (3, 200, 5.0, (1, 8), (1, 3), 3),             # 1-3 token outputs: runs of 1-2 steps
    ],
)
def test_runs_equal_step_by_step(llama_cal: Calibration, seed: int, n: int, rate: float,
                                 isl: tuple[int, int], osl: tuple[int, int],
                                 engines: int) -> None:
    items = _workload(seed, n, rate, isl, osl)
    ref = _run_engines(llama_cal, items, engines, 1, 0.037)
    run = _run_engines(llama_cal, items, engines, 32, 0.037)
    assert len(ref["finished"]) == n
    assert run["finished"] == ref["finished"]
    assert run["first"] == ref["first"]
    # counters exactly; the energy of a step in flight is its elapsed fraction, and a
    # run's step duration is a difference of summed ends (equal to ~1 ulp)
    assert [x[:-1] for x in run["samples"]] == [x[:-1] for x in ref["samples"]]
    assert [x[-1] for x in run["samples"]] == pytest.approx([x[-1] for x in ref["samples"]],
                                                           rel=1e-12)
    assert run["active_j"] == ref["active_j"]
    assert run["idle_j"] == ref["idle_j"]
    assert run["preemptions"] == ref["preemptions"]
    assert run["steps"] == ref["steps"]
    assert run["prompt_tokens"] == ref["prompt_tokens"]
    assert run["generation_tokens"] == ref["generation_tokens"]
    assert run["gap_counts"].tolist() == ref["gap_counts"].tolist()
    assert run["gap_count"] == ref["gap_count"]
    assert run["gap_sum"] == pytest.approx(ref["gap_sum"], rel=1e-12)


@pytest.mark.parametrize("run_steps", [1, 32])
@pytest.mark.parametrize(
    "seed,n,rate,isl,osl,engines",
    [(1, 300, 20.0, (20, 400), (5, 300), 2),
     (2, 200, 400.0, (2000, 4000), (1500, 3000), 1),   # with preemption and recomputation
     (3, 200, 5.0, (1, 8), (1, 3), 3)],
)
def test_token_counters_and_gaps_add_up_to_the_requests(
        llama_cal: Calibration, seed: int, n: int, rate: float, isl: tuple[int, int],
        osl: tuple[int, int], engines: int, run_steps: int) -> None:
    """vLLM's per-step series: prompt tokens are the prefill work, generation tokens every
    token produced, and each token after a request's first has one gap; a request's gaps
    add up to its decode time (last token - first token)."""
    out = _run_engines(llama_cal, _workload(seed, n, rate, isl, osl), engines, run_steps,
                       0.5)
    fin = list(out["finished"].values())
    assert len(fin) == n
    assert out["prompt_tokens"] == sum(f.prefilled_tokens for f in fin)
    assert out["generation_tokens"] == sum(f.output_tokens for f in fin)
    assert out["gap_count"] == sum(f.output_tokens - 1 for f in fin)
    assert int(out["gap_counts"].sum()) == out["gap_count"]
    assert out["gap_sum"] == pytest.approx(sum(f.completed_s - f.first_token_s for f in fin),
                                           rel=1e-9)


def test_heavy_workload_preempts(llama_cal: Calibration) -> None:
    """The heavy case above really exercises preemption (KV exhaustion) under runs."""
    items = _workload(2, 200, 400.0, (2000, 4000), (1500, 3000))
    out = _run_engines(llama_cal, items, 1, 32, 0.5)
    assert out["preemptions"] > 0


def test_runs_cover_many_steps(llama_cal: Calibration) -> None:
    """At light load a plan covers many decode steps (the point of runs)."""
    eng = Engine(llama_cal, "e", EngineConfig(max_run_steps=32), 0.0)
    eng.enqueue(EngineRequest("a", 100, 200, 0.0), 0.0)
    plans = []
    t = 0.0
    while (p := eng.next_step(t)) is not None:
        plans.append(p)
        eng.complete_step(p.end_s)
        t = p.end_s
    decode = [p for p in plans if p.kind == "decode"]
    # 199 decode steps after the prefill (first token from the prefill), 32 per plan
    assert sum(p.steps for p in decode) == 199
    assert len(decode) == -(-199 // 32)


def _dc_run(cal_setup: str, run_steps: int, change_at: Sequence[float]) -> Any:
    from services.config.calibration import load_calibration

    cal = load_calibration(cal_setup)
    dc = Datacenter(DcConfig(name="d", nodes=1, gpus_per_node=2, setup=cal_setup,
                             decode_run_steps=run_steps), cal, ConstantCI(100.0), 0.0)
    clock = VirtualClock(0.0)
    done: dict[str, FinishedRequest] = {}

    def sink(i: int, events: Sequence[EngineEvent]) -> None:
        for ev in events:
            if isinstance(ev, Finished):
                done[ev.request_id] = ev.finished

    drv = DcDriver(dc, clock, sink, record_lateness=False)
    items = _workload(7, 150, 15.0, (50, 600), (20, 400))
    for k, (t, isl, osl) in enumerate(items):
        clock.call_at(t, lambda k=k, isl=isl, osl=osl: drv.submit(
            EngineRequest(str(k), isl, osl, clock.now())))
    levels = cal.frequency.levels_mhz
    for j, t in enumerate(change_at):
        clock.call_at(t, drv.set_frequency, float(levels[j % len(levels)]))
    states = []
    for t in np.arange(0.25, 12.0, 0.5):
        clock.call_at(float(t), lambda: states.append(dc.counters(clock.now())))
    clock.run()
    return done, [(s.active_batch, s.kv_tokens, s.kv_occupancy_ratio, s.power_w, s.carbon_g)
                  for s in states]


def test_frequency_change_mid_run() -> None:
    """A GPU clock change takes effect from the next step, run or not (CA-RM)."""
    setup = DcConfig(name="").setup
    changes = [1.3, 2.71, 4.05, 6.6, 8.2]
    ref_done, ref_states = _dc_run(setup, 1, changes)
    run_done, run_states = _dc_run(setup, 32, changes)
    assert len(ref_done) == 150
    assert run_done == ref_done
    assert [s[:3] for s in run_states] == [s[:3] for s in ref_states]
    assert [v for s in run_states for v in s[3:]] == pytest.approx(
        [v for s in ref_states for v in s[3:]], rel=1e-12)
    base_done, _ = _dc_run(setup, 32, [])
    assert base_done != ref_done  # the changes did change the run


@pytest.mark.parametrize("mhz", [None, 1005.0])
def test_decode_run_equals_steps(llama_cal: Calibration, mhz: float | None) -> None:
    """`PerfModel.decode_run` (arrays from 8 steps on) gives the step-by-step floats."""
    from services.datacenter.perfmodel import PerfModel

    perf = PerfModel(llama_cal, frequency_mhz=mhz)
    rng = np.random.default_rng(5)
    for _ in range(200):
        n, kv, k = int(rng.integers(1, 41)), int(rng.integers(1, 170_000)), int(rng.integers(1, 33))
        times, energies = perf.decode_run(n, kv, k)
        assert times == [perf.decode_time(n, kv + n * s) for s in range(k)]
        assert energies == [perf.decode_energy(n, kv + n * s) for s in range(k)]
