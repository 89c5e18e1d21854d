"""The CA-RM gRPC service: `CarmLive` driven by the wall clock, talking to every DC.

One task wakes up at each slot boundary (absolute emulated deadlines on the run's dilated
clock; the first slot is the one the service starts in, planned at once). Each slot it
reads every DC's state (``GetState``: its request counts feed the load forecast), plans the
slot (``CarmLive.plan`` in a worker thread, so health checks and ``Status`` stay responsive),
and sends each DC its ``CarmSlotPlan`` (``ApplyCarmPlan``). Every call has a deadline of
``call_timeout_s`` emulated seconds; a DC that does not answer keeps its previous plan and
the failure is logged and counted. ``Status`` returns the last plans, the slot number, the
training-deadline counters and the last slot's latency (read + plan + apply, emulated s).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Mapping
from typing import TypeVar

import grpc
from geoserve.v1 import carm_pb2 as cpb
from geoserve.v1 import carm_pb2_grpc as cgrpc
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dgrpc
from prometheus_client import CollectorRegistry, Gauge

from services.carm.live import CarmLive, SlotPlan
from services.model.errors import InvalidInput
from services.runtime.clock import WallClock
from services.runtime.grpcutil import (
    install_signal_handlers,
    open_channel,
    set_not_serving,
    start_server,
)

log = logging.getLogger("geoserve.carm")
T = TypeVar("T")

FORMULATION_NAMES = {"performance": "performance-constrained", "carbon": "carbon-constrained",
                     "ppc": "ppc"}


class CarmMetrics:
    """Prometheus gauges of the CA-RM service."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.slot_latency = Gauge("geoserve_carm_slot_latency_seconds",
                                  "Last slot's read + plan + apply time (emulated s).",
                                  registry=r)
        self.frequency = Gauge("geoserve_carm_gpu_frequency_hertz",
                               "Planned inference GPU clock.", ["dc"], registry=r)
        self.training = Gauge("geoserve_carm_training_power_watts",
                              "Planned training power.", ["dc"], registry=r)
        self.supply = Gauge("geoserve_carm_renewable_supply_watts",
                            "On-site renewable supply this slot.", ["dc"], registry=r)
        self.missed = Gauge("geoserve_carm_training_deadlines_missed",
                            "Training jobs that missed their deadline so far.", registry=r)

    def on_slot(self, plans: list[SlotPlan], latency_s: float, missed: int) -> None:
        self.slot_latency.set(latency_s)
        self.missed.set(missed)
        for p in plans:
            self.frequency.labels(p.dc).set(p.gpu_frequency_mhz * 1e6)
            self.training.labels(p.dc).set(p.training_power_w)
            self.supply.labels(p.dc).set(p.renewable_supply_w)


class WallCarm:
    """Runs `CarmLive` slot by slot in wall-clock time (time-dilated)."""

    def __init__(self, live: CarmLive, clock: WallClock, dc_addresses: Mapping[str, str],
                 call_timeout_s: float | None = None,
                 metrics: CarmMetrics | None = None) -> None:
        names = list(live.sites)
        missing = [n for n in names if n not in dc_addresses]
        if missing:
            raise InvalidInput("--dcs", f"no address for DC(s) {', '.join(missing)}")
        unknown = sorted(set(dc_addresses) - set(names))
        if unknown:
            raise InvalidInput("--dcs", f"DC(s) {', '.join(unknown)} not in the topology")
        self.live = live
        self.clock = clock
        slot_s = live.spec.slot_s
        self.call_timeout_s = min(1.0, slot_s / 4) if call_timeout_s is None else call_timeout_s
        if not self.call_timeout_s > 0:
            raise InvalidInput("call_timeout_s", f"must be > 0, got {self.call_timeout_s}")
        self._channels = {dc: open_channel(a) for dc, a in dc_addresses.items()}
        self._stubs = {dc: dgrpc.DatacenterStub(ch) for dc, ch in self._channels.items()}
        self.metrics = metrics
        self.last_latency_s = 0.0
        self.failed_calls = 0
        self.closed = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="carm-slots")

    async def stop(self) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for ch in self._channels.values():
            await ch.close()

    async def _run(self) -> None:
        slot_s = self.live.spec.slot_s
        k = max(math.floor(self.clock.now() / slot_s + 1e-9), 0)
        while not self.closed:
            start = k * slot_s
            lateness = await self.clock.sleep_until(start)
            if lateness > slot_s:  # a whole slot lost (e.g. a stall): plan the current one
                k = math.floor(self.clock.now() / slot_s)
                start = k * slot_s
            try:
                await self.run_slot(start)
            except Exception:  # keep planning; a broken slot must not end the service
                log.exception("slot at t=%.1f s failed", start)
            k += 1

    async def _timed(self, call: Awaitable[T]) -> T | grpc.aio.AioRpcError:
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            self.failed_calls += 1
            return exc

    async def run_slot(self, slot_start_s: float) -> list[SlotPlan]:
        t0 = time.perf_counter()
        timeout = self.clock.wall_delay(self.call_timeout_s)
        names = list(self._stubs)
        replies = await asyncio.gather(*(self._timed(
            self._stubs[n].GetState(dpb.GetStateRequest(), timeout=timeout)) for n in names))
        for n, rep in zip(names, replies, strict=True):
            if isinstance(rep, dpb.DcStateReply):
                s = rep.state
                self.live.observe(n, s.time_s, s.completed + s.rejected + s.failed + s.in_flight)
            else:
                log.warning("GetState %s failed: %s", n, rep)
        plans = await asyncio.to_thread(self.live.plan, slot_start_s)
        acks = await asyncio.gather(*(self._timed(self._stubs[p.dc].ApplyCarmPlan(
            dpb.CarmSlotPlan(slot_start_s=p.slot_start_s, slot_length_s=p.slot_length_s,
                             gpu_frequency_mhz=p.gpu_frequency_mhz,
                             training_power_w=p.training_power_w,
                             renewable_supply_w=p.renewable_supply_w),
            timeout=timeout)) for p in plans))
        for p, ack in zip(plans, acks, strict=True):
            if not isinstance(ack, dpb.CarmSlotAck):
                log.warning("ApplyCarmPlan %s failed: %s", p.dc, ack)
        self.last_latency_s = (time.perf_counter() - t0) / self.clock.dilation
        c = self.live.counters
        if self.metrics is not None:
            self.metrics.on_slot(plans, self.last_latency_s, c.deadlines_missed)
        log.info("slot %d (t=%.1f s): %s; %.3f s (plan %.3f s)", c.slots - 1, slot_start_s,
                 ", ".join(f"{p.dc} {p.gpu_frequency_mhz:.0f} MHz tr {p.training_power_w:.0f} W "
                           f"ren {p.renewable_supply_w:.0f} W" for p in plans),
                 self.last_latency_s, c.last_slot_latency_s)
        return plans

    def status(self) -> cpb.CarmStatus:
        c = self.live.counters
        out = cpb.CarmStatus(
            formulation=FORMULATION_NAMES.get(self.live.spec.formulation,
                                              self.live.spec.formulation),
            slot=c.slots, training_deadlines_missed=c.deadlines_missed,
            last_slot_latency_s=self.last_latency_s)
        for name in self.live.sites:
            p = self.live.plans.get(name)
            if p is None:
                continue
            out.plans.append(cpb.DcPlan(
                dc=name,
                plan=dpb.CarmSlotPlan(slot_start_s=p.slot_start_s, slot_length_s=p.slot_length_s,
                                      gpu_frequency_mhz=p.gpu_frequency_mhz,
                                      training_power_w=p.training_power_w,
                                      renewable_supply_w=p.renewable_supply_w),
                solver_status=p.solver_status,
                solve_s=c.last_slot_latency_s,
                training_jobs_running=p.training_jobs_running))
        return out


class CarmService(cgrpc.CarmServicer):
    def __init__(self, rt: WallCarm) -> None:
        self.rt = rt

    async def Status(  # noqa: N802 (gRPC method name)
        self, request: cpb.CarmStatusRequest, context: grpc.aio.ServicerContext
    ) -> cpb.CarmStatus:
        return self.rt.status()


async def serve(rt: WallCarm, address: str, stop_grace_s: float = 1.0,
                ready: asyncio.Event | None = None) -> None:
    """Run the CA-RM service until SIGTERM/SIGINT (health NOT_SERVING, stop slots, stop)."""
    server, health_servicer, port = await start_server(
        [(cgrpc.add_CarmServicer_to_server, CarmService(rt))],
        [cpb.DESCRIPTOR.services_by_name["Carm"].full_name],
        address,
    )
    spec = rt.live.spec
    log.info("carm serving on port %d: %d DCs, slot %.1f s x %d, %s, dilation %g", port,
             len(rt.live.sites), spec.slot_s, spec.horizon_slots, spec.formulation,
             rt.clock.dilation)
    rt.start()
    stopping = asyncio.Event()

    async def on_stop() -> None:
        await set_not_serving(health_servicer)
        await rt.stop()
        await server.stop(stop_grace_s)
        stopping.set()

    install_signal_handlers(on_stop)
    if ready is not None:
        ready.set()
    await stopping.wait()
