"""Evaluate a CA-RM plan with the nonlinear models: energy, carbon, PPC, SLA.

Rules / theory of operation
---------------------------
* Independent of how the plan was found: latency, power, epochs and energy are recomputed from
  ``models.py`` at the plan's clocks and worker counts; renewables are dispatched lowest emission
  factor first, the grid covers the rest (eq. 19-25); carbon is charged to consumers pro rata.
* A training job stops at the first slot where its cumulative epochs reach its requirement (its
  completion slot h_j); it meets its deadline iff that slot <= deadline_slot. A job that never
  reaches its requirement within the horizon counts as a missed deadline.
* Workers allocated to a job are charged for the whole slot (nodes are reserved per slot), as in
  eq. 18.
* SLA violation: inference = fraction of (sub-cluster, slot) pairs whose latency exceeds the bound;
  training = fraction of jobs that miss their deadline; ``sla_violation_ratio`` = the mean of the
  two (paper Fig. 6 averages training and inference).
* PPC (eq. 26-29): inference = mean over (i, t) of (1/l_i(t)) / c_i(t) in (1/s)/g; training =
  mean over slots with training of epochs(t) / c_tr(t) in epochs/g.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from services.carm.models import (
    FloatArray,
    attribute_carbon,
    dispatch,
    epochs_per_slot,
    inference_power_w,
    latency_s,
    ppc_inference,
    ppc_training,
    training_power_per_worker_w,
)
from services.carm.problem import Instance, Plan


@dataclass(frozen=True)
class Summary:
    """Headline metrics of one plan (what ``--json`` prints)."""

    method: str
    workload: str
    status: str
    carbon_g: float
    energy_j: float
    renewable_used_j: float
    grid_j: float
    ppc_inference: float
    ppc_training: float
    sla_violation_ratio: float
    inference_sla_violation_ratio: float
    training_deadlines_missed: int
    training_jobs: int
    training_unfinished: int
    peak_power_w: float
    solve_s: float
    mip_gap: float
    objective: float
    iterations: int
    note: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Evaluation:
    """Per-slot detail of an evaluated plan plus its summary."""

    summary: Summary
    latency_s: FloatArray  # (H, T)
    inf_energy_j: FloatArray  # (H, T)
    train_energy_j: FloatArray  # (T,)
    demand_j: FloatArray  # (T,)
    carbon_g: FloatArray  # (T,)
    completion_slot: np.ndarray  # (J,), -1 = unfinished


def evaluate(inst: Instance, plan: Plan) -> Evaluation:
    h, t = inst.n_sub, inst.n_slots
    lat = np.empty((h, t))
    e_inf = np.empty((h, t))
    for i, prof in enumerate(inst.inf_profiles):
        f = inst.levels_mhz[plan.inf_level[i]]
        m = plan.inf_active[i]
        lat[i] = latency_s(prof, f, inst.rate_rps[i], m, inst.slot_s)
        e_inf[i] = inference_power_w(prof, f, inst.rate_rps[i], m) * inst.slot_s
    f_tr = inst.levels_mhz[plan.train_level]
    e_tr = np.zeros(t)
    ep_slot = np.zeros(t)
    completion = np.full(len(inst.jobs), -1, dtype=np.int64)
    for j, job in enumerate(inst.jobs):
        w = plan.train_workers[j].astype(np.float64)
        e_tr += w * inst.slot_s * training_power_per_worker_w(job.profile, f_tr)
        ep = epochs_per_slot(job.profile, f_tr, w, inst.slot_s)
        cum = np.cumsum(ep)
        done = np.nonzero(cum >= job.epochs * (1 - 1e-9))[0]
        if done.size:
            completion[j] = int(done[0])
        ep_slot += np.minimum(ep, np.maximum(job.epochs - (cum - ep), 0.0))
    demand = e_inf.sum(axis=0) + e_tr
    d = dispatch(demand, inst.solar_j, inst.wind_j, inst.factors, inst.grid_g_per_wh)
    att = attribute_carbon(np.vstack([e_inf, e_tr[None, :]]), d.carbon_g)
    bounds = inst.latency_bounds_s()
    inf_viol = float(np.mean(lat > bounds[:, None] * (1 + 1e-9)))
    missed = int(
        sum(
            1
            for j, job in enumerate(inst.jobs)
            if completion[j] < 0 or completion[j] > job.deadline_slot
        )
    )
    unfinished = int((completion < 0).sum())
    n_jobs = len(inst.jobs)
    tr_viol = missed / n_jobs if n_jobs else 0.0
    s = Summary(
        method=plan.method,
        workload=inst.meta.get("workload", ""),
        status=plan.info.status,
        carbon_g=float(d.carbon_g.sum()),
        energy_j=float(demand.sum()),
        renewable_used_j=float(d.solar_j.sum() + d.wind_j.sum()),
        grid_j=float(d.grid_j.sum()),
        ppc_inference=ppc_inference(lat, att[:h]),
        ppc_training=ppc_training(ep_slot, att[h]),
        sla_violation_ratio=0.5 * (inf_viol + tr_viol),
        inference_sla_violation_ratio=inf_viol,
        training_deadlines_missed=missed,
        training_jobs=n_jobs,
        training_unfinished=unfinished,
        peak_power_w=float(demand.max() / inst.slot_s) if t else 0.0,
        solve_s=plan.info.solve_s,
        mip_gap=plan.info.mip_gap,
        objective=plan.info.objective,
        iterations=plan.info.iterations,
        note=plan.info.note,
    )
    return Evaluation(s, lat, e_inf, e_tr, demand, d.carbon_g, completion)
