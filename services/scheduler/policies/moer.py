"""MOER-based routing (paper 1 §V-A, [43]): the lowest-CI SLO-feasible DC.

Rules / theory of operation
---------------------------
* Identical to greedy with alpha = 0: per request, among the SLO-feasible DCs, the one
  with the lowest carbon intensity in the snapshot; no capacity limit. No feasible DC ->
  fallback chain (round-robin over eligible DCs).
"""

from __future__ import annotations

from services.scheduler.policies.base import PolicyDeps
from services.scheduler.policies.greedy import GreedyConfig, GreedyPolicy
from services.scheduler.policies.registry import register


@register("moer", help="Per request: the lowest-CI SLO-feasible DC (greedy with alpha=0).")
class MoerPolicy(GreedyPolicy):
    """Lowest carbon intensity among SLO-feasible DCs: the greedy policy at alpha = 0."""

    def __init__(self, config: object = None, deps: PolicyDeps | None = None) -> None:
        super().__init__(GreedyConfig(alpha=0.0), deps)  # MOER has no settings of its own
