"""Load-coupled iterative ILP (paper 1 §IV-B).

Rules / theory of operation
---------------------------
* Round 1 is the window ILP (`ilp.py`) against the snapshot. After round t the assigned
  counts n_d and prompt tokens are projected onto the DCs "as if already dispatched"
  (`DcArrays.project`: B_d, waiting, Q_d and KV grow per engine), the estimates and
  feasible sets are recomputed from the projected state and the ILP is re-solved -- with
  the same capacities H_d from the snapshot, since the window's own requests are the
  projected load. Stop when two consecutive rounds give the same assignment or after
  T_max rounds (default 3); the last round's assignment is used.
* A round with no solution stops the loop; the previous round's assignment is kept if
  there is one, otherwise the whole window falls back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from services.scheduler.estimator import Estimates
from services.scheduler.policies.base import IntArray, Solved, SolverConfig, Window, check
from services.scheduler.policies.ilp import IlpPolicy
from services.scheduler.policies.registry import register


@dataclass(frozen=True)
class IterativeIlpConfig(SolverConfig):
    """Settings of the iterative ILP (the time limit holds per round)."""

    t_max: int = field(default=3, metadata={"help": "maximum solve rounds per window"})

    def __post_init__(self) -> None:
        check(self.t_max >= 1, "t_max", ">= 1", self.t_max)
        super().__post_init__()


@register(
    "iterative-ilp",
    IterativeIlpConfig,
    help="Window ILP re-solved on DC states projected with its own assignment (T_max).",
    batch=True,
)
class IterativeIlpPolicy(IlpPolicy):
    """ILP whose solution is fed back into the DC view until it is stable."""

    config: IterativeIlpConfig

    def solve(self, est: Estimates, problem: None, window: Window) -> Solved:
        reqs, snapshot = window.requests, window.snapshot
        base = self.estimator.dc_arrays(snapshot)
        capacity = est.capacity_requests
        solve_s = build_s = 0.0
        best: Solved | None = None
        prev: IntArray | None = None
        limit_hit = False
        rounds = 0
        for _ in range(self.config.t_max):
            rounds += 1
            res = self.assignment(est, capacity)
            solve_s += res.solve_s
            build_s += res.build_s
            limit_hit = limit_hit or res.limit_hit
            if not res.has_solution:
                if best is None:
                    best = Solved(est, res)
                break
            best = Solved(est, res)
            if prev is not None and np.array_equal(prev, res.assign):
                break
            prev = res.assign
            t1 = self.clock()
            placed = res.assign >= 0
            n = np.bincount(res.assign[placed], minlength=base.size).astype(np.float64)
            tok = np.bincount(
                res.assign[placed], weights=reqs.isl_tokens[placed], minlength=base.size
            ).astype(np.float64)
            projected = base.project(n, tok)
            est = self.estimator.estimate(reqs, snapshot, dcs=projected, now_s=window.now_s)
            build_s += self.clock() - t1
        assert best is not None
        totals = dataclasses.replace(
            best.result, solve_s=solve_s, build_s=build_s, limit_hit=limit_hit
        )
        return Solved(best.est, totals, rounds)
