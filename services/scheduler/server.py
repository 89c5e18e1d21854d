"""The regional scheduler gRPC service: `SchedulerCore` driven by the wall clock.

* ``Submit`` (from the load generator): stamps the arrival, lets the core decide (at once
  or at the window's close), dispatches to a local DC over a persistent SubmitStream, or
  forwards to the target region's scheduler after RTT/2 over a persistent Forward stream.
* ``Forward`` (from a peer): the request joins this scheduler's window and goes to its
  target DC when the window closes; its events go back on the Forward stream.
* Events of forwarded requests reach the origin RTT/2 after they happened at the DC; the
  origin records first-token and completion times there, so TTFT includes the full RTT.
* A DC or peer that is down when a request must go there: the request goes to another
  local DC (counted as a fallback). Requests lost when a link breaks end FAILED.
* Snapshots arrive on a Watch stream from the provisioner; without one for longer than
  the staleness bound the core decides round-robin.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import grpc
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dgrpc
from geoserve.v1 import provisioner_pb2 as ppb
from geoserve.v1 import provisioner_pb2_grpc as pgrpc
from geoserve.v1 import scheduler_pb2 as spb
from geoserve.v1 import scheduler_pb2_grpc as sgrpc

from services.config.calibration import load_calibration
from services.config.topology import Topology
from services.model.errors import InvalidInput
from services.model.requests import check_request, clipped
from services.model.state import RequestView
from services.runtime.clock import WallClock
from services.runtime.grpcutil import (
    CHANNEL_OPTIONS,
    install_signal_handlers,
    open_channel,
    serve_event_stream,
    set_not_serving,
    start_server,
)
from services.runtime.links import StreamLink
from services.runtime.metrics import SchedulerMetrics
from services.scheduler.core import Dispatch
from services.scheduler.driver import Journey, SchedulerDriver, core_for_region
from services.scheduler.summary import scheduler_block

log = logging.getLogger("geoserve.scheduler")

Sink = Callable[[pb.RequestEvent], None]


@dataclass
class _Entry:
    request: pb.Request          # as received (never mutated; outgoing copies are made)
    sink: Sink
    origin: bool                 # this scheduler is the request's origin


class SchedulerRuntime:
    """The wall transport of `SchedulerDriver`: gRPC streams to DCs and peers."""

    def __init__(
        self,
        topo: Topology,
        region: str,
        clock: WallClock,
        peers: Mapping[str, str],
        dcs: Mapping[str, str],
        provisioner: str | None,
    ) -> None:
        self.topo = topo
        self.region = region
        self.clock = clock
        self.spec = topo.region(region).scheduler
        self.core = core_for_region(topo, region, time.perf_counter)
        self.driver = SchedulerDriver(self.core, clock, topo.rtt_s, self,
                                      charge=lambda s: s / clock.dilation,
                                      on_decision=self._decided)
        self.entries: dict[str, _Entry] = {}
        self.models = {load_calibration(d.setup).model for d in topo.dcs}
        self.provisioner = provisioner
        self._tasks: list[asyncio.Task[None]] = []
        self.snapshots = 0
        self.on_decision: Callable[[Dispatch], None] | None = None  # metrics hook
        self.dc_links = {
            name: StreamLink(
                f"{region}->{name}",
                addr,
                lambda ch, it: dgrpc.DatacenterStub(ch).SubmitStream(it),
                self._on_dc_event,
                self._on_broken,
                request_id=lambda m: str(m.request.id),
                event_done=lambda e: e.kind == pb.FINISHED,
            )
            for name, addr in dcs.items()
        }
        self.peer_links = {
            name: StreamLink(
                f"{region}->{name}",
                addr,
                lambda ch, it: sgrpc.SchedulerStub(ch).Forward(it),
                self._on_peer_event,
                self._on_broken,
                event_done=lambda e: e.kind == pb.FINISHED,
            )
            for name, addr in peers.items()
            if name != region
        }

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        for link in [*self.dc_links.values(), *self.peer_links.values()]:
            link.start()
        if self.provisioner:
            self._tasks.append(asyncio.create_task(self._watch(), name="snapshots"))

    async def wait_links(self, timeout_s: float = 15.0) -> None:
        """Until every DC and peer link is up (bounded): a request arriving before that
        would be counted as a fallback. Peers are waited for too, so schedulers started
        together report healthy once they can all reach each other."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        links = [*self.dc_links.values(), *self.peer_links.values()]
        while not all(link.up for link in links) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        down = [link.name for link in links if not link.up]
        if down:
            log.warning("serving with links still down: %s", ", ".join(down))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for link in [*self.dc_links.values(), *self.peer_links.values()]:
            await link.stop()

    async def _watch(self) -> None:
        from services.provisioner.convert import snapshot_to_view

        assert self.provisioner is not None
        while True:
            try:
                async with open_channel(self.provisioner,
                                                     options=CHANNEL_OPTIONS) as ch:
                    stub = pgrpc.ProvisionerStub(ch)
                    async for snap in stub.Watch(
                        ppb.WatchRequest(subscriber=f"scheduler/{self.region}")
                    ):
                        self.core.on_snapshot(snapshot_to_view(snap), self.clock.now())
                        self.snapshots += 1
            except grpc.aio.AioRpcError as exc:
                log.warning("snapshot stream from %s broke: %s", self.provisioner,
                            exc.code().name)
            await asyncio.sleep(0.5)

    # ---------------------------------------------------------------- intake
    def submit(self, req: pb.Request, sink: Sink) -> pb.RequestEvent | None:
        """Accept a request (None) or return the event that refuses it."""
        now = self.clock.now()
        refusal = self._refusal(req, now)
        if refusal is not None:
            return refusal
        rid = req.id
        if req.model and req.model not in self.models:
            return _finished(req, pb.REJECTED, "INVALID_ARGUMENT",
                             f"request.model: no datacenter of the topology serves "
                             f"{req.model!r} (served: {sorted(self.models)})", now)
        self.entries[rid] = _Entry(req, sink, origin=True)
        self.driver.submit(RequestView(
            id=rid,
            model=req.model,
            isl_tokens=req.isl_tokens,
            osl_tokens=req.osl_tokens,
            origin_region=self.region,
            ttft_slo_s=req.slo.ttft_s or self.topo.slo.ttft_s,
            tpot_slo_s=req.slo.tpot_s or self.topo.slo.tpot_s,
            arrival_s=now,
            dataset=req.dataset,
        ))
        return None

    def forward_in(self, req: pb.Request, sink: Sink) -> pb.RequestEvent | None:
        now = self.clock.now()
        refusal = self._refusal(req, now)
        if refusal is not None:
            return refusal
        if self.core.dc_region.get(req.target_dc) != self.region:
            return _finished(req, pb.REJECTED, "INVALID_ARGUMENT",
                             f"request.target_dc: {req.target_dc!r} is not a datacenter of "
                             f"region {self.region}", now)
        self.entries[req.id] = _Entry(req, sink, origin=False)
        self.driver.forwarded_in(req.id, req.target_dc)
        return None

    def _refusal(self, req: pb.Request, now: float) -> pb.RequestEvent | None:
        """The REJECTED event of a request that is malformed or whose id is in flight."""
        try:
            check_request(req)
        except InvalidInput as exc:
            return _finished(clipped(req), pb.REJECTED, exc.status_code, str(exc), now)
        if req.id in self.entries:
            return _finished(req, pb.REJECTED, "ALREADY_EXISTS",
                             f"request.id: {req.id!r} is already in flight at scheduler "
                             f"{self.region}", now)
        return None

    # ---------------------------------------------------------------- transport
    def _decided(self, d: Dispatch) -> None:
        if self.on_decision is not None:
            self.on_decision(d)

    def _outgoing(self, rid: str) -> pb.Request:
        """The message sent on: the request as received plus, at its origin, the origin's
        stamps and decision (a copy: the received message is never mutated)."""
        e = self.entries[rid]
        out = pb.Request()
        out.CopyFrom(e.request)
        if e.origin:
            j = self.driver.journeys.get(rid)
            if j is not None:
                self._stamp_origin(out, j)
        return out

    def _stamp_origin(self, req: pb.Request, j: Journey) -> None:
        ts = req.timestamps
        ts.scheduler_arrival_s = j.arrival_s
        if not math.isnan(j.decided_s):
            ts.decided_s = j.decided_s
            req.decision_s = j.decision_s
        req.origin_region = req.origin_region or self.region
        req.policy = self.core.policy.name
        req.slo.ttft_s = req.slo.ttft_s or self.topo.slo.ttft_s
        req.slo.tpot_s = req.slo.tpot_s or self.topo.slo.tpot_s
        req.forwarded = j.forwarded
        req.fallback = j.fallback
        req.target_dc = j.target_dc
        req.target_region = j.target_region

    def to_peer(self, region: str, rid: str, dc: str, arrive_s: float) -> None:
        if rid not in self.entries:
            return
        msg = self._outgoing(rid)
        msg.timestamps.forwarded_arrival_s = arrive_s
        link = self.peer_links.get(region)
        if link is not None and link.send(msg):
            return
        alt = self.core.local_fallback("", self.clock.now())
        log.warning("peer %s unreachable; %s falls back to %s", region, rid, alt or "nothing")
        if alt:
            self.driver.fell_back(rid, alt)
            self.to_dc(rid, alt)
        else:
            self._finish_local(rid, pb.FAILED, "UNAVAILABLE",
                               f"peer scheduler {region} unreachable")

    def to_dc(self, rid: str, dc: str) -> None:
        e = self.entries.get(rid)
        if e is None:
            return
        msg = self._outgoing(rid)
        ts = msg.timestamps
        now = self.clock.now()
        if not e.origin and not self.core.batch and ts.forwarded_arrival_s:
            now = min(now, ts.forwarded_arrival_s)  # dispatched on arrival from the peer
        ts.dc_arrival_s = now  # dispatch stamp: the DC compensates the gRPC hop
        link = self.dc_links.get(dc)
        if link is not None and link.send(dpb.SubmitRequest(request=msg)):
            return
        alt = self.core.local_fallback(dc, self.clock.now())
        alt_link = self.dc_links.get(alt) if alt else None
        if alt_link is not None:
            self.driver.fell_back(rid, alt)
            msg = self._outgoing(rid)
            msg.timestamps.dc_arrival_s = now
            if not e.origin:
                msg.target_dc, msg.fallback = alt, True
            if alt_link.send(dpb.SubmitRequest(request=msg)):
                log.warning("DC %s unreachable; %s falls back to %s", dc, rid, alt)
                return
        self._finish_local(rid, pb.FAILED, "UNAVAILABLE", f"datacenter {dc} unreachable")

    def reject(self, rid: str, reason: str) -> None:
        self._finish_local(rid, pb.REJECTED, "UNAVAILABLE", reason)

    # ---------------------------------------------------------------- events
    def _on_dc_event(self, ev: pb.RequestEvent) -> None:
        e = self.entries.get(ev.request_id)
        if e is None or ev.kind == pb.ACCEPTED:
            return
        if e.origin:
            self.driver.deliver(ev.request_id, ev.time_s, self._deliver_origin, e, ev)
        else:
            if ev.kind == pb.FINISHED:
                del self.entries[ev.request_id]
            e.sink(ev)

    def _on_peer_event(self, ev: pb.RequestEvent) -> None:
        e = self.entries.get(ev.request_id)
        if e is None or ev.kind == pb.ACCEPTED:
            return
        self.driver.deliver(ev.request_id, ev.time_s, self._deliver_origin, e, ev)

    def _deliver_origin(self, t: float, e: _Entry, ev: pb.RequestEvent) -> None:
        rid = ev.request_id
        if self.entries.get(rid) is not e:
            return
        if ev.kind == pb.FIRST_TOKEN:
            self.driver.first_token(rid, t)
            e.sink(pb.RequestEvent(kind=pb.FIRST_TOKEN, request_id=rid, time_s=t, dc=ev.dc))
            return
        rec = pb.RequestRecord()
        rec.CopyFrom(ev.record)
        j = self.driver.done(rid)
        if j is not None:
            self._stamp_origin(rec.request, j)
            ts = rec.request.timestamps
            if e.request.timestamps.emitted_s:
                ts.emitted_s = e.request.timestamps.emitted_s
            if rec.state == pb.COMPLETED:
                (ts.first_token_origin_s, ts.completed_origin_s, rec.ttft_s,
                 rec.e2e_s) = j.latencies(ts.first_token_s, ts.completed_s)
        self.entries.pop(rid, None)
        e.sink(pb.RequestEvent(kind=pb.FINISHED, request_id=rid, time_s=t, record=rec,
                               dc=ev.dc))

    def _on_broken(self, rids: list[str], reason: str) -> None:
        for rid in rids:
            e = self.entries.get(rid)
            if e is None:
                continue
            j = self.driver.journeys.get(rid)
            where = (f"scheduler {j.via_region}" if j is not None and j.via_region
                     else (j.target_dc if j is not None else e.request.target_dc))
            self._finish_local(rid, pb.FAILED, "UNAVAILABLE",
                               f"lost when the link to {where} broke ({reason})")

    def _finish_local(self, rid: str, state: int, code: str, reason: str) -> None:
        if rid not in self.entries:
            return
        msg = self._outgoing(rid)
        e = self.entries.pop(rid)
        self.driver.done(rid)
        e.sink(_finished(msg, state, code, reason, self.clock.now()))

    def info(self) -> spb.SchedulerInfo:
        return spb.SchedulerInfo(
            region=self.region,
            snapshot_age_s=min(self.core.snapshot_age(self.clock.now()), 1e9),
            **scheduler_block(self.core, self.snapshots),
        )


def _finished(req: pb.Request, state: int, code: str, reason: str, now: float) -> pb.RequestEvent:
    rec = pb.RequestRecord(state=state, reason=reason, status_code=code,  # type: ignore[arg-type]
                           dc=req.target_dc)
    rec.request.CopyFrom(req)
    return pb.RequestEvent(kind=pb.FINISHED, request_id=req.id, time_s=now, record=rec)


class SchedulerService(sgrpc.SchedulerServicer):
    def __init__(self, rt: SchedulerRuntime) -> None:
        self.rt = rt

    def _pump(
        self,
        request_iterator: AsyncIterator[pb.Request],
        intake: Callable[[pb.Request, Sink], pb.RequestEvent | None],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.RequestEvent]:
        return serve_event_stream(request_iterator, intake,
                                  lambda e: e.kind == pb.FINISHED, lambda m: str(m.id), context)

    async def Submit(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.Request], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RequestEvent]:
        async for ev in self._pump(request_iterator, self.rt.submit, context):
            yield ev

    async def Forward(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.Request], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RequestEvent]:
        async for ev in self._pump(request_iterator, self.rt.forward_in, context):
            yield ev

    async def Info(  # noqa: N802
        self, request: spb.SchedulerInfoRequest, context: grpc.aio.ServicerContext
    ) -> spb.SchedulerInfo:
        return self.rt.info()


async def serve(rt: SchedulerRuntime, address: str, metrics: SchedulerMetrics | None = None
                ) -> None:
    if metrics is not None:
        metrics.attach(rt.core, rt.clock.now, rt.clock.dilation, lambda: len(rt.entries),
                       asyncio.get_running_loop())
        rt.on_decision = metrics.on_decision
    rt.start()
    server, health_servicer, port = await start_server(
        [(sgrpc.add_SchedulerServicer_to_server, SchedulerService(rt))],
        [spb.DESCRIPTOR.services_by_name["Scheduler"].full_name],
        address,
        ready=rt.wait_links,
    )
    log.info("scheduler %s (%s) serving on port %d", rt.region, rt.core.policy.name, port)
    stopping = asyncio.Event()

    async def on_stop() -> None:
        await set_not_serving(health_servicer)
        await server.stop(1.0)
        stopping.set()

    install_signal_handlers(on_stop)
    await stopping.wait()
    await rt.stop()
