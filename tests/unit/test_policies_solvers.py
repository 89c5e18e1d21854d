"""HiGHS models vs the same models written in PuLP (CBC): equal optimal objectives."""

from __future__ import annotations

import warnings

import numpy as np
import pulp
import pytest

from services.scheduler.estimator import Estimator
from services.scheduler.policies.facility_milp import facility_costs
from services.scheduler.policies.solver import HighsSolver, greedy_capacitated, unplaced_penalty
from services.scheduler.policies.synthetic import SyntheticShape, make_requests, make_snapshot


def cbc() -> pulp.LpSolver:
    """CBC as shipped inside the pulp wheel (PuLP 3.x flags the bundled-binary class as
    deprecated in favour of COIN_CMD with a separately installed CBC)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False)


def pulp_assignment(cost: np.ndarray, feas: np.ndarray, cap: np.ndarray) -> float:
    """Eq. 2 with binary x and the same unplaced slack as the HiGHS model."""
    n_r, n_d = feas.shape
    pen = unplaced_penalty(cost, None, feas)
    m = pulp.LpProblem("ilp", pulp.LpMinimize)
    x = {(r, d): m.add_variable(f"x_{r}_{d}", 0, 1, cat="Binary")
         for r in range(n_r) for d in range(n_d) if feas[r, d]}  # fmt: skip
    u = [m.add_variable(f"u_{r}", 0, 1) for r in range(n_r)]
    m += pulp.lpSum(float(cost[k]) * v for k, v in x.items()) + pen * pulp.lpSum(u)
    for r in range(n_r):
        m += pulp.lpSum(v for (rr, _), v in x.items() if rr == r) + u[r] == 1
    for d in range(n_d):
        m += pulp.lpSum(v for (_, dd), v in x.items() if dd == d) <= float(cap[d])
    m.solve(cbc())
    assert pulp.LpStatus[m.status] == "Optimal"
    return float(pulp.value(m.objective))


def pulp_facility(cost: np.ndarray, fixed: np.ndarray, feas: np.ndarray, cap: np.ndarray) -> float:
    """Facility MILP with binary x and y (no integrality shortcuts)."""
    n_r, n_d = feas.shape
    pen = unplaced_penalty(cost, fixed, feas)
    m = pulp.LpProblem("facility", pulp.LpMinimize)
    x = {(r, d): m.add_variable(f"x_{r}_{d}", 0, 1, cat="Binary")
         for r in range(n_r) for d in range(n_d) if feas[r, d]}  # fmt: skip
    y = [m.add_variable(f"y_{d}", 0, 1, cat="Binary") for d in range(n_d)]
    u = [m.add_variable(f"u_{r}", 0, 1) for r in range(n_r)]
    m += (
        pulp.lpSum(float(cost[k]) * v for k, v in x.items())
        + pulp.lpSum(float(fixed[d]) * y[d] for d in range(n_d))
        + pen * pulp.lpSum(u)
    )
    for r in range(n_r):
        m += pulp.lpSum(v for (rr, _), v in x.items() if rr == r) + u[r] == 1
    for d in range(n_d):
        m += pulp.lpSum(v for (_, dd), v in x.items() if dd == d) <= float(cap[d]) * y[d]
    for (_, d), v in x.items():
        m += v <= y[d]
    m.solve(cbc())
    assert pulp.LpStatus[m.status] == "Optimal"
    return float(pulp.value(m.objective))


def highs_objective(cost: np.ndarray, fixed: np.ndarray | None, feas: np.ndarray,
                    assign: np.ndarray) -> float:  # fmt: skip
    """Objective of an assignment including the unplaced penalty (as both models price it)."""
    pen = unplaced_penalty(cost, fixed, feas)
    placed = assign >= 0
    total = float(cost[np.nonzero(placed)[0], assign[placed]].sum())
    if fixed is not None:
        total += float(fixed[np.unique(assign[placed])].sum())
    return total + pen * float((~placed).sum())


def random_instance(seed: int, n_r: int, n_d: int, tight: bool) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    cost = rng.uniform(0.1, 2.0, (n_r, n_d))
    feas = rng.uniform(size=(n_r, n_d)) < 0.7
    cap = rng.integers(0, n_r // 3 + 1, n_d).astype(float) if tight else np.full(n_d, n_r / 2)
    fixed = rng.uniform(0.0, 3.0, n_d)
    return cost, feas, cap, fixed


@pytest.mark.parametrize("seed", range(6))
def test_assignment_parity_random(seed: int) -> None:
    cost, feas, cap, _ = random_instance(seed, 25, 5, tight=seed % 2 == 1)
    res = HighsSolver(lambda: 0.0).solve_assignment(cost, feas, cap, time_limit_s=10.0)
    assert res.status == "optimal"
    counts = np.bincount(res.assign[res.assign >= 0], minlength=5)
    assert np.all(counts <= cap) and np.all(feas[np.nonzero(res.assign >= 0)[0],
                                                 res.assign[res.assign >= 0]])  # fmt: skip
    ours = highs_objective(cost, None, feas, res.assign)
    assert ours == pytest.approx(pulp_assignment(cost, feas, cap), rel=1e-7, abs=1e-7)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("linking", [True, False])
def test_facility_parity_random(seed: int, linking: bool) -> None:
    cost, feas, cap, fixed = random_instance(100 + seed, 20, 5, tight=seed % 2 == 1)
    start = greedy_capacitated(cost, fixed, feas, cap)
    res = HighsSolver(lambda: 0.0).solve_facility(
        cost, fixed, feas, cap, time_limit_s=10.0, mip_rel_gap=0.0, warm_start=start,
        linking=linking,
    )  # fmt: skip
    assert res.status == "optimal"
    ours = highs_objective(cost, fixed, feas, res.assign)
    assert ours == pytest.approx(pulp_facility(cost, fixed, feas, cap), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_parity_on_estimator_instances(seed: int) -> None:
    """Real costs (grams, ~1e-4 scale) from the estimator on a synthetic topology."""
    rng = np.random.default_rng(seed)
    s = make_snapshot(rng, SyntheticShape(regions=2, dcs_per_region=3, engines=1, load=0.9))
    e = Estimator().estimate(make_requests(rng, 30, regions=2), s)
    cost, wake = facility_costs(e)
    solver = HighsSolver(lambda: 0.0)
    a = solver.solve_assignment(e.carbon_g, e.feasible, e.capacity_requests, time_limit_s=10.0)
    ref_a = pulp_assignment(e.carbon_g, e.feasible, e.capacity_requests)
    assert highs_objective(e.carbon_g, None, e.feasible, a.assign) == pytest.approx(ref_a, rel=1e-6)
    f = solver.solve_facility(cost, wake, e.feasible, e.capacity_requests,
                              time_limit_s=10.0, mip_rel_gap=0.0)  # fmt: skip
    ref_f = pulp_facility(cost, wake, e.feasible, e.capacity_requests)
    assert highs_objective(cost, wake, e.feasible, f.assign) == pytest.approx(ref_f, rel=1e-6)


def test_warm_start_is_feasible_and_not_better_than_optimum() -> None:
    cost, feas, cap, fixed = random_instance(7, 40, 6, tight=True)
    start = greedy_capacitated(cost, fixed, feas, cap)
    placed = start >= 0
    assert np.all(feas[np.nonzero(placed)[0], start[placed]])
    assert np.all(np.bincount(start[placed], minlength=6) <= cap)
    res = HighsSolver(lambda: 0.0).solve_facility(cost, fixed, feas, cap, time_limit_s=10.0,
                                                  mip_rel_gap=0.0, warm_start=start)  # fmt: skip
    assert highs_objective(cost, fixed, feas, res.assign) <= highs_objective(
        cost, fixed, feas, start
    ) + 1e-9
