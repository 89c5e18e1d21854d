"""Carbon-aware batch assignment ILP (paper 1 §IV-B, eq. 2), solved once per window.

Rules / theory of operation
---------------------------
* Window R (Δw = 100 ms or 300 requests), SLO-feasible sets F_r from the shared
  estimator against the pre-window snapshot; cost c[r,d] = estimated carbon (g) of r at d
  (prefill energy + OSL x marginal decode energy, x PUE x CI)::

      min sum c[r,d] x[r,d]   s.t.  sum_{d in F_r} x[r,d] = 1,   sum_r x[r,d] <= H_d

* H_d = free batch slots of the DC in the snapshot: floor(max(0, max_batch - B_d -
  waiting_d) x engines) -- the requests the DC can admit without queueing.
* Solved with HiGHS as the LP relaxation (the matrix is totally unimodular, so the simplex
  vertex is integral; see `solver.py`). Requests without a feasible DC, or left unplaced
  for lack of capacity, and every request when the solver returns no solution, go through
  the fallback chain (lowest-carbon feasible DC with headroom, then round-robin).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from services.common.state import RequestView, SnapshotView
from services.scheduler.estimator import Estimates
from services.scheduler.policies.base import (
    NO_CAPACITY,
    NO_FEASIBLE,
    SOLVER_FAILED,
    Decision,
    IntArray,
    Policy,
    PolicyDeps,
    empty_decision,
)
from services.scheduler.policies.registry import register
from services.scheduler.policies.solver import HighsSolver, SolveResult


@dataclass(frozen=True)
class IlpConfig:
    """Settings of the window ILP."""

    time_limit_s: float = field(
        default=0.25, metadata={"help": "HiGHS time limit per solve, seconds"}
    )

    def __post_init__(self) -> None:
        if not self.time_limit_s >= 0.0:
            raise ValueError(f"time_limit_s must be >= 0, got {self.time_limit_s!r}")


def reasons_for(est: Estimates, res: SolveResult) -> list[str]:
    """Fallback reason per request after a solve ("" where the solver placed it)."""
    has_feasible: list[bool] = np.asarray(est.feasible.any(axis=1)).tolist()
    out: list[str] = []
    for r, a in enumerate(res.assign.tolist()):
        if not has_feasible[r]:
            out.append(NO_FEASIBLE)
        elif not res.has_solution:
            out.append(SOLVER_FAILED)
        elif a < 0:
            out.append(NO_CAPACITY)
        else:
            out.append("")
    return out


def status_of(res: SolveResult) -> str:
    return res.status if res.has_solution else "solver_failed"


@register(
    "ilp",
    IlpConfig,
    help="Per window: min-carbon assignment of feasible pairs with per-DC slot capacity.",
    batch=True,
)
class IlpPolicy(Policy):
    """Window ILP over SLO-feasible pairs with per-DC capacity H_d."""

    def __init__(self, config: IlpConfig | None = None, deps: PolicyDeps | None = None) -> None:
        cfg = config or IlpConfig()
        super().__init__(cfg, deps)
        self.time_limit_s = cfg.time_limit_s
        self.solver = HighsSolver(self.clock)

    def solve(self, est: Estimates) -> SolveResult:
        return self.solver.solve_assignment(
            est.carbon_g, est.feasible, est.capacity_requests, time_limit_s=self.time_limit_s
        )

    def decide(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        if not requests:
            return empty_decision(self)
        t0 = self.clock()
        est = self.estimator.estimate(requests, snapshot, region=region, now_s=now_s)
        est_s = self.clock() - t0
        res = self.solve(est)
        assign: IntArray = res.assign if res.has_solution else np.full(len(requests), -1)
        return self.finish(
            est,
            assign,
            reasons_for(est, res),
            status_of(res),
            solve_s=res.solve_s,
            build_s=res.build_s + est_s,
            iterations=1,
            objective_g=res.objective_g,
            limit_hit=res.limit_hit,
        )
