"""The provisioner gRPC service: the `ProvisionerCore` driven by the wall clock.

The shared `ProvisionerDriver` wakes at the core's next poll slot (absolute emulated
deadlines on the run's dilated clock) and hands each due poll to this runtime, which
issues it as its own task over one persistent channel per DC, with a deadline of
``poll_timeout_s`` emulated seconds (× dilation in wall time). Results go back to the
core through the driver; every snapshot it publishes is converted once to a `pb.Snapshot`
and offered to every `Watch` subscriber. Each
subscriber has a one-slot queue: a slow reader gets the latest snapshot, never a backlog.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping

import grpc
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dgrpc
from geoserve.v1 import provisioner_pb2 as ppb
from geoserve.v1 import provisioner_pb2_grpc as pgrpc

from services.model.errors import InvalidInput
from services.model.requests import MAX_EMULATED_S, check_name, check_number
from services.provisioner.convert import batch_occupancy, snapshot_to_proto
from services.provisioner.core import Poll, ProvisionerCore, SnapshotData, Transition
from services.provisioner.driver import ProvisionerDriver
from services.runtime.clock import WallClock
from services.runtime.grpcutil import (
    install_signal_handlers,
    open_channel,
    set_not_serving,
    start_server,
)
from services.runtime.metrics import ProvisionerMetrics

log = logging.getLogger("geoserve.provisioner")

_Mailbox = asyncio.Queue[pb.Snapshot | None]


def client_channel_options(period_wall_s: float, timeout_wall_s: float) -> list[tuple[str, int]]:
    """Channel options for DC channels: reconnect within about a poll period after a DC
    restarts (the default backoff grows to minutes); a connection attempt may take as long
    as a poll's deadline (gRPC's minimum connect timeout)."""
    max_ms = int(min(max(period_wall_s * 1000.0, 200.0), 2000.0))
    return [
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.initial_reconnect_backoff_ms", min(100, max_ms)),
        ("grpc.min_reconnect_backoff_ms", max(int(timeout_wall_s * 1000.0), 1)),
        ("grpc.max_reconnect_backoff_ms", max_ms),
    ]


def default_poll_timeout_s(period_s: float) -> float:
    """Deadline of one GetState poll, emulated seconds: min(0.5, Δp/2)."""
    return min(0.5, period_s / 2.0)


class WallProvisioner:
    """Polls DCs in wall-clock time (time-dilated) and fans snapshots out to watchers."""

    def __init__(
        self,
        core: ProvisionerCore[pb.DcState],
        clock: WallClock,
        dc_addresses: Mapping[str, str],
        poll_timeout_s: float | None = None,
    ) -> None:
        missing = [d.dc for d in core.dcs if d.dc not in dc_addresses]
        if missing:
            raise InvalidInput("dcs", f"no address for DC(s) {missing}")
        self.core = core
        self.clock = clock
        self.poll_timeout_s = (
            default_poll_timeout_s(core.period_s) if poll_timeout_s is None else poll_timeout_s
        )
        if not self.poll_timeout_s > 0:
            raise InvalidInput("poll_timeout_s", f"must be > 0, got {self.poll_timeout_s}")
        opts = client_channel_options(clock.wall_delay(core.period_s),
                                      clock.wall_delay(self.poll_timeout_s))
        self._channels = {dc: open_channel(a, options=opts)
                          for dc, a in dc_addresses.items()}
        self._stubs = {dc: dgrpc.DatacenterStub(ch) for dc, ch in self._channels.items()}
        self.latest: pb.Snapshot | None = None
        self._subscribers: set[_Mailbox] = set()
        self._polls: set[asyncio.Task[None]] = set()
        self.driver: ProvisionerDriver[pb.DcState] = ProvisionerDriver(
            core, clock, self._issue, self._publish_data, self._log_transition,
            lambda late: log.warning("poll loop woke up %.3f s (emulated) late", late),
            occupancy=batch_occupancy)
        self.closed = False
        self.on_poll: Callable[[str, float, bool], None] | None = None  # metrics hook

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.driver.start()

    async def stop(self) -> None:
        """Stop polling, end every Watch stream, close the DC channels."""
        self.closed = True
        self.driver.stop()
        tasks = list(self._polls)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for q in list(self._subscribers):
            _offer(q, None)
        for ch in self._channels.values():
            await ch.close()

    # ---------------------------------------------------------------- polling
    def _issue(self, poll: Poll) -> None:
        task = asyncio.create_task(self._poll(poll), name=f"poll-{poll.dc}")
        self._polls.add(task)
        task.add_done_callback(self._polls.discard)

    async def _poll(self, poll: Poll) -> None:
        stub = self._stubs[poll.dc]
        t0 = self.clock.now()
        try:
            reply = await stub.GetState(
                dpb.GetStateRequest(), timeout=self.clock.wall_delay(self.poll_timeout_s)
            )
        except grpc.aio.AioRpcError as exc:
            if self.on_poll is not None:
                self.on_poll(poll.dc, self.clock.now() - t0, False)
            self.driver.failed(poll, f"{exc.code().name}: {exc.details()}")
            return
        if self.on_poll is not None:
            self.on_poll(poll.dc, self.clock.now() - t0, True)
        self.driver.ok(poll, reply.state, dc_up=reply.state.up)

    @staticmethod
    def _log_transition(t: Transition) -> None:
        if t.up:
            log.info("DC %s is up (t=%.3f s)", t.dc, t.time_s)
        else:
            log.warning("DC %s is down (t=%.3f s): %s", t.dc, t.time_s, t.reason)

    def _publish_data(self, data: SnapshotData[pb.DcState]) -> None:
        self.publish(snapshot_to_proto(data))

    # ---------------------------------------------------------------- fan-out
    def publish(self, snap: pb.Snapshot) -> None:
        self.latest = snap
        for q in self._subscribers:
            _offer(q, snap)

    def subscribe(self) -> _Mailbox:
        q: _Mailbox = asyncio.Queue(maxsize=1)
        if self.closed:
            q.put_nowait(None)
        elif self.latest is not None:
            q.put_nowait(self.latest)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: _Mailbox) -> None:
        self._subscribers.discard(q)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)


def _offer(q: _Mailbox, item: pb.Snapshot | None) -> None:
    """Replace whatever the subscriber has not read yet with `item` (latest wins)."""
    while not q.empty():
        q.get_nowait()
    q.put_nowait(item)


class ProvisionerService(pgrpc.ProvisionerServicer):
    def __init__(self, prov: WallProvisioner) -> None:
        self.prov = prov

    async def Watch(  # noqa: N802 (gRPC method name)
        self, request: ppb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Snapshot]:
        who = check_name("subscriber", request.subscriber) or context.peer()
        q = self.prov.subscribe()
        log.info("watch: %s subscribed (%d watching)", who, self.prov.subscribers)
        try:
            while True:
                snap = await q.get()
                if snap is None:
                    return
                yield snap
        finally:
            self.prov.unsubscribe(q)
            log.info("watch: %s left (%d watching)", who, self.prov.subscribers)

    async def GetSnapshot(  # noqa: N802
        self, request: ppb.GetSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.Snapshot:
        if self.prov.latest is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no snapshot yet")
        assert self.prov.latest is not None
        return self.prov.latest

    async def GetStats(  # noqa: N802
        self, request: ppb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> ppb.ProvisionerStats:
        since = check_number("since_s", request.since_s, 0.0, MAX_EMULATED_S, " s")
        until = check_number("until_s", request.until_s, 0.0, MAX_EMULATED_S, " s (0: now)")
        if 0 < until < since:
            raise InvalidInput("until_s", f"expected 0 (now) or >= since_s ({since:g}), "
                                          f"got {until:g}")
        st = self.prov.driver.window_stats(since, until if until > 0 else float("inf"))
        return ppb.ProvisionerStats(
            mode=st.mode, period_s=st.period_s, polls=st.polls, snapshots=st.snapshots,
            failures=st.failures, skipped=st.skipped,
            mean_batch_ratio=st.mean_batch_ratio or 0.0,
            occupancy_samples=st.occupancy_samples)


async def serve(
    prov: WallProvisioner,
    address: str,
    stop_grace_s: float = 1.0,
    ready: asyncio.Event | None = None,
    metrics: ProvisionerMetrics | None = None,
) -> None:
    """Run the provisioner until SIGTERM/SIGINT: health NOT_SERVING, end watches, stop."""
    if metrics is not None:
        metrics.attach(prov.core, prov.clock.now, prov.clock.dilation,
                       lambda: prov.subscribers, asyncio.get_running_loop())
        prov.on_poll = metrics.on_poll
    service = ProvisionerService(prov)
    server, health_servicer, port = await start_server(
        [(pgrpc.add_ProvisionerServicer_to_server, service)],
        [ppb.DESCRIPTOR.services_by_name["Provisioner"].full_name],
        address,
    )
    core = prov.core
    log.info("provisioner serving on port %d: %d DCs, period %.3f s (%s), poll timeout %.3f s,"
             " dilation %g", port, len(core.dcs), core.period_s, core.mode,
             prov.poll_timeout_s, prov.clock.dilation)
    prov.start()
    stopping = asyncio.Event()

    async def on_stop() -> None:
        await set_not_serving(health_servicer)
        await prov.stop()
        await server.stop(stop_grace_s)
        stopping.set()

    install_signal_handlers(on_stop)
    if ready is not None:
        ready.set()
    await stopping.wait()
