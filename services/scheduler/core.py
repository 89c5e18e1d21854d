"""Sans-IO regional scheduler: scheduling window, policy decisions, staleness fallback.

Theory of operation
-------------------
* Requests arriving at this region's scheduler are `submit`-ted with their arrival time.
  A per-request policy (``policy.batch`` False) decides at once. A batch policy collects
  a window that closes ``window_s`` after its first request or at ``window_max`` requests
  (paper 1: 100 ms or 300); the runtime calls `flush` at `deadline()`.
* A decision names a DC. If the DC is in another region the runtime forwards the request
  to that region's scheduler (after RTT/2), which `admit_forwarded`s it into its own
  window and dispatches it to the named DC when that window closes (at once for
  per-request policies) — paper 1 §III-C.
* The latest snapshot drives the policy, plus — with ``project_dispatches`` (default on) —
  this scheduler's own dispatches since that snapshot was taken, projected onto the DCs'
  states as the iterative ILP projects a window (paper 1 §IV-B). Without it, every window
  until the next poll (10 windows per second at Δp = 1 s) sees the same free capacity and
  the carbon-aware policies herd onto the greenest DC. With ``project_peers`` (default
  on) each own dispatch is projected N times, N = the number of regional schedulers:
  the peers see the same snapshot and, until the next poll, are assumed to route as
  this one does -- without it the N schedulers together fill a green DC N times over.
  Past ``staleness_s`` without a fresh snapshot (provisioner down) the scheduler
  decides round-robin over the topology's DCs and counts each such decision as a
  staleness fallback.
* A request no DC can take gets a `Dispatch` with ``dc == ""``; the runtime rejects it.
* Decision time is measured through the injected ``clock`` (wall seconds); the virtual
  runtime charges it to emulated time.
* OSL: the oracle length by default; with ``osl_mode: predicted`` the policy sees the
  median of the two-layer MLP predictor (`services.scheduler.osl`) instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from services.config.topology import DcSpec, SchedulerSpec
from services.model.state import RequestView, SnapshotView
from services.scheduler.estimator import Projection
from services.scheduler.policies.base import DecisionStats, Policy, zero_clock

Clock = Callable[[], float]


@dataclass(frozen=True)
class Dispatch:
    request_id: str
    dc: str                  # "" when no DC can take the request
    region: str              # region of the DC
    forward: bool            # the DC is in another region
    fallback: bool
    reason: str              # fallback reason ("" if none)
    decided_s: float         # emulated time the decision was made
    decision_s: float        # wall seconds the decision took (window solve time for batches)


@dataclass
class SchedulerStats(DecisionStats):
    """The policy's window counters (`DecisionStats`) over every window this scheduler
    decided, stale round-robin ones included, plus its routing counters. `fallbacks`
    counts the fallbacks a DC took (and each `local_fallback`)."""

    local: int = 0
    forwarded: int = 0
    stale_decisions: int = 0
    forwarded_in: int = 0
    window_sizes: list[int] = field(default_factory=list)  # the latest 5000-10000
    solver_status: dict[str, int] = field(default_factory=dict)

    @property
    def decisions(self) -> int:
        """Requests decided (`requests`)."""
        return self.requests

    def tally(self, targets: Sequence[str | None], fallback: Iterable[bool],
              reasons: Sequence[str]) -> None:
        placed = [f and bool(t) for f, t in zip(fallback, targets, strict=True)]
        super().tally(targets, placed, reasons)
        self.window_sizes.append(len(targets))
        if len(self.window_sizes) > 10_000:
            del self.window_sizes[:5_000]


class SchedulerCore:
    def __init__(
        self,
        region: str,
        spec: SchedulerSpec,
        dcs: Sequence[DcSpec],
        policy: Policy,
        clock: Clock = zero_clock,
    ) -> None:
        self.region = region
        self.spec = spec
        self.policy = policy
        self.clock = clock
        self.dc_region = {d.name: d.region for d in dcs}
        self._all_dcs = [d.name for d in dcs]
        self._rr = 0
        self.snapshot: SnapshotView | None = None
        self.snapshot_received_s = float("-inf")
        self.window: list[RequestView] = []
        self.window_opened_s: float | None = None
        self.forward_window: list[tuple[str, str]] = []
        self.stats = SchedulerStats()
        # each own dispatch stands for one per regional scheduler (project_peers)
        self.projection_scale = (float(len({d.region for d in dcs}) or 1)
                                 if spec.project_peers else 1.0)
        # own dispatches since the snapshot (None: no snapshot, or project_dispatches off)
        self._projection: Projection | None = None
        self.record_estimates = False
        # id -> (TTFT, TPOT) estimated on the snapshot, then on the projected view (s)
        self.estimates: dict[str, tuple[float, float, float, float]] = {}
        self._predict: Callable[[RequestView], int] | None = None
        if spec.osl_mode == "predicted":
            from services.scheduler.osl import OslPredictor

            predictor = OslPredictor.load()
            self._predict = lambda r: predictor.median_tokens(r.isl_tokens, r.model, r.dataset)

    # ---------------------------------------------------------------- snapshots
    def on_snapshot(self, snap: SnapshotView, now: float) -> None:
        self.snapshot = snap
        self.snapshot_received_s = now
        self._projection = (Projection(snap, self.projection_scale)
                            if self.spec.project_dispatches else None)

    def view(self) -> SnapshotView | None:
        """The snapshot the policy sees: with ``project_dispatches``, the latest snapshot
        plus this scheduler's own dispatches since it was taken, as the iterative ILP
        projects a window: they join the batch up to the limit (the rest wait), their
        prompts join the queue and the KV cache (`Projection`). Completions since the
        snapshot are not subtracted, so the view errs on the loaded side until the next
        poll. With ``project_peers`` each dispatch counts `projection_scale` times (one per
        regional scheduler)."""
        if self._projection is None:
            return self.snapshot
        return self._projection.view()

    def snapshot_age(self, now: float) -> float:
        if self.snapshot is None:
            return float("inf")
        return now - self.snapshot.time_s

    def stale(self, now: float) -> bool:
        return self.snapshot_age(now) > self.spec.staleness_s

    # ---------------------------------------------------------------- window
    @property
    def batch(self) -> bool:
        return bool(self.policy.batch)

    def deadline(self) -> float | None:
        """When the open window must be flushed (None: no open window)."""
        if self.window_opened_s is None:
            return None
        return self.window_opened_s + self.spec.window_s

    def _open(self, now: float) -> None:
        if self.window_opened_s is None:
            self.window_opened_s = now

    def submit(self, req: RequestView, now: float) -> list[Dispatch]:
        """A request arriving at this region; with ``osl_mode: predicted`` the policy sees
        the OSL predictor's median instead of the oracle length."""
        if self._predict is not None:
            req = dataclasses.replace(req, osl_tokens=max(1, int(self._predict(req))))
        if not self.batch:
            return self._decide([req], now)
        self._open(now)
        self.window.append(req)
        if len(self.window) + len(self.forward_window) >= self.spec.window_max:
            return self.flush(now)
        return []

    def admit_forwarded(self, request_id: str, dc: str, now: float) -> list[Dispatch]:
        """A peer's request for one of our DCs: dispatch when our window closes."""
        self.stats.forwarded_in += 1
        if not self.batch:
            return [self._forwarded_dispatch(request_id, dc, now)]
        self._open(now)
        self.forward_window.append((request_id, dc))
        if len(self.window) + len(self.forward_window) >= self.spec.window_max:
            return self.flush(now)
        return []

    def flush(self, now: float) -> list[Dispatch]:
        reqs, fwd = self.window, self.forward_window
        self.window, self.forward_window, self.window_opened_s = [], [], None
        out = [self._forwarded_dispatch(rid, dc, now) for rid, dc in fwd]
        if reqs:
            out.extend(self._decide(reqs, now))
        return out

    def _forwarded_dispatch(self, request_id: str, dc: str, now: float) -> Dispatch:
        return Dispatch(request_id, dc, self.region, False, False, "", now, 0.0)

    # ---------------------------------------------------------------- decisions
    def _decide(self, reqs: list[RequestView], now: float) -> list[Dispatch]:
        st = self.stats
        if self.stale(now) or self.snapshot is None:
            out = [self._stale_dispatch(r, now) for r in reqs]
            st.tally([d.dc for d in out], [d.fallback for d in out], [d.reason for d in out])
            return out
        t0 = self.clock()
        view = self.view()
        assert view is not None
        decision = self.policy.decide(reqs, view, self.region, now)
        took = self.clock() - t0
        if self.record_estimates:
            self._record_estimates(reqs, view, decision.targets, now)
        proj = self._projection
        if proj is not None:
            for r, dc in zip(reqs, decision.targets, strict=True):
                if dc:
                    proj.add(dc, r.isl_tokens)
        st.tally(decision.targets, decision.fallback, decision.fallback_reason)
        st.solver_status[decision.status] = st.solver_status.get(decision.status, 0) + 1
        out = []
        for k, r in enumerate(reqs):
            dc = decision.targets[k] or ""
            out.append(self._finish(r.id, dc, decision.fallback[k],
                                    decision.fallback_reason[k], now, took))
        return out

    def _record_estimates(self, reqs: list[RequestView], view: SnapshotView,
                          targets: Sequence[str | None], now: float) -> None:
        """Keep the shared estimator's TTFT/TPOT for each chosen DC (accuracy studies)."""
        assert self.snapshot is not None
        raw = self.policy.estimator.estimate(reqs, self.snapshot, now_s=now, region=self.region)
        est = self.policy.estimator.estimate(reqs, view, now_s=now, region=self.region)
        col = {name: j for j, name in enumerate(est.dc_names)}
        for k, (r, dc) in enumerate(zip(reqs, targets, strict=True)):
            if dc and dc in col:
                j = col[dc]
                self.estimates[r.id] = (float(raw.ttft_s[k, j]), float(raw.tpot_s[k, j]),
                                        float(est.ttft_s[k, j]), float(est.tpot_s[k, j]))

    def _stale_dispatch(self, r: RequestView, now: float) -> Dispatch:
        self.stats.stale_decisions += 1
        up = self._up_dcs()
        if not up:
            return self._finish(r.id, "", True, "stale_snapshot", now, 0.0)
        dc = up[self._rr % len(up)]
        self._rr += 1
        return self._finish(r.id, dc, True, "stale_snapshot", now, 0.0)

    def _up_dcs(self) -> list[str]:
        if self.snapshot is None:
            return list(self._all_dcs)
        down = {d.dc for d in self.snapshot.dcs if not d.up}
        return [d for d in self._all_dcs if d not in down]

    def _finish(self, rid: str, dc: str, fallback: bool, reason: str, now: float,
                took: float) -> Dispatch:
        if not dc:
            return Dispatch(rid, "", "", False, fallback, reason or "no_dc", now, took)
        region = self.dc_region.get(dc, self.region)
        forward = region != self.region
        if forward:
            self.stats.forwarded += 1
        else:
            self.stats.local += 1
        return Dispatch(rid, dc, region, forward, fallback, reason, now, took)

    def local_fallback(self, exclude: str, now: float) -> str:
        """A local DC other than `exclude` for a request whose target did not answer."""
        local = [d for d in self._up_dcs() if self.dc_region.get(d) == self.region and d != exclude]
        if not local:
            return ""
        dc = local[self._rr % len(local)]
        self._rr += 1
        self.stats.fallbacks += 1
        return dc

