"""Virtual-clock drivers of the datacenter core: the same engines, no sleeping.

`VirtualDcRuntime` runs a `Datacenter` on a shared `VirtualClock` (the virtual runtime of
the whole topology uses one clock for every component). `replay` runs a fixed request log
through engines with every decision fixed (paper 1 §V-B), for calibration checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.calibration import Calibration
from services.common.vclock import VirtualClock
from services.datacenter.dc import Datacenter
from services.datacenter.engine import (
    FINISHED,
    Engine,
    EngineConfig,
    EngineEvent,
    EngineRequest,
    FinishedRequest,
)

EventSink = Callable[[int, EngineEvent], None]


class VirtualDcRuntime:
    """Drives every engine of a DC on a virtual clock; events go to `on_event`."""

    def __init__(self, dc: Datacenter, clock: VirtualClock, on_event: EventSink) -> None:
        self.dc = dc
        self.clock = clock
        self.on_event = on_event

    def submit(self, req: EngineRequest, model: str = "") -> int:
        """Submit at the clock's now (raises InvalidInput / CapacityExceeded / Unavailable)."""
        req.arrival_s = self.clock.now()
        idx = self.dc.submit(req, model, self.clock.now())
        self._kick(idx)
        return idx

    def _kick(self, idx: int) -> None:
        eng = self.dc.engines[idx]
        if eng.busy:
            return
        plan = eng.next_step(self.clock.now())
        if plan is not None:
            self.clock.call_at(plan.end_s, self._complete, idx)

    def _complete(self, idx: int) -> None:
        eng = self.dc.engines[idx]
        events = eng.complete_step(self.clock.now())
        for ev in events:
            if ev.kind == FINISHED:
                self.dc.completed += 1
            self.on_event(idx, ev)
        self._kick(idx)

    def crash(self) -> list[tuple[int, EngineRequest]]:
        """Lose every request in flight (a killed DC process)."""
        return self.dc.fail_all(self.clock.now())


@dataclass(frozen=True)
class ReplayItem:
    arrival_s: float
    isl_tokens: int
    osl_tokens: int
    engine: int


@dataclass(frozen=True)
class ReplayResult:
    finished: list[FinishedRequest]          # in input order
    gpu_active_j: float
    gpu_idle_j: float
    end_s: float

    @property
    def gpu_energy_j(self) -> float:
        return self.gpu_active_j + self.gpu_idle_j


def replay(
    cal: Calibration,
    items: Sequence[ReplayItem],
    n_engines: int,
    config: EngineConfig | None = None,
    frequency_mhz: float | None = None,
) -> ReplayResult:
    """Run `items` through `n_engines` engines, each request on its logged engine.

    Every request runs to completion; the queue limit is lifted so nothing is refused.
    GPU energy is counted from t=0 to the last completion.
    """
    cfg = config or EngineConfig(max_queue=len(items) + 1)
    clock = VirtualClock(0.0)
    engines = [Engine(cal, f"e{i}", cfg, 0.0) for i in range(n_engines)]
    if frequency_mhz is not None:
        for e in engines:
            e.perf.set_frequency(frequency_mhz)
    done: dict[str, FinishedRequest] = {}

    def kick(i: int) -> None:
        eng = engines[i]
        if not eng.busy:
            plan = eng.next_step(clock.now())
            if plan is not None:
                clock.call_at(plan.end_s, complete, i)

    def complete(i: int) -> None:
        for ev in engines[i].complete_step(clock.now()):
            if ev.finished is not None:
                done[ev.request_id] = ev.finished
        kick(i)

    def arrive(k: int) -> None:
        it = items[k]
        engines[it.engine].enqueue(
            EngineRequest(str(k), it.isl_tokens, it.osl_tokens, clock.now()), clock.now()
        )
        kick(it.engine)

    for k, it in enumerate(items):
        if not 0 <= it.engine < n_engines:
            from services.common.errors import InvalidInput

            raise InvalidInput("engine", f"item {k}: engine {it.engine} not in [0, {n_engines})")
        clock.call_at(it.arrival_s, arrive, k)
    clock.run()
    end = clock.now()
    return ReplayResult(
        finished=[done[str(k)] for k in range(len(items))],
        gpu_active_j=sum(e.energy.active_j for e in engines),
        gpu_idle_j=sum(e.idle_energy_j(end) for e in engines),
        end_s=end,
    )
