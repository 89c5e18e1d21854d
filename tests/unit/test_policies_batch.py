"""Window policies (ILP, iterative ILP, facility MILP, Green-LLM) and the fallback chain."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from services.config.calibration import load_calibration
from services.datacenter.perfmodel import PerfModel
from services.model.state import DcView, RequestView, SnapshotView
from services.scheduler.estimator import DcArrays, Estimator
from services.scheduler.policies import get_policy
from services.scheduler.policies.base import BUDGET, NO_CAPACITY, SOLVER_FAILED
from services.scheduler.policies.facility_milp import facility_costs
from services.scheduler.policies.solver import HighsSolver
from services.scheduler.policies.synthetic import SyntheticShape, make_requests, make_snapshot

SETUP = "a100-40gb/llama-3.1-8b-tp1"


def dc(name: str, region: str = "eu", **kw: Any) -> DcView:
    base: dict[str, Any] = dict(
        dc=name, region=region, setup=SETUP, engines=4, max_batch=40, active_batch=5.0,
        queue_tokens=0.0, kv_tokens=2000.0, kv_occupancy_ratio=0.1, prefill_duty_ratio=0.0,
        waiting_requests=0.0, ci_g_per_kwh=300.0, pue=1.1,
    )  # fmt: skip
    base.update(kw)
    return DcView(**base)


def req(i: int = 0, **kw: Any) -> RequestView:
    base: dict[str, Any] = dict(
        id=f"r{i}", model="", isl_tokens=300, osl_tokens=80, origin_region="eu",
        ttft_slo_s=3.0, tpot_slo_s=0.1, arrival_s=0.0,
    )  # fmt: skip
    base.update(kw)
    return RequestView(**base)


def snap(*dcs: DcView, seq: int = 1) -> SnapshotView:
    return SnapshotView(seq=seq, time_s=0.0, dcs=list(dcs))


def split_snapshot(with_dirty: bool = True) -> SnapshotView:
    """green has 3 free slots, mid 2, dirty 140 (all SLO-feasible)."""
    dcs = [
        dc("green", ci_g_per_kwh=10.0, engines=1, active_batch=37.0, kv_tokens=37 * 400.0),
        dc("mid", ci_g_per_kwh=100.0, engines=1, active_batch=38.0, kv_tokens=38 * 400.0),
    ]
    if with_dirty:
        dcs.append(dc("dirty", ci_g_per_kwh=500.0))
    return snap(*dcs)


@pytest.mark.parametrize("name", ["ilp", "iterative-ilp", "facility-milp"])
def test_capacity_forces_a_split(name: str) -> None:
    s = split_snapshot()
    reqs = [req(i) for i in range(6)]
    assert Estimator().estimate(reqs, s).feasible.all()  # precondition of the construction
    # a generous limit: this is about the optimum, not speed (the machine may be busy)
    d = get_policy(name, time_limit_s=30.0).decide(reqs, s, "eu", 0.0)
    assert Counter(d.targets) == {"green": 3, "mid": 2, "dirty": 1}
    assert not any(d.fallback) and d.status == "optimal"


@pytest.mark.parametrize("name", ["ilp", "iterative-ilp", "facility-milp"])
def test_over_capacity_requests_fall_back_and_are_counted(name: str) -> None:
    s = split_snapshot(with_dirty=False)
    p = get_policy(name, time_limit_s=30.0)
    d = p.decide([req(i) for i in range(8)], s, "eu", 0.0)
    placed = [t for t, f in zip(d.targets, d.fallback, strict=True) if not f]
    assert Counter(placed) == {"green": 3, "mid": 2}
    assert d.fallback_reason.count(NO_CAPACITY) == 3
    # No headroom left anywhere: the chain ends in round-robin, still never None.
    assert all(t in {"green", "mid"} for t in d.targets)
    assert p.stats.fallbacks == 3 and p.stats.fallback_reasons[NO_CAPACITY] == 3


@pytest.mark.parametrize("name,cfg", [("ilp", {}), ("iterative-ilp", {}),
                                      ("facility-milp", {"warm_start": False})])  # fmt: skip
def test_zero_time_limit_is_a_solver_failure_with_greedy_fallback(
    name: str, cfg: dict[str, Any]
) -> None:
    s = split_snapshot()
    p = get_policy(name, time_limit_s=0.0, **cfg)
    d = p.decide([req(i) for i in range(6)], s, "eu", 0.0)
    assert d.status == "solver_failed" and d.limit_hit
    assert set(d.fallback_reason) == {SOLVER_FAILED}
    # Fallback = lowest-carbon feasible DC with headroom, request by request.
    assert Counter(d.targets) == {"green": 3, "mid": 2, "dirty": 1}
    assert p.stats.solver_failures == 1 and p.stats.fallbacks == 6


def test_facility_time_limit_keeps_the_warm_start() -> None:
    s = split_snapshot()
    p = get_policy("facility-milp", time_limit_s=0.0)
    d = p.decide([req(i) for i in range(6)], s, "eu", 0.0)
    assert d.limit_hit and d.status == "time_limit" and not any(d.fallback)
    assert d.mip_gap is not None and d.mip_gap >= 0.0
    assert Counter(d.targets) == {"green": 3, "mid": 2, "dirty": 1}
    assert p.stats.limit_hits == 1


def test_facility_solver_consolidates_on_wake_up_cost() -> None:
    s = HighsSolver(lambda: 0.0)
    cost = np.array([[1.0, 1.1], [1.1, 1.0], [1.1, 1.0]])
    fixed = np.array([0.5, 0.5])
    feas = np.ones((3, 2), dtype=np.bool_)
    # all -> d1: 1.1 + 1 + 1 + 0.5 = 3.6 < all -> d0: 3.7 < split: 3 + 1.0 = 4.0
    r = s.solve_facility(cost, fixed, feas, np.array([10.0, 10.0]),
                         time_limit_s=5.0, mip_rel_gap=0.0)  # fmt: skip
    assert r.assign.tolist() == [1, 1, 1] and r.objective_g == pytest.approx(3.6)
    # d1 holds only 2: all -> d0 (3.7) beats the split (4.0).
    r2 = s.solve_facility(cost, fixed, feas, np.array([10.0, 2.0]),
                          time_limit_s=5.0, mip_rel_gap=0.0)  # fmt: skip
    assert r2.assign.tolist() == [0, 0, 0] and r2.objective_g == pytest.approx(3.7)
    # The assignment ILP (no wake-up cost) splits instead.
    r3 = s.solve_assignment(cost, feas, np.array([10.0, 10.0]), time_limit_s=5.0)
    assert r3.assign.tolist() == [0, 1, 1] and r3.objective_g == pytest.approx(3.0)


def _facility_objective(cost: np.ndarray, fixed: np.ndarray, assign: np.ndarray) -> float:
    placed = assign >= 0
    used = np.unique(assign[placed])
    return float(cost[np.nonzero(placed)[0], assign[placed]].sum() + fixed[used].sum())


def test_facility_beats_ilp_on_its_own_objective_and_vice_versa() -> None:
    rng = np.random.default_rng(2)
    est = Estimator()
    for _ in range(4):
        s = make_snapshot(rng, SyntheticShape(load=0.9, engines=2))
        reqs = make_requests(rng, 60)
        e = est.estimate(reqs, s)
        cost, wake = facility_costs(e)
        solver = HighsSolver(lambda: 0.0)
        fac = solver.solve_facility(cost, wake, e.feasible, e.capacity_requests,
                                    time_limit_s=10.0, mip_rel_gap=0.0)  # fmt: skip
        ilp = solver.solve_assignment(e.carbon_g, e.feasible, e.capacity_requests,
                                      time_limit_s=10.0)  # fmt: skip
        assert (fac.assign >= 0).sum() == (ilp.assign >= 0).sum()  # same number placed
        f_fac = _facility_objective(cost, wake, fac.assign)
        f_ilp = _facility_objective(cost, wake, ilp.assign)
        assert f_fac <= f_ilp + 1e-9
        c = e.carbon_g
        c_ilp = sum(c[r, a] for r, a in enumerate(ilp.assign) if a >= 0)
        c_fac = sum(c[r, a] for r, a in enumerate(fac.assign) if a >= 0)
        assert c_ilp <= c_fac + 1e-9
        counts = np.bincount(fac.assign[fac.assign >= 0], minlength=len(e.dc_names))
        assert np.all(counts <= e.capacity_requests)


def _overload_instance(n: int) -> tuple[SnapshotView, list[RequestView]]:
    """A green DC that is feasible alone but not once the whole window joins it."""
    green = dc("green", ci_g_per_kwh=10.0, engines=1, max_batch=400, active_batch=100.0,
               kv_tokens=100 * 300.0)  # fmt: skip
    dirty = dc("dirty", ci_g_per_kwh=500.0)
    s = snap(green, dirty)
    est = Estimator()
    probe = [req(i) for i in range(n)]
    before = est.estimate(probe, s).tpot_s[0]
    base = DcArrays.from_snapshot(s)
    after = est.estimate(probe, s, dcs=base.project(np.array([n, 0.0]), np.array([n * 300.0, 0.0])))
    slo = 0.5 * (before[0] + after.tpot_s[0, 0])
    assert before[1] < slo  # dirty stays feasible
    return s, [req(i, tpot_slo_s=float(slo)) for i in range(n)]


def test_iterative_ilp_moves_load_off_an_overloaded_dc() -> None:
    s, reqs = _overload_instance(60)
    one = get_policy("iterative-ilp", t_max=1, time_limit_s=30.0).decide(reqs, s, "eu", 0.0)
    ilp = get_policy("ilp", time_limit_s=30.0).decide(reqs, s, "eu", 0.0)
    assert one.targets == ilp.targets and set(ilp.targets) == {"green"}
    two = get_policy("iterative-ilp", t_max=2, time_limit_s=30.0).decide(reqs, s, "eu", 0.0)
    assert two.iterations == 2 and "dirty" in two.targets
    assert Counter(two.targets)["green"] < len(reqs)


def test_iterative_ilp_stops_when_stable() -> None:
    s = split_snapshot()
    d = get_policy("iterative-ilp", t_max=3, time_limit_s=30.0).decide([req(0)], s, "eu", 0.0)
    assert d.iterations == 2 and d.targets == ("green",)


def test_green_llm_budget_is_spent_then_resets_each_hour() -> None:
    pm = PerfModel(load_calibration(SETUP))
    ctx = 1024.0
    budget = 1 * 1 * 3600.0 / pm.decode_time(1, ctx)  # engines x max_batch x 1 h / t_dec
    osl = int(budget / 2.5)
    s = snap(dc("green", ci_g_per_kwh=10.0, engines=1, max_batch=1, active_batch=0.0),
             dc("dirty", ci_g_per_kwh=400.0))  # fmt: skip
    p = get_policy("green-llm", budget_ctx_tokens=ctx, pacing_s=0.0)
    got = [p.decide([req(i, osl_tokens=osl)], s, "eu", 10.0).targets[0] for i in range(3)]
    assert got == ["green", "green", "dirty"]
    assert p.decide([req(9, osl_tokens=osl)], s, "eu", 3600.0 + 1.0).targets == ("green",)


def test_green_llm_is_batch_agnostic_but_moer_is_not() -> None:
    loaded = dc("green", ci_g_per_kwh=10.0, active_batch=40.0, waiting_requests=30.0,
                queue_tokens=200000.0, kv_tokens=40 * 2000.0, prefill_duty_ratio=0.9)  # fmt: skip
    s = snap(loaded, dc("dirty", ci_g_per_kwh=400.0))
    assert get_policy("green-llm").decide([req()], s, "eu", 0.0).targets == ("green",)
    assert get_policy("moer").decide([req()], s, "eu", 0.0).targets == ("dirty",)


def test_green_llm_budget_exhaustion_falls_back() -> None:
    pm = PerfModel(load_calibration(SETUP))
    budget = 3600.0 / pm.decode_time(1, 1024.0)
    s = snap(dc("only", engines=1, max_batch=1))
    p = get_policy("green-llm")
    d = p.decide([req(0, osl_tokens=int(budget * 2))], s, "eu", 0.0)
    assert d.fallback_reason == (BUDGET,) and d.targets == ("only",)


@pytest.mark.parametrize("name", ["ilp", "iterative-ilp", "facility-milp", "green-llm"])
def test_empty_window(name: str) -> None:
    d = get_policy(name).decide([], split_snapshot(), "eu", 0.0)
    assert d.targets == () and d.n_fallback == 0


def test_green_llm_paced_budget_spreads_load_over_time() -> None:
    """With pacing, a DC takes about its per-second share of the hourly budget, split over
    the schedulers, then the next-greenest DC gets the rest."""
    pm = PerfModel(load_calibration(SETUP))
    isl = 300.0                                             # req()'s prompt
    # one engine at batch limit 1: each request pays its prefill, then OSL decode steps
    def per_s_for(osl: float) -> float:
        pre = pm.prefill_time(isl, 1, isl * isl)
        return osl / (pre + osl * pm.decode_time(1, 1024.0)) / 2   # two regions
    osl = 8
    per_s = per_s_for(osl)
    s = snap(dc("green", "eu", ci_g_per_kwh=10.0, engines=1, max_batch=1),
             dc("dirty", "us", ci_g_per_kwh=500.0, engines=1, max_batch=1))
    p = get_policy("green-llm", pacing_s=1.0)
    assert per_s > 2 * osl                                  # the bucket holds a few requests
    d = p.decide([req(i, osl_tokens=osl) for i in range(12)], s, "eu", 0.0)
    budgeted = Counter(t for t, f in zip(d.targets, d.fallback, strict=True) if not f)
    fits = int(per_s // osl)                               # requests one second's share holds
    assert budgeted == {"green": fits, "dirty": fits}      # greenest first, then the next
    assert d.fallback_reason.count(BUDGET) == 12 - 2 * fits
    # tokens placed by the fallback chain are spent too (the bucket goes negative); one
    # second later each bucket has refilled by one second's share, minus that overdraft
    over = osl * Counter(t for t, f in zip(d.targets, d.fallback, strict=True) if f)["green"]
    d2 = p.decide([req(100 + i, osl_tokens=osl) for i in range(12)], s, "eu", 1.0)
    again = Counter(t for t, f in zip(d2.targets, d2.fallback, strict=True) if not f)
    left = min(per_s, per_s - fits * osl - over + per_s)
    assert again["green"] == max(int(left // osl), 0)
