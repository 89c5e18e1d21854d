"""Conversions between the datacenter core's data and the wire contract (protos)."""

from __future__ import annotations

from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb

from services.datacenter.dc import Datacenter, DcCounters
from services.datacenter.engine import FinishedRequest
from services.model.state import latencies


def finished_record(
    request: pb.Request, fin: FinishedRequest, dc: str, engine: str
) -> pb.RequestRecord:
    rec = pb.RequestRecord(state=pb.COMPLETED, dc=dc, engine=engine)
    rec.request.CopyFrom(request)
    ts = rec.request.timestamps
    ts.dc_arrival_s = fin.arrival_s
    ts.admitted_s = fin.admitted_s
    ts.first_token_s = fin.first_token_s
    ts.completed_s = fin.completed_s
    origin = ts.scheduler_arrival_s if ts.scheduler_arrival_s > 0 else fin.arrival_s
    rec.output_tokens = fin.output_tokens
    rec.prefill_tokens = fin.prefilled_tokens
    rec.preemptions = fin.preemptions
    rec.ttft_s, rec.e2e_s = latencies(origin, fin.first_token_s, fin.completed_s)
    rec.tpot_s = fin.tpot_s
    rec.queue_s = fin.queue_s
    rec.energy_j = fin.energy_j
    return rec


def failed_record(
    request: pb.Request,
    state: int,
    reason: str,
    status_code: str,
    dc: str,
    now: float,
    engine: str = "",
    dc_arrival_s: float = 0.0,
) -> pb.RequestRecord:
    rec = pb.RequestRecord(state=state, reason=reason, status_code=status_code, dc=dc,
                           engine=engine)  # type: ignore[arg-type]
    rec.request.CopyFrom(request)
    rec.request.timestamps.dc_arrival_s = dc_arrival_s or now
    return rec


def counters_to_proto(dc: Datacenter, c: DcCounters, names: list[str]) -> dpb.DcStateReply:
    cfg = dc.config
    e = c.energy
    state = pb.DcState(
        dc=cfg.name,
        region=cfg.region,
        zone=cfg.zone,
        time_s=c.time_s,
        up=not dc.draining,
        engines=c.engines,
        active_batch=c.active_batch,
        queue_tokens=c.queue_tokens,
        kv_occupancy_ratio=c.kv_occupancy_ratio,
        kv_tokens=c.kv_tokens,
        prefill_duty_ratio=c.prefill_duty_ratio,
        waiting_requests=c.waiting_requests,
        max_batch=dc.cal.engine.max_num_seqs,
        grid_ci_g_per_kwh=c.grid_ci_g_per_kwh,
        effective_ci_g_per_kwh=c.effective_ci_g_per_kwh,
        pue=cfg.pue,
        gpu_frequency_mhz=c.gpu_frequency_mhz,
        lateness_s_p50=c.lateness_s_p50,
        lateness_s_p99=c.lateness_s_p99,
        lateness_s_max=c.lateness_s_max,
        faithful=c.faithful,
        power_w=c.power_w,
        energy=pb.EnergyBreakdown(
            gpu_active_j=e.gpu_active_j,
            gpu_idle_j=e.gpu_idle_j,
            host_j=e.host_j,
            training_j=e.training_j,
            it_total_j=e.it_total_j,
            facility_j=c.facility_j,
            renewable_j=e.renewable_j,
            grid_j=e.grid_j,
        ),
        carbon_g=c.carbon_g,
        completed=dc.completed,
        rejected=dc.rejected,
        failed=dc.failed,
        in_flight=c.in_flight,
        model=dc.cal.model,
        gpu=dc.cal.gpu,
        tp=dc.cal.tp,
        renewable_w=dc.renewable_w,
        training_w=dc.training_w,
    )
    reply = dpb.DcStateReply(state=state)
    for name, row in zip(names, c.per_engine, strict=False):
        reply.engines.add(
            engine=name,
            running=int(row["running"]),
            waiting=int(row["waiting"]),
            queue_tokens=row["queue_tokens"],
            kv_tokens=row["kv_tokens"],
            kv_occupancy_ratio=row["kv_occupancy_ratio"],
            prefill_duty_ratio=row["prefill_duty_ratio"],
            steps=int(row["steps"]),
        )
    return reply
