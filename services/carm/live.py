"""CA-RM in a running emulation: the glue between a topology's DCs and `CarmController`.

Rules / theory of operation
---------------------------
* Sans-IO: ``CarmLive`` takes ``now`` (emulated seconds) and observations, and returns per-DC
  slot plans; the runtimes (``services/carm/server.py`` over gRPC, ``services/sim/runtime.py``
  on the virtual clock) carry them to the DCs. No clocks except an injected ``perf_clock`` used
  only to measure how long planning took (slot latency); randomness only from a seeded
  ``numpy.random.Generator`` (the generated training jobs).
* Sites: one ``DcSite`` per DC of the topology's ``carm:`` section: ``workers`` = the DC's
  engines, the CA-RM inference profile of the DC's calibration (``llama3.1-8b`` on ``a100``
  in ``data/carm/profiles.yaml`` for ``a100-40gb/llama-3.1-8b-tp1``), clock levels from the
  calibration's frequency model, ``train_nodes`` from the DC's training cluster. Training jobs
  use the RTX4090-profiled models of ``profiles.yaml`` (the only training profiles we have)
  evaluated at the DC's clock levels.
* Load forecast (requests/s, flat over the horizon): from the DC's cumulative request count
  (completed + rejected + failed + in flight = arrived). ``persistence``: the rate over the last
  observed interval; ``ewma``: ``r <- a * last + (1 - a) * r``. Before any observation the prior
  is the topology's load rate shared evenly by the DCs.
* Supply forecast (W, per horizon slot): PV nameplate x the site PV model's output at 1000 W/m2
  (``renewables.site_supply`` of ``data/carm/site.yaml``, 1-min resolution) plus wind rating x
  the ENTSO-E capacity factor; the trace day wraps every 24 h, emulated t = 0 is
  ``trace_start_hour`` of it. Traces are the truth, so the supply forecast is exact.
* Grid CI forecast (gCO2/kWh, per slot): the DC's CI source's mean over the slot
  (``build_ci(topo, dc).mean(t0, t1)``), i.e. a perfect forecast of the trace, unless
  ``carm.ci_forecast_error`` sets a relative error (`services.model.carbon.CIForecast`:
  growing with the square root of the lead time, seeded by the load seed).
* Plans: ``plan(now)`` submits the jobs that have arrived, calls ``plan_slot`` (one controller
  per DC, so one DC's trouble cannot stop the others) and snaps each frequency to the
  calibration's levels.
* Admission: the controller needs a feasible job set (Problem 2 has hard deadlines; its
  Problem-1 fallback still needs the work inside the horizon to fit). A job whose deadline
  cannot be met -- the DC's pending work at the top clock, earliest deadline first, does not fit
  in ``train_nodes x (deadline - now)`` or the job alone does not fit on its worker cap -- is
  handed to the controller with the earliest deadline that fits (its real deadline still counts).
  Should the controller still find no plan, the slot falls back to earliest-deadline-first at the
  top clock on every training node (status ``fallback``), advancing the controller's jobs.
  With ``control: none`` every slot is planned that way (status ``no-carm``): the reference
  without CA-RM that still has the supply and the training jobs.
* Deadlines: a job that leaves the controller's queue
  finished at the end of the slot it was last planned in -- met if that is not after its
  deadline; a job still pending once its deadline has passed is missed (counted once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.carm.controller import CarmController, DcPlan, DcSite
from services.carm.milp import MilpOptions
from services.carm.models import (
    FloatArray,
    InferenceProfile,
    TrainingProfile,
    epoch_time_s,
    epochs_per_slot,
    inference_power_w,
    latency_s,
    training_power_per_worker_w,
)
from services.carm.profiles import ProfileSet, load_profiles
from services.carm.renewables import load_site, site_supply
from services.carm.workload import load_workloads
from services.config.calibration import Calibration, load_calibration
from services.config.factory import build_ci
from services.config.topology import CarmDcSpec, CarmSpec, Topology
from services.model.carbon import CIForecast
from services.model.errors import ConfigError, InvalidInput, UsageError

DAY_S = 86400.0
MINUTE_S = 60.0
STC_W_PER_M2 = 1000.0


def _norm(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def inference_profile_for(cal: Calibration, profiles: ProfileSet) -> InferenceProfile:
    """The CA-RM inference profile of a calibration's (GPU, model); matched by name."""
    gpu, model = _norm(cal.gpu), _norm(cal.model)
    for p in profiles.models.values():
        if _norm(p.name) == model and gpu.startswith(_norm(p.gpu)):
            return p.inference
    raise ConfigError("data/carm/profiles.yaml", "models",
                      f"no inference profile for {cal.model} on {cal.gpu} (setup {cal.setup})")


class RenewableTraces:
    """Normalised 24 h PV (per W of nameplate) and wind (per W of rating) shapes, 1-min steps."""

    def __init__(self, site: Mapping[str, Any] | None = None) -> None:
        site = dict(site or load_site())
        sup = site_supply(site, MINUTE_S, int(DAY_S / MINUTE_S))
        sol = site["solar"]
        if str(sol.get("source", "nrel_midc")) == "nrel_midc":
            nameplate = float(sol["area_m2"]) * float(sol["efficiency"]) * STC_W_PER_M2
        else:
            nameplate = float(sol["peak_w"])
        self.pv = np.asarray(sup.solar_j / MINUTE_S / nameplate, dtype=np.float64)
        self.wind = np.asarray(sup.wind_j / MINUTE_S / float(site["wind"]["rated_w"]),
                               dtype=np.float64)
        self.pv_source, self.wind_source = sup.solar_source, sup.wind_source
        self._cum_pv = np.concatenate([[0.0], np.cumsum(self.pv)])
        self._cum_wind = np.concatenate([[0.0], np.cumsum(self.wind)])

    @staticmethod
    def _integral(cum: FloatArray, t_s: float) -> float:
        """Integral of a wrapped 1-min series from trace time 0 to ``t_s`` (W*s per W)."""
        n = len(cum) - 1
        days, rest = divmod(t_s, DAY_S)
        k = int(rest // MINUTE_S)
        frac = rest - k * MINUTE_S
        part = cum[k] * MINUTE_S + (cum[k + 1] - cum[k]) * frac if k < n else cum[n] * MINUTE_S
        return float(days * cum[n] * MINUTE_S + part)

    def mean_w(self, spec: CarmDcSpec, t0_s: float, t1_s: float) -> float:
        """Mean renewable power of a DC over emulated [t0, t1)."""
        if not t1_s > t0_s:
            raise InvalidInput("t1_s", f"expected > t0_s ({t0_s}), got {t1_s}")
        off = spec.trace_start_hour * 3600.0
        a, b = t0_s + off, t1_s + off
        pv = (self._integral(self._cum_pv, b) - self._integral(self._cum_pv, a)) / (b - a)
        wind = (self._integral(self._cum_wind, b) - self._integral(self._cum_wind, a)) / (b - a)
        return max(spec.pv_peak_w * pv + spec.wind_peak_w * wind, 0.0)


@dataclass(frozen=True)
class SlotPlan:
    """What a DC is told for one slot (``CarmSlotPlan`` on the wire) plus the planner's view."""

    dc: str
    slot_start_s: float
    slot_length_s: float
    gpu_frequency_mhz: float
    training_power_w: float
    renewable_supply_w: float
    solver_status: str
    training_jobs_running: int
    training_workers: int
    load_forecast_rps: float
    grid_ci_g_per_kwh: float
    expected_latency_s: float


@dataclass
class _JobState:
    dc: str
    job_id: str
    model: str
    epochs: float
    arrival_s: float
    deadline_s: float
    submitted: bool = False
    state: str = "waiting"        # waiting | pending | met | missed
    finished_s: float = math.nan


@dataclass
class _Load:
    rate_rps: float
    last_count: int | None = None
    last_s: float = 0.0


@dataclass
class CarmCounters:
    slots: int = 0
    deadlines_met: int = 0
    deadlines_missed: int = 0
    slot_latency_s: list[float] = field(default_factory=list)

    @property
    def last_slot_latency_s(self) -> float:
        return self.slot_latency_s[-1] if self.slot_latency_s else 0.0


def _zero_clock() -> float:
    return 0.0


class CarmLive:
    """Per-slot CA-RM planning for the DCs of a topology (see the module docstring)."""

    def __init__(
        self,
        topo: Topology,
        *,
        perf_clock: Callable[[], float] = _zero_clock,
        rng: np.random.Generator | None = None,
        profiles: ProfileSet | None = None,
        traces: RenewableTraces | None = None,
    ) -> None:
        if topo.carm is None:
            raise InvalidInput("carm", f"topology {topo.name} has no carm section")
        self.topo = topo
        self.spec: CarmSpec = topo.carm
        self.perf_clock = perf_clock
        self.profiles = profiles or load_profiles()
        self.traces = traces or RenewableTraces()
        self.cals: dict[str, Calibration] = {}
        self.ci: dict[str, Any] = {}
        self.ci_forecast: dict[str, CIForecast] = {}
        sites: list[DcSite] = []
        for d in topo.dcs:
            cal = load_calibration(d.setup)
            self.cals[d.name] = cal
            self.ci[d.name] = build_ci(topo, d)
            # the grid CI the planner sees ahead: the trace, or a forecast with an error
            self.ci_forecast[d.name] = CIForecast(self.ci[d.name],
                                                  self.spec.ci_forecast_error, topo.load.seed)
            cs = self.spec.dc(d.name)
            sites.append(DcSite(
                name=d.name,
                levels_mhz=tuple(float(x) for x in cal.frequency.levels_mhz),
                inference=inference_profile_for(cal, self.profiles),
                workers=d.nodes * d.gpus_per_node // cal.tp,
                train_nodes=cs.training.nodes,
                renewable_g_per_wh=self.spec.renewable_g_per_kwh / 1000.0,
            ))
        self.sites = {s.name: s for s in sites}
        opts = MilpOptions(time_limit_s=self.spec.time_limit_s)
        self.controllers = {s.name: CarmController([s], self.spec.slot_s, opts,
                                                   formulation=self.spec.formulation)
                            for s in sites}
        prior = topo.load.rate_rps / max(len(sites), 1)
        self.load = {s.name: _Load(prior) for s in sites}
        self.jobs: dict[str, _JobState] = {}
        self._train_profile: dict[str, TrainingProfile] = {}
        self._make_jobs(rng if rng is not None else np.random.default_rng(topo.load.seed + 7000))
        self.counters = CarmCounters()
        self.plans: dict[str, SlotPlan] = {}
        self.slot = 0

    # ---------------------------------------------------------------- jobs
    def _profile(self, model: str) -> TrainingProfile:
        if model not in self._train_profile:
            tr = self.profiles.model(model).training
            if tr is None:
                raise ConfigError("profiles.yaml", f"models.{model}.training", "missing")
            self._train_profile[model] = tr
        return self._train_profile[model]

    def _make_jobs(self, rng: np.random.Generator) -> None:
        doc = load_workloads()
        for d in self.topo.dcs:
            tr = self.spec.dc(d.name).training
            specs = [(j.model, j.epochs, j.arrival_s, j.deadline_s) for j in tr.jobs]
            if tr.count:
                mix = doc["workloads"][tr.workload]["mix"]
                names = [n for n in doc["models"] if float(mix.get(n, 0.0)) > 0]
                p = np.array([float(mix[n]) for n in names])
                for _ in range(tr.count):
                    model = names[int(rng.choice(len(names), p=p / p.sum()))]
                    lo, hi = (float(x) for x in doc["epochs_range"][model])
                    epochs = max(1.0, float(np.round(rng.uniform(lo, hi) * tr.epochs_scale)))
                    arrival = float(rng.uniform(*tr.arrival_s))
                    specs.append((model, epochs, arrival, arrival + float(rng.uniform(
                        *tr.deadline_s))))
            for k, (model, epochs, arrival, deadline) in enumerate(specs):
                self._profile(model)
                jid = f"{d.name}/job{k}"
                self.jobs[jid] = _JobState(d.name, jid, model, epochs, arrival, deadline)

    # ---------------------------------------------------------------- observations
    def observe(self, dc: str, now: float, arrived_total: int) -> None:
        """Feed a DC's cumulative count of requests that reached it (any terminal state or
        in flight) at emulated time ``now``."""
        if dc not in self.load:
            raise InvalidInput("dc", f"unknown DC {dc!r}")
        if arrived_total < 0:
            raise InvalidInput("arrived_total", f"expected >= 0, got {arrived_total}")
        ld = self.load[dc]
        if ld.last_count is not None and now > ld.last_s:
            rate = max(arrived_total - ld.last_count, 0) / (now - ld.last_s)
            if self.spec.forecast == "ewma":
                a = self.spec.ewma_alpha
                ld.rate_rps = a * rate + (1.0 - a) * ld.rate_rps
            else:
                ld.rate_rps = rate
        ld.last_count, ld.last_s = arrived_total, now

    def supply_w(self, dc: str, t0_s: float, t1_s: float) -> float:
        return self.traces.mean_w(self.spec.dc(dc), t0_s, t1_s)

    def next_slot_s(self) -> float:
        return self.slot * self.spec.slot_s

    # ---------------------------------------------------------------- planning
    def plan(self, now: float) -> list[SlotPlan]:
        """Plan the slot starting at ``now`` for every DC."""
        slot_s, h = self.spec.slot_s, self.spec.horizon_slots
        for j in self.jobs.values():
            if not j.submitted and j.arrival_s <= now + 1e-9:
                self.controllers[j.dc].submit_job(
                    j.dc, j.job_id, self._profile(j.model), j.epochs,
                    self._admissible_deadline(j, now),
                    max_workers=self.spec.dc(j.dc).training.max_workers_per_job)
                j.submitted, j.state = True, "pending"
        load: dict[str, list[float]] = {}
        supply: dict[str, list[float]] = {}
        ci: dict[str, list[float]] = {}
        for name in self.sites:
            load[name] = [self.load[name].rate_rps] * h
            supply[name] = [self.supply_w(name, now + k * slot_s, now + (k + 1) * slot_s)
                            for k in range(h)]
            fc = self.ci_forecast[name]
            ci[name] = [fc.forecast(now, now + k * slot_s, now + (k + 1) * slot_s)
                        for k in range(h)]
        before = {n: dict(self.controllers[n].pending_jobs(n)) for n in self.sites}
        t0 = self.perf_clock()
        plans: list[DcPlan] = []
        for name, ctl in self.controllers.items():
            one = {name: load[name]}
            if self.spec.control == "none":
                plans.append(self._fallback(name, now, load[name][0], supply[name][0], ""))
                continue
            try:
                plans += ctl.plan_slot(now, one, {name: supply[name]}, {name: ci[name]})
            except UsageError as exc:
                plans.append(self._fallback(name, now, load[name][0], supply[name][0], str(exc)))
        self.counters.slot_latency_s.append(self.perf_clock() - t0)
        self.counters.slots += 1
        self.slot += 1
        out: list[SlotPlan] = []
        end = now + slot_s
        for p in plans:
            after = dict(self.controllers[p.dc].pending_jobs(p.dc))
            running = 0
            for jid, rem in before[p.dc].items():
                if jid not in after or after[jid] < rem - 1e-9:
                    running += 1
                j = self.jobs[jid]
                if jid not in after:
                    j.finished_s = end
                    if j.state == "pending":
                        j.state = "met" if end <= j.deadline_s + 1e-6 else "missed"
                        self._count(j.state)
                elif j.state == "pending" and end >= j.deadline_s - 1e-6:
                    j.state = "missed"
                    self._count("missed")
            cal = self.cals[p.dc]
            sp = SlotPlan(
                dc=p.dc, slot_start_s=now, slot_length_s=slot_s,
                gpu_frequency_mhz=cal.frequency.snap(p.gpu_frequency_mhz),
                training_power_w=p.training_power_w, renewable_supply_w=p.renewable_supply_w,
                solver_status=p.status, training_jobs_running=running,
                training_workers=p.training_workers, load_forecast_rps=load[p.dc][0],
                grid_ci_g_per_kwh=ci[p.dc][0], expected_latency_s=p.expected_latency_s,
            )
            self.plans[p.dc] = sp
            out.append(sp)
        return out

    def _work_s(self, model: str, epochs: float, top_mhz: float) -> float:
        """Worker-seconds of ``epochs`` at the top clock."""
        return epochs * float(epoch_time_s(self._profile(model), top_mhz))

    def _admissible_deadline(self, job: _JobState, now: float) -> float:
        """The job's deadline, or the earliest one its DC can meet (module docstring)."""
        site = self.sites[job.dc]
        top = site.levels_mhz[-1]
        nodes = max(site.train_nodes, 1)
        cap = min(self.spec.dc(job.dc).training.max_workers_per_job, nodes)
        pending = self.controllers[job.dc].pending_jobs(job.dc)
        backlog = sum(self._work_s(self.jobs[jid].model, rem, top) for jid, rem in pending)
        own = self._work_s(job.model, job.epochs, top)
        earliest = now + max((backlog + own) / nodes, own / cap)
        slot_s = self.spec.slot_s
        if job.deadline_s >= earliest:
            return job.deadline_s
        return (math.ceil(earliest / slot_s - 1e-9) + 1) * slot_s

    def _fallback(self, dc: str, now: float, rate_rps: float, supply_w: float,
                  why: str) -> DcPlan:
        """EDF at the top clock on every training node; the controller's jobs advance."""
        site = self.sites[dc]
        ctl = self.controllers[dc]
        top = site.levels_mhz[-1]
        free = site.train_nodes
        p_tr, n_tr = 0.0, 0
        jobs = sorted(ctl._jobs[dc], key=lambda j: j.deadline_s)  # noqa: SLF001 (same package)
        for j in jobs:
            n = min(j.max_workers, free)
            if n <= 0:
                break
            free -= n
            n_tr += n
            p_tr += n * float(training_power_per_worker_w(j.profile, top))
            j.remaining_epochs -= float(epochs_per_slot(j.profile, top, n, self.spec.slot_s))
        ctl._jobs[dc] = [j for j in ctl._jobs[dc] if j.remaining_epochs > 1e-9]  # noqa: SLF001
        p_inf = float(inference_power_w(site.inference, top, rate_rps, site.workers))
        lat = float(latency_s(site.inference, top, rate_rps, site.workers, self.spec.slot_s))
        return DcPlan(dc, top, p_tr, supply_w, p_inf, max(p_inf + p_tr - supply_w, 0.0), lat,
                      n_tr, f"fallback ({why})" if why else "no-carm")

    def _count(self, state: str) -> None:
        if state == "met":
            self.counters.deadlines_met += 1
        else:
            self.counters.deadlines_missed += 1

    def finish(self, now: float) -> None:
        """Close the run at ``now``: pending jobs whose deadline has passed are missed."""
        for j in self.jobs.values():
            if j.state in ("pending", "waiting") and j.deadline_s <= now + 1e-6:
                j.state = "missed"
                self._count("missed")

    def summary(self) -> dict[str, Any]:
        lat = np.array(self.counters.slot_latency_s or [0.0])
        states = [j.state for j in self.jobs.values()]
        left = {jid: rem for ctl in self.controllers.values() for dc in self.sites
                if dc in ctl._jobs for jid, rem in ctl.pending_jobs(dc)}  # noqa: SLF001
        done = sum(j.epochs - left.get(j.job_id, 0.0) for j in self.jobs.values() if j.submitted)
        return {
            "formulation": self.spec.formulation,
            "slot_s": self.spec.slot_s,
            "horizon_slots": self.spec.horizon_slots,
            "slots": self.counters.slots,
            "training_jobs": len(self.jobs),
            "training_deadlines_met": self.counters.deadlines_met,
            "training_deadlines_missed": self.counters.deadlines_missed,
            "training_jobs_unfinished": sum(s in ("pending", "waiting") for s in states),
            "training_epochs_total": sum(j.epochs for j in self.jobs.values()),
            "training_epochs_done": done,
            "slot_latency_s": {"mean": float(lat.mean()), "p50": float(np.quantile(lat, 0.5)),
                               "max": float(lat.max())},
            "renewable_traces": {"pv": self.traces.pv_source, "wind": self.traces.wind_source},
        }
