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

from dataclasses import dataclass

from services.scheduler.estimator import Estimates
from services.scheduler.policies.base import FloatArray, Solved, SolverConfig, SolverPolicy, Window
from services.scheduler.policies.registry import register
from services.scheduler.policies.solver import SolveResult


@dataclass(frozen=True)
class IlpConfig(SolverConfig):
    """Settings of the window ILP."""


@register(
    "ilp",
    IlpConfig,
    help="Per window: min-carbon assignment of feasible pairs with per-DC slot capacity.",
    batch=True,
)
class IlpPolicy(SolverPolicy[None]):
    """Window ILP over SLO-feasible pairs with per-DC capacity H_d: one `assignment` solve
    per window (the iterative ILP makes one per round)."""

    config: SolverConfig

    def assignment(self, est: Estimates, capacity: FloatArray) -> SolveResult:
        """One solve of the assignment ILP on `est` with capacities `capacity`."""
        return self.solver.solve_assignment(
            est.carbon_g, est.feasible, capacity, time_limit_s=self.config.time_limit_s
        )

    def prepare(self, est: Estimates) -> None:
        return None

    def solve(self, est: Estimates, problem: None, window: Window) -> Solved:
        return Solved(est, self.assignment(est, est.capacity_requests))
