"""Least-loaded (LL): the carbon-blind load-balancing baseline of paper 1 §V-A.

Rules / theory of operation
---------------------------
* Load of a DC = (B_d + waiting_d + pending_d) / max_batch, per engine, where pending_d
  counts the requests this policy object sent to d since the snapshot it last saw
  (divided by the DC's engines). Snapshots arrive every Δp (1 s); without the pending
  term every request of that second would go to the same DC. pending resets whenever a
  snapshot with a new ``seq`` arrives.
* Per request: the eligible DC (up, serves the model) with the least load; ties go to the
  DC with fewer queued tokens, then to the first in snapshot order. SLO and carbon are
  ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.model.state import RequestView, SnapshotView
from services.scheduler.policies.base import Decision, Policy, PolicyDeps
from services.scheduler.policies.registry import register


@register("least-loaded", help="Send each request to the DC with the lowest batch load.")
class LeastLoadedPolicy(Policy):
    """Least-loaded over eligible DCs, with the policy's own dispatches projected."""

    def __init__(self, config: object = None, deps: PolicyDeps | None = None) -> None:
        super().__init__(config, deps)
        self._seq: int | None = None
        self._pending: dict[str, float] = {}

    def decide_window(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        if snapshot.seq != self._seq:
            self._seq = snapshot.seq
            self._pending = {}
        _, dcs, elig = self.estimator.eligibility(requests, snapshot, region)
        pending = np.array([self._pending.get(n, 0.0) for n in dcs.names], dtype=np.float64)
        eng = np.maximum(dcs.engines, 1.0)
        tie = dcs.queue_tokens / (1.0 + float(dcs.queue_tokens.max(initial=0.0)))
        assign = np.full(len(requests), -1, dtype=np.int64)
        for r in range(len(requests)):
            load = (dcs.batch + dcs.waiting + pending) / dcs.max_batch + 1e-9 * tie
            load = np.where(elig[r], load, np.inf)
            d = int(np.argmin(load))
            if np.isfinite(load[d]):
                assign[r] = d
                pending[d] += 1.0 / eng[d]
        for i, n in enumerate(dcs.names):
            self._pending[n] = float(pending[i])
        return self.build(dcs.names, assign, [""] * len(requests), "heuristic")
