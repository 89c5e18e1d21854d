"""Per-step latency and energy of one engine (paper 1 §III-B), frequency-scaled.

Rules
-----
* The one home of the step formulas (DESIGN §4)::

      t_pre = t_tok(N) + b0 + b1*B + b2*sum(n_i^2)
      t_tok = s_lo*N (N <= knee),  s_lo*knee + s_hi*(N - knee) (N > knee)
      t_dec = a0 + a1*B + a2*B^2,  a_j = alpha_j + beta_j * (K / B)   (0 for B = 0)
      E_pre = e0 + e_p*N + e_a*sum(n_i^2)
      E_dec = e0 + e_d*B + e_k*K                                        (0 for B = 0)

  Each is written once (`prefill_step_time`, `decode_step_time`, `prefill_step_energy`,
  `decode_step_energy`, and `chunked_prefill_time` built on t_pre) over a coefficient
  record of `services.config.calibration` and step shapes that may be Python floats or
  numpy arrays (broadcasting). Where a formula branches (the knee, an empty batch) it
  tests for an array and uses `numpy.where`, else a plain conditional, so one step costs
  no numpy call. The engine (`PerfModel`, plain float math on its hot path), the ``*_arr``
  helpers, the scheduler's estimator (coefficient records of per-DC columns, `columns`)
  and the calibration fit all evaluate these functions.
* Step shapes: prefill (total tokens N, requests B, sum n_i^2), decode (batch B, cached
  tokens K). Energies are per step for the whole engine (all TP GPUs); idle and host power
  are standing costs accounted by the engine and datacenter, not here.
* A frequency level scales each phase's time and energy by the calibration's frequency
  model (`FrequencyModel.factors`); the maximum level leaves the calibrated values
  unchanged. The ``*_arr`` helpers are at the maximum level.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from services.config.calibration import (
    Calibration,
    DecodeCoeffs,
    EnergyCoeffs,
    PrefillCoeffs,
)
from services.model.errors import InvalidInput

FloatArray = npt.NDArray[np.float64]
X = TypeVar("X", float, FloatArray)  # a step shape: one step, or an array of steps
_ndarray = np.ndarray  # bound once: the scalar/array test is on the hot path


def select(cond: Any, a: X, b: X | float) -> X:
    """``a`` where `cond` holds, else ``b``: `numpy.where` for arrays, a plain
    conditional for a Python bool (no numpy on the scalar path). The step formulas below
    make this test inline: they are the engine's hot path."""
    if isinstance(cond, _ndarray):
        return np.where(cond, a, b)  # type: ignore[return-value]
    return a if cond else b  # type: ignore[return-value]


# --- the step formulas -----------------------------------------------------------------
def prefill_step_time(
    p: PrefillCoeffs[Any], n_tokens: X, n_requests: X | float, sum_sq: X | float
) -> X:
    """t_pre = t_tok(N) + b0 + b1*B + b2*sum(n_i^2), t_tok piecewise linear with a knee."""
    k = p.knee_tokens
    below = p.tok_slope_s * n_tokens
    above = p.tok_slope_s * k + p.tok_slope_above_s * (n_tokens - k)
    lo = n_tokens <= k
    tok = np.where(lo, below, above) if isinstance(lo, _ndarray) else (below if lo else above)
    return tok + p.b0_s + p.b1_s * n_requests + p.b2_s * sum_sq


def _decode_time(d: DecodeCoeffs[Any], b: X, kv_tokens: X | float) -> X:
    """t_dec of a busy step (B > 0)."""
    ctx = kv_tokens / b
    a, be = d.alpha_s, d.beta_s
    return (a[0] + be[0] * ctx) + (a[1] + be[1] * ctx) * b + (a[2] + be[2] * ctx) * b * b


def _decode_energy(e: EnergyCoeffs[Any], batch: X, kv_tokens: X | float) -> X:
    """E_dec of a busy step (B > 0)."""
    return e.decode_e0_j + e.decode_ed_j * batch + e.decode_ek_j * kv_tokens


def _busy(f: Any, c: Any, batch: X, kv_tokens: X | float) -> X:
    """``f(c, B, K)`` for busy steps, 0 where the batch is empty (B <= 0)."""
    if isinstance(batch, _ndarray):
        busy = batch > 0
        return np.where(busy, f(c, np.where(busy, batch, 1.0), kv_tokens), 0.0)
    return f(c, batch, kv_tokens) if batch > 0 else 0.0


def decode_step_time(d: DecodeCoeffs[Any], batch: X, kv_tokens: X | float) -> X:
    """t_dec = a0 + a1*B + a2*B^2 with a_j = alpha_j + beta_j*(K/B); 0 for an empty batch."""
    return _busy(_decode_time, d, batch, kv_tokens)


def prefill_step_energy(e: EnergyCoeffs[Any], n_tokens: X, sum_sq: X | float) -> X:
    """E_pre = e0 + e_p*N + e_a*sum(n_i^2) (whole engine, J)."""
    return e.prefill_e0_j + e.prefill_ep_j * n_tokens + e.prefill_ea_j * sum_sq


def decode_step_energy(e: EnergyCoeffs[Any], batch: X, kv_tokens: X | float) -> X:
    """E_dec = e0 + e_d*B + e_k*K (whole engine, J); 0 for an empty batch."""
    return _busy(_decode_energy, e, batch, kv_tokens)


def chunked_prefill_time(
    p: PrefillCoeffs[Any],
    chunk_tokens: FloatArray,
    n_tokens: FloatArray,
    n_requests: FloatArray | float,
    sum_sq: FloatArray | float,
) -> tuple[FloatArray, FloatArray]:
    """(time, steps) of prefilling `n_tokens` in steps of at most `chunk_tokens`: full steps
    of one request and no attention term, then the last step with the remaining tokens,
    `n_requests` requests and `sum_sq`. 0 tokens take 0 s."""
    n = np.maximum(n_tokens, 0.0)
    steps = np.ceil(n / chunk_tokens)
    full = np.maximum(steps - 1.0, 0.0)
    last = n - full * chunk_tokens
    t = full * prefill_step_time(p, chunk_tokens, 1.0, 0.0) + prefill_step_time(
        p, last, n_requests, sum_sq
    )
    return np.where(n > 0, t, 0.0), steps


def engine_idle_w(e: EnergyCoeffs[Any], tp: Any) -> Any:
    """Idle power of a whole engine (all its `tp` GPUs)."""
    return e.idle_w_per_gpu * tp


def columns(cls: type[Any], records: Sequence[Any]) -> Any:
    """One record of class `cls` whose fields are numpy columns (one entry per record, in
    order) of the float fields of `records`; a ``tuple[...]`` field becomes a tuple of
    columns. Used for per-DC coefficient arrays (`PrefillCoeffs` of columns, ...)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        vals = [getattr(r, f.name) for r in records]
        if typing.get_origin(hints[f.name]) is tuple:
            width = len(typing.get_args(hints[f.name]))
            out[f.name] = tuple(
                np.array([v[j] for v in vals], dtype=np.float64) for j in range(width)
            )
        else:
            out[f.name] = np.array(vals, dtype=np.float64)
    return cls(**out)


# --- the engine's model: scalar, frequency-scaled --------------------------------------
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

    def prefill_time(self, n_tokens: float, n_requests: float, sum_sq: float) -> float:
        return prefill_step_time(self._p, n_tokens, n_requests, sum_sq) * self.prefill_time_factor

    def prefill_energy(self, n_tokens: float, sum_sq: float) -> float:
        return prefill_step_energy(self._e, n_tokens, sum_sq) * self.prefill_energy_factor

    # Decode steps are most of the engine's hot path: the scalar methods test for an empty
    # batch themselves and call the busy-step formulas without the scalar/array test.
    def decode_time(self, batch: float, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        return _decode_time(self._d, batch, kv_tokens) * self.decode_time_factor

    def decode_energy(self, batch: float, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        return _decode_energy(self._e, batch, kv_tokens) * self.decode_energy_factor

    def decode_run(self, batch: int, kv_tokens: int, steps: int
                   ) -> tuple[list[float], list[float]]:
        """(times, energies) of `steps` decode steps of a fixed batch whose KV grows by one
        token per request per step (step s reads ``kv_tokens + batch * s``): the scalar
        formulas, on arrays for longer runs -- the same floating-point operations, so the
        same values as `decode_time` / `decode_energy` step by step."""
        if steps < 8:
            kvs = [kv_tokens + batch * s for s in range(steps)]
            return ([self.decode_time(batch, k) for k in kvs],
                    [self.decode_energy(batch, k) for k in kvs])
        if batch <= 0:
            return [0.0] * steps, [0.0] * steps
        b: FloatArray = np.full(steps, float(batch))
        kv: FloatArray = np.arange(steps, dtype=np.float64) * float(batch) + float(kv_tokens)
        times = _decode_time(self._d, b, kv) * self.decode_time_factor
        energies = _decode_energy(self._e, b, kv) * self.decode_energy_factor
        return times.tolist(), energies.tolist()

    @property
    def idle_w(self) -> float:
        """Idle power of the whole engine (all its TP GPUs)."""
        return engine_idle_w(self._e, self.cal.tp)


# --- array helpers at the maximum frequency --------------------------------------------
def prefill_time_arr(
    cal: Calibration, n_tokens: FloatArray, n_requests: FloatArray, sum_sq: FloatArray
) -> FloatArray:
    """Vectorised `PerfModel.prefill_time` at the maximum frequency."""
    return prefill_step_time(
        cal.prefill, np.asarray(n_tokens, dtype=np.float64), np.asarray(n_requests),
        np.asarray(sum_sq),
    )


def decode_time_arr(cal: Calibration, batch: FloatArray, kv_tokens: FloatArray) -> FloatArray:
    """Vectorised `PerfModel.decode_time` at the maximum frequency (0 where batch is 0)."""
    return decode_step_time(
        cal.decode, np.asarray(batch, dtype=np.float64), np.asarray(kv_tokens, dtype=np.float64)
    )


def prefill_energy_arr(cal: Calibration, n_tokens: FloatArray, sum_sq: FloatArray) -> FloatArray:
    return prefill_step_energy(cal.energy, np.asarray(n_tokens), np.asarray(sum_sq))


def decode_energy_arr(cal: Calibration, batch: FloatArray, kv_tokens: FloatArray) -> FloatArray:
    return decode_step_energy(
        cal.energy, np.asarray(batch, dtype=np.float64), np.asarray(kv_tokens)
    )
