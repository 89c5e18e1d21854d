"""The provisioner's driver: `ProvisionerCore` on any `Clock`, for both runtimes.

* It wakes at the core's next poll slot (``clock.call_at``), asks the core which polls are
  due and hands each to the transport's `issue` callback: the wall runtime sends a
  `GetState` RPC and reports back later; the virtual runtime reads the DC core and
  reports back at once. Either way the result comes back through `ok` / `failed`.
* Every outcome's transition goes to `on_transition` and every snapshot to `publish`.
* With ``until_s`` it stops arming wake-ups past that time (the virtual runtime stops
  polling when the load ends, so the run ends at the last completion).
* A wake-up later than one period is reported through `on_late` (the wall runtime logs it).
* With ``occupancy`` (state -> active batch / batch limit) every successful poll's
  occupancy is kept by slot; `window_stats` gives the counts and the mean occupancy
  over a window — the load regime of a run (paper 1: < 15 % low, 15–40 % moderate).

The driver holds no transport and no clock of its own: the two runtimes differ only in
`issue` and in the clock they pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from services.config.topology import Topology
from services.provisioner.core import (
    DcInfo,
    Poll,
    PollOutcome,
    ProvisionerCore,
    SnapshotData,
    Transition,
)
from services.runtime.clock import Cancellable, Clock

S = TypeVar("S")


@dataclass(frozen=True)
class WindowStats:
    """Polls and snapshots by slot over a window, failures and skipped slots of the whole
    run, and the mean occupancy of the window's successful polls."""

    mode: str
    period_s: float
    polls: int
    snapshots: int
    failures: int
    skipped: int
    mean_batch_ratio: float | None
    occupancy_samples: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def core_for_topology(topo: Topology, start_s: float, period_s: float | None = None,
                      mode: str | None = None) -> ProvisionerCore[Any]:
    """The provisioner core of a topology (both runtimes build it here)."""
    return ProvisionerCore(
        [DcInfo(d.name, d.region, d.zone) for d in topo.dcs],
        topo.rtt_s,
        period_s=topo.provisioner.period_s if period_s is None else period_s,
        mode=mode or topo.provisioner.mode,
        start_s=start_s,
    )


class ProvisionerDriver(Generic[S]):
    def __init__(
        self,
        core: ProvisionerCore[S],
        clock: Clock,
        issue: Callable[[Poll], Any],
        publish: Callable[[SnapshotData[S]], None],
        on_transition: Callable[[Transition], None] | None = None,
        on_late: Callable[[float], None] | None = None,
        until_s: float = math.inf,
        occupancy: Callable[[S], float] | None = None,
    ) -> None:
        self.core = core
        self.clock = clock
        self.issue = issue
        self.publish = publish
        self.on_transition = on_transition
        self.on_late = on_late
        self.until_s = until_s
        self.occupancy = occupancy
        self._occ: list[tuple[float, float]] = []  # (slot, active batch / limit)
        self._handle: Cancellable | None = None
        self.closed = False

    def start(self) -> None:
        self._arm()

    def stop(self) -> None:
        self.closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        if self.closed:
            return
        t = self.core.next_poll_s()
        if t > self.until_s:
            self._handle = None
            return
        self._handle = self.clock.call_at(t, self._wake, t)

    def _wake(self, t: float) -> None:
        if self.closed:
            return
        now = self.clock.now()
        if self.on_late is not None and now - t > self.core.period_s:
            self.on_late(now - t)
        for poll in self.core.due(now):
            self.issue(poll)
        self._arm()

    # ---------------------------------------------------------------- results
    def ok(self, poll: Poll, state: S, dc_up: bool = True) -> None:
        if self.occupancy is not None:
            self._occ.append((poll.scheduled_s, self.occupancy(state)))
        self._apply(self.core.on_poll_ok(poll, state, self.clock.now(), dc_up=dc_up))

    def failed(self, poll: Poll, reason: str) -> None:
        self._apply(self.core.on_poll_failed(poll, self.clock.now(), reason))

    def window_stats(self, since_s: float, until_s: float = math.inf) -> WindowStats:
        st = self.core.window_stats(since_s, until_s)
        occ = [r for t, r in self._occ if since_s <= t < until_s]
        return WindowStats(self.core.mode, self.core.period_s, st.polls, st.snapshots,
                           st.failures, st.skipped,
                           sum(occ) / len(occ) if occ else None, len(occ))

    def _apply(self, outcome: PollOutcome[S]) -> None:
        if outcome.transition is not None and self.on_transition is not None:
            self.on_transition(outcome.transition)
        if outcome.snapshot is not None:
            self.publish(outcome.snapshot)
