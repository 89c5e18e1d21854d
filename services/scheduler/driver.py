"""The regional scheduler's driver: window timer, forwarding, back path, origin latencies.

Both runtimes run a `SchedulerCore` through this driver on their own `Clock`; they differ
only in the `Transport` (gRPC streams, or direct calls into the other components):

* `submit` / `forwarded_in` hand a request to the core; a window policy's window is
  flushed by a timer at the core's `deadline()` (a timer that fires for a window flushed
  early by ``window_max`` re-arms for the current one).
* Each dispatch is ready at ``decided_s + charge(decision_s)``: the policy's measured
  solve time in emulated seconds (the wall clock has already spent it: wall s / k; the
  virtual clock charges it, or not, by the runtime's choice). A local DC gets the request
  then (`Transport.to_dc`); a DC in another region gets it through that region's
  scheduler RTT/2 later (`Transport.to_peer`); a request no DC can take is rejected then.
* Origin side: every request submitted here has a `Journey` — the origin's stamps and
  decision. Events of a forwarded request reach the origin RTT/2 after they happened at
  the DC (`deliver`); `Journey.latencies` gives TTFT and e2e from the origin's arrival,
  the one place they are computed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from services.config.topology import Topology
from services.model.state import RequestView, latencies
from services.runtime.clock import Cancellable, Clock
from services.scheduler.core import Dispatch, SchedulerCore

NO_DC = "no datacenter can serve the request"


class Transport(Protocol):
    def to_dc(self, rid: str, dc: str) -> None: ...

    def to_peer(self, region: str, rid: str, dc: str, arrive_s: float) -> None: ...

    def reject(self, rid: str, reason: str) -> None: ...


@dataclass(slots=True)
class Journey:
    """The origin scheduler's view of one request (emulated seconds)."""

    arrival_s: float
    decided_s: float = math.nan      # when the decision was ready (solve time included)
    decision_s: float = math.nan     # wall seconds the policy took
    fallback: bool = False
    forwarded: bool = False
    via_region: str = ""             # the region it was forwarded to
    target_dc: str = ""
    target_region: str = ""
    back_s: float = 0.0              # RTT/2 from the DC's region back to the origin
    first_token_origin_s: float = math.nan

    def latencies(self, first_token_dc_s: float, completed_dc_s: float
                  ) -> tuple[float, float, float, float]:
        """(first token at the origin, completion at the origin, TTFT, e2e)."""
        ft = self.first_token_origin_s
        if math.isnan(ft):
            ft = first_token_dc_s + self.back_s
        done = completed_dc_s + self.back_s
        ttft, e2e = latencies(self.arrival_s, ft, done)
        return ft, done, ttft, e2e


def core_for_region(topo: Topology, region: str, policy_clock: Callable[[], float]
                    ) -> SchedulerCore:
    """A region's scheduler core with its policy (both runtimes build it here). The
    policy's generator is seeded with the load seed + 1000 + the region's index."""
    from services.scheduler.policies.registry import get_policy

    names = [r.name for r in topo.regions]
    spec = topo.region(region).scheduler
    policy = get_policy(
        spec.policy,
        clock=policy_clock,
        rng=np.random.default_rng(topo.load.seed + 1000 + names.index(region)),
        **dict(spec.policy_config),
    )
    return SchedulerCore(region, spec, topo.dcs, policy, clock=policy_clock)


class SchedulerDriver:
    def __init__(
        self,
        core: SchedulerCore,
        clock: Clock,
        rtt_s: Mapping[tuple[str, str], float],
        transport: Transport,
        charge: Callable[[float], float],
        on_decision: Callable[[Dispatch], None] | None = None,
    ) -> None:
        self.core = core
        self.clock = clock
        self.rtt_s = rtt_s
        self.transport = transport
        self.charge = charge
        self.on_decision = on_decision
        self.journeys: dict[str, Journey] = {}
        self._timer: Cancellable | None = None
        self._timer_at = math.inf

    # ---------------------------------------------------------------- intake
    def submit(self, view: RequestView) -> Journey:
        """A request arriving at this (its origin) scheduler now."""
        j = Journey(arrival_s=view.arrival_s)
        self.journeys[view.id] = j
        self._handle(self.core.submit(view, self.clock.now()))
        self._arm()
        return j

    def forwarded_in(self, rid: str, dc: str) -> None:
        """A peer's request for one of this region's DCs, arriving now."""
        self._handle(self.core.admit_forwarded(rid, dc, self.clock.now()))
        self._arm()

    # ---------------------------------------------------------------- window
    def _arm(self) -> None:
        deadline = self.core.deadline()
        if deadline is None or deadline >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.clock.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        deadline = self.core.deadline()
        now = self.clock.now()
        if deadline is not None and deadline <= now:
            self._handle(self.core.flush(now))
        self._arm()

    # ---------------------------------------------------------------- dispatch
    def _handle(self, dispatches: list[Dispatch]) -> None:
        for d in dispatches:
            ready = d.decided_s + self.charge(d.decision_s)
            j = self.journeys.get(d.request_id)
            if j is not None and math.isnan(j.decided_s):
                j.decided_s, j.decision_s, j.fallback = ready, d.decision_s, d.fallback
                if self.on_decision is not None:
                    self.on_decision(d)
            if not d.dc:
                self.clock.call_at(ready, self.transport.reject, d.request_id, NO_DC)
                continue
            if j is not None:
                j.target_dc, j.target_region = d.dc, d.region
            if d.forward:
                half = self.rtt_s[(self.core.region, d.region)] / 2
                if j is not None:
                    j.forwarded, j.via_region, j.back_s = True, d.region, half
                self.clock.call_at(ready + half, self.transport.to_peer, d.region,
                                   d.request_id, d.dc, ready + half)
            else:
                self.clock.call_at(ready, self.transport.to_dc, d.request_id, d.dc)

    def fell_back(self, rid: str, dc: str) -> None:
        """The transport sent `rid` to local DC `dc` instead (its target or peer was down)."""
        j = self.journeys.get(rid)
        if j is not None:
            j.fallback, j.forwarded, j.via_region, j.back_s = True, False, "", 0.0
            j.target_dc, j.target_region = dc, self.core.region

    # ---------------------------------------------------------------- back path
    def deliver(self, rid: str, time_s: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(t_origin, *args)`` when an event at the DC at `time_s` reaches the
        origin: at once for a local request, RTT/2 later for a forwarded one."""
        j = self.journeys.get(rid)
        back = j.back_s if j is not None else 0.0
        if back == 0.0:
            fn(time_s, *args)
        else:
            self.clock.call_at(time_s + back, fn, time_s + back, *args)

    def first_token(self, rid: str, t_origin: float) -> None:
        j = self.journeys.get(rid)
        if j is not None:
            j.first_token_origin_s = t_origin

    def done(self, rid: str) -> Journey | None:
        """The request's journey ends (its record is written)."""
        return self.journeys.pop(rid, None)
