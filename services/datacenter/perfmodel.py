"""Per-step latency and energy of one engine (paper 1 §III-B), frequency-scaled.

Rules
-----
* Pure functions of the step's shape: prefill (total tokens N, requests B, sum n_i^2) and
  decode (batch B, cached tokens K). All coefficients come from a `Calibration`.
* Energies are per step for the whole engine (all TP GPUs); idle and host power are
  standing costs accounted by the engine and datacenter, not here.
* A frequency level scales each phase's time and energy by the calibration's frequency
  model; the maximum level leaves the calibrated values unchanged.
* Scalar methods are the engine's hot path (plain float math); the ``*_arr`` functions are
  numpy versions for estimators, fitting and plots.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from services.common.calibration import Calibration
from services.common.errors import InvalidInput

FloatArray = npt.NDArray[np.float64]


def t_tok(n_tokens: float, slope: float, slope_above: float, knee: float) -> float:
    """Piecewise-linear token term: slope up to the knee, slope_above beyond it."""
    if n_tokens <= knee:
        return slope * n_tokens
    return slope * knee + slope_above * (n_tokens - knee)


class PerfModel:
    """Step-time and step-energy model of one engine at a settable GPU frequency."""

    def __init__(self, cal: Calibration, frequency_mhz: float | None = None) -> None:
        self.cal = cal
        self._p = cal.prefill
        self._d = cal.decode
        self._e = cal.energy
        self.frequency_mhz = cal.frequency.max_mhz
        self.prefill_time_factor = 1.0
        self.prefill_energy_factor = 1.0
        self.decode_time_factor = 1.0
        self.decode_energy_factor = 1.0
        if frequency_mhz is not None:
            self.set_frequency(frequency_mhz)

    def set_frequency(self, mhz: float) -> float:
        """Apply the supported level nearest to `mhz`; returns the level applied."""
        if not mhz > 0:
            raise InvalidInput("gpu_frequency_mhz", f"expected > 0, got {mhz!r}")
        fm = self.cal.frequency
        level = fm.snap(mhz)
        self.frequency_mhz = level
        self.prefill_time_factor, self.prefill_energy_factor = fm.factors(level, "prefill")
        self.decode_time_factor, self.decode_energy_factor = fm.factors(level, "decode")
        return level

    # --- prefill -----------------------------------------------------------------------
    def prefill_time(self, n_tokens: float, n_requests: float, sum_sq: float) -> float:
        p = self._p
        t = (
            t_tok(n_tokens, p.tok_slope_s, p.tok_slope_above_s, p.knee_tokens)
            + p.b0_s
            + p.b1_s * n_requests
            + p.b2_s * sum_sq
        )
        return t * self.prefill_time_factor

    def prefill_energy(self, n_tokens: float, sum_sq: float) -> float:
        e = self._e
        j = e.prefill_e0_j + e.prefill_ep_j * n_tokens + e.prefill_ea_j * sum_sq
        return j * self.prefill_energy_factor

    # --- decode ------------------------------------------------------------------------
    def decode_time(self, batch: float, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        mean_ctx = kv_tokens / batch
        a, b = self._d.alpha_s, self._d.beta_s
        a0 = a[0] + b[0] * mean_ctx
        a1 = a[1] + b[1] * mean_ctx
        a2 = a[2] + b[2] * mean_ctx
        return (a0 + a1 * batch + a2 * batch * batch) * self.decode_time_factor

    def decode_energy(self, batch: float, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        e = self._e
        j = e.decode_e0_j + e.decode_ed_j * batch + e.decode_ek_j * kv_tokens
        return j * self.decode_energy_factor

    # --- standing power ----------------------------------------------------------------
    @property
    def idle_w(self) -> float:
        """Idle power of the whole engine (all its TP GPUs)."""
        return self._e.idle_w_per_gpu * self.cal.tp


def prefill_time_arr(
    cal: Calibration, n_tokens: FloatArray, n_requests: FloatArray, sum_sq: FloatArray
) -> FloatArray:
    """Vectorised `PerfModel.prefill_time` at the maximum frequency."""
    p = cal.prefill
    n = np.asarray(n_tokens, dtype=np.float64)
    tok = np.where(
        n <= p.knee_tokens,
        p.tok_slope_s * n,
        p.tok_slope_s * p.knee_tokens + p.tok_slope_above_s * (n - p.knee_tokens),
    )
    return tok + p.b0_s + p.b1_s * np.asarray(n_requests) + p.b2_s * np.asarray(sum_sq)


def decode_time_arr(cal: Calibration, batch: FloatArray, kv_tokens: FloatArray) -> FloatArray:
    """Vectorised `PerfModel.decode_time` at the maximum frequency (0 where batch is 0)."""
    b = np.asarray(batch, dtype=np.float64)
    k = np.asarray(kv_tokens, dtype=np.float64)
    safe_b = np.where(b > 0, b, 1.0)
    ctx = k / safe_b
    a, be = cal.decode.alpha_s, cal.decode.beta_s
    t = (a[0] + be[0] * ctx) + (a[1] + be[1] * ctx) * b + (a[2] + be[2] * ctx) * b * b
    return np.where(b > 0, t, 0.0)


def prefill_energy_arr(cal: Calibration, n_tokens: FloatArray, sum_sq: FloatArray) -> FloatArray:
    e = cal.energy
    return e.prefill_e0_j + e.prefill_ep_j * np.asarray(n_tokens) + e.prefill_ea_j * np.asarray(
        sum_sq
    )


def decode_energy_arr(cal: Calibration, batch: FloatArray, kv_tokens: FloatArray) -> FloatArray:
    e = cal.energy
    b = np.asarray(batch, dtype=np.float64)
    j = e.decode_e0_j + e.decode_ed_j * b + e.decode_ek_j * np.asarray(kv_tokens)
    return np.where(b > 0, j, 0.0)
