"""CA-RM problem instance, plans and the per-level tables every method shares.

Rules / theory of operation
---------------------------
* Slots ``t = 0..T-1`` each last ``slot_s`` seconds. A training job may run in slots
  ``arrival_slot..T-1`` (paper eq. 6 read as "a job cannot run before it arrives"); its deadline
  ``deadline_slot`` is the last slot it may use to finish on time (eq. 10, 54).
* Inference sub-cluster ``i`` has ``workers[i]`` nodes and arrival rate ``rate_rps[i, t]``; its
  clock is one of the GPU's discrete levels per slot. Training runs at ``train_level`` (the
  max clock, as in the paper, unless a baseline says otherwise).
* Because clocks are discrete and the rate of each slot is data, latency and energy of every
  (sub-cluster, slot, level) are constants: ``tables()`` evaluates the nonlinear models of
  ``models.py`` once, and every formulation is linear in its decision variables.
* ``validate()`` rejects bad input (negative supply or rates, unknown levels, inconsistent
  shapes, jobs that cannot fit the horizon) with ``InvalidInput`` naming the field.
* A ``Plan`` is what a method decides; ``evaluate.py`` turns it into metrics with the nonlinear
  models again, independently of any MILP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.carm.models import (
    EmissionFactors,
    FloatArray,
    InferenceProfile,
    IntArray,
    TrainingProfile,
    epochs_per_slot,
    inference_power_w,
    latency_s,
    training_power_per_worker_w,
)
from services.model.errors import InvalidInput


@dataclass(frozen=True)
class TrainingJob:
    """A deferrable training job (paper §3.2)."""

    job_id: int
    profile: TrainingProfile
    arrival_slot: int
    deadline_slot: int
    epochs: float
    priority: float
    max_workers: int


@dataclass(frozen=True)
class Instance:
    """Everything a CA-RM method needs for one planning horizon."""

    slot_s: float
    levels_mhz: FloatArray  # (K,) ascending
    inf_profiles: tuple[InferenceProfile, ...]  # (H,)
    inf_workers: IntArray  # (H,)
    rate_rps: FloatArray  # (H, T)
    jobs: tuple[TrainingJob, ...]
    train_nodes: int
    solar_j: FloatArray  # (T,)
    wind_j: FloatArray  # (T,)
    factors: EmissionFactors
    grid_g_per_wh: FloatArray  # (T,)
    price_usd_per_kwh: FloatArray  # (T,)
    train_level: int = -1  # index into levels_mhz; -1 = max clock
    inf_weight: FloatArray | None = None  # omega_i^Inf; default 1 / latency bound
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def n_slots(self) -> int:
        return int(self.solar_j.shape[0])

    @property
    def n_levels(self) -> int:
        return int(self.levels_mhz.shape[0])

    @property
    def n_sub(self) -> int:
        return len(self.inf_profiles)

    def latency_bounds_s(self) -> FloatArray:
        return np.array([p.latency_bound_s for p in self.inf_profiles], dtype=np.float64)

    def inference_weights(self) -> FloatArray:
        if self.inf_weight is not None:
            return np.asarray(self.inf_weight, dtype=np.float64)
        return 1.0 / self.latency_bounds_s()

    def validate(self) -> Instance:
        t = self.n_slots
        if not self.slot_s > 0:
            raise InvalidInput("slot_s", f"expected > 0, got {self.slot_s}")
        if t < 1:
            raise InvalidInput("solar_j", "expected at least one slot")
        for name, arr in (
            ("solar_j", self.solar_j),
            ("wind_j", self.wind_j),
            ("grid_g_per_wh", self.grid_g_per_wh),
            ("price_usd_per_kwh", self.price_usd_per_kwh),
        ):
            a = np.asarray(arr)
            if a.shape != (t,):
                raise InvalidInput(name, f"expected shape ({t},), got {a.shape}")
            if not np.all(np.isfinite(a)):
                raise InvalidInput(name, "non-finite value")
            if (a < 0).any():
                raise InvalidInput(name, f"negative value {float(a.min())} in slot "
                                         f"{int(np.argmin(a))}")
        lv = np.asarray(self.levels_mhz)
        if lv.ndim != 1 or lv.size < 1 or (lv <= 0).any() or (np.diff(lv) <= 0).any():
            raise InvalidInput("levels_mhz", "expected ascending positive clock levels")
        h = self.n_sub
        if np.asarray(self.inf_workers).shape != (h,) or (np.asarray(self.inf_workers) < 1).any():
            raise InvalidInput("inf_workers", f"expected {h} positive worker counts")
        r = np.asarray(self.rate_rps)
        if r.shape != (h, t):
            raise InvalidInput("rate_rps", f"expected shape ({h}, {t}), got {r.shape}")
        if not np.all(np.isfinite(r)) or (r < 0).any():
            raise InvalidInput("rate_rps", "expected finite non-negative arrival rates")
        if self.train_nodes < 0:
            raise InvalidInput("train_nodes", f"expected >= 0, got {self.train_nodes}")
        if not -self.n_levels <= self.train_level < self.n_levels:
            raise InvalidInput("train_level", f"no clock level {self.train_level}")
        for j in self.jobs:
            f = f"jobs[{j.job_id}]"
            if not 0 <= j.arrival_slot < t:
                raise InvalidInput(f + ".arrival_slot", f"expected 0..{t - 1}")
            if not j.arrival_slot <= j.deadline_slot:
                raise InvalidInput(f + ".deadline_slot", "expected >= arrival_slot")
            if not j.epochs > 0:
                raise InvalidInput(f + ".epochs", f"expected > 0, got {j.epochs}")
            if j.max_workers < 1:
                raise InvalidInput(f + ".max_workers", "expected >= 1")
            if j.priority < 0:
                raise InvalidInput(f + ".priority", "expected >= 0")
        return self


@dataclass(frozen=True)
class Tables:
    """Per-(sub-cluster, slot, level) constants and per-job per-worker-slot constants."""

    latency_s: FloatArray  # (H, T, K)
    inf_energy_j: FloatArray  # (H, T, K)
    epochs_per_worker_slot: FloatArray  # (J,)
    train_energy_per_worker_slot_j: FloatArray  # (J,)


def tables(inst: Instance, active_workers: IntArray | None = None) -> Tables:
    """Evaluate the nonlinear models at every discrete choice (see module docstring)."""
    h, t, k = inst.n_sub, inst.n_slots, inst.n_levels
    m = np.asarray(inst.inf_workers if active_workers is None else active_workers)
    m = m.reshape(m.shape + (1,) * (3 - m.ndim)) if m.ndim > 1 else m[:, None, None]
    m = np.broadcast_to(m, (h, t, k))  # workers powered on, per (i, t) or per (i, t, level)
    lat = np.empty((h, t, k))
    en = np.empty((h, t, k))
    for i, prof in enumerate(inst.inf_profiles):
        f = inst.levels_mhz[None, :]
        lam = inst.rate_rps[i][:, None]
        mi = m[i]
        lat[i] = latency_s(prof, f, lam, mi, inst.slot_s)
        en[i] = inference_power_w(prof, f, lam, mi) * inst.slot_s
    f_tr = inst.levels_mhz[inst.train_level]
    ep = np.array([float(epochs_per_slot(j.profile, f_tr, 1, inst.slot_s)) for j in inst.jobs])
    pw = np.array([float(training_power_per_worker_w(j.profile, f_tr)) for j in inst.jobs])
    return Tables(lat, en, ep, pw * inst.slot_s)


@dataclass(frozen=True)
class SolveInfo:
    """How a plan was obtained."""

    status: str  # "optimal", "time_limit", "infeasible", "heuristic", ...
    objective: float
    mip_gap: float
    solve_s: float
    iterations: int = 1
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """Decisions for every slot of the horizon."""

    method: str
    inf_level: IntArray  # (H, T) index into levels_mhz
    inf_active: IntArray  # (H, T) powered-on workers (DRS); = inf_workers when not right-sized
    train_workers: IntArray  # (J, T) n_j(t) * x_j(t)
    train_level: IntArray  # (T,) training clock index per slot
    info: SolveInfo

    @property
    def feasible(self) -> bool:
        return self.info.status not in ("infeasible", "error")
