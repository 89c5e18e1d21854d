"""Capacitated facility-location MILP (paper 1 §IV-C), solved once per window.

Rules / theory of operation
---------------------------
* Same window, feasible sets and capacities H_d as the ILP, but the carbon of the fixed
  energy that batched requests share is charged once per DC instead of once per request::

      min sum_d f_d y_d + sum c[r,d] x[r,d]
      s.t. sum_{d in F_r} x[r,d] = 1,  sum_r x[r,d] <= H_d y_d,  x[r,d] <= y_d,
           y_d in {0, 1},  x[r,d] in [0, 1]

  - c[r,d] = marginal carbon: the estimator's carbon minus its fixed part
    (``energy_fixed_j``: the prefill step's e0 and the wake-up share of the decode e0).
  - f_d = the carbon of waking d's engines: the window's mean fixed energy per request at
    d x PUE x CI -- one request's worth of fixed energy, paid once however many requests
    join (the paper's "activation cost charged once").
* Only y is integer: with y fixed the remaining problem is a transportation problem whose
  LP relaxation is integral, so the MILP has just |D| binaries; the tight linking rows
  x <= y keep the relaxation strong. A greedy warm start (requests with fewest options
  first, cheapest DC with capacity, opening cost on first use) is passed with
  ``setSolution``, so the 0.25 s time limit still yields a feasible incumbent; its MIP gap
  is reported. Limit hits are counted in ``stats.limit_hits``.
* Fallback as in the ILP: no feasible DC, unplaced for capacity, or no solution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.estimator import Estimates
from services.scheduler.policies.base import (
    FloatArray,
    IntArray,
    Solved,
    SolverConfig,
    SolverPolicy,
    Window,
    check,
)
from services.scheduler.policies.registry import register
from services.scheduler.policies.solver import greedy_capacitated

# (c[r,d] marginal carbon, f[d] wake-up carbon, the warm start or None)
FacilityInputs = tuple[FloatArray, FloatArray, IntArray | None]


@dataclass(frozen=True)
class FacilityMilpConfig(SolverConfig):
    """Settings of the facility MILP."""

    mip_rel_gap: float = field(
        default=1e-4, metadata={"help": "relative MIP gap at which HiGHS stops"}
    )
    warm_start: bool = field(
        default=True, metadata={"help": "pass the greedy assignment as a starting solution"}
    )
    linking: bool = field(
        default=True, metadata={"help": "add the tight x[r,d] <= y_d rows (else aggregate only)"}
    )
    presolve: bool = field(default=True, metadata={"help": "run HiGHS presolve"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0.0 <= self.mip_rel_gap < 1.0, "mip_rel_gap", "in [0, 1)", self.mip_rel_gap)


def facility_costs(est: Estimates) -> tuple[FloatArray, FloatArray]:
    """(c[r,d] marginal carbon, f[d] wake-up carbon), grams."""
    fixed_g = est.energy_fixed_j * est.carbon_per_j
    marginal = est.carbon_g - fixed_g
    n_r = max(fixed_g.shape[0], 1)
    wake = fixed_g.sum(axis=0) / n_r
    return marginal, wake


@register(
    "facility-milp",
    FacilityMilpConfig,
    help="Per window: facility-location MILP, each DC's wake-up carbon charged once.",
    batch=True,
)
class FacilityMilpPolicy(SolverPolicy[FacilityInputs]):
    """Capacitated facility MILP with a greedy warm start (HiGHS)."""

    config: FacilityMilpConfig

    def prepare(self, est: Estimates) -> FacilityInputs:
        cost, wake = facility_costs(est)
        start: IntArray | None = None
        if self.config.warm_start:
            start = greedy_capacitated(cost, wake, est.feasible, est.capacity_requests)
        return cost, wake, start

    def solve(self, est: Estimates, problem: FacilityInputs, window: Window) -> Solved:
        cost, wake, start = problem
        res = self.solver.solve_facility(
            cost,
            wake,
            est.feasible,
            est.capacity_requests,
            time_limit_s=self.config.time_limit_s,
            mip_rel_gap=self.config.mip_rel_gap,
            warm_start=start,
            linking=self.config.linking,
            presolve=self.config.presolve,
        )
        return Solved(est, res)
