"""Baselines of paper 2 §5.3: baseline-MIN, baseline-MAX and PowerCap (EnergyCost is a MILP,
see ``milp.solve_energycost``).

Rules / theory of operation
---------------------------
* baseline-MIN / baseline-MAX: every clock (inference and training) fixed at the lowest /
  highest level; jobs are placed on arrival, first come first served, each on up to its worker
  cap of the free workers in the nearest slots, until its epochs are done (the last slot uses
  only the workers it needs). No deadline or carbon awareness.
* PowerCap (ref. [25], frequency control under a power budget): the same on-arrival placement,
  slot by slot; in each slot it picks the highest (inference clock, training clock) pair,
  inference first, whose cluster power fits the budget ``cap_w``; if even the lowest clocks do
  not fit, it holds back training workers (latest arrivals first) until the power fits.
* Deterministic; no randomness; ``solve_s`` is 0 (no optimisation).
"""

from __future__ import annotations

import math

import numpy as np

from services.carm.models import (
    FloatArray,
    IntArray,
    epochs_per_slot,
    inference_power_w,
    training_power_per_worker_w,
)
from services.carm.problem import Instance, Plan, SolveInfo
from services.model.errors import InvalidInput


def _full_active(inst: Instance) -> IntArray:
    return np.broadcast_to(inst.inf_workers[:, None], (inst.n_sub, inst.n_slots)).astype(
        np.int64
    ).copy()


def greedy_placement(inst: Instance, train_level: int) -> IntArray:
    """Workers per (job, slot) when jobs are placed on arrival in the nearest free slots."""
    t = inst.n_slots
    free = np.full(t, inst.train_nodes, dtype=np.int64)
    w = np.zeros((len(inst.jobs), t), dtype=np.int64)
    f = inst.levels_mhz[train_level]
    order = sorted(range(len(inst.jobs)), key=lambda j: (inst.jobs[j].arrival_slot, j))
    for j in order:
        job = inst.jobs[j]
        e = float(epochs_per_slot(job.profile, f, 1, inst.slot_s))
        remaining = job.epochs
        for s in range(job.arrival_slot, t):
            if remaining <= 1e-9:
                break
            k = min(job.max_workers, int(free[s]), math.ceil(remaining / e - 1e-9))
            if k > 0:
                w[j, s] = k
                free[s] -= k
                remaining -= k * e
    return w


def fixed_clock(inst: Instance, level: int, name: str) -> Plan:
    """baseline-MIN (level 0) or baseline-MAX (top level)."""
    lv = level % inst.n_levels
    t = inst.n_slots
    w = greedy_placement(inst, lv)
    return Plan(
        name,
        np.full((inst.n_sub, t), lv, dtype=np.int64),
        _full_active(inst),
        w,
        np.full(t, lv, dtype=np.int64),
        SolveInfo("heuristic", float("nan"), 0.0, 0.0, 0, "fixed clocks, on-arrival placement"),
    )


def peak_power_w(inst: Instance) -> float:
    """All nodes at the top clock and full load (the PowerCap budget's reference)."""
    top = inst.levels_mhz[-1]
    p_inf = 0.0
    for i, prof in enumerate(inst.inf_profiles):
        m = int(inst.inf_workers[i])
        p_inf += float(prof.alpha0_w_per_mhz * top + prof.alpha1_w_per_mhz * top
                       + prof.alpha2_w + prof.alpha3_w) * m
    p_tr = max((float(training_power_per_worker_w(j.profile, top)) for j in inst.jobs),
               default=0.0)
    return p_inf + inst.train_nodes * p_tr


def power_cap(inst: Instance, cap_w: float) -> Plan:
    """PowerCap baseline (see the module docstring)."""
    if not np.isfinite(cap_w) or cap_w <= 0:
        raise InvalidInput("power_cap_w", f"expected a positive budget, got {cap_w}")
    h, t, k = inst.n_sub, inst.n_slots, inst.n_levels
    nj = len(inst.jobs)
    inf_lv = np.zeros((h, t), dtype=np.int64)
    tr_lv = np.zeros(t, dtype=np.int64)
    w = np.zeros((nj, t), dtype=np.int64)
    remaining: FloatArray = np.array([j.epochs for j in inst.jobs], dtype=np.float64)
    order = sorted(range(nj), key=lambda j: (inst.jobs[j].arrival_slot, j))
    pairs = [(ki, kt) for ki in range(k - 1, -1, -1) for kt in range(k - 1, -1, -1)]
    over = 0
    for s in range(t):
        p_inf_lv = [
            sum(float(inference_power_w(p, inst.levels_mhz[ki], inst.rate_rps[i, s],
                                        inst.inf_workers[i]))
                for i, p in enumerate(inst.inf_profiles))
            for ki in range(k)
        ]

        def alloc(kt: int, s: int = s) -> tuple[IntArray, float]:
            free = inst.train_nodes
            ws = np.zeros(nj, dtype=np.int64)
            p = 0.0
            f = inst.levels_mhz[kt]
            for j in order:
                job = inst.jobs[j]
                if job.arrival_slot > s or remaining[j] <= 1e-9 or free <= 0:
                    continue
                e = float(epochs_per_slot(job.profile, f, 1, inst.slot_s))
                n = min(job.max_workers, free, math.ceil(remaining[j] / e - 1e-9))
                ws[j] = n
                free -= n
                p += n * float(training_power_per_worker_w(job.profile, f))
            return ws, p

        chosen = None
        for ki, kt in pairs:
            ws, p_tr = alloc(kt)
            if p_inf_lv[ki] + p_tr <= cap_w:
                chosen = (ki, kt, ws)
                break
        if chosen is None:
            ws, _ = alloc(0)
            f0 = inst.levels_mhz[0]
            budget = cap_w - p_inf_lv[0]
            for j in reversed(order):
                while ws[j] > 0 and sum(
                    int(ws[q]) * float(training_power_per_worker_w(inst.jobs[q].profile, f0))
                    for q in range(nj)
                ) > budget:
                    ws[j] -= 1
            if p_inf_lv[0] > cap_w:
                over += 1
            chosen = (0, 0, ws)
        ki, kt, ws = chosen
        inf_lv[:, s] = ki
        tr_lv[s] = kt
        w[:, s] = ws
        f = inst.levels_mhz[kt]
        for j in range(nj):
            if ws[j]:
                remaining[j] -= ws[j] * float(
                    epochs_per_slot(inst.jobs[j].profile, f, 1, inst.slot_s)
                )
    note = f"power budget {cap_w:.0f} W"
    if over:
        note += f"; inference alone exceeds it in {over} slots"
    return Plan("powercap", inf_lv, _full_active(inst), w, tr_lv,
                SolveInfo("heuristic", float("nan"), 0.0, 0.0, 0, note))
