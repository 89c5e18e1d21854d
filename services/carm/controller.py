"""Sans-IO CA-RM controller for the emulator's LLM DCs (the gRPC service wraps this).

Rules / theory of operation
---------------------------
* One ``CarmController`` plans every DC each slot, rolling horizon: ``plan_slot(now_s,
  load_forecast_rps, supply_forecast_w, grid_ci_g_per_kwh)`` takes per-DC forecasts over the
  next H slots (index 0 = the slot starting at ``now_s``), solves the controller's
  ``formulation`` for each DC on that horizon, and returns the decisions of slot 0 as
  ``DcPlan`` records. Formulations are the offline methods of the same names
  (`services.carm.methods`): ``performance`` (Problem 2: min carbon s.t. the latency bound
  and deadlines, the default), ``carbon`` (Problem 1: min SLA penalties s.t. a carbon budget
  of the horizon, derived per slot as offline: the least-carbon plan's carbon plus 5 % of
  the gap to baseline-MAX, every GPU at the top clock) and ``ppc`` (Problem 3: max
  performance per carbon). DCs do not share supply, so each DC is an independent MILP: its
  inference engines form one sub-cluster (``workers`` GPUs/engines with an inference
  profile, e.g. A100 + Llama-3.1-8B from ``data/carm/profiles.yaml``), and its training
  jobs (``submit_job``) run on ``train_nodes`` nodes.
* The renewable forecast is one series per DC (W); it is charged at ``renewable_g_per_wh``.
  The grid is charged at the forecast CI (gCO2/kWh; default the coal factor of paper Table 1).
* Jobs whose deadline lies beyond the horizon must only do, within the horizon, the epochs
  they could not do after it at full speed (so work is deferred while it can be); jobs whose
  deadline falls inside it must finish by it. If that is infeasible (a deadline can no longer
  be met) the controller falls back to Problem 1 with an unbounded budget (least tardiness).
* After planning, the controller assumes slot 0 is executed as planned and advances each job's
  remaining epochs; finished jobs are dropped. No clocks, no I/O, deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.carm import methods, milp
from services.carm.models import (
    EmissionFactors,
    InferenceProfile,
    TrainingProfile,
    epochs_per_slot,
    latency_s,
)
from services.carm.problem import Instance, Plan, TrainingJob
from services.model.errors import InvalidInput, UsageError

# the formulations a live controller solves each slot (names of `services.carm.methods`)
FORMULATIONS = ("performance", "carbon", "ppc")


@dataclass(frozen=True)
class DcSite:
    """A DC as the controller sees it."""

    name: str
    levels_mhz: tuple[float, ...]
    inference: InferenceProfile
    workers: int
    train_nodes: int = 0
    renewable_g_per_wh: float = 0.05  # paper Table 1, solar PV
    default_grid_g_per_wh: float = 0.96  # paper Table 1, coal


@dataclass(frozen=True)
class DcPlan:
    """Decisions for one DC for the slot starting at ``now_s``."""

    dc: str
    gpu_frequency_mhz: float
    training_power_w: float
    renewable_supply_w: float
    inference_power_w: float
    grid_power_w: float
    expected_latency_s: float
    training_workers: int
    status: str


@dataclass
class _Job:
    job_id: str
    profile: TrainingProfile
    remaining_epochs: float
    deadline_s: float
    priority: float
    max_workers: int


@dataclass
class CarmController:
    """Rolling-horizon CA-RM planner over several DCs (see the module docstring)."""

    sites: Sequence[DcSite]
    slot_s: float
    opts: milp.MilpOptions = field(default_factory=lambda: milp.MilpOptions(time_limit_s=10.0))
    formulation: str = "performance"
    _jobs: dict[str, list[_Job]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.slot_s > 0:
            raise InvalidInput("slot_s", f"expected > 0, got {self.slot_s}")
        if self.formulation not in FORMULATIONS:
            raise InvalidInput("formulation", f"expected one of {list(FORMULATIONS)}, "
                                              f"got {self.formulation!r}")
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise InvalidInput("sites", "duplicate DC names")
        for s in self.sites:
            if s.workers < 1:
                raise InvalidInput(f"sites[{s.name}].workers", "expected >= 1")
            self._jobs.setdefault(s.name, [])

    def submit_job(self, dc: str, job_id: str, profile: TrainingProfile, epochs: float,
                   deadline_s: float, priority: float = 1.0, max_workers: int = 8) -> None:
        if dc not in self._jobs:
            raise InvalidInput("dc", f"unknown DC {dc!r}")
        if not epochs > 0:
            raise InvalidInput("epochs", f"expected > 0, got {epochs}")
        self._jobs[dc].append(_Job(job_id, profile, float(epochs), float(deadline_s),
                                   float(priority), int(max_workers)))

    def pending_jobs(self, dc: str) -> list[tuple[str, float]]:
        return [(j.job_id, j.remaining_epochs) for j in self._jobs.get(dc, [])]

    def _instance(self, site: DcSite, now_s: float, load: np.ndarray, supply_w: np.ndarray,
                  ci: np.ndarray) -> tuple[Instance, list[_Job]]:
        t = load.size
        levels = np.array(site.levels_mhz, dtype=np.float64)
        jobs: list[TrainingJob] = []
        used: list[_Job] = []
        for j in self._jobs[site.name]:
            e = float(epochs_per_slot(j.profile, levels[-1], 1, self.slot_s))
            dl = math.floor((j.deadline_s - now_s) / self.slot_s + 1e-9) - 1
            need = j.remaining_epochs
            if dl >= t:  # deadline beyond the horizon: only what cannot be done after it
                after = (dl - t + 1) * min(j.max_workers, site.train_nodes) * e
                need = j.remaining_epochs - after
                dl = t - 1
            if need <= 1e-9:
                continue
            jobs.append(TrainingJob(len(jobs), j.profile, 0, max(dl, 0), need, j.priority,
                                    min(j.max_workers, max(site.train_nodes, 1))))
            used.append(j)
        inst = Instance(
            slot_s=self.slot_s,
            levels_mhz=levels,
            inf_profiles=(site.inference,),
            inf_workers=np.array([site.workers], dtype=np.int64),
            rate_rps=load[None, :],
            jobs=tuple(jobs),
            train_nodes=site.train_nodes,
            solar_j=supply_w * self.slot_s,
            wind_j=np.zeros(t),
            factors=EmissionFactors(site.renewable_g_per_wh, site.renewable_g_per_wh,
                                    site.default_grid_g_per_wh),
            grid_g_per_wh=ci,
            price_usd_per_kwh=np.zeros(t),
            meta={"dc": site.name},
        ).validate()
        return inst, used

    def plan_slot(
        self,
        now_s: float,
        load_forecast_rps: Mapping[str, Sequence[float]],
        supply_forecast_w: Mapping[str, Sequence[float]],
        grid_ci_g_per_kwh: Mapping[str, Sequence[float]] | None = None,
    ) -> list[DcPlan]:
        """Plan the slot starting at ``now_s`` for every DC (see the module docstring)."""
        out: list[DcPlan] = []
        for site in self.sites:
            if site.name not in load_forecast_rps:
                raise InvalidInput(f"load_forecast_rps[{site.name}]", "missing")
            if site.name not in supply_forecast_w:
                raise InvalidInput(f"supply_forecast_w[{site.name}]", "missing")
            load = np.asarray(load_forecast_rps[site.name], dtype=np.float64)
            sup = np.asarray(supply_forecast_w[site.name], dtype=np.float64)
            if load.ndim != 1 or load.size < 1:
                raise InvalidInput(f"load_forecast_rps[{site.name}]", "expected >= 1 slot")
            if sup.shape != load.shape:
                raise InvalidInput(f"supply_forecast_w[{site.name}]",
                                   f"expected {load.size} slots, got {sup.size}")
            if (sup < 0).any() or not np.all(np.isfinite(sup)):
                raise InvalidInput(f"supply_forecast_w[{site.name}]",
                                   "expected finite non-negative watts")
            if grid_ci_g_per_kwh is not None and site.name in grid_ci_g_per_kwh:
                ci = np.asarray(grid_ci_g_per_kwh[site.name], dtype=np.float64) / 1000.0
                if ci.shape != load.shape:
                    raise InvalidInput(f"grid_ci_g_per_kwh[{site.name}]",
                                       f"expected {load.size} slots")
            else:
                ci = np.full(load.shape, site.default_grid_g_per_wh)
            inst, used = self._instance(site, now_s, load, sup, ci)
            try:
                plan: Plan | None = methods.run(self.formulation, inst,
                                                methods.MethodConfig(milp=self.opts))
            except InvalidInput:  # Problem 1's budget needs every job done in the horizon
                plan = None
            if plan is None or not plan.feasible or plan.info.status == "no_solution":
                plan = milp.solve_carbon(inst, 1e18, self.opts)
            out.append(self._record(site, inst, plan, used))
        return out

    def _record(self, site: DcSite, inst: Instance, plan: Plan, used: list[_Job]) -> DcPlan:
        if plan.info.status in ("infeasible", "no_solution", "model_error"):
            raise UsageError(f"CA-RM found no plan for DC {site.name}: {plan.info.note}")
        lvl = int(plan.inf_level[0, 0])
        f = float(inst.levels_mhz[lvl])
        from services.carm.models import inference_power_w, training_power_per_worker_w

        p_inf = float(inference_power_w(site.inference, f, inst.rate_rps[0, 0], site.workers))
        f_tr = float(inst.levels_mhz[plan.train_level[0]])
        p_tr = 0.0
        n_tr = 0
        for k, job in enumerate(used):
            n = int(plan.train_workers[k, 0])
            if n:
                n_tr += n
                p_tr += n * float(training_power_per_worker_w(job.profile, f_tr))
                job.remaining_epochs -= float(epochs_per_slot(job.profile, f_tr, n, self.slot_s))
        self._jobs[site.name] = [j for j in self._jobs[site.name] if j.remaining_epochs > 1e-9]
        sup_w = float(inst.solar_j[0] / self.slot_s)
        lat = float(latency_s(site.inference, f, inst.rate_rps[0, 0], site.workers, self.slot_s))
        return DcPlan(site.name, f, p_tr, sup_w, p_inf, max(p_inf + p_tr - sup_w, 0.0), lat,
                      n_tr, plan.info.status)
