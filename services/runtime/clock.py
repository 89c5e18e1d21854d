"""Clocks: one interface, two implementations.

Every driver (engine stepping, provisioner polling, the scheduler's window, forwarding,
the back path) is written against `Clock`: ``now()`` in emulated seconds and
``call_at(t, fn, *args)`` to run a callback at emulated time ``t``. The logic never knows
which clock it runs on — as SimPy's `RealtimeEnvironment` only overrides ``step()``.

* `WallClock` — emulated time t maps to wall time ``epoch_unix + t * dilation``: every
  sleep, RTT, window and poll period is stretched by the dilation factor k >= 1, and every
  recorded latency is emulated time (wall / k). All processes of a run get the same
  epoch, so their emulated clocks agree. ``call_at`` goes through the running asyncio
  loop; `sleep_until` returns how late the wake-up was (emulated seconds) — the overrun
  detector's sample. asyncio waits in ``epoll_wait``, whose timeout has a resolution of
  1 ms, rounded up: a timer fires 0-1 ms late before any scheduling delay. So
  ``call_at`` arms the loop's timer `EARLY_S` before the deadline and sleeps the rest
  (``time.sleep``, accurate to tens of µs) before running the callback; the loop is held
  for at most `EARLY_S` per timer.
* `services.runtime.vclock.VirtualClock` — an event heap that runs callbacks in time order
  without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from services.model.errors import InvalidInput


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What a driver needs of a clock."""

    def now(self) -> float:
        """Emulated seconds."""
        ...

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any) -> Cancellable:
        """Run ``fn(*args)`` at emulated time `t` (at once if `t` has passed)."""
        ...


EARLY_S = 0.0012  # wall s: above epoll's 1 ms rounding of the loop's timeout


def _at_deadline(deadline: float, fn: Callable[..., Any], *args: Any) -> None:
    rest = deadline - time.time()
    if rest > 0:
        time.sleep(rest)
    fn(*args)


class WallClock:
    def __init__(self, dilation: float = 1.0, epoch_unix: float | None = None) -> None:
        if not dilation >= 1.0 or dilation == float("inf"):
            raise InvalidInput("dilation", f"must be a finite number >= 1, got {dilation}")
        self.dilation = dilation
        self.epoch_unix = time.time() if epoch_unix is None else epoch_unix

    def now(self) -> float:
        """Emulated seconds since the run's epoch."""
        return (time.time() - self.epoch_unix) / self.dilation

    def wall_delay(self, emulated_s: float) -> float:
        return emulated_s * self.dilation

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        deadline = self.epoch_unix + t * self.dilation
        delay = deadline - time.time()
        if delay <= 0:
            return loop.call_at(loop.time(), fn, *args)
        return loop.call_at(loop.time() + max(delay - EARLY_S, 0.0), _at_deadline, deadline,
                            fn, *args)

    async def sleep(self, emulated_s: float) -> None:
        if emulated_s > 0:
            await asyncio.sleep(emulated_s * self.dilation)

    async def sleep_until(self, t_emulated: float) -> float:
        """Sleep until emulated time `t_emulated`; returns the lateness in emulated s."""
        delay = self.epoch_unix + t_emulated * self.dilation - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        return self.now() - t_emulated
