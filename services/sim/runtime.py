"""The virtual runtime: a whole topology in one process on a virtual clock.

The same cores as the wall runtime — `Datacenter`/`Engine`, `SchedulerCore` with the
registry's policies, the load plan and the summary — wired through a `VirtualClock`
instead of gRPC and sleeps:

* the load generator's planned requests arrive at their origin scheduler at their time;
* a decision takes the policy's measured wall time (charged to emulated time unless
  ``charge_solver_time`` is off, which makes runs bit-for-bit deterministic);
* a forwarded request reaches the peer scheduler RTT/2 later, joins its window, and goes
  to the target DC when that window closes; first-token and completion notices reach the
  origin RTT/2 after they happen, so TTFT includes the full RTT;
* the provisioner samples every DC every Δp (sync: all at the tick; async: DC i at offset
  i·Δp/n) and hands the snapshot to every scheduler at once.

After the load ends the run continues until every request has finished (or
``drain_limit_s`` has passed, after which the rest are recorded as failed).

With a ``carm:`` section in the topology a CA-RM slot event runs every slot during the
load (``services.carm.live.CarmLive``, the same glue as the CA-RM service): it observes each
DC's request count, plans, and applies each plan to the DC core directly
(``set_frequency``, ``apply_carm``); after the last slot training stops. Planning time is
measured (slot latency) but not charged to emulated time. The summary gets a ``carm`` key.

With ``metrics_csv`` the run also writes the services' Prometheus series (the same
`services.runtime.metrics` objects the wall runtime serves) to CSV, sampled every
provisioner period during the load, at the first event past each period while draining,
and at the end. Per-engine series are left out unless ``metrics_per_engine`` (at
base.yaml's 512 engines they are 85 % of the rows and of the sampling time); per-request
updates are applied in bulk before each sample (`services.runtime.metrics.Deferred`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from geoserve.v1 import common_pb2 as pb

from services.config.factory import build_datacenter
from services.config.topology import Topology
from services.datacenter.convert import counters_to_proto
from services.datacenter.dc import Datacenter
from services.datacenter.driver import DcDriver
from services.datacenter.engine import (
    EngineEvent,
    EngineRequest,
    FinishedRequest,
    FirstToken,
)
from services.loadgen.plan import PlannedRequest, plan_requests
from services.loadgen.records import COMPLETED, FAILED, REJECTED, RecordRow
from services.loadgen.summary import (
    DcFinal,
    dc_final_from_states,
    load_window,
    occupancy_block,
    summarize,
)
from services.model.errors import GeoServeError
from services.model.state import RequestView, latencies
from services.provisioner.convert import batch_occupancy, snapshot_to_proto, snapshot_to_view
from services.provisioner.core import Poll, SnapshotData
from services.provisioner.driver import ProvisionerDriver, core_for_topology
from services.runtime.vclock import VirtualClock
from services.scheduler.core import Dispatch, SchedulerCore
from services.scheduler.driver import Journey, SchedulerDriver, core_for_region
from services.scheduler.policies.base import zero_clock
from services.scheduler.summary import scheduler_block

Progress = Callable[[float, int, int], None]


def dc_state(dc: Datacenter, now: float) -> pb.DcState:
    """What a `GetState` poll of the DC returns (the same conversion as the DC service)."""
    return counters_to_proto(dc, dc.counters(now), []).state


class _SimMetrics:
    """The services' metrics objects over the virtual runtime's cores, sampled to CSV."""

    def __init__(self, run: SimRun, path: Path) -> None:
        from services.runtime.metrics import (
            DcMetrics,
            Deferred,
            HotMetrics,
            LoadgenMetrics,
            MetricsCsv,
            SchedulerMetrics,
        )

        self.run = run
        self.period_s = run.topo.provisioner.period_s
        self.next_s = 0.0

        def now() -> float:
            return run.clock.now()

        self.dc = {n: DcMetrics(per_engine=run.metrics_per_engine) for n in run.dcs}
        for n, m in self.dc.items():
            m.attach(run.dcs[n], now)
        self.sched = {r: SchedulerMetrics() for r in run.schedulers}
        for r, sm in self.sched.items():
            sm.attach(run.schedulers[r], now)
        self.lg = LoadgenMetrics({r.name: run.schedulers[r.name].policy.name
                                  for r in run.topo.regions})
        self.lg.attach(now)
        # per-request updates applied in bulk before each sample (nothing reads them between)
        self.deferred = Deferred()
        hot: list[HotMetrics] = [*self.dc.values(), *self.sched.values(), self.lg,
                                 *(m.vllm for m in self.dc.values() if m.vllm is not None)]
        for h in hot:
            h.deferred = self.deferred
        self.csv = MetricsCsv(path)

    def completed(self, dc: str, row: RecordRow) -> None:
        ttft, e2e = latencies(row.scheduler_arrival_s, row.first_token_s, row.completed_s)
        m = self.dc[dc]
        m.on_completed(ttft, row.tpot_s, e2e, row.queue_s, row.isl_tokens, row.output_tokens)
        if m.vllm is not None:
            m.vllm.on_request(row.engine, row.dc_arrival_s, row.admitted_s, row.first_token_s,
                              row.completed_s, row.isl_tokens, row.output_tokens)
        self.lg.on_finished(row)

    def schedule(self, end_s: float) -> None:
        for k in range(int(end_s / self.period_s) + 1):
            self.run.clock.call_at(k * self.period_s, self.sample)

    def sample(self) -> None:
        now = self.run.clock.now()
        self.deferred.flush()
        self.csv.sample(now, [*self.dc.values(), *self.sched.values(), self.lg])
        self.next_s = now + self.period_s

    def maybe_sample(self) -> None:
        if self.run.clock.now() >= self.next_s:
            self.sample()

    def close(self) -> None:
        self.sample()
        self.csv.close()


def _origin_fields(row: RecordRow, j: Journey) -> None:
    """The origin's stamps and decision of a request, from its journey."""
    row.decided_s = j.decided_s
    row.decision_s = j.decision_s
    row.fallback = j.fallback
    row.forwarded = j.forwarded


@dataclass(slots=True)
class _Req:
    row: RecordRow
    model: str


class SimRun:
    def __init__(
        self,
        topo: Topology,
        *,
        charge_solver_time: bool = True,
        drain_limit_s: float = 600.0,
        progress: Progress | None = None,
        metrics_csv: Path | None = None,
        metrics_per_engine: bool = False,
    ) -> None:
        self.topo = topo
        self.metrics_per_engine = metrics_per_engine
        self.clock = VirtualClock(0.0)
        self.charge = charge_solver_time
        self.drain_limit_s = drain_limit_s
        self.progress = progress
        self.dcs: dict[str, Datacenter] = {}
        self.drivers: dict[str, DcDriver] = {}
        for spec in topo.dcs:
            dc = build_datacenter(topo, spec.name, 0.0)
            self.dcs[spec.name] = dc
            self.drivers[spec.name] = DcDriver(dc, self.clock, self._dc_sink(spec.name),
                                               record_lateness=False)
        policy_clock = time.perf_counter if charge_solver_time else zero_clock
        self.schedulers: dict[str, SchedulerCore] = {}
        self.sched: dict[str, SchedulerDriver] = {}
        for region in topo.regions:
            core = core_for_region(topo, region.name, policy_clock)
            self.schedulers[region.name] = core
            self.sched[region.name] = SchedulerDriver(
                core, self.clock, topo.rtt_s, self,
                (lambda s: s) if charge_solver_time else (lambda s: 0.0),
                on_decision=self._on_decision(region.name))
        self.reqs: dict[str, _Req] = {}
        self._plan: list[PlannedRequest | None] = []
        self.in_flight = 0
        self.emitted: list[str] = []
        self.prov: ProvisionerDriver[pb.DcState] = ProvisionerDriver(
            core_for_topology(topo, 0.0), self.clock, self._issue_poll, self._publish,
            occupancy=batch_occupancy)
        self.snapshots = 0
        self.wall_s = 0.0
        self._m = _SimMetrics(self, metrics_csv) if metrics_csv is not None else None
        self.carm: Any = None
        self._carm_freq: dict[str, list[tuple[float, float]]] = {}
        if topo.carm is not None:
            from services.carm.live import CarmLive

            self.carm = CarmLive(topo, perf_clock=time.perf_counter)

    # ---------------------------------------------------------------- CA-RM
    def _schedule_carm(self, end_s: float) -> None:
        assert self.topo.carm is not None
        slot = self.topo.carm.slot_s
        n = max(math.ceil(end_s / slot - 1e-9), 1)
        for k in range(n):
            self.clock.call_at(k * slot, self._carm_slot)
        self.clock.call_at(n * slot, self._carm_end)

    def _carm_slot(self) -> None:
        now = self.clock.now()
        for name, dc in self.dcs.items():
            self.carm.observe(name, now, dc.completed + dc.rejected + dc.failed + dc.in_flight())
        for p in self.carm.plan(now):
            dc = self.dcs[p.dc]
            dc.apply_carm(now, p.training_power_w, p.renewable_supply_w)
            self._carm_freq.setdefault(p.dc, []).append((now, self.drivers[p.dc].set_frequency(
                p.gpu_frequency_mhz)))

    def _carm_end(self) -> None:
        now = self.clock.now()
        for name, dc in self.dcs.items():
            dc.apply_carm(now, 0.0, self.carm.supply_w(name, now, now + self.carm.spec.slot_s))
        self.carm.finish(now)

    # ---------------------------------------------------------------- load
    def _arrive(self, i: int) -> None:
        plan = self._plan
        if i + 1 < len(plan):
            nxt = plan[i + 1]
            assert nxt is not None
            self.clock.call_at(nxt.t_s, self._arrive, i + 1)
        p = plan[i]
        plan[i] = None  # emitted: its row holds what is left of it
        assert p is not None
        self._emit(p)

    def _emit(self, p: PlannedRequest) -> None:
        now = self.clock.now()
        row = RecordRow.for_plan(p, emitted_s=now, scheduler_arrival_s=now,
                                 policy=self.schedulers[p.origin_region].policy.name)
        self.reqs[p.id] = _Req(row, p.model)
        self.emitted.append(p.id)
        if self._m is not None:
            self._m.lg.on_emitted(p.origin_region)
        self.in_flight += 1
        view = RequestView(
            id=p.id, model=p.model, isl_tokens=p.isl_tokens, osl_tokens=p.osl_tokens,
            origin_region=p.origin_region, ttft_slo_s=p.ttft_slo_s, tpot_slo_s=p.tpot_slo_s,
            arrival_s=now, dataset=p.dataset,
        )
        self.sched[p.origin_region].submit(view)

    # ---------------------------------------------------------------- transport
    # (the virtual transport of `SchedulerDriver`: direct calls)
    def _on_decision(self, region: str) -> Callable[[Dispatch], None]:
        def hook(d: Dispatch) -> None:
            if self._m is not None:
                self._m.sched[region].on_decision(d)
        return hook

    def to_peer(self, region: str, rid: str, dc: str, arrive_s: float) -> None:
        self.sched[region].forwarded_in(rid, dc)

    def reject(self, rid: str, reason: str) -> None:
        self._finish_failed(rid, REJECTED, reason, "UNAVAILABLE")

    def to_dc(self, rid: str, dc: str) -> None:
        r = self.reqs[rid]
        row = r.row
        row.dc = dc
        row.dc_region = self.dcs[dc].config.region
        row.dc_arrival_s = self.clock.now()
        ereq = EngineRequest(rid, row.isl_tokens, row.osl_tokens, self.clock.now(),
                             payload=rid)
        try:
            idx = self.drivers[dc].submit(ereq, r.model)
        except GeoServeError as exc:
            self.dcs[dc].rejected += 1
            self._finish_failed(rid, REJECTED, str(exc), exc.status_code)
            return
        row.engine = self.dcs[dc].engines[idx].name

    # ---------------------------------------------------------------- datacenters
    def _dc_sink(self, dc: str) -> Callable[[int, Sequence[EngineEvent]], None]:
        def sink(idx: int, events: Sequence[EngineEvent]) -> None:
            for ev in events:
                row = self.reqs[ev.request_id].row
                drv = self.sched[row.origin_region]
                if isinstance(ev, FirstToken):
                    row.first_token_s = ev.time_s
                    drv.deliver(ev.request_id, ev.time_s, drv.first_token, ev.request_id)
                else:
                    drv.deliver(ev.request_id, ev.time_s, self._completed, dc, ev.finished)

        return sink

    def _completed(self, t_origin: float, dc: str, f: FinishedRequest) -> None:
        row = self.reqs[f.id].row
        j = self.sched[row.origin_region].done(f.id)
        assert j is not None
        _origin_fields(row, j)
        row.admitted_s = f.admitted_s
        row.completed_s = f.completed_s
        row.first_token_origin_s, row.completed_origin_s, row.ttft_s, row.e2e_s = \
            j.latencies(f.first_token_s, f.completed_s)
        row.output_tokens = f.output_tokens
        row.prefill_tokens = f.prefilled_tokens
        row.preemptions = f.preemptions
        row.energy_j = f.energy_j
        row.tpot_s = f.tpot_s
        row.queue_s = f.queue_s
        row.state = COMPLETED
        self.in_flight -= 1
        if self._m is not None:
            self._m.completed(dc, row)

    def _finish_failed(self, rid: str, state: str, reason: str, code: str) -> None:
        row = self.reqs[rid].row
        if row.state:
            return
        j = self.sched[row.origin_region].done(rid)
        if j is not None:
            _origin_fields(row, j)
        row.state = state
        row.reason = reason
        row.status_code = code
        self.in_flight -= 1
        if self._m is not None:
            self._m.lg.on_finished(row)

    # ---------------------------------------------------------------- provisioner
    def _issue_poll(self, poll: Poll) -> None:
        """The virtual transport of a poll: read the DC core now, answer at once."""
        state = dc_state(self.dcs[poll.dc], self.clock.now())
        self.prov.ok(poll, state, dc_up=state.up)

    def _publish(self, data: SnapshotData[pb.DcState]) -> None:
        now = self.clock.now()
        snap = snapshot_to_view(snapshot_to_proto(data))
        self.snapshots += 1
        for s in self.schedulers.values():
            s.on_snapshot(snap, now)

    # ---------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        t_wall = time.perf_counter()
        plan = plan_requests(self.topo)
        self._start_states = {n: dc_state(dc, 0.0) for n, dc in self.dcs.items()}
        duration = self.topo.load.duration_s
        plan.sort(key=lambda p: p.t_s)  # stable: already in time order from the plan
        if plan:  # one arrival on the clock at a time (each schedules the next)
            self.clock.call_at(plan[0].t_s, self._arrive, 0)
        self._plan = list[PlannedRequest | None](plan)
        del plan  # each entry is dropped once emitted
        horizon = duration + self.drain_limit_s
        self.prov.until_s = duration
        self.prov.start()
        if self.carm is not None:
            self._schedule_carm(duration)
        if self._m is not None:
            self._m.schedule(duration)
        step = max(duration / 10, 1.0)
        t = 0.0
        while t < duration:
            t = min(t + step, duration)
            self.clock.run(until=t)
            if self.progress:
                self.progress(t, len(self.emitted), len(self.emitted) - self.in_flight)
        # drain: run until everything emitted has finished, in chunks
        while self.in_flight > 0:
            nxt = self.clock.peek()
            if nxt is None or nxt > horizon:
                break
            self.clock.run(until=nxt)  # event by event: the run ends at the last completion
            if self._m is not None:
                self._m.maybe_sample()
        end = self.clock.now()
        if self.in_flight > 0:
            for rid in self.emitted:
                self._finish_failed(rid, FAILED, "run ended before the request finished",
                                    "DEADLINE_EXCEEDED")
        if self._m is not None:
            self._m.close()
        self.end_s = end
        self.wall_s = time.perf_counter() - t_wall
        return self.summary()

    def _carm_summary(self, finals: list[DcFinal]) -> dict[str, Any]:
        """CA-RM figures: energy by source, deadlines, frequency per DC (time-weighted)."""
        out: dict[str, Any] = dict(self.carm.summary())
        fac = sum(f.facility_j for f in finals)
        ren = sum(f.renewable_j for f in finals)
        out["training_energy_j"] = sum(f.training_j for f in finals)
        out["renewable_energy_j"] = ren
        out["grid_energy_j"] = sum(f.grid_j for f in finals)
        out["renewable_share"] = ren / fac if fac > 0 else 0.0
        per_dc: dict[str, Any] = {}
        for f in finals:
            hist = self._carm_freq.get(f.dc, [])
            ts = [t for t, _ in hist] + [max(self.end_s, hist[-1][0] if hist else 0.0)]
            dur = np.diff(ts) if hist else np.zeros(0)
            mhz = np.array([m for _, m in hist])
            per_dc[f.dc] = {
                "training_energy_j": f.training_j,
                "renewable_energy_j": f.renewable_j,
                "grid_energy_j": f.grid_j,
                "facility_energy_j": f.facility_j,
                "gpu_frequency_mhz_mean": float(np.sum(mhz * dur) / np.sum(dur))
                if hist and np.sum(dur) > 0 else None,
                "gpu_frequency_mhz_slots": [m for _, m in hist],
            }
        out["dcs"] = per_dc
        return out

    def records(self) -> list[RecordRow]:
        return [self.reqs[rid].row for rid in self.emitted]

    def summary(self) -> dict[str, Any]:
        end = self.end_s
        load = self.topo.load
        end_states = {d.name: dc_state(self.dcs[d.name], end) for d in self.topo.dcs}
        finals = [dc_final_from_states(self._start_states[d.name], end_states[d.name])
                  for d in self.topo.dcs]
        occ = self.prov.window_stats(load.warmup_s, load.duration_s)
        sched = {region: scheduler_block(s, self.snapshots)
                 for region, s in self.schedulers.items()}
        config = {
            **self.topo.to_dict(),
            "policy": ",".join(sorted({s.policy.name for s in self.schedulers.values()})),
            "charge_solver_time": self.charge,
        }
        out = summarize(
            self.records(),
            self.emitted,
            finals,
            runtime="virtual",
            config=config,
            warmup_s=self.topo.load.warmup_s,
            dilation=1.0,
            scheduler=sched,
            wall_s=self.wall_s,
            emulated_s=end,
            provisioner=self.prov.window_stats(0.0, load.duration_s).as_dict(),
            occupancy=occupancy_block(occ.mean_batch_ratio, occ.occupancy_samples),
            window=load_window(0.0, end, self._start_states, end_states),
        )
        if self.carm is not None:
            out["carm"] = self._carm_summary(finals)
        return out
