"""A virtual clock: an event heap that runs callbacks in time order without sleeping.

Rules
-----
* ``call_at(t, fn, *args)`` schedules ``fn(*args)`` at emulated time ``t`` (never before
  ``now``); ties run in scheduling order (FIFO), so runs are deterministic.
* ``run(until)`` pops events in order, setting ``now()`` to each event's time, and stops
  when the heap is empty or the next event is after ``until`` (``now()`` is then
  ``until``).
* It implements `services.runtime.clock.Clock`, as the wall clock does.
* Callbacks may schedule more events. Cancelled handles are skipped.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from services.model.errors import UsageError


class Handle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s
        self._heap: list[tuple[float, int, Handle, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.events_run = 0

    def now(self) -> float:
        return self._now

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any) -> Handle:
        if t < self._now - 1e-9:
            raise UsageError(f"cannot schedule at {t} before now={self._now}")
        h = Handle()
        heapq.heappush(self._heap, (max(t, self._now), next(self._seq), h, fn, args))
        return h

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Handle:
        return self.call_at(self._now + delay, fn, *args)

    def peek(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def run(self, until: float = float("inf")) -> None:
        heap = self._heap
        while heap:
            t, _, h, fn, args = heap[0]
            if t > until:
                break
            heapq.heappop(heap)
            if h.cancelled:
                continue
            self._now = t
            self.events_run += 1
            fn(*args)
        if until != float("inf") and until > self._now:
            self._now = until
