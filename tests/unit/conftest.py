"""Shared fixtures of the core unit tests: small calibrations and a virtual-clock engine harness.

The harness drives an `Engine` exactly as a runtime would (enqueue at arrival, then
``next_step`` / ``complete_step`` on a virtual clock) and checks the engine's invariants
after every call, independently of the engine's own bookkeeping. Fixtures are
session-scoped (they return data or functions, never mutable per-test state) so hypothesis
tests can use them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.config.calibration import Calibration, load_calibration, parse_calibration
from services.datacenter.engine import (
    DECODE,
    PREFILL,
    Engine,
    EngineRequest,
    Finished,
    FinishedRequest,
    FirstToken,
    StepPlan,
)

SHIPPED_SETUP = "a100-40gb/llama-3.1-8b-tp1"

# A deliberately cramped engine: 32 KV blocks of 4 tokens (128 tokens), at most 4 running
# requests, 16 prefill tokens per step, prompts+outputs up to 64 tokens. Queueing, chunked
# prefill and preemption all happen with a handful of requests. kv_bytes_per_token = 1 and
# weight_bytes = 0 make the KV capacity equal to gpu_memory_bytes tokens.
# The prefill fixed cost b0 + b1 (0.011 s) exceeds the batch-1 decode step at full context
# (0.0055 + 64 * 1.1e-6 s), so a re-prefill after a preemption is never faster than a decode.
TINY_CAL: dict[str, Any] = {
    "setup": "test/tiny-tp1",
    "gpu": "test-gpu",
    "model": "tiny-model",
    "tp": 1,
    "derived": "synthetic",
    "engine": {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
        "gpu_memory_bytes": 128,
        "gpu_memory_utilization": 1.0,
        "weight_bytes": 0,
        "kv_bytes_per_token": 1,
        "kv_block_tokens": 4,
        "max_model_len": 64,
    },
    "prefill": {
        "b0_s": 0.01,
        "b1_s": 0.001,
        "b2_s": 1.0e-6,
        "tok_slope_s": 1.0e-4,
        "tok_slope_above_s": 3.0e-4,
        "knee_tokens": 8,
    },
    "decode": {"alpha_s": [0.005, 0.0005, 1.0e-5], "beta_s": [0.0, 1.0e-6, 1.0e-7]},
    "energy": {
        "prefill": {"e0_j": 2.0, "e_p_j": 0.05, "e_a_j": 1.0e-4},
        "decode": {"e0_j": 1.0, "e_d_j": 0.2, "e_k_j": 1.0e-3},
        "idle_w_per_gpu": 50.0,
        "host_w_per_node": 200.0,
        "tdp_w_per_gpu": 300.0,
    },
    "frequency": {
        "levels_mhz": [500, 1000, 1500, 2000],
        "static_power_fraction": 0.25,
        "prefill": {"compute_fraction": 0.8, "power_exponent": 2.0},
        "decode": {"compute_fraction": 0.2, "power_exponent": 1.5},
    },
    "provenance": {"summary": "synthetic calibration for unit tests"},
}


def tiny_cal_dict() -> dict[str, Any]:
    """A fresh deep copy of the tiny calibration mapping (safe to mutate)."""
    return copy.deepcopy(TINY_CAL)


@pytest.fixture(scope="session")
def tiny_cal_data() -> Callable[[], dict[str, Any]]:
    return tiny_cal_dict


@pytest.fixture(scope="session")
def tiny_cal() -> Calibration:
    return parse_calibration(tiny_cal_dict(), "test")


@pytest.fixture(scope="session")
def llama_cal() -> Calibration:
    return load_calibration(SHIPPED_SETUP)


# ---------------------------------------------------------------------------- harness
class EngineStalled(AssertionError):
    """`next_step` returned None although requests that had already arrived were waiting."""


@dataclass
class RunRecord:
    """What the harness observed, independently of the engine's counters."""

    finished: dict[str, FinishedRequest] = field(default_factory=dict)
    first_token_s: dict[str, float] = field(default_factory=dict)
    first_admission: list[str] = field(default_factory=list)
    plans: list[StepPlan] = field(default_factory=list)
    empty_s: float = 0.0          # time with nothing running or waiting, [start, end]
    end_s: float = 0.0
    stalls: int = 0
    max_running: int = 0
    preempt_seen: int = 0


def _blocks(tokens: int, block: int) -> int:
    return -(-tokens // block)


def check_engine_invariants(eng: Engine) -> None:
    """Invariants that must hold between any two calls into the engine."""
    bt = eng.block_tokens
    assert 0 <= eng.free_blocks <= eng.total_blocks
    used = sum(r.blocks for r in eng.running)
    assert eng.total_blocks - eng.free_blocks == used, "leaked or double-counted KV blocks"
    assert all(r.blocks == 0 for r in eng.waiting), "a waiting request holds KV blocks"
    assert len(eng.running) <= eng.max_num_seqs
    ids = [r.id for r in eng.running] + [r.id for r in eng.waiting]
    assert len(ids) == len(set(ids)), "a request is in the pipeline twice"
    for r in eng.running:
        assert 0 <= r.prefill_done <= r.prefill_target
        # KV of every prefilled token is cached; the newest generated token's KV is written
        # by the next step, so the cache may lag the context by one token at most.
        assert r.blocks * bt >= r.prefill_target
        assert r.blocks * bt >= r.context_tokens - 1
        assert r.generated < r.osl_tokens, "a finished request is still running"
    c = eng.counters(eng._now)
    assert c.kv_tokens == sum(r.isl_tokens + r.generated for r in eng.running)
    assert c.queue_tokens == sum(r.prefill_target for r in eng.waiting) + sum(
        r.prefill_target - r.prefill_done for r in eng.running
    )
    assert 0.0 <= c.kv_occupancy_ratio <= 1.0
    assert 0.0 <= c.prefill_duty_ratio <= 1.0


def run_engine(
    eng: Engine,
    arrivals: Sequence[tuple[float, int, int]],
    *,
    strict: bool = True,
    max_steps: int = 200_000,
) -> RunRecord:
    """Drive `eng` through `arrivals` on a virtual clock until every request completes.

    `arrivals` are ``(time_s, isl_tokens, osl_tokens)``. Request ids are the arrival
    indices (as strings); arrivals are processed in time order, ties in list order.
    With ``strict=False`` a stall (None from `next_step` while arrived requests wait,
    which the engine's contract forbids) is recorded and the engine is asked again at
    the same instant, so the other invariants can still be checked.
    """
    order = sorted(range(len(arrivals)), key=lambda k: (arrivals[k][0], k))
    rec = RunRecord()
    now = eng._now
    empty_since: float | None = now
    plan: StepPlan | None = None
    i = 0
    admitted: set[str] = set()
    last_end = now
    steps = 0

    def after_plan(p: StepPlan | None) -> StepPlan | None:
        nonlocal last_end
        check_engine_invariants(eng)
        for r in eng.running:
            if r.id not in admitted:
                admitted.add(r.id)
                rec.first_admission.append(r.id)
        rec.max_running = max(rec.max_running, len(eng.running))
        if p is None:
            if eng.waiting:
                rec.stalls += 1
                if strict:
                    raise EngineStalled(
                        f"next_step({now}) returned None with {len(eng.waiting)} arrived "
                        "request(s) waiting and nothing running"
                    )
            return None
        assert p.start_s == pytest.approx(now, abs=1e-12)
        assert p.start_s >= last_end - 1e-12, "steps overlap or time went backwards"
        assert p.duration_s > 0.0 and math.isfinite(p.duration_s)
        assert p.energy_j > 0.0 and math.isfinite(p.energy_j)
        assert 1 <= p.n_requests <= eng.max_num_seqs
        if p.kind == PREFILL:
            assert 1 <= p.n_tokens <= eng.token_budget
        else:
            assert p.kind == DECODE
            assert p.n_tokens == p.n_requests == len(eng.running)
        rec.plans.append(p)
        return p

    def plan_next() -> StepPlan | None:
        p = after_plan(eng.next_step(now))
        if p is None and eng.waiting and not strict:
            p = after_plan(eng.next_step(now))
            assert p is not None, "engine made no progress with requests waiting"
        return p

    while True:
        steps += 1
        assert steps < max_steps, "run did not terminate"
        t_arr = arrivals[order[i]][0] if i < len(order) else math.inf
        t_end = plan.end_s if plan is not None else math.inf
        if t_arr == math.inf and t_end == math.inf:
            break
        if t_arr < t_end:
            now = t_arr
            k = order[i]
            i += 1
            _, isl, osl = arrivals[k]
            eng.enqueue(EngineRequest(str(k), isl, osl, now), now)
            if empty_since is not None:
                rec.empty_s += now - empty_since
                empty_since = None
            check_engine_invariants(eng)
            if plan is None:
                plan = plan_next()
        else:
            assert plan is not None
            now = t_end
            last_end = now
            events = eng.complete_step(now)
            plan = None
            for ev in events:
                assert ev.time_s == now
                if isinstance(ev, FirstToken):
                    assert ev.request_id not in rec.first_token_s, "second first token"
                    rec.first_token_s[ev.request_id] = now
                elif isinstance(ev, Finished):
                    assert ev.finished is not None
                    assert ev.request_id not in rec.finished, "request finished twice"
                    rec.finished[ev.request_id] = ev.finished
            check_engine_invariants(eng)
            if not eng.has_work:
                empty_since = now
            plan = plan_next()
    rec.end_s = now
    if empty_since is not None:
        rec.empty_s += rec.end_s - empty_since
    rec.preempt_seen = eng.preemptions
    return rec
