"""Shared scheduler estimator: sanity, monotonicity and agreement with the scalar model."""

from __future__ import annotations

import numpy as np
import pytest

from services.config.calibration import load_calibration
from services.datacenter.perfmodel import PerfModel
from services.model.state import DcView, RequestView, SnapshotView
from services.scheduler.estimator import DcArrays, Estimator, EstimatorConfig

SETUP = "a100-40gb/llama-3.1-8b-tp1"


def dc(name: str = "d", region: str = "eu", **kw: object) -> DcView:
    base: dict[str, object] = dict(
        dc=name, region=region, setup=SETUP, engines=4, max_batch=40, active_batch=0.0,
        queue_tokens=0.0, kv_tokens=0.0, kv_occupancy_ratio=0.0, prefill_duty_ratio=0.0,
        waiting_requests=0.0, ci_g_per_kwh=100.0, pue=1.1,
    )  # fmt: skip
    base.update(kw)
    return DcView(**base)  # type: ignore[arg-type]


def req(isl: int = 200, osl: int = 100, origin: str = "eu", **kw: object) -> RequestView:
    base: dict[str, object] = dict(
        id="r", model="", isl_tokens=isl, osl_tokens=osl, origin_region=origin,
        ttft_slo_s=3.0, tpot_slo_s=0.1, arrival_s=0.0,
    )  # fmt: skip
    base.update(kw)
    return RequestView(**base)  # type: ignore[arg-type]


def snap(*dcs: DcView, rtt: dict[tuple[str, str], float] | None = None) -> SnapshotView:
    return SnapshotView(seq=1, time_s=0.0, dcs=list(dcs), rtt_s=rtt or {})


@pytest.fixture(scope="module")
def pm() -> PerfModel:
    return PerfModel(load_calibration(SETUP))


def test_idle_local_dc_matches_scalar_perf_model(pm: PerfModel) -> None:
    e = Estimator().estimate([req(isl=300, osl=50)], snap(dc()))
    assert e.ttft_s[0, 0] == pytest.approx(pm.prefill_time(300, 1, 300**2))
    assert e.tpot_s[0, 0] == pytest.approx(pm.decode_time(1, 300))


def test_rtt_is_added_to_ttft_only() -> None:
    s = snap(dc("local", "eu"), dc("remote", "us"), rtt={("eu", "us"): 0.2})
    e = Estimator().estimate([req(origin="eu")], s)
    assert e.ttft_s[0, 1] - e.ttft_s[0, 0] == pytest.approx(0.2)
    assert e.tpot_s[0, 1] == pytest.approx(e.tpot_s[0, 0])
    # From the other side the roles swap.
    e2 = Estimator().estimate([req(origin="us")], s)
    assert e2.ttft_s[0, 0] - e2.ttft_s[0, 1] == pytest.approx(0.2)


def test_monotone_in_queue_tokens() -> None:
    queues = [0.0, 500.0, 2000.0, 10000.0, 40000.0]
    s = snap(*[dc(f"d{i}", queue_tokens=q, waiting_requests=2.0) for i, q in enumerate(queues)])
    e = Estimator().estimate([req()], s)
    assert np.all(np.diff(e.ttft_s[0]) > 0)
    assert np.all(np.diff(e.tpot_s[0]) >= 0)
    assert e.tpot_s[0, -1] > e.tpot_s[0, 0]


def test_monotone_in_batch_and_kv() -> None:
    batches = [0.0, 5.0, 10.0, 20.0, 35.0, 39.0]
    s = snap(*[dc(f"d{i}", active_batch=b, kv_tokens=b * 800) for i, b in enumerate(batches)])
    e = Estimator().estimate([req()], s)
    assert np.all(np.diff(e.tpot_s[0]) > 0)
    assert np.all(np.diff(e.ttft_s[0]) >= 0)


def test_full_batch_waits_for_a_slot() -> None:
    s = snap(
        dc("free", active_batch=30.0, kv_tokens=30 * 500),
        dc("full", active_batch=40.0, kv_tokens=40 * 500, waiting_requests=5.0),
    )
    e = Estimator().estimate([req()], s)
    assert e.ttft_s[0, 1] > e.ttft_s[0, 0] + 0.05


def test_duty_stretches_tpot() -> None:
    s = snap(dc("a", active_batch=10.0), dc("b", active_batch=10.0, prefill_duty_ratio=0.5))
    e = Estimator().estimate([req()], s)
    assert e.tpot_s[0, 1] == pytest.approx(2.0 * e.tpot_s[0, 0])


def test_carbon_scales_with_ci_and_pue_and_osl() -> None:
    s = snap(dc("a", ci_g_per_kwh=100.0), dc("b", ci_g_per_kwh=200.0),
             dc("c", ci_g_per_kwh=100.0, pue=2.2))  # fmt: skip
    e = Estimator().estimate([req(osl=100), req(osl=1000)], s)
    assert e.carbon_g[0, 1] == pytest.approx(2 * e.carbon_g[0, 0])
    assert e.carbon_g[0, 2] == pytest.approx(2 * e.carbon_g[0, 0])
    assert e.carbon_g[1, 0] > 5 * e.carbon_g[0, 0]
    # grams = joules x PUE x CI / 3.6e6
    assert e.carbon_g[0, 0] == pytest.approx(e.energy_j[0, 0] * 1.1 * 100.0 / 3.6e6)


def test_busy_dc_has_lower_marginal_energy_than_idle(pm: PerfModel) -> None:
    s = snap(dc("idle"), dc("busy", active_batch=20.0, kv_tokens=20 * 500))
    e = Estimator().estimate([req(isl=100, osl=100)], s)
    assert e.energy_j[0, 1] < e.energy_j[0, 0]
    # At a busy DC the fixed decode energy is already paid: only e_d + e_k*ctx per step.
    assert e.energy_fixed_j[0, 1] == pytest.approx(pm.cal.energy.prefill_e0_j)


def test_feasibility_follows_the_slos() -> None:
    s = snap(dc("near", "eu"), dc("far", "us"), rtt={("eu", "us"): 0.5})
    e = Estimator().estimate([req(ttft_slo_s=0.3), req(ttft_slo_s=3.0)], s)
    assert e.feasible.tolist() == [[True, False], [True, True]]
    tight = Estimator().estimate([req(tpot_slo_s=0.001)], s)
    assert not tight.feasible.any()


def test_down_dc_and_other_model_are_never_feasible() -> None:
    s = snap(dc("up", model="llama"), dc("down", up=False), dc("other", model="qwen"))
    e = Estimator().estimate([req(model="llama")], s)
    assert e.feasible.tolist() == [[True, False, False]]
    assert e.capacity_requests[1] == 0.0


def test_capacity_is_free_slots_times_engines() -> None:
    s = snap(dc("a", engines=4, max_batch=40, active_batch=30.0, waiting_requests=2.0),
             dc("b", engines=2, max_batch=40, active_batch=41.0))  # fmt: skip
    e = Estimator().estimate([req()], s)
    assert e.capacity_requests.tolist() == [(40 - 30 - 2) * 4, 0.0]


def test_window_estimate_equals_single_request_estimates() -> None:
    rng = np.random.default_rng(3)
    dcs = [
        dc(f"d{i}", "eu" if i < 2 else "us", active_batch=float(rng.uniform(0, 40)),
           queue_tokens=float(rng.uniform(0, 5000)), waiting_requests=float(rng.uniform(0, 3)),
           kv_tokens=float(rng.uniform(0, 30000)), prefill_duty_ratio=0.2)
        for i in range(4)
    ]  # fmt: skip
    s = snap(*dcs, rtt={("eu", "us"): 0.1})
    isl = rng.integers(1, 9000, 12).tolist()
    osl = rng.integers(1, 900, 12).tolist()
    pairs = enumerate(zip(isl, osl, strict=True))
    reqs = [req(i, o, "eu" if k % 2 else "us") for k, (i, o) in pairs]
    est = Estimator(EstimatorConfig(mean_osl_tokens=150.0))
    window = est.estimate(reqs, s)
    for k, r in enumerate(reqs):
        one = est.estimate([r], s)
        np.testing.assert_allclose(window.ttft_s[k], one.ttft_s[0])
        np.testing.assert_allclose(window.tpot_s[k], one.tpot_s[0])
        np.testing.assert_allclose(window.carbon_g[k], one.carbon_g[0])


def test_long_prompt_is_chunked(pm: PerfModel) -> None:
    chunk = pm.cal.engine.max_num_batched_tokens
    e = Estimator().estimate([req(isl=chunk), req(isl=2 * chunk)], snap(dc()))
    one = pm.prefill_time(chunk, 1, chunk**2)
    # Two chunks cost about twice one chunk (idle engine: no decode steps in between).
    # Attention term: (2C)^2 = 4 C^2 in total, of which 2 C^2 are already in 2 x one.
    assert e.ttft_s[1, 0] == pytest.approx(2 * one + pm.cal.prefill.b2_s * 2 * chunk**2)


def test_projection_adds_load_per_engine() -> None:
    s = snap(dc("a", engines=4, active_batch=38.0))
    base = DcArrays.from_snapshot(s)
    p = base.project(np.array([12.0]), np.array([4000.0]))
    assert p.batch[0] == 40.0 and p.waiting[0] == pytest.approx(1.0)
    assert p.queue_tokens[0] == pytest.approx(1000.0)
    e0 = Estimator().estimate([req()], s)
    e1 = Estimator().estimate([req()], s, dcs=p)
    assert e1.ttft_s[0, 0] > e0.ttft_s[0, 0] and e1.tpot_s[0, 0] > e0.tpot_s[0, 0]
