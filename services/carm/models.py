"""CA-RM system model (paper 2 §3): latency, power, epochs, energy, carbon, PPC.

Rules / theory of operation
---------------------------
* Pure, deterministic numpy functions; no I/O, no clocks, no randomness. Every coefficient
  comes from a profile object loaded from ``data/carm/profiles.yaml`` (see ``profiles.py``).
* Units are in the names: ``_mhz``, ``_s``, ``_w``, ``_j``, ``_rps`` (requests per second),
  ``_g`` (grams CO2e), ``_g_per_wh`` (emission factors, paper Table 1).
* Inference (eq. 1): ``l = P_Q / (m*mu(f) - lambda) + 1/mu(f) + e`` with ``P_Q = 1`` and the
  per-worker service rate ``mu(f) = 1 / (a0/f + a1)`` (eq. 1's ``rho*f`` is the case a1 = 0).
  When ``m*mu(f) <= lambda`` the sub-cluster is saturated: eq. 1 has no finite value, so we use
  the fluid-queue mean wait of a backlog growing for one slot,
  ``(1 - m*mu/lambda) * slot_s / 2``, plus the service time and ``e`` -- finite and monotone,
  and always above any sensible latency bound.
* Inference power (eq. 11): ``p = m*(alpha0*f*u + alpha1*f + alpha2*u + alpha3)`` summed over the
  ``m`` powered-on workers, with utilisation ``u = min(lambda / (m*mu(f)), 1)`` (eq. 12 is the
  special case ``mu`` proportional to ``f``). Energy per slot is ``slot_s * p`` (eq. 15).
* Training (eq. 4, 18): epochs per slot ``tau = n * slot_s / (alpha0/f + alpha1)``; energy per
  slot ``n * slot_s * (beta0*f + beta1)``.
* Carbon (eq. 19-25): in each slot the demand is met by on-site renewables first, cheapest
  emission factor first, then by the grid; carbon = sum(factor x delivered Wh). The split of each
  source among consumers (``ir_i``, ``tr``) does not change the total, so consumers are charged
  pro rata to their energy (``attribute_carbon``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

J_PER_WH = 3600.0


@dataclass(frozen=True)
class InferenceProfile:
    """Per-node inference coefficients of one DNN model on one GPU type."""

    model: str
    a0_s_mhz: float
    a1_s: float
    alpha0_w_per_mhz: float
    alpha1_w_per_mhz: float
    alpha2_w: float
    alpha3_w: float
    latency_bound_s: float
    network_delay_s: float


@dataclass(frozen=True)
class TrainingProfile:
    """Per-node training coefficients of one DNN model on one GPU type (eq. 4, 18)."""

    model: str
    alpha0_s_mhz: float
    alpha1_s: float
    beta0_w_per_mhz: float
    beta1_w: float


@dataclass(frozen=True)
class EmissionFactors:
    """Carbon emission factors in gCO2e/Wh (paper Table 1)."""

    solar_g_per_wh: float
    wind_g_per_wh: float
    grid_g_per_wh: float


# --- inference -------------------------------------------------------------------------------


def service_time_s(prof: InferenceProfile, f_mhz: npt.ArrayLike) -> FloatArray:
    """Per-request service time of one worker at clock ``f_mhz``."""
    f = np.asarray(f_mhz, dtype=np.float64)
    return np.asarray(prof.a0_s_mhz / f + prof.a1_s, dtype=np.float64)


def service_rate_rps(prof: InferenceProfile, f_mhz: npt.ArrayLike) -> FloatArray:
    """Per-worker service rate mu(f) in requests per second."""
    return 1.0 / service_time_s(prof, f_mhz)


def latency_s(
    prof: InferenceProfile,
    f_mhz: npt.ArrayLike,
    rate_rps: npt.ArrayLike,
    workers: npt.ArrayLike,
    slot_s: float,
) -> FloatArray:
    """Mean request latency of a sub-cluster (eq. 1), with the saturated fallback."""
    mu = service_rate_rps(prof, f_mhz)
    lam = np.asarray(rate_rps, dtype=np.float64)
    m = np.asarray(workers, dtype=np.float64)
    cap = m * mu
    with np.errstate(divide="ignore", invalid="ignore"):
        queue = np.where(
            cap > lam,
            1.0 / np.maximum(cap - lam, 1e-300),
            np.where(lam > 0, (1.0 - cap / np.maximum(lam, 1e-300)) * slot_s / 2.0, 0.0),
        )
    # P_Q = 1 (paper: all workers busy); a sub-cluster with no load has no queueing term.
    queue = np.where(lam > 0, queue, 0.0)
    out = queue + 1.0 / mu + prof.network_delay_s
    return np.asarray(out, dtype=np.float64)


def utilisation(
    prof: InferenceProfile, f_mhz: npt.ArrayLike, rate_rps: npt.ArrayLike, workers: npt.ArrayLike
) -> FloatArray:
    """Worker utilisation u in [0, 1]."""
    mu = service_rate_rps(prof, f_mhz)
    m = np.asarray(workers, dtype=np.float64)
    lam = np.asarray(rate_rps, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(m > 0, lam / np.maximum(m * mu, 1e-300), 0.0)
    return np.asarray(np.clip(u, 0.0, 1.0), dtype=np.float64)


def inference_power_w(
    prof: InferenceProfile, f_mhz: npt.ArrayLike, rate_rps: npt.ArrayLike, workers: npt.ArrayLike
) -> FloatArray:
    """Power of a sub-cluster of ``workers`` powered-on nodes (eq. 11)."""
    f = np.asarray(f_mhz, dtype=np.float64)
    u = utilisation(prof, f, rate_rps, workers)
    m = np.asarray(workers, dtype=np.float64)
    per_node = (
        prof.alpha0_w_per_mhz * f * u
        + prof.alpha1_w_per_mhz * f
        + prof.alpha2_w * u
        + prof.alpha3_w
    )
    return np.asarray(m * per_node, dtype=np.float64)


# --- training --------------------------------------------------------------------------------


def epoch_time_s(prof: TrainingProfile, f_mhz: npt.ArrayLike) -> FloatArray:
    """Seconds per epoch on one worker at clock ``f_mhz`` (denominator of eq. 4)."""
    f = np.asarray(f_mhz, dtype=np.float64)
    return np.asarray(prof.alpha0_s_mhz / f + prof.alpha1_s, dtype=np.float64)


def epochs_per_slot(
    prof: TrainingProfile, f_mhz: npt.ArrayLike, workers: npt.ArrayLike, slot_s: float
) -> FloatArray:
    """tau_j = n_j * delta / (alpha0/f + alpha1)  (eq. 4)."""
    n = np.asarray(workers, dtype=np.float64)
    return np.asarray(n * slot_s / epoch_time_s(prof, f_mhz), dtype=np.float64)


def training_power_per_worker_w(prof: TrainingProfile, f_mhz: npt.ArrayLike) -> FloatArray:
    """beta0*f + beta1 (eq. 18's power term)."""
    f = np.asarray(f_mhz, dtype=np.float64)
    return np.asarray(prof.beta0_w_per_mhz * f + prof.beta1_w, dtype=np.float64)


def training_energy_j(
    prof: TrainingProfile,
    f_mhz: npt.ArrayLike,
    workers: npt.ArrayLike,
    running: npt.ArrayLike,
    slot_s: float,
) -> FloatArray:
    """E_j(t) = n_j(t) * x_j(t) * delta * (beta0*f + beta1)  (eq. 18)."""
    n = np.asarray(workers, dtype=np.float64)
    x = np.asarray(running, dtype=np.float64)
    return np.asarray(n * x * slot_s * training_power_per_worker_w(prof, f_mhz), dtype=np.float64)


# --- carbon ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """Per-slot energy delivered from each source (J) and the resulting carbon (g)."""

    solar_j: FloatArray
    wind_j: FloatArray
    grid_j: FloatArray
    carbon_g: FloatArray


def dispatch(
    demand_j: FloatArray,
    solar_supply_j: FloatArray,
    wind_supply_j: FloatArray,
    factors: EmissionFactors,
    grid_g_per_wh: FloatArray | None = None,
) -> Dispatch:
    """Meet each slot's demand with renewables (lowest factor first), then the grid (eq. 19-25).

    ``grid_g_per_wh`` overrides the constant grid factor per slot (e.g. an hourly CI trace).
    """
    demand = np.asarray(demand_j, dtype=np.float64)
    solar = np.asarray(solar_supply_j, dtype=np.float64)
    wind = np.asarray(wind_supply_j, dtype=np.float64)
    grid_f = (
        np.full(demand.shape, factors.grid_g_per_wh)
        if grid_g_per_wh is None
        else np.asarray(grid_g_per_wh, dtype=np.float64)
    )
    if factors.wind_g_per_wh <= factors.solar_g_per_wh:
        use_w = np.minimum(wind, demand)
        use_s = np.minimum(solar, demand - use_w)
    else:
        use_s = np.minimum(solar, demand)
        use_w = np.minimum(wind, demand - use_s)
    grid = demand - use_s - use_w
    carbon = (
        factors.solar_g_per_wh * use_s + factors.wind_g_per_wh * use_w + grid_f * grid
    ) / J_PER_WH
    return Dispatch(use_s, use_w, grid, carbon)


def attribute_carbon(consumer_energy_j: FloatArray, slot_carbon_g: FloatArray) -> FloatArray:
    """Charge each consumer (rows) its pro-rata share of each slot's carbon (columns)."""
    e = np.asarray(consumer_energy_j, dtype=np.float64)
    total = e.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, e / np.maximum(total, 1e-300), 0.0)
    return np.asarray(share * slot_carbon_g, dtype=np.float64)


def ppc_inference(latency: FloatArray, carbon_g: FloatArray) -> float:
    """Mean over (i, t) of l_i(t)^-1 / c_i(t)  (eq. 26-27), in (1/s)/g; slots with c = 0 skipped."""
    lat = np.asarray(latency, dtype=np.float64)
    c = np.asarray(carbon_g, dtype=np.float64)
    ok = c > 0
    if not ok.any():
        return 0.0
    return float(np.mean(1.0 / lat[ok] / c[ok]))


def ppc_training(epochs: FloatArray, carbon_g: FloatArray) -> float:
    """Mean over active slots of sum_j tau_j x_j / c^Tr(t)  (eq. 28-29), in epochs/g."""
    ep = np.asarray(epochs, dtype=np.float64)
    c = np.asarray(carbon_g, dtype=np.float64)
    ok = c > 0
    if not ok.any():
        return 0.0
    return float(np.mean(ep[ok] / c[ok]))
