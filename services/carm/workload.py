"""Paper-2 experiment instances: cluster, workload mix, jobs, inference load, supply.

Rules / theory of operation
---------------------------
* ``paper_instance(workload, seed)`` builds the §5.1 set-up from ``data/carm/workloads.yaml``,
  ``profiles.yaml`` and ``site.yaml``: 50 training + 50 inference RTX4090 nodes, 15-min slots,
  24 h, one inference sub-cluster per model with nodes split by the workload mix, training jobs
  drawn from the mix. The generator parameters and their provenance are in the YAML.
* Randomness only through the injected/derived ``numpy.random.Generator`` (seeded); the same
  (workload, seed) always gives the same instance.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from services.carm.models import EmissionFactors, service_rate_rps
from services.carm.problem import Instance, TrainingJob
from services.carm.profiles import CARM_DIR, ProfileSet, load_profiles, read_yaml
from services.carm.renewables import load_site, site_supply
from services.model.errors import ConfigError, InvalidInput


def load_workloads(path: Path | None = None) -> dict[str, Any]:
    return read_yaml(path or CARM_DIR / "workloads.yaml")


def workload_names(doc: dict[str, Any] | None = None) -> list[str]:
    return list((doc or load_workloads())["workloads"].keys())


def split_nodes(total: int, mix: dict[str, float], names: list[str], minimum: int) -> list[int]:
    """Largest-remainder split of ``total`` nodes by ``mix`` with ``minimum`` per entry."""
    w = np.array([float(mix.get(n, 0.0)) for n in names])
    if (w < 0).any() or w.sum() <= 0:
        raise InvalidInput("mix", "expected non-negative fractions with a positive sum")
    if total < minimum * len(names):
        raise InvalidInput("inference_nodes", f"need at least {minimum * len(names)}")
    rest = total - minimum * len(names)
    raw = w / w.sum() * rest
    base = np.floor(raw).astype(int)
    left = rest - int(base.sum())
    order = np.argsort(-(raw - base), kind="stable")
    base[order[:left]] += 1
    return [int(b) + minimum for b in base]


def diurnal_shape(hours: np.ndarray) -> np.ndarray:
    return np.asarray(0.55 + 0.45 * np.cos(2 * np.pi * (hours - 14.0) / 24.0))


def paper_instance(
    workload: str,
    seed: int = 0,
    *,
    profiles: ProfileSet | None = None,
    site: dict[str, Any] | None = None,
    doc: dict[str, Any] | None = None,
    n_jobs: int | None = None,
    horizon_slots: int | None = None,
) -> Instance:
    """The paper's 24 h x 15-min instance for ``workload`` in {light, medium, heavy}."""
    doc = doc or load_workloads()
    if workload not in doc["workloads"]:
        raise InvalidInput(
            "workload", f"unknown workload {workload!r}; expected one of {workload_names(doc)}"
        )
    profiles = profiles or load_profiles()
    site = site or load_site()
    rng = np.random.default_rng(seed)
    wl = doc["workloads"][workload]
    cl = doc["cluster"]
    slot_s = float(cl["slot_s"])
    t = int(horizon_slots or cl["horizon_slots"])
    gpu = profiles.gpu(str(cl["gpu"]))
    levels = np.array(gpu.frequency_levels_mhz)
    names: list[str] = list(doc["models"])
    mix = {n: float(wl["mix"].get(n, 0.0)) for n in names}
    m = split_nodes(int(cl["inference_nodes"]), mix, names, 2)

    hours = (np.arange(t) + 0.5) * slot_s / 3600.0
    shape = diurnal_shape(hours)
    rates = np.empty((len(names), t))
    inf_profiles = []
    for i, n in enumerate(names):
        prof = profiles.model(n).inference
        inf_profiles.append(prof)
        mu_max = float(service_rate_rps(prof, gpu.max_mhz))
        noise = 1.0 + rng.normal(0.0, float(doc["inference_noise_sd"]), t)
        lam = float(wl["peak_utilisation"]) * m[i] * mu_max * shape * np.clip(noise, 0.5, 1.5)
        # never offer more than the sub-cluster can serve within its bound at the top clock
        # (eq. 1 at f_max solved for lambda; the paper assumes Problem 2 is feasible, §4.2)
        slack_s = prof.latency_bound_s - prof.network_delay_s - 1.0 / mu_max
        if slack_s <= 0:
            raise ConfigError("profiles.yaml", f"models.{n}.inference.latency_bound_s",
                              "below the service time at the top clock")
        lam_cap = max(0.0, m[i] * mu_max - 1.0 / slack_s)
        rates[i] = np.minimum(lam, 0.98 * lam_cap)

    jobs: list[TrainingJob] = []
    n_j = int(n_jobs if n_jobs is not None else wl["jobs"])
    p = np.array([mix[n] for n in names])
    p = p / p.sum()
    nmax = int(cl["max_workers_per_job"])
    last_arrival = min(int(doc["arrival_last_slot"]), t - 1)
    lo_s, hi_s = (float(x) for x in doc["deadline_slack_range"])
    for j in range(n_j):
        name = names[int(rng.choice(len(names), p=p))]
        tr = profiles.model(name).training
        if tr is None:
            raise ConfigError("profiles.yaml", f"models.{name}.training", "missing")
        lo, hi = (float(x) for x in doc["epochs_range"][name])
        epochs = float(np.round(rng.uniform(lo, hi)))
        arrival = int(rng.integers(0, last_arrival + 1))
        per_worker_slot = slot_s / (tr.alpha0_s_mhz / gpu.max_mhz + tr.alpha1_s)
        min_slots = math.ceil(epochs / (per_worker_slot * nmax))
        slack = float(rng.uniform(lo_s, hi_s))
        deadline = min(t - 1, arrival + math.ceil(min_slots * slack) - 1)
        deadline = max(deadline, min(t - 1, arrival + min_slots - 1))
        prio = float(rng.integers(1, 4))
        jobs.append(TrainingJob(j, tr, arrival, deadline, epochs, prio, nmax))

    supply = site_supply(site, slot_s, t)
    ef = site["emission_factors_g_per_wh"]
    factors = EmissionFactors(float(ef["solar"]), float(ef["wind"]), float(ef["coal"]))
    price_h = np.array(site["price_usd_per_kwh_by_hour"], dtype=float)
    price = price_h[(np.floor(hours).astype(int)) % 24]
    return Instance(
        slot_s=slot_s,
        levels_mhz=levels,
        inf_profiles=tuple(inf_profiles),
        inf_workers=np.array(m, dtype=np.int64),
        rate_rps=rates,
        jobs=tuple(jobs),
        train_nodes=int(cl["training_nodes"]),
        solar_j=supply.solar_j,
        wind_j=supply.wind_j,
        factors=factors,
        grid_g_per_wh=np.full(t, factors.grid_g_per_wh),
        price_usd_per_kwh=price,
        meta={
            "workload": workload,
            "seed": str(seed),
            "solar": supply.solar_source,
            "wind": supply.wind_source,
        },
    ).validate()
