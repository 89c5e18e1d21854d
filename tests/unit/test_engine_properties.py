"""Property tests of the continuous-batching engine on random request streams.

Every stream is driven through the engine by the harness in conftest (virtual clock:
enqueue at arrival, next_step / complete_step), which checks KV-block, batch and
step-time invariants after every call. The tests below check what must hold at the end:
tokens conserved, FIFO admission, latency lower bounds derived from the calibration
coefficients (DESIGN §4 formulas, re-implemented here), and energy floors.

Lower bounds (prefill coefficients are >= 0 by the calibration schema; decode betas may be
negative in fitted files, so the decode bound handles both signs):

* TTFT. Each step that carries c tokens of the request's prompt lasts at least
  f(c) = t_tok(c) + b0 + b1 + b2*c^2 (t_tok, B and sum n^2 only grow with other requests in
  the step). The prompt is split into m >= ceil(ISL/budget) chunks; with t_tok convex
  (slope above the knee >= slope below), Jensen gives sum f(c_j) >= m*f(ISL/m); the bound
  is the minimum over m. (The literal "prefill time of the request alone" is not a lower
  bound: another split of a prompt can make its convex t_tok and n^2 terms cheaper.)
* TPOT. Each of the OSL-1 tokens after the first is produced by its own step containing
  the request: a decode step with batch B >= 1 and cached tokens K >= ISL + B, or (at most
  once per preemption) the step finishing a recompute prefill. With beta_0 = 0 and
  beta_1, beta_2 >= 0, t_dec(B, K) >= t_dec(1, ISL+1), the batch-1 decode step; otherwise
  the minimum of t_dec over every feasible (B, K).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.config.calibration import Calibration, DecodeCoeffs, PrefillCoeffs
from services.datacenter.engine import DECODE, PREFILL, Engine, EngineConfig

from .conftest import TINY_CAL, run_engine, tiny_cal_dict

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---------------------------------------------------------------------------- bounds
@lru_cache(maxsize=8192)
def _ttft_lb(p: PrefillCoeffs, budget: int, isl: int) -> float:
    m = np.arange(math.ceil(isl / budget), isl + 1, dtype=np.float64)
    c = isl / m
    if p.tok_slope_above_s >= p.tok_slope_s:
        tok = np.where(
            c <= p.knee_tokens,
            p.tok_slope_s * c,
            p.tok_slope_s * p.knee_tokens + p.tok_slope_above_s * (c - p.knee_tokens),
        )
    else:  # concave t_tok through 0: t_tok(n) >= (smaller slope) * n
        tok = min(p.tok_slope_s, p.tok_slope_above_s) * c
    f = tok + p.b0_s + p.b1_s + p.b2_s * c * c
    return float(np.min(m * f))


def ttft_lower_bound(cal: Calibration, isl: int) -> float:
    """Least possible time from arrival to the end of the step that finishes the prompt."""
    return _ttft_lb(cal.prefill, cal.engine.max_num_batched_tokens, isl)


def t_dec(d: DecodeCoeffs, batch: int, kv: float) -> float:
    """DESIGN §4: t_dec = a0 + a1*B + a2*B^2, a_j = alpha_j + beta_j * K/B."""
    a, b = d.alpha_s, d.beta_s
    x = kv / batch
    return (a[0] + b[0] * x) + (a[1] + b[1] * x) * batch + (a[2] + b[2] * x) * batch**2


@lru_cache(maxsize=8192)
def _decode_lb(d: DecodeCoeffs, max_seqs: int, k_max: int, isl: int) -> float:
    b = d.beta_s
    if b[0] == 0.0 and b[1] >= 0.0 and b[2] >= 0.0:
        return t_dec(d, 1, isl + 1)
    best = math.inf
    for batch in range(1, max_seqs + 1):
        k_lo = isl + batch  # our context plus at least one token per other request
        if k_lo > k_max:
            break
        slope = b[0] / batch + b[1] + b[2] * batch  # t_dec is linear in K for fixed B
        best = min(best, t_dec(d, batch, k_lo if slope >= 0 else k_max))
    return best


def decode_step_lower_bound(cal: Calibration, isl: int) -> float:
    k_max = cal.engine.kv_capacity_tokens(cal.tp)
    return _decode_lb(cal.decode, cal.engine.max_num_seqs, k_max, isl)


def reprefill_step_lower_bound(cal: Calibration) -> float:
    """Least duration of any prefill step (one request, at least one token)."""
    p = cal.prefill
    return min(p.tok_slope_s, p.tok_slope_above_s) + p.b0_s + p.b1_s + p.b2_s


def tpot_lower_bound(cal: Calibration, isl: int, osl: int, preemptions: int) -> float:
    dec = decode_step_lower_bound(cal, isl)
    pre = min(dec, reprefill_step_lower_bound(cal))
    n_pre = min(preemptions, osl - 1)
    return ((osl - 1 - n_pre) * dec + n_pre * pre) / (osl - 1)


# ---------------------------------------------------------------------------- strategies
@st.composite
def streams(draw, max_model_len: int, max_n: int, max_gap_s: float, max_isl: int, max_osl: int):
    n = draw(st.integers(1, max_n))
    t = draw(st.floats(0.0, 1.0, allow_nan=False))
    out = []
    for _ in range(n):
        t += draw(st.floats(0.0, max_gap_s, allow_nan=False, allow_infinity=False))
        isl = draw(st.integers(1, min(max_isl, max_model_len - 1)))
        osl = draw(st.integers(1, min(max_osl, max_model_len - isl)))
        out.append((t, isl, osl))
    return out


# ---------------------------------------------------------------------------- checks
def check_run(cal: Calibration, eng: Engine, arrivals, rec) -> None:
    n = len(arrivals)
    ids = [str(k) for k in range(n)]
    # everything enqueued ends completed, nothing left behind
    assert sorted(rec.finished) == sorted(ids)
    assert not eng.running and not eng.waiting
    assert eng.free_blocks == eng.total_blocks
    end = eng.counters(rec.end_s)
    assert end.kv_tokens == 0 and end.queue_tokens == 0 and end.running == 0

    # FIFO admission: first admissions in arrival order (ties in submission order)
    arrival_order = [str(k) for k in sorted(range(n), key=lambda k: (arrivals[k][0], k))]
    assert rec.first_admission == arrival_order

    total_preempt = 0
    tol = 1e-9
    for k, (t_arr, isl, osl) in enumerate(arrivals):
        f = rec.finished[str(k)]
        total_preempt += f.preemptions
        # tokens conserved
        assert f.output_tokens == osl
        assert f.isl_tokens == isl
        assert f.prefilled_tokens >= isl
        if f.preemptions == 0:
            assert f.prefilled_tokens == isl
        else:
            # each recompute re-prefills the prompt plus 1..OSL-1 generated tokens
            assert f.prefilled_tokens >= isl + f.preemptions * (isl + 1)
            assert f.prefilled_tokens <= isl + f.preemptions * (isl + osl - 1)
        # time order and the first-token event
        assert f.arrival_s == t_arr
        assert t_arr <= f.admitted_s <= f.first_token_s <= f.completed_s
        assert rec.first_token_s[str(k)] == f.first_token_s
        # latency lower bounds from the calibration
        assert f.ttft_s >= ttft_lower_bound(cal, isl) * (1 - tol)
        if osl >= 2:
            lb = tpot_lower_bound(cal, isl, osl, f.preemptions)
            assert f.tpot_s >= lb * (1 - tol)
        assert f.energy_j > 0.0
    assert total_preempt == eng.preemptions

    # step-level token accounting: each prefill completion (first prompt or recompute)
    # produces one token, every decode step one per request in the batch
    decode_tokens = sum(p.n_tokens for p in rec.plans if p.kind == DECODE)
    prefill_tokens = sum(p.n_tokens for p in rec.plans if p.kind == PREFILL)
    assert decode_tokens == sum(a[2] for a in arrivals) - (n + total_preempt)
    assert prefill_tokens == sum(f.prefilled_tokens for f in rec.finished.values())
    assert eng.steps == len(rec.plans)

    # energy: step energies add up; shares add up; idle energy covers the empty time
    active = sum(p.energy_j for p in rec.plans)
    assert eng.energy.active_j == pytest.approx(active, rel=1e-9)
    assert sum(f.energy_j for f in rec.finished.values()) == pytest.approx(active, rel=1e-9)
    idle_w = cal.energy.idle_w_per_gpu * cal.tp
    idle = eng.idle_energy_j(rec.end_s)
    assert idle == pytest.approx(idle_w * rec.empty_s, rel=1e-9, abs=1e-9)
    assert eng.energy.active_j + idle >= idle_w * rec.empty_s * (1 - 1e-12)


# ---------------------------------------------------------------------------- tests
@SETTINGS
@given(data=st.data())
def test_tiny_engine_random_streams(tiny_cal, data) -> None:
    arrivals = data.draw(streams(tiny_cal.engine.max_model_len, 16, 0.03, 63, 63))
    eng = Engine(tiny_cal, "tiny", EngineConfig(max_queue=len(arrivals) + 1, watermark_ratio=0))
    rec = run_engine(eng, arrivals)
    check_run(tiny_cal, eng, arrivals, rec)


@SETTINGS
@given(data=st.data(), watermark=st.sampled_from([0.0, 0.01, 0.1]))
def test_tiny_engine_random_streams_with_watermark(tiny_cal, data, watermark) -> None:
    arrivals = data.draw(streams(tiny_cal.engine.max_model_len, 10, 0.02, 63, 63))
    cfg = EngineConfig(max_queue=len(arrivals) + 1, watermark_ratio=watermark)
    eng = Engine(tiny_cal, "tiny", cfg, start_s=0.0)
    rec = run_engine(eng, arrivals)
    check_run(tiny_cal, eng, arrivals, rec)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shipped_engine_random_streams(llama_cal, data) -> None:
    arrivals = data.draw(streams(llama_cal.engine.max_model_len, 60, 0.01, 4096, 96))
    eng = Engine(llama_cal, "llama", EngineConfig(max_queue=len(arrivals) + 1))
    rec = run_engine(eng, arrivals)
    check_run(llama_cal, eng, arrivals, rec)
    assert rec.max_running <= 40


def test_tiny_stream_exercises_queueing_chunking_and_preemption(tiny_cal) -> None:
    """Guard for the property tests: the tiny calibration really reaches the hard paths."""
    # 12 requests in a burst, long prompts and outputs: more than 4 at once (queueing),
    # prompts over 16 tokens (chunked prefill), 12 x ~60 tokens of KV >> 128 (preemption)
    arrivals = [(0.001 * k, 30 + (k % 3), 30) for k in range(12)]
    eng = Engine(tiny_cal, "tiny", EngineConfig(watermark_ratio=0))
    rec = run_engine(eng, arrivals)
    check_run(tiny_cal, eng, arrivals, rec)
    assert eng.preemptions > 0
    assert rec.max_running == tiny_cal.engine.max_num_seqs
    assert any(p.kind == PREFILL and p.n_tokens == 16 for p in rec.plans)
    assert eng.prefill_steps > len(arrivals)      # prompts were split over several steps


def test_tiny_calibration_is_cramped() -> None:
    """The synthetic calibration has the KV geometry the property tests rely on."""
    e = TINY_CAL["engine"]
    cap_tokens = e["gpu_memory_bytes"] * e["gpu_memory_utilization"] - e["weight_bytes"]
    assert cap_tokens / e["kv_bytes_per_token"] == 128
    assert e["max_model_len"] < cap_tokens < e["max_num_seqs"] * e["max_model_len"]
    assert e["max_num_batched_tokens"] < e["max_model_len"]
    assert tiny_cal_dict() == TINY_CAL and tiny_cal_dict() is not TINY_CAL
