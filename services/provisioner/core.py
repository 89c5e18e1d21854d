"""Sans-IO provisioner: poll schedule, DC up/down marking, snapshot sequencing.

Theory of operation (paper 1 §III-A, §III-C)
--------------------------------------------
* Every poll period Δp the provisioner pulls each DC's counters (averaged over its
  engines, with the DC's CI) and broadcasts them, with the inter-region RTT matrix, to
  every scheduler as a `SnapshotData`.
* Schedule. Period k starts at ``start_s + k·Δp``. In ``sync`` mode every DC is polled at
  the start of each period; in ``async`` mode DC i (0-based, in configuration order) is
  polled at offset ``i·Δp/n`` within each period, so the polls are staggered.
* Publication. ``sync``: one snapshot per period, as soon as every poll of that period
  has a result (success or failure). ``async``: one snapshot after every poll result, so
  snapshots are spread over the period (n per period) while each DC's entry is still
  refreshed once per Δp — "staggered polling only spreads the snapshots over time
  without reducing their age" (paper 1 §V-C).
* Up/down. A DC is marked down when a poll fails or times out (the runtime reports it
  with `on_poll_failed`) or when the DC itself reports it is not up (draining); it is
  up again after the next successful poll. While down its last known counters are kept
  and published with ``up=False``. A DC never reached yet is published with no counters.
* At most one poll per DC is in flight. A slot that comes while the previous poll is
  still outstanding, or that the runtime woke up too late for (it was overtaken by a
  later slot), is skipped and counted, never queued.
* Sequence numbers start at 1 and grow by one per published snapshot.
* Counting. `window_stats(since, until)` counts polls by their scheduled slot and
  snapshots by the slot of the poll that completed them, over ``[since, until)``: over a
  window of m whole periods that is exactly m·n polls, and m (sync) or m·n (async)
  snapshots when no poll is skipped — whichever clock drives the core.

`services.provisioner.driver.ProvisionerDriver` runs this core on either clock.

The core is generic over the DC state payload ``S`` (a protobuf ``DcState`` in the wall
runtime, any plain object in a virtual one); it never inspects it. Times are emulated
seconds; the runtime owns clocks, sockets and deadlines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from services.model.errors import InvalidInput, UsageError

S = TypeVar("S")

MODES = ("sync", "async")


@dataclass(frozen=True)
class DcInfo:
    """A DC the provisioner polls (static, from the topology)."""

    dc: str
    region: str
    zone: str = ""


@dataclass(frozen=True)
class Poll:
    """One poll the runtime must issue now: `dc`'s slot of period `period`."""

    dc: str
    period: int
    scheduled_s: float


@dataclass(frozen=True)
class Transition:
    """A DC changed between up and down."""

    dc: str
    up: bool
    time_s: float
    reason: str          # why it went down ("" when it came back up)


@dataclass(frozen=True)
class DcEntry(Generic[S]):
    """One DC in a snapshot: its last known state and whether it is up now."""

    dc: str
    region: str
    zone: str
    up: bool
    state: S | None          # last state a successful poll returned (None: never reached)
    last_ok_s: float | None  # emulated time of the last successful poll result
    failures: int            # consecutive failed polls
    last_error: str


@dataclass(frozen=True)
class SnapshotData(Generic[S]):
    """The provisioner's global view, published every Δp (sync) or every poll (async)."""

    seq: int
    time_s: float
    period_s: float
    dcs: tuple[DcEntry[S], ...]
    rtt_s: Mapping[tuple[str, str], float]


@dataclass(frozen=True)
class PollOutcome(Generic[S]):
    """What one poll result caused: an up/down transition and/or a new snapshot."""

    transition: Transition | None
    snapshot: SnapshotData[S] | None


@dataclass(frozen=True)
class ProvisionerStats:
    polls: int
    failures: int
    skipped: int
    snapshots: int


@dataclass
class _DcSlot(Generic[S]):
    info: DcInfo
    offset_s: float
    next_period: int = 0
    in_flight: Poll | None = None
    up: bool = False
    ever_up: bool = False
    state: S | None = None
    last_ok_s: float | None = None
    failures: int = 0
    last_error: str = "not polled yet"


@dataclass
class _Counters:
    polls: int = 0
    failures: int = 0
    skipped: int = 0
    snapshots: int = 0
    pending: dict[int, set[str]] = field(default_factory=dict)


class ProvisionerCore(Generic[S]):
    """Poll schedule and snapshot aggregation for a fixed set of DCs."""

    def __init__(
        self,
        dcs: Sequence[DcInfo],
        rtt_s: Mapping[tuple[str, str], float],
        period_s: float,
        mode: str = "sync",
        start_s: float = 0.0,
    ) -> None:
        if not dcs:
            raise InvalidInput("dcs", "the provisioner needs at least one DC")
        names = [d.dc for d in dcs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InvalidInput("dcs", f"duplicate DC names {dup}")
        if not (period_s > 0 and math.isfinite(period_s)):
            raise InvalidInput("period_s", f"must be a finite number > 0, got {period_s}")
        if mode not in MODES:
            raise InvalidInput("mode", f"expected one of {list(MODES)}, got {mode!r}")
        self.period_s = period_s
        self.mode = mode
        self.start_s = start_s
        self.rtt_s: Mapping[tuple[str, str], float] = dict(rtt_s)
        n = len(dcs)
        self._slots: dict[str, _DcSlot[S]] = {
            d.dc: _DcSlot(d, i * period_s / n if mode == "async" else 0.0)
            for i, d in enumerate(dcs)
        }
        self._c = _Counters()
        self._poll_slots: list[float] = []
        self._snap_slots: list[float] = []
        self._seq = 0
        self.latest: SnapshotData[S] | None = None

    # ------------------------------------------------------------------ schedule
    def slot_s(self, dc: str, period: int) -> float:
        """Emulated time of `dc`'s poll in period `period`."""
        return self.start_s + period * self.period_s + self._slot(dc).offset_s

    def next_poll_s(self) -> float:
        """Earliest scheduled time of a poll not yet issued (the runtime's next wake-up)."""
        return min(self.slot_s(s.info.dc, s.next_period) for s in self._slots.values())

    def next_polls(self) -> list[tuple[float, str]]:
        """The next slot (time, dc) of every DC, in time order; read-only."""
        return sorted((self.slot_s(s.info.dc, s.next_period), s.info.dc)
                      for s in self._slots.values())

    def due(self, now: float) -> list[Poll]:
        """Issue every poll whose slot is at or before `now` (marks them in flight).

        Per DC only the latest slot at or before `now` is issued; earlier ones it
        overtook, and a slot whose DC still has a poll in flight, are skipped.
        """
        out: list[Poll] = []
        for s in self._slots.values():
            if self.slot_s(s.info.dc, s.next_period) > now:
                continue
            k = math.floor((now - self.start_s - s.offset_s) / self.period_s)
            k = max(k, s.next_period)
            while self.slot_s(s.info.dc, k) > now:  # float guard
                k -= 1
            self._c.skipped += k - s.next_period
            s.next_period = k + 1
            if s.in_flight is not None:
                self._c.skipped += 1
                continue
            poll = Poll(s.info.dc, k, self.slot_s(s.info.dc, k))
            s.in_flight = poll
            self._c.polls += 1
            self._poll_slots.append(poll.scheduled_s)
            if self.mode == "sync":
                self._c.pending.setdefault(k, set()).add(s.info.dc)
            out.append(poll)
        out.sort(key=lambda p: (p.scheduled_s, p.dc))
        return out

    # ------------------------------------------------------------------ results
    def on_poll_ok(self, poll: Poll, state: S, now: float, dc_up: bool = True) -> PollOutcome[S]:
        """A poll returned `state`; `dc_up` False when the DC says it is not up (draining)."""
        s = self._resolve(poll)
        s.state = state
        s.last_ok_s = now
        s.failures = 0
        s.last_error = "" if dc_up else "datacenter reports it is not up (draining)"
        return self._finish(s, poll, dc_up, now)

    def on_poll_failed(self, poll: Poll, now: float, reason: str) -> PollOutcome[S]:
        """A poll failed or timed out; the DC is down until a poll succeeds."""
        s = self._resolve(poll)
        s.failures += 1
        s.last_error = reason or "poll failed"
        self._c.failures += 1
        return self._finish(s, poll, False, now)

    def _resolve(self, poll: Poll) -> _DcSlot[S]:
        s = self._slot(poll.dc)
        if s.in_flight != poll:
            raise UsageError(f"poll {poll} is not in flight (in flight: {s.in_flight})")
        s.in_flight = None
        return s

    def _finish(self, s: _DcSlot[S], poll: Poll, up: bool, now: float) -> PollOutcome[S]:
        transition = None
        # a DC never reached starts down silently; report its first failure and every change
        if up != s.up or (not up and not s.ever_up and s.failures == 1):
            transition = Transition(s.info.dc, up, now, "" if up else s.last_error)
        s.up = up
        s.ever_up = s.ever_up or up
        snapshot = None
        if self.mode == "async":
            snapshot = self._publish(now, poll.scheduled_s)
        else:
            pending = self._c.pending.get(poll.period)
            if pending is not None:
                pending.discard(s.info.dc)
                if not pending:
                    del self._c.pending[poll.period]
                    snapshot = self._publish(now, poll.scheduled_s)
        return PollOutcome(transition, snapshot)

    def _publish(self, now: float, slot_s: float) -> SnapshotData[S]:
        self._seq += 1
        self._c.snapshots += 1
        self._snap_slots.append(slot_s)
        snap = SnapshotData(
            seq=self._seq,
            time_s=now,
            period_s=self.period_s,
            dcs=tuple(
                DcEntry(s.info.dc, s.info.region, s.info.zone, s.up, s.state, s.last_ok_s,
                        s.failures, s.last_error)
                for s in self._slots.values()
            ),
            rtt_s=self.rtt_s,
        )
        self.latest = snap
        return snap

    # ------------------------------------------------------------------ queries
    @property
    def dcs(self) -> tuple[DcInfo, ...]:
        return tuple(s.info for s in self._slots.values())

    def is_up(self, dc: str) -> bool:
        return self._slot(dc).up

    def in_flight(self) -> list[Poll]:
        return [s.in_flight for s in self._slots.values() if s.in_flight is not None]

    def stats(self) -> ProvisionerStats:
        c = self._c
        return ProvisionerStats(c.polls, c.failures, c.skipped, c.snapshots)

    def window_stats(self, since_s: float, until_s: float = math.inf) -> ProvisionerStats:
        """Polls and snapshots whose slot lies in ``[since_s, until_s)``; failures and
        skipped slots of the whole run."""
        def count(slots: list[float]) -> int:
            return sum(1 for t in slots if since_s <= t < until_s)

        c = self._c
        return ProvisionerStats(count(self._poll_slots), c.failures, c.skipped,
                                count(self._snap_slots))

    def _slot(self, dc: str) -> _DcSlot[S]:
        try:
            return self._slots[dc]
        except KeyError:
            raise UsageError(f"unknown DC {dc!r}; known: {list(self._slots)}") from None
