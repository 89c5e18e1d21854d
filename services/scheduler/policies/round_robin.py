"""Round-robin (RR): the carbon- and SLO-blind baseline of paper 1 §V-A.

Rules / theory of operation
---------------------------
* Per request, the next DC in snapshot order after the previous choice, skipping DCs
  that are down or do not serve the request's model. The cursor lives in the policy
  object, so each scheduler keeps its own rotation; no estimates are computed.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.model.state import RequestView, SnapshotView
from services.scheduler.policies.base import (
    Decision,
    Policy,
    PolicyDeps,
    RoundRobin,
)
from services.scheduler.policies.registry import register


@register("round-robin", help="Rotate over the DCs that are up (carbon- and SLO-blind).")
class RoundRobinPolicy(Policy):
    """Round-robin over eligible DCs."""

    def __init__(self, config: object = None, deps: PolicyDeps | None = None) -> None:
        super().__init__(config, deps)
        self._rr = RoundRobin()

    def decide_window(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        names = self.estimator.dc_arrays(snapshot).names
        est = self.estimator
        assign = [self._rr.pick_index(est.eligible_indices(snapshot, r.model), len(names))
                  for r in requests]
        return self.build(names, assign, [""] * len(requests), "heuristic")
