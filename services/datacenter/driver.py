"""The datacenter's driver: steps every engine of a `Datacenter` on any `Clock`.

Both runtimes run their engines through `DcDriver` (and calibration replays through
`EngineDriver`); they differ only in the clock
and in what they do with the events:

* `kick(idx)` after a request was enqueued: an idle engine plans its next step from now,
  or from the (transport-compensated) arrival of its oldest waiting request if that is
  earlier, never before the engine's own time; a busy engine's decode run is cut at its
  next step boundary (`Engine.cut`), where the request can join, and its timer moved.
* `set_frequency` changes the DC's GPU clock and cuts every run the same way, so the new
  clock applies from the next step, as without runs.
* Each step ends with a timer at its planned end (an absolute deadline, so wake-up jitter
  does not accumulate). The wake-up's lateness (now − planned end, 0 on the virtual
  clock) is recorded in the DC's lateness record; the step completes at its planned end
  and the next one is planned from there — or, past ``resync_s`` of lateness, from now
  (a resync, counted: the emulation fell behind).
* Completions are counted on the DC (``dc.completed``) and the events of each step go to
  ``on_events(idx, events)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.datacenter.dc import Datacenter, LatenessStats
from services.datacenter.engine import Engine, EngineEvent, EngineRequest, Finished
from services.runtime.clock import Cancellable, Clock

EventsSink = Callable[[int, Sequence[EngineEvent]], None]


class EngineDriver:
    """Steps a set of engines on a clock (a DC's, or a replay's without a DC)."""

    def __init__(self, engines: Sequence[Engine], clock: Clock, on_events: EventsSink,
                 lateness: LatenessStats | None = None, resync_s: float = 0.05) -> None:
        self.engines = engines
        self.clock = clock
        self.on_events = on_events
        self.lateness = lateness
        self.resync_s = resync_s
        self._timers: list[Cancellable | None] = [None] * len(engines)
        self.stopped = False

    def kick(self, idx: int) -> None:
        """Engine `idx` got a request: plan a step if it is idle, or end its decode run
        at the next step boundary, where the request can join."""
        eng = self.engines[idx]
        if self.stopped:
            return
        if eng.busy:
            self._cut(idx, self.clock.now())
            return
        t = self.clock.now()
        oldest = eng.oldest_waiting_arrival_s()
        if oldest is not None:
            t = min(t, oldest)
        self._plan(idx, t)

    def _plan(self, idx: int, t: float) -> None:
        eng = self.engines[idx]
        plan = eng.next_step(max(t, eng.now_s))
        if plan is None and eng.waiting:  # arrivals after t: plan again from the actual time
            now = self.clock.now()
            if now > t:
                plan = eng.next_step(max(now, eng.now_s))
        if plan is None:
            self._timers[idx] = None
            return
        self._timers[idx] = self.clock.call_at(plan.end_s, self._complete, idx, plan.end_s)

    def _cut(self, idx: int, t: float) -> None:
        end = self.engines[idx].cut(t)
        if end is not None:
            timer = self._timers[idx]
            if timer is not None:
                timer.cancel()
            self._timers[idx] = self.clock.call_at(end, self._complete, idx, end)

    def cut_all(self) -> None:
        """End every decode run at its next step boundary (the step formulas changed)."""
        now = self.clock.now()
        for idx, eng in enumerate(self.engines):
            if eng.busy:
                self._cut(idx, now)

    def _complete(self, idx: int, end_s: float) -> None:
        if self.stopped:
            return
        lateness = self.clock.now() - end_s
        if self.lateness is not None:
            self.lateness.add(max(lateness, 0.0), end_s)
        self.on_events(idx, self.engines[idx].complete_step(end_s))
        t = end_s
        if lateness > self.resync_s:
            if self.lateness is not None:
                self.lateness.resyncs += 1
            t = self.clock.now()
        self._plan(idx, t)

    def stop(self) -> None:
        self.stopped = True
        for h in self._timers:
            if h is not None:
                h.cancel()


class DcDriver(EngineDriver):
    """The engines of a `Datacenter`: completions counted on the DC, lateness recorded
    (``record_lateness`` off: not recorded, e.g. on a virtual clock, where it is 0)."""

    def __init__(self, dc: Datacenter, clock: Clock, on_events: EventsSink,
                 resync_s: float = 0.05, record_lateness: bool = True) -> None:
        self.dc = dc
        self._sink = on_events
        super().__init__(dc.engines, clock, self._count,
                         dc.lateness if record_lateness else None, resync_s)

    def _count(self, idx: int, events: Sequence[EngineEvent]) -> None:
        for ev in events:
            if isinstance(ev, Finished):
                self.dc.completed += 1
        self._sink(idx, events)

    def set_frequency(self, mhz: float, field: str = "gpu_frequency_mhz") -> float:
        """Set the DC's GPU clock (`Datacenter.set_frequency`) from the next step on."""
        level = self.dc.set_frequency(mhz, field)
        self.cut_all()
        return level

    def submit(self, req: EngineRequest, model: str = "") -> int:
        """Route and enqueue at ``req.arrival_s`` (raises InvalidInput / CapacityExceeded /
        Unavailable); returns the engine index."""
        idx = self.dc.submit(req, model, req.arrival_s)
        self.kick(idx)
        return idx

    def crash(self) -> list[tuple[int, EngineRequest]]:
        """Lose every request in flight (a killed DC process)."""
        return self.dc.fail_all(self.clock.now())
