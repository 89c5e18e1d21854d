"""The load generator process (wall runtime): emit, dispatch, collect, summarise.

* Plans the requests (`services.loadgen.plan`), opens one Submit stream per regional
  scheduler and emits each request at its planned time (time-dilated) to its origin
  region's scheduler.
* Collects the events; every request ends in exactly one record: the scheduler's
  FINISHED record, FAILED when its scheduler's stream broke, or FAILED when no record
  arrived within ``drain_limit_s`` after the load ended.
* Energy and carbon cover the load window: DC counters are read when the load starts and
  after the last record, and the difference is reported. The summary's ``window`` block
  keeps the absolute DC carbon counters and the DCs' emulated times of both reads, so the
  window can be cut out of other sources of the same counters (Prometheus).
* With a `LoadgenMetrics` attached, every emitted request and every terminal record
  also feeds the Prometheus counters and histograms.
* Writes ``records.csv`` and ``summary.json`` into the output folder and prints progress
  and a summary table.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import grpc
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dgrpc
from geoserve.v1 import provisioner_pb2 as ppb
from geoserve.v1 import provisioner_pb2_grpc as pgrpc
from geoserve.v1 import scheduler_pb2 as spb
from geoserve.v1 import scheduler_pb2_grpc as sgrpc

from services.config.topology import Topology
from services.loadgen.plan import PlannedRequest, plan_requests
from services.loadgen.records import (
    COMPLETED,
    FAILED,
    REJECTED,
    RecordJournal,
    RecordRow,
    write_csv,
)
from services.loadgen.summary import (
    dc_final_from_states,
    format_table,
    load_window,
    occupancy_block,
    partial_block,
    summarize,
)
from services.model.errors import InvalidInput
from services.provisioner.convert import window_stats_from_proto
from services.runtime.clock import WallClock
from services.runtime.grpcutil import CHANNEL_OPTIONS, open_channel
from services.runtime.metrics import LoadgenMetrics
from services.scheduler.summary import block_from_info

STATE_NAMES = {pb.COMPLETED: COMPLETED, pb.REJECTED: REJECTED, pb.FAILED: FAILED}


def row_from_record(rec: pb.RequestRecord, plan: PlannedRequest, t0: float) -> RecordRow:
    """A flat record with times relative to the start of the load (`t0`)."""
    r = rec.request
    ts = r.timestamps

    def rel(v: float) -> float:
        return v - t0 if v > 0 else math.nan

    done = rec.state == pb.COMPLETED
    return RecordRow.for_plan(
        plan,
        state=STATE_NAMES.get(rec.state, FAILED),
        reason=rec.reason,
        status_code=rec.status_code,
        dc=rec.dc or r.target_dc,
        dc_region=r.target_region,
        engine=rec.engine,
        forwarded=r.forwarded,
        fallback=r.fallback,
        policy=r.policy,
        emitted_s=rel(ts.emitted_s),
        scheduler_arrival_s=rel(ts.scheduler_arrival_s),
        decided_s=rel(ts.decided_s),
        dc_arrival_s=rel(ts.dc_arrival_s),
        admitted_s=rel(ts.admitted_s),
        first_token_s=rel(ts.first_token_s),
        completed_s=rel(ts.completed_s),
        first_token_origin_s=rel(ts.first_token_origin_s),
        completed_origin_s=rel(ts.completed_origin_s),
        ttft_s=rec.ttft_s if done else math.nan,
        tpot_s=rec.tpot_s if done else math.nan,
        e2e_s=rec.e2e_s if done else math.nan,
        queue_s=rec.queue_s if done else math.nan,
        output_tokens=rec.output_tokens,
        prefill_tokens=rec.prefill_tokens,
        preemptions=rec.preemptions,
        energy_j=rec.energy_j,
        decision_s=r.decision_s if ts.decided_s > 0 else math.nan,
    )


def failed_row(plan: PlannedRequest, t0: float, emitted_s: float, reason: str) -> RecordRow:
    return RecordRow.for_plan(
        plan, state=FAILED, reason=reason, status_code="UNAVAILABLE",
        emitted_s=emitted_s - t0 if emitted_s else math.nan,
    )


class LoadGenerator:
    def __init__(
        self,
        topo: Topology,
        schedulers: Mapping[str, str],
        dcs: Mapping[str, str],
        clock: WallClock,
        out_dir: Path | None,
        drain_limit_s: float = 120.0,
        progress_every_s: float = 5.0,
        stream: TextIO = sys.stdout,
        provisioner: str | None = None,
    ) -> None:
        self.topo = topo
        self.provisioner = provisioner
        self.schedulers = dict(schedulers)
        self.dcs = dict(dcs)
        self.clock = clock
        self.out_dir = out_dir
        self.drain_limit_s = drain_limit_s
        self.progress_every_s = progress_every_s
        self.out = stream
        self.plan = plan_requests(topo)
        self.by_id = {p.id: p for p in self.plan}
        self.rows: dict[str, RecordRow] = {}
        self.emitted_at: dict[str, float] = {}
        self.outstanding: dict[str, set[str]] = {r: set() for r in self.schedulers}
        self.t0 = 0.0
        self.metrics: LoadgenMetrics | None = None
        self.journal = RecordJournal(out_dir) if out_dir is not None else None
        self.interrupted: str | None = None   # why the load stopped early (a signal)
        self._stop = asyncio.Event()

    def interrupt(self, reason: str) -> None:
        """Stop emitting; every request emitted so far still gets exactly one record."""
        if self.interrupted is None:
            self.interrupted = reason
            self.log(f"loadgen: {reason}; writing the partial results")
        self._stop.set()

    def log(self, msg: str) -> None:
        print(msg, file=self.out, flush=True)

    async def _dc_states(self) -> dict[str, pb.DcState]:
        async def one(name: str, addr: str) -> tuple[str, pb.DcState | None]:
            async with open_channel(addr, options=CHANNEL_OPTIONS) as ch:
                try:
                    r = await dgrpc.DatacenterStub(ch).GetState(dpb.GetStateRequest(), timeout=5)
                    return name, r.state
                except grpc.aio.AioRpcError:
                    return name, None

        got = await asyncio.gather(*(one(n, a) for n, a in self.dcs.items()))
        return {n: s for n, s in got if s is not None}

    async def _provisioner_stats(self, since_s: float, until_s: float
                                 ) -> ppb.ProvisionerStats | None:
        if not self.provisioner:
            return None
        async with open_channel(self.provisioner, options=CHANNEL_OPTIONS) as ch:
            try:
                return await pgrpc.ProvisionerStub(ch).GetStats(
                    ppb.GetStatsRequest(since_s=since_s, until_s=until_s), timeout=5)
            except grpc.aio.AioRpcError:
                return None

    async def _scheduler_info(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for region, addr in self.schedulers.items():
            async with open_channel(addr, options=CHANNEL_OPTIONS) as ch:
                try:
                    i = await sgrpc.SchedulerStub(ch).Info(spb.SchedulerInfoRequest(), timeout=5)
                    out[region] = block_from_info(i)
                except grpc.aio.AioRpcError as exc:
                    out[region] = {"error": exc.code().name}
        return out

    def _record(self, rid: str, row: RecordRow) -> None:
        if rid in self.rows:
            return
        self.rows[rid] = row
        if self.journal is not None:
            self.journal.record(row)
        if self.metrics is not None:
            self.metrics.on_finished(row)

    async def _region_stream(self, region: str, addr: str, items: list[PlannedRequest],
                             all_sent: asyncio.Event) -> None:
        done = asyncio.Event()
        pending = self.outstanding[region]

        async def gen():  # type: ignore[no-untyped-def]
            for p in items:
                await self.clock.sleep_until(self.t0 + p.t_s)
                if self._stop.is_set():
                    break
                now = self.clock.now()
                self.emitted_at[p.id] = now
                if self.journal is not None:
                    self.journal.emitted(p.id, now - self.t0)
                req = pb.Request(
                    id=p.id, model=p.model, isl_tokens=p.isl_tokens, osl_tokens=p.osl_tokens,
                    dataset=p.dataset, origin_region=p.origin_region,
                    slo=pb.Slo(ttft_s=p.ttft_slo_s, tpot_s=p.tpot_slo_s),
                )
                req.timestamps.emitted_s = now
                pending.add(p.id)
                if self.metrics is not None:
                    self.metrics.on_emitted(region)
                yield req
            await done.wait()  # keep the stream open until every record is back

        try:
            async with open_channel(addr, options=CHANNEL_OPTIONS) as ch:
                call = sgrpc.SchedulerStub(ch).Submit(gen())
                async for ev in call:
                    if ev.kind != pb.FINISHED:
                        continue
                    p = self.by_id.get(ev.request_id)
                    if p is None:
                        continue
                    pending.discard(p.id)
                    self._record(p.id, row_from_record(ev.record, p, self.t0))
                    if all_sent.is_set() and not pending and len(self.emitted_at) >= len(items):
                        done.set()
                        break
                    if self._all_emitted(region, items) and not pending:
                        done.set()
                        break
        except grpc.aio.AioRpcError as exc:
            reason = f"scheduler {region} unreachable ({exc.code().name})"
            for rid in list(pending):
                p = self.by_id[rid]
                self._record(rid, failed_row(p, self.t0, self.emitted_at.get(rid, 0.0), reason))
            pending.clear()
            # requests not yet emitted to this region are never sent: record them too
            for p in items:
                if p.id not in self.emitted_at and p.id not in self.rows:
                    self.emitted_at[p.id] = self.clock.now()
                    self._record(p.id, failed_row(p, self.t0, 0.0, reason))

    def _all_emitted(self, region: str, items: list[PlannedRequest]) -> bool:
        return all(p.id in self.emitted_at for p in items[-1:]) if items else True

    async def _progress(self) -> None:
        start = time.monotonic()
        n = len(self.plan)
        while True:
            await asyncio.sleep(self.progress_every_s)
            emitted = len(self.emitted_at)
            done = len(self.rows)
            t = self.clock.now() - self.t0
            ok = sum(r.state == COMPLETED for r in self.rows.values())
            self.log(f"[{time.monotonic() - start:6.1f}s wall | t={t:7.1f}s emulated] "
                     f"emitted {emitted}/{n}  finished {done} (completed {ok})  "
                     f"in flight {emitted - done}")

    async def run(self) -> dict[str, Any]:
        wall0 = time.monotonic()
        start_states = await self._dc_states()
        self.t0 = self.clock.now()  # energy and carbon are counted from here
        by_region: dict[str, list[PlannedRequest]] = {r: [] for r in self.schedulers}
        for p in self.plan:
            if p.origin_region not in by_region:
                self._record(p.id, failed_row(p, self.t0, 0.0,
                                              f"no scheduler address for {p.origin_region}"))
                continue
            by_region[p.origin_region].append(p)
        self.log(f"load: {len(self.plan)} requests over {self.topo.load.duration_s:.0f} s "
                 f"emulated ({self.topo.load.rate_rps} req/s, {self.topo.load.dataset}), "
                 f"dilation {self.clock.dilation}")
        all_sent = asyncio.Event()
        prog = asyncio.create_task(self._progress())
        tasks = [
            asyncio.create_task(self._region_stream(r, self.schedulers[r], items, all_sent))
            for r, items in by_region.items()
        ]
        end_load = self.t0 + self.topo.load.duration_s
        stop: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
        sleeper: asyncio.Future[Any] = asyncio.ensure_future(self.clock.sleep_until(end_load))
        await asyncio.wait({sleeper, stop}, return_when=asyncio.FIRST_COMPLETED)
        sleeper.cancel()
        all_sent.set()
        if self.interrupted is None:
            drain: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*tasks))
            await asyncio.wait({drain, stop}, timeout=self.clock.wall_delay(self.drain_limit_s),
                               return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        prog.cancel()
        stop.cancel()
        plan = self.plan
        if self.interrupted is not None:  # the run covers what was emitted before the stop
            plan = [p for p in self.plan if p.id in self.emitted_at or p.id in self.rows]
        reason = (f"run interrupted ({self.interrupted}) before the request finished"
                  if self.interrupted else "no record before the run ended (drain limit)")
        for p in plan:
            if p.id not in self.rows:
                self._record(p.id, failed_row(p, self.t0, self.emitted_at.get(p.id, 0.0),
                                              reason))
        end_states = await self._dc_states()
        sched = await self._scheduler_info()
        load = self.topo.load
        prov_st = await self._provisioner_stats(self.t0, self.t0 + load.duration_s)
        occ = await self._provisioner_stats(self.t0 + load.warmup_s,
                                            self.t0 + load.duration_s)
        prov = window_stats_from_proto(prov_st).as_dict() if prov_st is not None else None
        end = self.clock.now()
        finals = [
            dc_final_from_states(start_states[n], end_states[n])
            for n in self.dcs
            if n in start_states and n in end_states
        ]
        # the policies the schedulers report running (a swapped scheduler may differ from
        # the topology); the topology's where a scheduler did not answer
        live = {i.get("policy") for i in sched.values() if i.get("policy")}
        planned = {r.scheduler.policy for r in self.topo.regions}
        config = {
            **self.topo.to_dict(),
            "policy": ",".join(sorted(live if len(live) and all(
                "policy" in i for i in sched.values()) else planned)),
        }
        rows = [self.rows[p.id] for p in plan]
        summary = summarize(
            rows,
            [p.id for p in plan],
            finals,
            runtime="wall",
            config=config,
            warmup_s=self.topo.load.warmup_s,
            dilation=self.clock.dilation,
            scheduler=sched,
            wall_s=time.monotonic() - wall0,
            emulated_s=end - self.t0,
            provisioner=prov,
            occupancy=occupancy_block(occ.mean_batch_ratio if occ else None,
                                      occ.occupancy_samples if occ else 0),  # 0.0: none
            window=load_window(self.t0, end, start_states, end_states),
            partial=partial_block(self.interrupted, len(self.plan), len(plan))
            if self.interrupted else None,
        )
        missing = sorted(set(self.dcs) - {f.dc for f in finals})
        if missing:
            summary["dcs_unreachable_at_end"] = missing
        if self.out_dir is not None:
            write_outputs(self.out_dir, rows, summary)
        if self.journal is not None:
            self.journal.close(remove=True)  # records.csv and summary.json are written
        self.log(format_table(summary))
        return summary


def rebuild_outputs(out_dir: Path, topo: Topology, reason: str) -> dict[str, Any]:
    """records.csv and summary.json from the journal a load generator left when it died
    (`RecordJournal`): every emitted request in exactly one terminal state (FAILED with
    `reason` where it had no record), the summary marked partial. Energy and carbon are
    not known (the DCs were not read at the end): they are reported as 0 and the partial
    block says so."""
    if not RecordJournal.exists(out_dir):
        raise InvalidInput(str(out_dir), f"no {RecordJournal.ROWS} to rebuild the run from")
    plan = plan_requests(topo)
    rows, ids = RecordJournal.rebuild(out_dir, reason, {p.id: p for p in plan})
    summary = summarize(
        rows, ids, [], runtime="wall", config=topo.to_dict(), warmup_s=topo.load.warmup_s,
        dilation=topo.dilation,
        partial={**partial_block(reason, len(plan), len(ids)),
                 "energy": "not measured: the run ended before the DCs were read"},
    )
    write_outputs(out_dir, rows, summary)
    for name in (RecordJournal.ROWS, RecordJournal.EMITTED):
        (out_dir / name).unlink(missing_ok=True)
    return summary


def write_outputs(out_dir: Path, rows: list[RecordRow], summary: Mapping[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "records.csv", rows)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=_json) + "\n")


def _json(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return str(v)
