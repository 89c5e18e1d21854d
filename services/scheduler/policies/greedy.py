"""Carbon-aware greedy (paper 1 §IV-A): one independent decision per request.

Rules / theory of operation
---------------------------
* Estimate TTFT/TPOT for every DC with the shared estimator, keep the SLO-feasible set
  F_r, and pick the DC of lowest::

      score[r,d] = alpha * Lat[r,d] / max_{F_r} Lat + (1 - alpha) * CI_d / max_{F_r} CI

  where Lat = TTFT + OSL * TPOT (estimated end-to-end latency) and CI is the DC's
  effective carbon intensity from the snapshot. Ties go to the first DC in snapshot order.
* No capacity limit: the requests of one call all see the same state; between calls
  only the scheduler's projection of its dispatches since the snapshot moves the view
  (`SchedulerCore.view`), so for small alpha the SLO-feasibility test alone stops the
  herding onto the greenest DC that the paper measures.
* No feasible DC -> fallback chain (here: round-robin over eligible DCs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from services.model.state import RequestView, SnapshotView
from services.scheduler.estimator import Estimates
from services.scheduler.policies.base import (
    NO_FEASIBLE,
    Decision,
    IntArray,
    Policy,
    PolicyDeps,
    check,
)
from services.scheduler.policies.registry import register


@dataclass(frozen=True)
class GreedyConfig:
    """Settings of the greedy policy."""

    alpha: float = field(
        default=0.5, metadata={"help": "latency weight in [0, 1]; 0 = carbon only (MOER)"}
    )

    def __post_init__(self) -> None:
        check(0.0 <= self.alpha <= 1.0, "alpha", "in [0, 1]", self.alpha)


def greedy_choice(est: Estimates, ci: np.ndarray, alpha: float) -> IntArray:
    """Per request, the feasible DC of lowest score (-1 where none is feasible)."""
    f = est.feasible
    lat = np.where(f, est.latency_s, 0.0)
    ci_b = np.where(f, np.broadcast_to(ci, f.shape), 0.0)
    max_lat = np.maximum(lat.max(axis=1, keepdims=True, initial=0.0), 1e-12)
    max_ci = np.maximum(ci_b.max(axis=1, keepdims=True, initial=0.0), 1e-12)
    score = alpha * lat / max_lat + (1.0 - alpha) * ci_b / max_ci
    score = np.where(f, score, np.inf)
    pick = np.argmin(score, axis=1).astype(np.int64) if f.shape[1] else np.zeros(0, np.int64)
    if f.shape[1] == 0:
        return np.full(f.shape[0], -1, dtype=np.int64)
    return np.where(f.any(axis=1), pick, -1)


@register(
    "greedy",
    GreedyConfig,
    help="Per request: lowest alpha*latency + (1-alpha)*CI score among SLO-feasible DCs.",
)
class GreedyPolicy(Policy):
    """Carbon-aware greedy scoring over the SLO-feasible DCs."""

    config: GreedyConfig

    def __init__(self, config: GreedyConfig | None = None, deps: PolicyDeps | None = None) -> None:
        super().__init__(config, deps)
        self.alpha = float(self.config.alpha)

    def decide_window(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        est = self.estimator.estimate(requests, snapshot, region=region, now_s=now_s)
        ci = self.estimator.dc_arrays(snapshot).ci_g_per_kwh
        assign = greedy_choice(est, ci, self.alpha)
        reasons = [NO_FEASIBLE if a < 0 else "" for a in assign.tolist()]
        return self.finish(est, assign, reasons, "heuristic")
