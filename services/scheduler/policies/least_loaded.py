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

import math
from collections.abc import Sequence

from services.model.state import RequestView, SnapshotView
from services.scheduler.policies.base import Decision, Policy, PolicyDeps
from services.scheduler.policies.registry import register


@register("least-loaded", help="Send each request to the DC with the lowest batch load.")
class LeastLoadedPolicy(Policy):
    """Least-loaded over eligible DCs, with the policy's own dispatches projected."""

    def __init__(self, config: object = None, deps: PolicyDeps | None = None) -> None:
        super().__init__(config, deps)
        self._seq: int | None = None
        self._names: Sequence[str] = ()
        # per snapshot, in its DC order: own dispatches since it (per engine), the
        # batch capacities and 1 / engines (constant while the snapshot is)
        self._pending: list[float] = []
        self._max_batch: list[float] = []
        self._inv_eng: list[float] = []

    def decide_window(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        est = self.estimator
        dcs = est.dc_arrays(snapshot)
        names = dcs.names
        if snapshot.seq != self._seq or names != self._names:
            self._seq, self._names = snapshot.seq, names
            self._pending = [0.0] * len(names)
            self._max_batch = dcs.max_batch.tolist()
            self._inv_eng = [1.0 / max(e, 1.0) for e in dcs.engines.tolist()]
        pending, max_batch, inv_eng = self._pending, self._max_batch, self._inv_eng
        batch = dcs.batch.tolist()
        waiting = dcs.waiting.tolist()
        q = dcs.queue_tokens.tolist()
        # ties go to fewer queued tokens: a term below any load difference
        q_top = 1.0 + max([0.0, *q])
        assign = []
        for r in requests:  # plain floats: a few eligible DCs per request
            best, best_load = -1, math.inf
            for d in est.eligible_indices(snapshot, r.model):
                load = (batch[d] + waiting[d] + pending[d]) / max_batch[d] + 1e-9 * (q[d] / q_top)
                if load < best_load:
                    best, best_load = d, load
            assign.append(best)
            if best >= 0:
                pending[best] += inv_eng[best]
        return self.build(names, assign, [""] * len(requests), "heuristic")
