"""The datacenter gRPC service: the `Datacenter` core driven by the wall clock.

Each engine is an asyncio task that plans a step, sleeps until the step's planned end
(absolute deadlines, so wake-up lateness does not accumulate), records how late it woke
up, completes the step and delivers the events to the stream that submitted each request.
When a wake-up is later than ``resync_s`` the engine restarts its schedule from the
actual time and counts a resync (the run is then marked unfaithful).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dgrpc

from services.datacenter.convert import counters_to_proto, failed_record, finished_record
from services.datacenter.dc import Datacenter
from services.datacenter.driver import DcDriver
from services.datacenter.engine import EngineEvent, EngineRequest, FirstToken
from services.model.errors import AlreadyExists, GeoServeError, InvalidInput
from services.model.requests import MAX_EMULATED_S, check_number, check_request, clipped
from services.runtime.clock import WallClock
from services.runtime.grpcutil import (
    install_signal_handlers,
    serve_event_stream,
    set_not_serving,
    start_server,
)
from services.runtime.metrics import DcMetrics

log = logging.getLogger("geoserve.datacenter")

Sink = Callable[[pb.RequestEvent], None]
# Largest gRPC hop (wall seconds) a sender's dispatch stamp may compensate for.
TRANSPORT_COMP_S = 0.01


@dataclass
class _Ticket:
    """Per-request runtime context carried as the engine request's payload."""

    request: pb.Request
    sink: Sink | None
    dc_arrival_s: float
    engine: str = ""
    extra: dict[str, float] = field(default_factory=dict)


class WallDcRuntime:
    """Runs the engines of a `Datacenter` in wall-clock time (time-dilated)."""

    def __init__(self, dc: Datacenter, clock: WallClock, resync_s: float = 0.05) -> None:
        self.dc = dc
        self.clock = clock
        self.resync_s = resync_s
        self.driver = DcDriver(dc, clock, self._dispatch, resync_s)
        self.stopped = False
        self.in_flight_ids: set[str] = set()  # request identity: one request per id at a time
        self.on_completed: Callable[[pb.RequestRecord], None] | None = None  # metrics hook
        self.poll_trace: list[float] | None = None  # GetState arrivals (GEOSERVE_TRACE_DIR)

    def start(self) -> None:
        """Engines step through the shared `DcDriver` (timers on the running loop)."""

    async def stop(self) -> None:
        self.stopped = True
        self.driver.stop()

    # ---------------------------------------------------------------- submission
    def submit(self, request: pb.Request, sink: Sink | None) -> tuple[int, float]:
        """Validate, route and enqueue; raises a domain error (the caller records it).

        Transport compensation: a sender stamps ``timestamps.dc_arrival_s`` with the
        emulated time it sent the request; the emulated network inside a region has no
        delay, so the request counts as arrived then, provided the stamp lies within the
        last ``TRANSPORT_COMP_S`` (the emulator's own gRPC hop is not part of the model).
        """
        now = self.clock.now()
        check_request(request)
        if request.id in self.in_flight_ids:
            raise AlreadyExists("request.id",
                                f"{request.id!r} is already in flight at this datacenter")
        sent = request.timestamps.dc_arrival_s
        arrival = sent if now - TRANSPORT_COMP_S * self.clock.dilation <= sent <= now else now
        ticket = _Ticket(request, sink, arrival)
        ereq = EngineRequest(
            id=request.id,
            isl_tokens=request.isl_tokens,
            osl_tokens=request.osl_tokens,
            arrival_s=arrival,
            payload=ticket,
        )
        idx = self.driver.submit(ereq, request.model)
        self.in_flight_ids.add(request.id)
        ticket.engine = self.dc.engines[idx].name
        return idx, now

    def reject(self, request: pb.Request, exc: GeoServeError, sink: Sink | None) -> None:
        """Record a refused request and deliver its REJECTED record."""
        ev = self.rejection(request, exc)
        if sink is not None:
            sink(ev)

    def rejection(self, request: pb.Request, exc: GeoServeError) -> pb.RequestEvent:
        """Record a refused request; returns its REJECTED event."""
        now = self.clock.now()
        self.dc.rejected += 1
        rec = failed_record(
            clipped(request), pb.REJECTED, str(exc), exc.status_code, self.dc.config.name, now
        )
        return _finished_event(rec, now, self.dc.config.name)

    def _deliver(self, rec: pb.RequestRecord, sink: Sink | None, now: float) -> None:
        if sink is not None:
            sink(_finished_event(rec, now, self.dc.config.name))

    # ---------------------------------------------------------------- engines
    def _dispatch(self, idx: int, events: Sequence[EngineEvent]) -> None:
        name = self.dc.config.name
        for ev in events:
            ticket: _Ticket = ev.payload
            if isinstance(ev, FirstToken):
                if ticket.sink is not None:
                    ticket.sink(
                        pb.RequestEvent(
                            kind=pb.FIRST_TOKEN, request_id=ev.request_id, time_s=ev.time_s, dc=name
                        )
                    )
            else:
                self.in_flight_ids.discard(ev.request_id)
                rec = finished_record(ticket.request, ev.finished, name, ticket.engine)
                if self.on_completed is not None:
                    self.on_completed(rec)
                self._deliver(rec, ticket.sink, ev.time_s)

    def fail_in_flight(self, reason: str, status: str = "UNAVAILABLE") -> int:
        now = self.clock.now()
        dropped = self.dc.fail_all(now)
        for idx, req in dropped:
            self.in_flight_ids.discard(req.id)
            ticket: _Ticket = req.payload
            self.dc.failed += 1
            rec = failed_record(
                ticket.request, pb.FAILED, reason, status, self.dc.config.name, now,
                engine=self.dc.engines[idx].name, dc_arrival_s=ticket.dc_arrival_s,
            )
            self._deliver(rec, ticket.sink, now)
        return len(dropped)


def _finished_event(rec: pb.RequestRecord, now: float, dc: str) -> pb.RequestEvent:
    return pb.RequestEvent(kind=pb.FINISHED, request_id=rec.request.id, time_s=now,
                           record=rec, dc=dc)


class DatacenterService(dgrpc.DatacenterServicer):
    def __init__(self, runtime: WallDcRuntime) -> None:
        self.rt = runtime

    async def SubmitStream(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[dpb.SubmitRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RequestEvent]:
        def intake(msg: dpb.SubmitRequest, sink: Sink) -> pb.RequestEvent | None:
            req = msg.request
            try:
                _, now = self.rt.submit(req, sink)
            except GeoServeError as exc:
                return self.rt.rejection(req, exc)
            sink(pb.RequestEvent(kind=pb.ACCEPTED, request_id=req.id, time_s=now,
                                 dc=self.rt.dc.config.name))
            return None

        async for ev in serve_event_stream(request_iterator, intake,
                                           lambda e: e.kind == pb.FINISHED,
                                           lambda m: str(m.request.id), context):
            yield ev

    async def Submit(  # noqa: N802
        self, request: dpb.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> dpb.SubmitAck:
        try:
            idx, now = self.rt.submit(request.request, None)
        except GeoServeError as exc:
            self.rt.reject(request.request, exc, None)
            raise
        return dpb.SubmitAck(
            request_id=request.request.id, engine=self.rt.dc.engines[idx].name, time_s=now
        )

    async def GetState(  # noqa: N802
        self, request: dpb.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DcStateReply:
        now = self.rt.clock.now()
        if self.rt.poll_trace is not None:
            self.rt.poll_trace.append(now)
        c = self.rt.dc.counters(now, per_engine=request.include_engines)
        return counters_to_proto(self.rt.dc, c, names=[e.name for e in self.rt.dc.engines])

    async def SetFrequency(  # noqa: N802
        self, request: dpb.SetFrequencyRequest, context: grpc.aio.ServicerContext
    ) -> dpb.SetFrequencyReply:
        self.rt.dc.accrue(self.rt.clock.now())
        level = self.rt.driver.set_frequency(request.gpu_frequency_mhz)
        p = self.rt.dc.perf
        return dpb.SetFrequencyReply(
            gpu_frequency_mhz=level,
            prefill_time_factor=p.prefill_time_factor,
            decode_time_factor=p.decode_time_factor,
        )

    async def ApplyCarmPlan(  # noqa: N802
        self, request: dpb.CarmSlotPlan, context: grpc.aio.ServicerContext
    ) -> dpb.CarmSlotAck:
        now = self.rt.clock.now()
        f = request.gpu_frequency_mhz
        if not (math.isfinite(f) and f >= 0):  # 0: keep the current level
            raise InvalidInput("gpu_frequency_mhz",
                               f"expected a finite frequency >= 0 MHz (0: keep), got {f}")
        check_number("slot_start_s", request.slot_start_s, 0.0, MAX_EMULATED_S, " s")
        check_number("slot_length_s", request.slot_length_s, 0.0, MAX_EMULATED_S, " s")
        if f > 0:  # refused before anything is applied
            top = 2.0 * self.rt.dc.cal.frequency.max_mhz
            check_number("gpu_frequency_mhz", f, 0.0, top, " MHz (0: keep)")
        self.rt.dc.apply_carm(now, request.training_power_w, request.renewable_supply_w)
        level = self.rt.dc.perf.frequency_mhz
        if f > 0:
            level = self.rt.driver.set_frequency(f)
        return dpb.CarmSlotAck(gpu_frequency_mhz=level)

    async def Drain(  # noqa: N802
        self, request: dpb.DrainRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DrainReply:
        check_number("grace_s", request.grace_s, 0.0, MAX_DRAIN_GRACE_S, " s (emulated)")
        completed, failed = await drain(self.rt, request.grace_s)
        return dpb.DrainReply(completed=completed, failed=failed)


MAX_DRAIN_GRACE_S = 3600.0


async def drain(rt: WallDcRuntime, grace_s: float) -> tuple[int, int]:
    """Refuse new requests, let running ones finish for `grace_s` (emulated), fail the rest."""
    rt.dc.draining = True
    before = rt.dc.completed
    deadline = rt.clock.now() + grace_s
    while rt.dc.in_flight() and rt.clock.now() < deadline:
        await rt.clock.sleep(min(0.05, max(deadline - rt.clock.now(), 0.0)))
    failed = rt.fail_in_flight("datacenter drained before the request finished")
    return rt.dc.completed - before, failed


async def serve(
    dc: Datacenter,
    address: str,
    clock: WallClock,
    drain_grace_s: float = 5.0,
    ready: asyncio.Event | None = None,
    metrics: DcMetrics | None = None,
) -> None:
    """Run the datacenter service until SIGTERM/SIGINT (then drain and stop)."""
    rt = WallDcRuntime(dc, clock)
    trace_dir = os.environ.get("GEOSERVE_TRACE_DIR", "")
    if trace_dir:  # diagnosis: every wake-up's lateness and every poll's arrival
        dc.lateness.trace = []
        rt.poll_trace = []
    if metrics is not None:
        metrics.attach(dc, clock.now, clock.dilation, asyncio.get_running_loop())
        rt.on_completed = metrics.on_record
    rt.start()
    service = DatacenterService(rt)
    server, health_servicer, port = await start_server(
        [(dgrpc.add_DatacenterServicer_to_server, service)],
        [dpb.DESCRIPTOR.services_by_name["Datacenter"].full_name],
        address,
    )
    log.info("datacenter %s serving on port %d (%d engines)", dc.config.name, port,
             len(dc.engines))
    stopping = asyncio.Event()

    async def on_stop() -> None:
        await set_not_serving(health_servicer)
        await drain(rt, drain_grace_s / clock.dilation)
        await server.stop(1.0)
        stopping.set()

    install_signal_handlers(on_stop)
    if ready is not None:
        ready.set()
    await stopping.wait()
    await rt.stop()
    if trace_dir:
        _write_trace(Path(trace_dir), dc, rt.poll_trace or [])


def _write_trace(out: Path, dc: Datacenter, polls: list[float]) -> None:
    """``<dc>.trace.csv``: ``kind,time_s,lateness_s`` rows, kind ``wake`` (a step's planned
    end and how late it woke up) or ``poll`` (a GetState's arrival), emulated seconds."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{dc.config.name}.trace.csv").open("w") as f:
        f.write("kind,time_s,lateness_s\n")
        for at, late in dc.lateness.trace or []:
            f.write(f"wake,{at:.6f},{late:.6f}\n")
        for at in polls:
            f.write(f"poll,{at:.6f},\n")

