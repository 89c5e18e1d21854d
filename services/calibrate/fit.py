"""Least-squares fitting of the step latency and energy models to step-level measurements.

Rules / theory of operation
---------------------------
* Input is a step-level table (one row per engine step, see `STEP_COLUMNS`):
  ``phase`` is ``prefill`` or ``decode``; prefill rows need ``n_tokens``, ``n_requests``,
  ``sum_sq`` (sum of squared prompt lengths in the step) and decode rows need ``batch`` and
  ``kv_tokens`` (cached tokens over the batch); both need ``time_s``; ``energy_j`` (whole
  engine, all TP GPUs) is optional — blank cells mean "not measured".
* Every fit minimises *relative* squared error (rows weighted by 1/y), because step times
  span three orders of magnitude and the paper reports MAPE.
* Prefill: ``t = s_lo*N + d*max(N-k, 0) + b0 + b1*B + b2*sum_sq`` with all coefficients
  >= 0 (non-negative least squares) so the slope can only increase past the knee
  (``s_hi = s_lo + d``); the knee ``k`` is found by a grid search over candidate token
  counts, keeping the knee with the least weighted residual.
* Decode: ``t = sum_j (alpha_j + beta_j*l) * B^j`` with ``l = K/B``, i.e. features
  ``1, B, B^2, l, K, K*B``. Ordinary weighted least squares is tried first (it allows the
  sublinear shapes the paper describes); if the result is not monotone in B and K over
  the measured range, non-negative least squares is used instead.
* Energy: ``E_pre = e0 + e_p*N + e_a*sum_sq`` and ``E_dec = e0 + e_d*B + e_k*K``, both
  non-negative least squares.
* The fit returns coefficients and per-phase MAPE. `PrefillFit` and `DecodeFit` are the
  calibration's own `PrefillCoeffs` / `DecodeCoeffs` records plus the fit's quality, and
  their predictions (and MAPE) use the one set of step formulas in
  `services.datacenter.perfmodel`. Merging into a calibration mapping replaces only the
  fitted keys (the records' field names) and records their provenance. Pure numpy, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from services.calibrate.csvio import Table, read_table
from services.config.calibration import DecodeCoeffs, PrefillCoeffs
from services.datacenter.perfmodel import decode_step_time, prefill_step_time
from services.model.errors import ConfigError, InvalidInput

FloatArray = npt.NDArray[np.float64]

STEP_COLUMNS = {
    "phase": "prefill | decode",
    "n_tokens": "prefill: total prompt tokens processed in the step (N)",
    "n_requests": "prefill: requests in the step (B)",
    "sum_sq": "prefill: sum of squared prompt lengths of the step's requests (sum n_i^2)",
    "batch": "decode: requests in the decode batch (B)",
    "kv_tokens": "decode: cached KV tokens over the whole batch (K)",
    "time_s": "measured step duration in seconds",
    "energy_j": "optional: measured step energy of the whole engine in joules",
}


def nnls(a: FloatArray, b: FloatArray, max_iter: int = 500) -> FloatArray:
    """Non-negative least squares ``min ||Ax - b||, x >= 0`` (Lawson-Hanson active set)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    it = 0
    while (~passive).any() and (w[~passive] > tol).any() and it < max_iter:
        it += 1
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            mask = passive & (z <= 0)
            alpha = np.min(x[mask] / (x[mask] - z[mask]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


def mape(pred: FloatArray, actual: FloatArray) -> float:
    """Mean absolute percentage error in percent."""
    return float(np.mean(np.abs(pred - actual) / np.abs(actual)) * 100.0)


def _weighted(a: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
    w = 1.0 / y
    return a * w[:, None], np.ones_like(y)


@dataclass(frozen=True)
class PrefillFit(PrefillCoeffs[float]):
    """Fitted prefill coefficients (the calibration's record) and the fit's quality."""

    mape_pct: float
    n_rows: int

    def predict(self, n: FloatArray, reqs: FloatArray, sum_sq: FloatArray) -> FloatArray:
        return prefill_step_time(self, n, reqs, sum_sq)


@dataclass(frozen=True)
class DecodeFit(DecodeCoeffs[float]):
    """Fitted decode coefficients (the calibration's record) and the fit's quality."""

    mape_pct: float
    n_rows: int
    method: str

    def predict(self, batch: FloatArray, kv: FloatArray) -> FloatArray:
        return decode_step_time(self, batch, kv)


@dataclass(frozen=True)
class EnergyFit:
    e0_j: float
    e1_j: float  # e_p (prefill, per token) or e_d (decode, per request)
    e2_j: float  # e_a (prefill, per n^2) or e_k (decode, per cached token)
    mape_pct: float
    n_rows: int


@dataclass(frozen=True)
class FitResult:
    prefill: PrefillFit | None
    decode: DecodeFit | None
    prefill_energy: EnergyFit | None
    decode_energy: EnergyFit | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def mape_table(self) -> dict[str, float | None]:
        return {
            "prefill_time": self.prefill.mape_pct if self.prefill else None,
            "decode_time": self.decode.mape_pct if self.decode else None,
            "prefill_energy": self.prefill_energy.mape_pct if self.prefill_energy else None,
            "decode_energy": self.decode_energy.mape_pct if self.decode_energy else None,
        }


def _prefill_design(n: FloatArray, reqs: FloatArray, ssq: FloatArray, knee: float) -> FloatArray:
    return np.column_stack([n, np.maximum(n - knee, 0.0), np.ones_like(n), reqs, ssq])


def fit_prefill(
    n: FloatArray, reqs: FloatArray, ssq: FloatArray, t: FloatArray, n_knees: int = 64
) -> PrefillFit:
    """Fit the piecewise-linear prefill model with a knee grid search (see module rules)."""
    if len(t) < 5:
        raise InvalidInput("measurements", f"prefill fit needs >= 5 rows, got {len(t)}")
    lo, hi = float(np.min(n)), float(np.max(n))
    uniq = np.unique(n)
    grid = np.unique(
        np.concatenate([
            uniq[(uniq > lo) & (uniq < hi)],
            np.geomspace(max(lo, 1.0), hi, n_knees),
        ])
    )
    if len(grid) > 4 * n_knees:
        grid = grid[np.linspace(0, len(grid) - 1, 4 * n_knees).astype(int)]
    # Column scaling keeps NNLS well conditioned (sum_sq is ~1e6 x larger than B).
    best: tuple[float, float, FloatArray] | None = None
    for knee in [0.0, *grid.tolist()]:
        a = _prefill_design(n, reqs, ssq, knee)
        aw, yw = _weighted(a, t)
        scale = np.maximum(np.abs(aw).max(axis=0), 1e-300)
        x = nnls(aw / scale, yw) / scale
        sse = float(np.sum((aw @ x - yw) ** 2))
        if best is None or sse < best[0] - 1e-15:
            best = (sse, knee, x)
    assert best is not None
    _, knee, x = best
    p = PrefillCoeffs(
        b0_s=float(x[2]),
        b1_s=float(x[3]),
        b2_s=float(x[4]),
        tok_slope_s=float(x[0]),
        tok_slope_above_s=float(x[0] + x[1]),
        knee_tokens=float(knee),
    )
    pred = prefill_step_time(p, n, reqs, ssq)
    return PrefillFit(**dataclasses.asdict(p), mape_pct=mape(pred, t), n_rows=len(t))


def _decode_design(batch: FloatArray, kv: FloatArray) -> FloatArray:
    ell = kv / batch
    return np.column_stack([np.ones_like(batch), batch, batch**2, ell, kv, kv * batch])


def _decode_monotone(x: FloatArray, b_max: float, l_max: float) -> bool:
    """Decode coefficients ``x = alpha + beta`` give positive step times that grow with B
    and with the mean context l over ``1..b_max`` x ``0..l_max``."""
    bb, ll = np.meshgrid(np.arange(1.0, b_max + 1.0), np.linspace(0.0, l_max, 33))
    t = decode_step_time(_decode_coeffs(x), bb, bb * ll)
    ok_b = bool((np.diff(t, axis=1) >= -1e-12).all())
    ok_l = bool((np.diff(t, axis=0) >= -1e-12).all())
    return ok_b and ok_l and bool((t > 0).all())


def fit_decode(batch: FloatArray, kv: FloatArray, t: FloatArray) -> DecodeFit:
    """Fit the decode polynomial (see module rules); monotone in B and K over the data."""
    if len(t) < 3:
        raise InvalidInput("measurements", f"decode fit needs >= 3 rows, got {len(t)}")
    if (batch <= 0).any():
        raise InvalidInput("batch", "decode rows need batch >= 1")
    a = _decode_design(batch, kv)
    if np.linalg.matrix_rank(a / t[:, None]) < a.shape[1]:
        return _fit_decode_reduced(batch, kv, t)
    aw, yw = _weighted(a, t)
    scale = np.maximum(np.abs(aw).max(axis=0), 1e-300)
    x = np.linalg.lstsq(aw / scale, yw, rcond=None)[0] / scale
    method = "weighted least squares"
    b_max, l_max = float(batch.max()), float((kv / batch).max())
    if not _decode_monotone(x, b_max, l_max):
        x = nnls(aw / scale, yw) / scale
        method = "non-negative least squares (unconstrained fit was not monotone)"
    return _decode_fit(x, batch, kv, t, method)


def _fit_decode_reduced(batch: FloatArray, kv: FloatArray, t: FloatArray) -> DecodeFit:
    """Too few distinct shapes for six terms: ``t = alpha0 + alpha1*B + beta1*K`` (NNLS)."""
    a = np.column_stack([np.ones_like(batch), batch, kv])
    aw, yw = _weighted(a, t)
    scale = np.maximum(np.abs(aw).max(axis=0), 1e-300)
    x = nnls(aw / scale, yw) / scale
    full = np.array([x[0], x[1], 0.0, 0.0, x[2], 0.0])
    return _decode_fit(full, batch, kv, t,
                       "reduced model alpha0 + alpha1*B + beta1*K (too few distinct shapes)")


def _decode_coeffs(x: FloatArray) -> DecodeCoeffs[float]:
    """The decode record of the design's coefficients ``(alpha_0..2, beta_0..2)``."""
    return DecodeCoeffs(alpha_s=(float(x[0]), float(x[1]), float(x[2])),
                        beta_s=(float(x[3]), float(x[4]), float(x[5])))


def _decode_fit(
    x: FloatArray, batch: FloatArray, kv: FloatArray, t: FloatArray, method: str
) -> DecodeFit:
    d = _decode_coeffs(x)
    pred = decode_step_time(d, batch, kv)
    return DecodeFit(d.alpha_s, d.beta_s, mape(pred, t), len(t), method)


def fit_energy(x1: FloatArray, x2: FloatArray, e: FloatArray) -> EnergyFit:
    """Fit ``E = e0 + c1*x1 + c2*x2`` with non-negative coefficients (relative errors)."""
    if len(e) < 3:
        raise InvalidInput("measurements", f"energy fit needs >= 3 rows, got {len(e)}")
    a = np.column_stack([np.ones_like(x1), x1, x2])
    aw, yw = _weighted(a, e)
    scale = np.maximum(np.abs(aw).max(axis=0), 1e-300)
    x = nnls(aw / scale, yw) / scale
    pred = a @ x
    return EnergyFit(float(x[0]), float(x[1]), float(x[2]), mape(pred, e), len(e))


# --- step tables -------------------------------------------------------------------------


def read_steps(path: str) -> Table:
    """Read a step-level measurement CSV; per-phase columns are checked in `fit_steps`."""
    return read_table(
        path,
        numeric=("time_s",),
        text=("phase",),
        optional_numeric=("n_tokens", "n_requests", "sum_sq", "batch", "kv_tokens", "energy_j"),
    )


def _phase_cols(
    table: Table, mask: npt.NDArray[np.bool_], cols: tuple[str, ...]
) -> list[FloatArray]:
    out = []
    for c in cols:
        if c not in table.num:
            raise ConfigError(table.path, c, "missing column required by the phase's rows")
        v = table.num[c][mask]
        bad = np.flatnonzero(np.isnan(v))
        if len(bad):
            row = int(np.flatnonzero(mask)[bad[0]]) + 2
            raise ConfigError(table.path, c, f"row {row}: empty cell, expected a number")
        out.append(v)
    return out


def fit_steps(table: Table) -> FitResult:
    """Fit every phase present in `table` (see module rules for columns)."""
    phase = np.array([p.lower() for p in table.text["phase"]])
    bad = np.flatnonzero(~np.isin(phase, ["prefill", "decode"]))
    if len(bad):
        raise ConfigError(
            table.path, "phase", f"row {int(bad[0]) + 2}: expected prefill or decode, got "
            f"{table.text['phase'][int(bad[0])]!r}"
        )
    t = table.num["time_s"]
    if (t <= 0).any():
        raise ConfigError(table.path, "time_s", f"row {int(np.argmax(t <= 0)) + 2}: must be > 0")
    notes: list[str] = []
    energy = table.num.get("energy_j")
    pre = phase == "prefill"
    dec = phase == "decode"
    pf = pe = df = de = None
    if pre.any():
        n, reqs, ssq = _phase_cols(table, pre, ("n_tokens", "n_requests", "sum_sq"))
        pf = fit_prefill(n, reqs, ssq, t[pre])
        if energy is not None and (~np.isnan(energy[pre])).sum() >= 3:
            m = ~np.isnan(energy[pre])
            pe = fit_energy(n[m], ssq[m], energy[pre][m])
        else:
            notes.append("prefill energy not measured: energy coefficients kept from the base")
    else:
        notes.append("no prefill rows: prefill coefficients kept from the base")
    if dec.any():
        b, kv = _phase_cols(table, dec, ("batch", "kv_tokens"))
        df = fit_decode(b, kv, t[dec])
        if energy is not None and (~np.isnan(energy[dec])).sum() >= 3:
            m = ~np.isnan(energy[dec])
            de = fit_energy(b[m], kv[m], energy[dec][m])
        else:
            notes.append("decode energy not measured: energy coefficients kept from the base")
    else:
        notes.append("no decode rows: decode coefficients kept from the base")
    return FitResult(pf, df, pe, de, tuple(notes))


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def merge_fit(base: Mapping[str, Any], fit: FitResult, source: str) -> dict[str, Any]:
    """A copy of calibration mapping `base` with the fitted keys replaced (4 significant digits)."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    energy = dict(out.get("energy", {}))
    prov = dict(out.get("provenance", {}) or {})
    if fit.prefill:
        p = fit.prefill
        out["prefill"] = {
            f.name: _sig(getattr(p, f.name)) for f in dataclasses.fields(PrefillCoeffs)
        }
        prov["prefill"] = f"fit: {source} ({p.n_rows} steps, MAPE {p.mape_pct:.2f} %)"
    if fit.decode:
        d = fit.decode
        out["decode"] = {
            f.name: [_sig(v) for v in getattr(d, f.name)] for f in dataclasses.fields(DecodeCoeffs)
        }
        prov["decode"] = f"fit: {source} ({d.n_rows} steps, {d.method}, MAPE {d.mape_pct:.2f} %)"
    if fit.prefill_energy:
        e = fit.prefill_energy
        energy["prefill"] = {"e0_j": _sig(e.e0_j), "e_p_j": _sig(e.e1_j), "e_a_j": _sig(e.e2_j)}
        prov["energy.prefill"] = f"fit: {source} ({e.n_rows} steps, MAPE {e.mape_pct:.2f} %)"
    if fit.decode_energy:
        e = fit.decode_energy
        energy["decode"] = {"e0_j": _sig(e.e0_j), "e_d_j": _sig(e.e1_j), "e_k_j": _sig(e.e2_j)}
        prov["energy.decode"] = f"fit: {source} ({e.n_rows} steps, MAPE {e.mape_pct:.2f} %)"
    out["energy"] = energy
    out["provenance"] = prov
    return out
