"""MOER-based routing (paper 1 §V-A, [43]): the lowest-CI SLO-feasible DC.

Rules / theory of operation
---------------------------
* Identical to greedy with alpha = 0: per request, among the SLO-feasible DCs, the one
  with the lowest carbon intensity in the snapshot; no capacity limit. No feasible DC ->
  fallback chain (round-robin over eligible DCs).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.state import RequestView, SnapshotView
from services.scheduler.policies.base import NO_FEASIBLE, Decision, Policy, empty_decision
from services.scheduler.policies.greedy import greedy_choice
from services.scheduler.policies.registry import register


@register("moer", help="Per request: the lowest-CI SLO-feasible DC (greedy with alpha=0).")
class MoerPolicy(Policy):
    """Lowest carbon intensity among SLO-feasible DCs."""

    def decide(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        if not requests:
            return empty_decision(self)
        est = self.estimator.estimate(requests, snapshot, region=region, now_s=now_s)
        ci = self.estimator.dc_arrays(snapshot).ci_g_per_kwh
        assign = greedy_choice(est, ci, 0.0)
        reasons = [NO_FEASIBLE if a < 0 else "" for a in assign.tolist()]
        return self.finish(est, assign, reasons, "heuristic")
