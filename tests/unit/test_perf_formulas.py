"""One set of step formulas (`services.datacenter.perfmodel`) behind every consumer.

The engine's scalar `PerfModel`, the ``*_arr`` helpers, the scheduler's estimator and the
calibration fit must all give the numbers of DESIGN §4 for the tiny calibration of
``conftest.py``; the scheduler's view and `DcArrays.project` must follow one projection
rule. Every expected value below is worked out by hand from the formulas:

    tiny prefill: b0 0.01, b1 0.001, b2 1e-6, slopes 1e-4 / 3e-4 s per token, knee 8
    tiny decode:  alpha (0.005, 5e-4, 1e-5), beta (0, 1e-6, 1e-7)
    tiny energy:  prefill e0 2, e_p 0.05, e_a 1e-4; decode e0 1, e_d 0.2, e_k 1e-3;
                  idle 50 W per GPU, TP 1; max_num_batched_tokens 16
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from services.calibrate.fit import DecodeFit, PrefillFit
from services.config.calibration import Calibration
from services.config.topology import DcSpec, SchedulerSpec
from services.datacenter.perfmodel import (
    PerfModel,
    decode_energy_arr,
    decode_time_arr,
    prefill_energy_arr,
    prefill_time_arr,
)
from services.model.state import DcView, RequestView, SnapshotView
from services.scheduler.core import SchedulerCore
from services.scheduler.estimator import DcArrays, Estimator, project_dispatches
from services.scheduler.policies.base import Decision, Policy

# (N, B, sum n^2) -> t_pre
# below the knee: 1e-4*6 + 0.01 + 0.001*2 + 1e-6*20 = 0.01262
# above the knee: 1e-4*8 + 3e-4*(12-8) + 0.01 + 0.001*1 + 1e-6*144 = 0.013144
PREFILL = [((6.0, 2.0, 20.0), 0.01262), ((12.0, 1.0, 144.0), 0.013144)]
# (B, K) -> t_dec; K/B = 20: 0.005 + (5e-4 + 2e-5)*2 + (1e-5 + 2e-6)*4 = 0.006088
DECODE = [((2.0, 40.0), 0.006088), ((0.0, 0.0), 0.0)]
# (N, sum n^2) -> E_pre = 2 + 0.05*12 + 1e-4*144 = 2.6144
PREFILL_J = [((12.0, 144.0), 2.6144)]
# (B, K) -> E_dec = 1 + 0.2*2 + 1e-3*40 = 1.44; empty batch 0
DECODE_J = [((2.0, 40.0), 1.44), ((0.0, 0.0), 0.0)]


def test_engine_scalar_model(tiny_cal: Calibration) -> None:
    pm = PerfModel(tiny_cal)
    for (n, b, s), t in PREFILL:
        assert pm.prefill_time(n, b, s) == pytest.approx(t, rel=1e-12)
    for (b, k), t in DECODE:
        assert pm.decode_time(b, k) == pytest.approx(t, rel=1e-12)
    for (n, s), j in PREFILL_J:
        assert pm.prefill_energy(n, s) == pytest.approx(j, rel=1e-12)
    for (b, k), j in DECODE_J:
        assert pm.decode_energy(b, k) == pytest.approx(j, rel=1e-12)
    assert pm.idle_w == 50.0


def test_array_helpers(tiny_cal: Calibration) -> None:
    cols = [np.array(c) for c in zip(*(x for x, _ in PREFILL), strict=True)]
    np.testing.assert_allclose(prefill_time_arr(tiny_cal, *cols), [t for _, t in PREFILL])
    cols = [np.array(c) for c in zip(*(x for x, _ in DECODE), strict=True)]
    np.testing.assert_allclose(decode_time_arr(tiny_cal, *cols), [t for _, t in DECODE])
    np.testing.assert_allclose(decode_energy_arr(tiny_cal, *cols), [j for _, j in DECODE_J])
    np.testing.assert_allclose(prefill_energy_arr(tiny_cal, np.array([12.0]),
                                                  np.array([144.0])), [2.6144])


def test_fit_records_predict_with_the_same_formulas(tiny_cal: Calibration) -> None:
    pf = PrefillFit(**tiny_cal.prefill.__dict__, mape_pct=0.0, n_rows=0)
    df = DecodeFit(tiny_cal.decode.alpha_s, tiny_cal.decode.beta_s, 0.0, 0, "test")
    n, b, s = (np.array(c) for c in zip(*(x for x, _ in PREFILL), strict=True))
    np.testing.assert_allclose(pf.predict(n, b, s), [t for _, t in PREFILL])
    np.testing.assert_allclose(df.predict(np.array([2.0]), np.array([40.0])), [0.006088])


def _dc(**kw: object) -> DcView:
    base: dict[str, object] = dict(
        dc="d", region="eu", setup="tiny", engines=1, max_batch=4, active_batch=0.0,
        queue_tokens=0.0, kv_tokens=0.0, kv_occupancy_ratio=0.0, prefill_duty_ratio=0.0,
        waiting_requests=0.0, ci_g_per_kwh=100.0, pue=1.0,
    )  # fmt: skip
    base.update(kw)
    return DcView(**base)  # type: ignore[arg-type]


def _req(isl: int, osl: int) -> RequestView:
    return RequestView(id="r", model="", isl_tokens=isl, osl_tokens=osl, origin_region="eu",
                       ttft_slo_s=3.0, tpot_slo_s=0.1, arrival_s=0.0)


def test_estimator_on_an_idle_engine(tiny_cal: Calibration) -> None:
    est = Estimator(loader=lambda setup: tiny_cal)
    snap = SnapshotView(seq=1, time_s=0.0, dcs=[_dc()])
    e = est.estimate([_req(12, 2), _req(20, 2)], snap)
    # one step: t_pre(12, 1, 144) (no wait, no RTT within the region)
    assert e.ttft_s[0, 0] == pytest.approx(0.013144, rel=1e-12)
    # 20 tokens in steps of 16: t_pre(16, 1, 0) + t_pre(4, 1, 400)
    #   = (8e-4 + 3e-4*8 + 0.011) + (4e-4 + 0.011 + 4e-4) = 0.0142 + 0.0118
    assert e.ttft_s[1, 0] == pytest.approx(0.026, rel=1e-12)
    # t_dec(1, 12): 0.005 + (5e-4 + 1.2e-5) + (1e-5 + 1.2e-6) = 0.0055232
    assert e.tpot_s[0, 0] == pytest.approx(0.0055232, rel=1e-12)
    # E_pre 2.6144 + OSL x [e_d + e_k (ISL + OSL/2) = 0.213] + OSL x wake-up share
    # (e0_dec - idle_w * alpha0 = 1 - 50 * 0.005 = 0.75) = 4.5404
    assert e.energy_j[0, 0] == pytest.approx(4.5404, rel=1e-12)


# batch 38 + 12/4 = 41 per engine: 40 in the batch (the limit), 1 more waits;
# 12 x 300 = 3600 prompt tokens / 4 engines = 900 more queued and cached per engine
PROJ_IN = dict(batch=38.0, waiting=1.0, queue_tokens=100.0, kv_tokens=1000.0,
               max_batch=40.0, engines=4.0, n_requests=12.0, isl_tokens=3600.0)
PROJ_OUT = (40.0, 2.0, 1000.0, 1900.0)
BUSY = dict(engines=4, max_batch=40, active_batch=38.0, waiting_requests=1.0,
            queue_tokens=100.0, kv_tokens=1000.0)


def test_projection_rule_on_floats_and_arrays() -> None:
    assert project_dispatches(**PROJ_IN) == pytest.approx(PROJ_OUT)
    cols = {k: np.array([v, v]) for k, v in PROJ_IN.items()}
    for got, want in zip(project_dispatches(**cols), PROJ_OUT, strict=True):
        np.testing.assert_allclose(got, [want, want])
    # no engine counts as one: 0 + 2 requests of 30 tokens
    assert project_dispatches(0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 2.0, 60.0) == (2.0, 0.0, 60.0, 60.0)


def test_dc_arrays_project_follows_the_rule() -> None:
    snap = SnapshotView(seq=1, time_s=0.0, dcs=[_dc(**BUSY)])
    p = DcArrays.from_snapshot(snap).project(np.array([12.0]), np.array([3600.0]))
    got = (p.batch[0], p.waiting[0], p.queue_tokens[0], p.kv_tokens[0])
    assert got == pytest.approx(PROJ_OUT)


class AllToD(Policy):
    """Every request to the first DC (per-request policy)."""

    name = "all-to-d"

    def decide(self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str,
               now_s: float) -> Decision:
        return self.build([d.dc for d in snapshot.dcs], np.zeros(len(requests), np.int64),
                          [""] * len(requests), "heuristic")


def test_scheduler_view_follows_the_rule() -> None:
    spec = DcSpec(name="d", region="eu", zone="", nodes=1, gpus_per_node=4, setup="tiny",
                  pue=1.0, ci={"constant": 100})
    core = SchedulerCore("eu", SchedulerSpec(policy="all-to-d", project_peers=False), [spec],
                         AllToD())
    core.on_snapshot(SnapshotView(seq=1, time_s=0.0, dcs=[_dc(**BUSY)]), now=0.0)
    for i in range(12):
        core.submit(RequestView(id=f"q{i}", model="", isl_tokens=300, osl_tokens=10,
                                origin_region="eu", ttft_slo_s=3.0, tpot_slo_s=0.1,
                                arrival_s=0.0), now=0.01)
    view = core.view()
    assert view is not None
    d = view.dcs[0]
    got = (d.active_batch, d.waiting_requests, d.queue_tokens, d.kv_tokens)
    assert got == pytest.approx(PROJ_OUT)
