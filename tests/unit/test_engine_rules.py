"""Rule tests of the engine: expected values computed here from calibration coefficients.

The step-time and step-energy formulas of DESIGN §4 are re-implemented below (`t_pre`,
`t_dec`, `e_pre`, `e_dec`) and every expectation is built from them and from the engine's
documented rules (module docstring of services/datacenter/engine.py). K, the cached tokens
of a decode step, is the sum over the batch of prompt + generated tokens.
"""

from __future__ import annotations

import math

import pytest

from services.config.calibration import Calibration
from services.datacenter.engine import (
    DECODE,
    PREFILL,
    Engine,
    EngineConfig,
    EngineRequest,
    Finished,
    FirstToken,
)
from services.datacenter.perfmodel import PerfModel
from services.datacenter.vdriver import ReplayItem, replay
from services.model.errors import CapacityExceeded, InvalidInput, UsageError

from .conftest import check_engine_invariants, run_engine

REL = 1e-12


# ---------------------------------------------------------------------------- formulas
def t_tok(cal: Calibration, n: float) -> float:
    p = cal.prefill
    if n <= p.knee_tokens:
        return p.tok_slope_s * n
    return p.tok_slope_s * p.knee_tokens + p.tok_slope_above_s * (n - p.knee_tokens)


def t_pre(cal: Calibration, chunks: list[int]) -> float:
    p = cal.prefill
    n = sum(chunks)
    return t_tok(cal, n) + p.b0_s + p.b1_s * len(chunks) + p.b2_s * sum(c * c for c in chunks)


def t_dec(cal: Calibration, batch: int, kv: int) -> float:
    a, b = cal.decode.alpha_s, cal.decode.beta_s
    x = kv / batch
    return (a[0] + b[0] * x) + (a[1] + b[1] * x) * batch + (a[2] + b[2] * x) * batch**2


def e_pre(cal: Calibration, chunks: list[int]) -> float:
    e = cal.energy
    return e.prefill_e0_j + e.prefill_ep_j * sum(chunks) + e.prefill_ea_j * sum(
        c * c for c in chunks
    )


def e_dec(cal: Calibration, batch: int, kv: int) -> float:
    e = cal.energy
    return e.decode_e0_j + e.decode_ed_j * batch + e.decode_ek_j * kv


def freq_factors(cal: Calibration, mhz: float, phase: str) -> tuple[float, float]:
    """calibration.py docstring: time x (c*fmax/f + 1-c); power x (s + (1-s)(f/fmax)^g)."""
    fm = cal.frequency
    fmax = max(fm.levels_mhz)
    ph = fm.prefill if phase == "prefill" else fm.decode
    time_f = ph.compute_fraction * fmax / mhz + (1 - ph.compute_fraction)
    s = fm.static_power_fraction
    power_f = s + (1 - s) * (mhz / fmax) ** ph.power_exponent
    return time_f, time_f * power_f


def blocks(tokens: int, block_tokens: int) -> int:
    return math.ceil(tokens / block_tokens)


def cal_for(request: pytest.FixtureRequest, name: str) -> Calibration:
    return request.getfixturevalue(name)


# ---------------------------------------------------------------------------- one request alone
@pytest.mark.parametrize(
    ("cal_name", "isl", "osl"),
    [("llama_cal", 1000, 5), ("llama_cal", 37, 1), ("llama_cal", 4000, 12), ("tiny_cal", 10, 6)],
)
def test_single_request_alone_timeline(request, cal_name, isl, osl) -> None:
    cal = cal_for(request, cal_name)
    eng = Engine(cal, "solo", start_s=0.0)
    t0 = 2.0
    eng.enqueue(EngineRequest("r", isl, osl, t0), t0)

    plan = eng.next_step(t0)
    assert plan is not None and plan.kind == PREFILL
    assert plan.start_s == t0 and plan.n_tokens == isl and plan.n_requests == 1
    assert plan.duration_s == pytest.approx(t_pre(cal, [isl]), rel=REL)
    assert plan.energy_j == pytest.approx(e_pre(cal, [isl]), rel=REL)
    events = eng.complete_step(plan.end_s)
    ttft = t_pre(cal, [isl])
    assert isinstance(events[0], FirstToken)
    assert events[0].time_s == pytest.approx(t0 + ttft, rel=REL)

    expected_end = t0 + ttft
    expected_energy = e_pre(cal, [isl])
    now = plan.end_s
    for k in range(1, osl):
        plan = eng.next_step(now)
        assert plan is not None and plan.kind == DECODE and plan.n_requests == 1
        assert plan.kv_tokens == isl + k
        assert plan.duration_s == pytest.approx(t_dec(cal, 1, isl + k), rel=REL)
        assert plan.energy_j == pytest.approx(e_dec(cal, 1, isl + k), rel=REL)
        expected_end += t_dec(cal, 1, isl + k)
        expected_energy += e_dec(cal, 1, isl + k)
        now = plan.end_s
        events = eng.complete_step(now)
    fin = [e for e in events if isinstance(e, Finished)]
    assert len(fin) == 1 and fin[0].finished is not None
    f = fin[0].finished
    assert f.ttft_s == pytest.approx(ttft, rel=REL)
    assert f.completed_s == pytest.approx(expected_end, rel=REL)
    assert f.queue_s == 0.0 and f.output_tokens == osl and f.prefilled_tokens == isl
    if osl > 1:
        assert f.tpot_s == pytest.approx((expected_end - t0 - ttft) / (osl - 1), rel=1e-9)
    assert f.energy_j == pytest.approx(expected_energy, rel=REL)
    assert eng.energy.active_j == pytest.approx(expected_energy, rel=REL)
    assert eng.next_step(now) is None

    # idle power: before the arrival and after the completion, not while busy
    idle_w = cal.energy.idle_w_per_gpu * cal.tp
    assert eng.idle_energy_j(now + 3.0) == pytest.approx(idle_w * (t0 + 3.0), rel=1e-9)


def test_idle_engine_draws_idle_power_only(llama_cal) -> None:
    eng = Engine(llama_cal, "idle", start_s=10.0)
    assert eng.next_step(10.0) is None
    assert eng.idle_energy_j(70.0) == pytest.approx(60.0 * llama_cal.energy.idle_w_per_gpu)
    assert eng.energy.active_j == 0.0


# ---------------------------------------------------------------------------- chunked prefill
@pytest.mark.parametrize("isl", [1, 15, 16, 17, 32, 33, 50, 63])
def test_chunked_prefill_step_count_and_ttft(tiny_cal, isl) -> None:
    budget = tiny_cal.engine.max_num_batched_tokens
    assert budget == 16
    eng = Engine(tiny_cal, "chunk")
    eng.enqueue(EngineRequest("r", isl, 1, 0.0), 0.0)
    chunks, now = [], 0.0
    while (plan := eng.next_step(now)) is not None:
        assert plan.kind == PREFILL
        chunks.append(plan.n_tokens)
        assert plan.duration_s == pytest.approx(t_pre(tiny_cal, [plan.n_tokens]), rel=REL)
        now = plan.end_s
        events = eng.complete_step(now)
    assert len(chunks) == math.ceil(isl / budget)
    expected = [budget] * (isl // budget) + ([isl % budget] if isl % budget else [])
    assert chunks == expected
    f = events[-1].finished
    assert f is not None and f.output_tokens == 1
    assert f.ttft_s == pytest.approx(sum(t_pre(tiny_cal, [c]) for c in expected), rel=REL)


def test_prefill_budget_is_shared_fifo_and_stalls_decode(tiny_cal) -> None:
    """Two 10-token prompts: step 1 = A10 + B6 (A's first token), step 2 = B4, then a
    decode step for both; energy shared by tokens in prefill, equally in decode."""
    eng = Engine(tiny_cal, "pair", EngineConfig(watermark_ratio=0.0))
    eng.enqueue(EngineRequest("A", 10, 2, 0.0), 0.0)
    eng.enqueue(EngineRequest("B", 10, 2, 0.0), 0.0)
    p1 = eng.next_step(0.0)
    assert p1.kind == PREFILL and p1.n_tokens == 16 and p1.n_requests == 2
    assert p1.duration_s == pytest.approx(t_pre(tiny_cal, [10, 6]), rel=REL)
    ev1 = eng.complete_step(p1.end_s)
    assert [(type(e), e.request_id) for e in ev1] == [(FirstToken, "A")]
    p2 = eng.next_step(p1.end_s)
    assert p2.kind == PREFILL and p2.n_tokens == 4 and p2.n_requests == 1  # A does not decode
    assert p2.duration_s == pytest.approx(t_pre(tiny_cal, [4]), rel=REL)
    ev2 = eng.complete_step(p2.end_s)
    assert [(type(e), e.request_id) for e in ev2] == [(FirstToken, "B")]
    p3 = eng.next_step(p2.end_s)
    assert p3.kind == DECODE and p3.n_requests == 2 and p3.kv_tokens == 22
    assert p3.duration_s == pytest.approx(t_dec(tiny_cal, 2, 22), rel=REL)
    ev3 = eng.complete_step(p3.end_s)
    done = {e.request_id: e.finished for e in ev3 if isinstance(e, Finished)}
    t1 = t_pre(tiny_cal, [10, 6])
    t2 = t1 + t_pre(tiny_cal, [4])
    t3 = t2 + t_dec(tiny_cal, 2, 22)
    assert done["A"].first_token_s == pytest.approx(t1, rel=REL)
    assert done["B"].first_token_s == pytest.approx(t2, rel=REL)
    assert done["A"].completed_s == done["B"].completed_s == pytest.approx(t3, rel=REL)
    ep1, ep2, ed = e_pre(tiny_cal, [10, 6]), e_pre(tiny_cal, [4]), e_dec(tiny_cal, 2, 22)
    assert done["A"].energy_j == pytest.approx(ep1 * 10 / 16 + ed / 2, rel=REL)
    assert done["B"].energy_j == pytest.approx(ep1 * 6 / 16 + ep2 + ed / 2, rel=REL)


def test_arrival_during_decode_is_admitted_at_next_iteration(llama_cal) -> None:
    eng = Engine(llama_cal, "late")
    eng.enqueue(EngineRequest("A", 100, 4, 0.0), 0.0)
    p = eng.next_step(0.0)
    eng.complete_step(p.end_s)
    p = eng.next_step(p.end_s)
    assert p.kind == DECODE
    t_b = p.start_s + p.duration_s / 2
    eng.enqueue(EngineRequest("B", 300, 2, t_b), t_b)
    eng.complete_step(p.end_s)
    p = eng.next_step(p.end_s)                 # new iteration: B admitted, prefilled alone
    assert p.kind == PREFILL and p.n_tokens == 300 and p.n_requests == 1
    assert p.duration_s == pytest.approx(t_pre(llama_cal, [300]), rel=REL)
    eng.complete_step(p.end_s)
    p = eng.next_step(p.end_s)
    # A has prompt + 2 generated tokens, B prompt + its first token
    assert p.kind == DECODE and p.n_requests == 2 and p.kv_tokens == (100 + 2) + (300 + 1)


# ---------------------------------------------------------------------------- admission
def test_batch_never_exceeds_max_num_seqs(tiny_cal) -> None:
    eng = Engine(tiny_cal, "cap")
    for k in range(7):
        eng.enqueue(EngineRequest(str(k), 2, 3, 0.0), 0.0)
    eng.next_step(0.0)
    assert [r.id for r in eng.running] == ["0", "1", "2", "3"]
    assert [r.id for r in eng.waiting] == ["4", "5", "6"]


def test_head_of_line_blocking_and_fifo(tiny_cal) -> None:
    # 32 blocks of 4 tokens: A and B take 15 blocks each, C needs 3 (> 2 free) and blocks D
    # (1 block) behind it although D would fit.
    eng = Engine(tiny_cal, "hol", EngineConfig(watermark_ratio=0.0))
    for rid, isl in [("A", 60), ("B", 60), ("C", 12), ("D", 4)]:
        eng.enqueue(EngineRequest(rid, isl, 2, 0.0), 0.0)
    eng.next_step(0.0)
    assert [r.id for r in eng.running] == ["A", "B"]
    assert [r.id for r in eng.waiting] == ["C", "D"]
    assert eng.free_blocks == eng.total_blocks - 2 * blocks(60, 4) == 2


@pytest.mark.parametrize(("watermark", "admitted"), [(0.0, True), (0.1, False)])
def test_watermark_blocks_kept_back_at_admission(tiny_cal, watermark, admitted) -> None:
    # 32 blocks; A takes 15 -> 17 free; B needs 15. Watermark 0.1 keeps int(3.2) = 3 back.
    eng = Engine(tiny_cal, "wm", EngineConfig(watermark_ratio=watermark))
    eng.enqueue(EngineRequest("A", 60, 2, 0.0), 0.0)
    eng.enqueue(EngineRequest("B", 60, 2, 0.0), 0.0)
    eng.next_step(0.0)
    assert ("B" in [r.id for r in eng.running]) is admitted


def test_queue_full_raises_capacity_exceeded(tiny_cal) -> None:
    eng = Engine(tiny_cal, "q", EngineConfig(max_queue=2))
    eng.enqueue(EngineRequest("a", 5, 2, 0.0), 0.0)
    eng.enqueue(EngineRequest("b", 7, 2, 0.0), 0.0)
    with pytest.raises(CapacityExceeded) as exc:
        eng.enqueue(EngineRequest("c", 9, 2, 0.0), 0.0)
    assert exc.value.status_code == "RESOURCE_EXHAUSTED"
    assert [r.id for r in eng.waiting] == ["a", "b"]
    assert eng.counters(0.0).queue_tokens == 12
    eng.next_step(0.0)                                # both admitted: room in the queue again
    eng.enqueue(EngineRequest("c", 9, 2, 0.0), 0.0)
    assert [r.id for r in eng.waiting] == ["c"]


@pytest.mark.parametrize(
    ("isl", "osl", "fields"),
    [
        (0, 5, {"isl_tokens"}),
        (-4, 5, {"isl_tokens"}),
        (10, 0, {"osl_tokens"}),
        (10, -1, {"osl_tokens"}),
        (60, 5, {"isl_tokens", "osl_tokens"}),   # 65 > max_model_len = 64
        (1, 64, {"isl_tokens", "osl_tokens"}),
    ],
)
def test_invalid_requests_name_the_field(tiny_cal, isl, osl, fields) -> None:
    eng = Engine(tiny_cal, "v")
    with pytest.raises(InvalidInput) as exc:
        eng.enqueue(EngineRequest("bad", isl, osl, 1.0), 1.0)
    assert exc.value.field in fields
    assert exc.value.status_code == "INVALID_ARGUMENT"
    assert not eng.waiting and not eng.has_work
    # a refused request does not end the idle period
    assert eng.idle_energy_j(2.0) == pytest.approx(2.0 * tiny_cal.energy.idle_w_per_gpu)


def test_context_limit_is_inclusive(tiny_cal) -> None:
    eng = Engine(tiny_cal, "v")
    eng.enqueue(EngineRequest("edge", 60, 4, 0.0), 0.0)     # 64 == max_model_len
    rec = run_engine(Engine(tiny_cal, "v2"), [(0.0, 1, 63), (0.0, 63, 1)])
    assert eng.waiting[0].id == "edge"
    assert {k: f.output_tokens for k, f in rec.finished.items()} == {"0": 63, "1": 1}


# ---------------------------------------------------------------------------- preemption
def test_preemption_when_kv_runs_out(tiny_cal) -> None:
    """Three 20-token prompts growing to 60 tokens each need 180 KV tokens > 128."""
    eng = Engine(tiny_cal, "pre", EngineConfig(watermark_ratio=0.0))
    isl, osl = 20, 40
    for rid in "ABC":
        eng.enqueue(EngineRequest(rid, isl, osl, 0.0), 0.0)
    now = 0.0
    first_tokens: dict[str, list[float]] = {}
    finished = {}
    preempted: list[tuple[str, int]] = []
    reprefill_tokens: dict[str, set[int]] = {}
    while True:
        free_before, running_before = eng.free_blocks, [r.id for r in eng.running]
        n_pre = eng.preemptions
        plan = eng.next_step(now)
        if plan is None:
            break
        check_engine_invariants(eng)
        if eng.preemptions > n_pre:
            # a preemption needs more blocks than are free: at most one new block per
            # request per decode step, so fewer free blocks than running requests
            assert plan.kind == DECODE
            assert free_before < len(running_before)
            victims = [rid for rid in running_before if rid not in {r.id for r in eng.running}]
            assert victims == running_before[len(running_before) - len(victims):]  # newest
            for rid in victims:
                req = next(r for r in eng.waiting if r.id == rid)
                assert req.blocks == 0 and req.prefill_done == 0
                assert req.prefill_target == isl + req.generated   # prompt + generated
                assert 1 <= req.generated < osl
                preempted.append((rid, req.generated))
            assert [r.id for r in eng.waiting][: len(victims)] == victims  # front of queue
        if plan.kind == PREFILL and preempted:
            for r in eng.running:
                if r.preemptions and r.prefill_done < r.prefill_target:
                    reprefill_tokens.setdefault(r.id, set()).add(r.prefill_target)
        now = plan.end_s
        for ev in eng.complete_step(now):
            if isinstance(ev, FirstToken):
                first_tokens.setdefault(ev.request_id, []).append(now)
            if isinstance(ev, Finished):
                finished[ev.request_id] = ev.finished
        check_engine_invariants(eng)
    assert preempted, "KV never ran out"
    assert set(finished) == {"A", "B", "C"}
    assert all(len(v) == 1 for v in first_tokens.values())   # recompute: no second first token
    assert preempted[0][0] == "C"
    for rid, f in finished.items():
        assert f.output_tokens == osl
        assert f.first_token_s == first_tokens[rid][0]
        gens = [g for (r, g) in preempted if r == rid]
        assert f.preemptions == len(gens)
        assert f.prefilled_tokens == isl + sum(isl + g for g in gens)
        if gens:  # each recompute prefilled the prompt plus the tokens generated so far
            assert reprefill_tokens[rid] == {isl + g for g in gens}
    assert eng.free_blocks == eng.total_blocks


# ---------------------------------------------------------------------------- frequency
@pytest.mark.parametrize("mhz", [500.0, 1000.0, 1500.0, 2000.0, 1210.0, 90.0, 5000.0])
def test_set_frequency_scales_step_time_and_energy(tiny_cal, mhz) -> None:
    levels = tiny_cal.frequency.levels_mhz
    nearest = min(levels, key=lambda lv: abs(lv - mhz))
    base = PerfModel(tiny_cal)
    perf = PerfModel(tiny_cal)
    assert perf.set_frequency(mhz) == nearest
    assert perf.frequency_mhz == nearest
    tp, ep = freq_factors(tiny_cal, nearest, "prefill")
    td, ed = freq_factors(tiny_cal, nearest, "decode")
    assert perf.prefill_time(40, 2, 800) == pytest.approx(base.prefill_time(40, 2, 800) * tp)
    assert perf.prefill_energy(40, 800) == pytest.approx(base.prefill_energy(40, 800) * ep)
    assert perf.decode_time(3, 90) == pytest.approx(base.decode_time(3, 90) * td)
    assert perf.decode_energy(3, 90) == pytest.approx(base.decode_energy(3, 90) * ed)
    # and against the formulas directly
    assert perf.prefill_time(16, 1, 256) == pytest.approx(t_pre(tiny_cal, [16]) * tp, rel=REL)
    assert perf.decode_time(2, 50) == pytest.approx(t_dec(tiny_cal, 2, 50) * td, rel=REL)


def test_frequency_applies_from_the_next_step(llama_cal) -> None:
    perf = PerfModel(llama_cal)
    eng = Engine(llama_cal, "f", perf=perf)
    eng.enqueue(EngineRequest("r", 500, 3, 0.0), 0.0)
    plan = eng.next_step(0.0)
    low = llama_cal.frequency.levels_mhz[1]
    perf.set_frequency(low)                    # mid-step: the planned step is unchanged
    assert plan.duration_s == pytest.approx(t_pre(llama_cal, [500]), rel=REL)
    eng.complete_step(plan.end_s)
    plan = eng.next_step(plan.end_s)
    td, ed = freq_factors(llama_cal, low, "decode")
    assert plan.duration_s == pytest.approx(t_dec(llama_cal, 1, 501) * td, rel=REL)
    assert plan.energy_j == pytest.approx(e_dec(llama_cal, 1, 501) * ed, rel=REL)


def test_replay_at_lower_frequency_is_slower(llama_cal) -> None:
    items = [ReplayItem(0.0, 800, 20, 0)]
    fast = replay(llama_cal, items, 1)
    low = llama_cal.frequency.levels_mhz[0]
    slow = replay(llama_cal, items, 1, frequency_mhz=low)
    tp, _ = freq_factors(llama_cal, low, "prefill")
    assert slow.finished[0].ttft_s == pytest.approx(fast.finished[0].ttft_s * tp, rel=1e-9)
    assert slow.end_s > fast.end_s


@pytest.mark.parametrize("mhz", [0.0, -100.0, float("nan")])
def test_bad_frequency_is_invalid_input(tiny_cal, mhz) -> None:
    with pytest.raises(InvalidInput) as exc:
        PerfModel(tiny_cal).set_frequency(mhz)
    assert exc.value.field == "gpu_frequency_mhz"


# ---------------------------------------------------------------------------- counters
def test_prefill_duty_is_fraction_of_window(llama_cal) -> None:
    eng = Engine(llama_cal, "duty", EngineConfig(duty_window_s=1.0))
    eng.enqueue(EngineRequest("r", 2000, 2, 0.0), 0.0)
    p = eng.next_step(0.0)
    d = t_pre(llama_cal, [2000])
    assert d < 1.0
    assert eng.prefill_duty(d / 2) == pytest.approx(0.5 * d)     # in-flight prefill counts
    eng.complete_step(p.end_s)
    assert eng.prefill_duty(d) == pytest.approx(d)
    assert eng.prefill_duty(1.0 + d / 4) == pytest.approx(0.75 * d)
    assert eng.prefill_duty(5.0) == 0.0


def test_queue_tokens_count_waiting_and_unfinished_prefill(tiny_cal) -> None:
    eng = Engine(tiny_cal, "qt")
    eng.enqueue(EngineRequest("a", 50, 2, 0.0), 0.0)
    eng.enqueue(EngineRequest("b", 30, 2, 0.0), 0.0)
    assert eng.counters(0.0).queue_tokens == 80
    p = eng.next_step(0.0)
    eng.complete_step(p.end_s)
    c = eng.counters(p.end_s)
    assert c.queue_tokens == 80 - 16
    assert c.running == 2 and c.waiting == 0
    assert c.kv_tokens == 80                    # prompts are counted from admission
    assert c.kv_occupancy_ratio == pytest.approx(
        (blocks(50, 4) + blocks(30, 4)) / (128 // 4)
    )


# ---------------------------------------------------------------------------- misuse
def test_runtime_misuse_raises_usage_error(tiny_cal) -> None:
    eng = Engine(tiny_cal, "u", start_s=5.0)
    with pytest.raises(UsageError):
        eng.complete_step(5.0)                       # nothing planned
    eng.enqueue(EngineRequest("r", 10, 3, 5.0), 5.0)
    plan = eng.next_step(5.0)
    with pytest.raises(UsageError):
        eng.next_step(plan.end_s)                    # step in flight
    with pytest.raises(UsageError):
        eng.complete_step(4.0)                       # ends before it started
    eng.complete_step(plan.end_s)
    with pytest.raises(UsageError):
        eng.next_step(plan.end_s - 1.0)              # time went backwards


def test_fail_all_returns_every_request_and_frees_kv(tiny_cal) -> None:
    eng = Engine(tiny_cal, "crash")
    for k in range(6):
        eng.enqueue(EngineRequest(str(k), 20, 10, 0.0), 0.0)
    p = eng.next_step(0.0)
    dropped = eng.fail_all(p.start_s + p.duration_s / 2)
    assert sorted(r.id for r in dropped) == [str(k) for k in range(6)]
    assert eng.free_blocks == eng.total_blocks and not eng.has_work and not eng.busy
    assert eng.counters(1.0).kv_tokens == 0 and eng.counters(1.0).queue_tokens == 0


# ------------------------------------------------------------ regressions of fixed bugs
def test_waiting_request_not_stranded_after_prefill_retires_the_batch(llama_cal) -> None:
    eng = Engine(llama_cal, "strand")
    eng.enqueue(EngineRequest("a", 1000, 1, 0.0), 0.0)
    p = eng.next_step(0.0)
    eng.enqueue(EngineRequest("b", 100, 5, 0.001), 0.001)      # arrives during a's prefill
    events = eng.complete_step(p.end_s)
    assert [type(e) for e in events] == [FirstToken, Finished]
    # "None with requests still waiting means they all arrived after `now`" - b arrived
    # at 0.001 < p.end_s, so the engine must plan b's prefill now.
    nxt = eng.next_step(p.end_s)
    assert nxt is not None and nxt.kind == PREFILL and nxt.n_tokens == 100


def test_replay_completes_request_arriving_during_osl1_prefill(llama_cal) -> None:
    res = replay(llama_cal, [ReplayItem(0.0, 1000, 1, 0), ReplayItem(0.001, 100, 5, 0)], 1)
    assert [f.output_tokens for f in res.finished] == [1, 5]


def test_zero_duty_window_does_not_crash(tiny_cal) -> None:
    eng = Engine(tiny_cal, "duty0", EngineConfig(duty_window_s=0.0))
    eng.enqueue(EngineRequest("r", 10, 2, 0.0), 0.0)
    p = eng.next_step(0.0)
    eng.complete_step(p.end_s)
    assert eng.prefill_duty(p.end_s) == 0.0
