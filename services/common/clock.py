"""Wall clock with time dilation, shared by every process of one run.

Emulated time t (seconds) maps to wall time ``epoch_unix + t * dilation``: every sleep,
RTT, window and poll period is stretched by the dilation factor k >= 1, and every
recorded latency is emulated time (wall / k). All processes of a run get the same epoch,
so their emulated clocks agree. `sleep_until` returns how late the wake-up was
(emulated seconds) — the overrun detector's sample.
"""

from __future__ import annotations

import asyncio
import time

from services.common.errors import InvalidInput


class WallClock:
    def __init__(self, dilation: float = 1.0, epoch_unix: float | None = None) -> None:
        if not dilation >= 1.0:
            raise InvalidInput("dilation", f"must be >= 1, got {dilation}")
        self.dilation = dilation
        self.epoch_unix = time.time() if epoch_unix is None else epoch_unix

    def now(self) -> float:
        """Emulated seconds since the run's epoch."""
        return (time.time() - self.epoch_unix) / self.dilation

    def wall_delay(self, emulated_s: float) -> float:
        return emulated_s * self.dilation

    async def sleep(self, emulated_s: float) -> None:
        if emulated_s > 0:
            await asyncio.sleep(emulated_s * self.dilation)

    async def sleep_until(self, t_emulated: float) -> float:
        """Sleep until emulated time `t_emulated`; returns the lateness in emulated s."""
        delay = self.epoch_unix + t_emulated * self.dilation - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        return self.now() - t_emulated
