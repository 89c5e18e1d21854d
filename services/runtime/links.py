"""Persistent bidirectional gRPC stream links with reconnection and failure accounting.

A `StreamLink` keeps one streaming call open to a peer (a datacenter's SubmitStream or a
peer scheduler's Forward). `send` queues a message when the link is up and returns
False when it is down, so the caller can fall back. When the call breaks, every request
still outstanding on it is handed to `on_broken` (to be recorded as failed) and the link
reconnects with back-off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from services.runtime.grpcutil import CHANNEL_OPTIONS, open_channel

log = logging.getLogger("geoserve.links")

OpenCall = Callable[[grpc.aio.Channel, AsyncIterator[Any]], Any]


class StreamLink:
    def __init__(
        self,
        name: str,
        address: str,
        open_call: OpenCall,
        on_event: Callable[[Any], None],
        on_broken: Callable[[list[str], str], None],
        connect_timeout_s: float = 2.0,
        request_id: Callable[[Any], str] = lambda m: str(m.id),
        event_done: Callable[[Any], bool] = lambda e: False,
    ) -> None:
        self.name = name
        self.address = address
        self._open = open_call
        self._on_event = on_event
        self._on_broken = on_broken
        self._connect_timeout = connect_timeout_s
        self._rid = request_id
        self._done = event_done
        self.up = False
        self.outstanding: set[str] = set()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"link-{self.name}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def send(self, msg: Any) -> bool:
        if not self.up:
            return False
        self.outstanding.add(self._rid(msg))
        self._queue.put_nowait(msg)
        return True

    @staticmethod
    async def _gen(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
        while True:
            yield await queue.get()

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            async with open_channel(self.address, options=CHANNEL_OPTIONS) as ch:
                try:
                    await asyncio.wait_for(ch.channel_ready(), self._connect_timeout)
                    # each connection reads its own queue: a dead call's request iterator
                    # must not swallow messages meant for the next one
                    self._queue = asyncio.Queue()
                    call = self._open(ch, self._gen(self._queue))
                    self.up = True
                    if backoff > 0.2:
                        log.info("link %s to %s is up again", self.name, self.address)
                    backoff = 0.2
                    async for ev in call:
                        if self._done(ev):
                            self.outstanding.discard(str(ev.request_id))
                        self._on_event(ev)
                    reason = "stream ended"
                except asyncio.CancelledError:
                    self.up = False
                    raise
                except (grpc.aio.AioRpcError, TimeoutError) as exc:
                    code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "TIMEOUT"
                    reason = f"{code}"
                self.up = False
            self.failures += 1
            self._drain_queue()
            lost = sorted(self.outstanding)
            self.outstanding.clear()
            if lost:
                log.warning("link %s to %s broke (%s): %d requests lost", self.name,
                            self.address, reason, len(lost))
                self._on_broken(lost, reason)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _drain_queue(self) -> None:
        while not self._queue.empty():
            msg = self._queue.get_nowait()
            self.outstanding.add(self._rid(msg))
