"""Replays of a fixed request log through engines on a virtual clock.

`replay` runs a log through engines with every decision fixed (paper 1 §V-B), for
calibration checks, with the same `EngineDriver` that steps the runtimes' engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.config.calibration import Calibration
from services.datacenter.driver import EngineDriver
from services.datacenter.engine import (
    Engine,
    EngineConfig,
    EngineEvent,
    EngineRequest,
    Finished,
    FinishedRequest,
)
from services.runtime.vclock import VirtualClock


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

    def collect(i: int, events: Sequence[EngineEvent]) -> None:
        for ev in events:
            if isinstance(ev, Finished):
                done[ev.request_id] = ev.finished

    driver = EngineDriver(engines, clock, collect)

    def arrive(k: int) -> None:
        it = items[k]
        engines[it.engine].enqueue(
            EngineRequest(str(k), it.isl_tokens, it.osl_tokens, clock.now()), clock.now()
        )
        driver.kick(it.engine)

    for k, it in enumerate(items):
        if not 0 <= it.engine < n_engines:
            from services.model.errors import InvalidInput

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
