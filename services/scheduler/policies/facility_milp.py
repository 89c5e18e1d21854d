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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from services.common.state import RequestView, SnapshotView
from services.scheduler.estimator import Estimates
from services.scheduler.policies.base import (
    Decision,
    FloatArray,
    IntArray,
    Policy,
    PolicyDeps,
    empty_decision,
)
from services.scheduler.policies.ilp import reasons_for, status_of
from services.scheduler.policies.registry import register
from services.scheduler.policies.solver import HighsSolver, greedy_capacitated


@dataclass(frozen=True)
class FacilityMilpConfig:
    """Settings of the facility MILP."""

    time_limit_s: float = field(default=0.25, metadata={"help": "HiGHS time limit, seconds"})
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
        if not self.time_limit_s >= 0.0:
            raise ValueError(f"time_limit_s must be >= 0, got {self.time_limit_s!r}")
        if not 0.0 <= self.mip_rel_gap < 1.0:
            raise ValueError(f"mip_rel_gap must be in [0, 1), got {self.mip_rel_gap!r}")


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
class FacilityMilpPolicy(Policy):
    """Capacitated facility MILP with a greedy warm start (HiGHS)."""

    def __init__(
        self, config: FacilityMilpConfig | None = None, deps: PolicyDeps | None = None
    ) -> None:
        cfg = config or FacilityMilpConfig()
        super().__init__(cfg, deps)
        self.cfg = cfg
        self.solver = HighsSolver(self.clock)

    def decide(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        if not requests:
            return empty_decision(self)
        t0 = self.clock()
        est = self.estimator.estimate(requests, snapshot, region=region, now_s=now_s)
        cost, wake = facility_costs(est)
        start: IntArray | None = None
        if self.cfg.warm_start:
            start = greedy_capacitated(cost, wake, est.feasible, est.capacity_requests)
        prep_s = self.clock() - t0
        res = self.solver.solve_facility(
            cost,
            wake,
            est.feasible,
            est.capacity_requests,
            time_limit_s=self.cfg.time_limit_s,
            mip_rel_gap=self.cfg.mip_rel_gap,
            warm_start=start,
            linking=self.cfg.linking,
            presolve=self.cfg.presolve,
        )
        assign = res.assign if res.has_solution else np.full(len(requests), -1)
        return self.finish(
            est,
            assign,
            reasons_for(est, res),
            status_of(res),
            solve_s=res.solve_s,
            build_s=res.build_s + prep_s,
            iterations=1,
            objective_g=res.objective_g,
            mip_gap=res.mip_gap,
            limit_hit=res.limit_hit,
        )
