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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from services.common.state import RequestView, SnapshotView
from services.scheduler.estimator import Estimates, RequestArrays
from services.scheduler.policies.base import (
    Decision,
    IntArray,
    Policy,
    PolicyDeps,
    empty_decision,
)
from services.scheduler.policies.ilp import reasons_for, status_of
from services.scheduler.policies.registry import register
from services.scheduler.policies.solver import HighsSolver, SolveResult


@dataclass(frozen=True)
class IterativeIlpConfig:
    """Settings of the iterative ILP."""

    t_max: int = field(default=3, metadata={"help": "maximum solve rounds per window"})
    time_limit_s: float = field(
        default=0.25, metadata={"help": "HiGHS time limit per round, seconds"}
    )

    def __post_init__(self) -> None:
        if self.t_max < 1:
            raise ValueError(f"t_max must be >= 1, got {self.t_max!r}")
        if not self.time_limit_s >= 0.0:
            raise ValueError(f"time_limit_s must be >= 0, got {self.time_limit_s!r}")


@register(
    "iterative-ilp",
    IterativeIlpConfig,
    help="Window ILP re-solved on DC states projected with its own assignment (T_max).",
    batch=True,
)
class IterativeIlpPolicy(Policy):
    """ILP whose solution is fed back into the DC view until it is stable."""

    def __init__(
        self, config: IterativeIlpConfig | None = None, deps: PolicyDeps | None = None
    ) -> None:
        cfg = config or IterativeIlpConfig()
        super().__init__(cfg, deps)
        self.t_max = cfg.t_max
        self.time_limit_s = cfg.time_limit_s
        self.solver = HighsSolver(self.clock)

    def decide(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        if not requests:
            return empty_decision(self)
        t0 = self.clock()
        reqs = RequestArrays.from_requests(requests, region)
        base = self.estimator.dc_arrays(snapshot)
        est = self.estimator.estimate(reqs, snapshot, now_s=now_s)
        build_s = self.clock() - t0
        capacity = est.capacity_requests
        solve_s = 0.0
        best: tuple[Estimates, SolveResult] | None = None
        prev: IntArray | None = None
        limit_hit = False
        rounds = 0
        for _ in range(self.t_max):
            rounds += 1
            res = self.solver.solve_assignment(
                est.carbon_g, est.feasible, capacity, time_limit_s=self.time_limit_s
            )
            solve_s += res.solve_s
            build_s += res.build_s
            limit_hit = limit_hit or res.limit_hit
            if not res.has_solution:
                if best is None:
                    best = (est, res)
                break
            best = (est, res)
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
            est = self.estimator.estimate(reqs, snapshot, dcs=projected, now_s=now_s)
            build_s += self.clock() - t1
        assert best is not None
        est_b, res_b = best
        assign = res_b.assign if res_b.has_solution else np.full(len(requests), -1)
        return self.finish(
            est_b,
            assign,
            reasons_for(est_b, res_b),
            status_of(res_b),
            solve_s=solve_s,
            build_s=build_s,
            iterations=rounds,
            objective_g=res_b.objective_g,
            limit_hit=limit_hit,
            capacity=capacity,
        )
