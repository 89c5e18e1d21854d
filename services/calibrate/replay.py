"""Replay of a logged serving run with every decision fixed (paper 1 §V-B method).

Rules / theory of operation
---------------------------
* A log is a CSV with one row per request: ``arrival_s`` (seconds from the run's start),
  ``isl`` and ``osl`` (tokens), ``engine`` (0-based engine index the request ran on) and,
  optionally, the measured ``ttft_s``, ``tpot_s`` and ``energy_j`` (per-request energy
  as attributed by the engine; blank = not measured). `LOG_COLUMNS` documents them.
* Each request is sent to its logged engine at its logged arrival with its logged ISL and
  OSL (`services.datacenter.vdriver.replay`), so the comparison isolates the engine
  model. Engines are as many as the largest index + 1 (or ``n_engines``).
* Errors per metric are MAPE over the requests that carry a measurement (TPOT over
  requests with OSL > 1); the totals compare sums. A metric with no measurement is
  reported as null.
* `log_rows` turns a replay's own result back into a log, so an emulated run replays to
  itself (a self-check of determinism).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from services.calibrate.csvio import Table, read_table
from services.config.calibration import Calibration
from services.datacenter.vdriver import ReplayItem, ReplayResult, replay
from services.model.errors import ConfigError, InvalidInput

LOG_COLUMNS = {
    "arrival_s": "request arrival, seconds from the start of the run",
    "isl": "input (prompt) tokens",
    "osl": "output tokens actually generated",
    "engine": "0-based index of the engine that served the request",
    "ttft_s": "optional: measured time to first token (s)",
    "tpot_s": "optional: measured mean time per output token after the first (s)",
    "energy_j": "optional: measured per-request GPU energy (J)",
}
METRICS = ("ttft_s", "tpot_s", "energy_j")


@dataclass(frozen=True)
class Log:
    items: list[ReplayItem]
    measured: dict[str, np.ndarray]   # metric -> values (NaN = not measured)
    path: str


def read_log(path: str) -> Log:
    t: Table = read_table(path, numeric=("arrival_s", "isl", "osl", "engine"),
                          optional_numeric=METRICS)
    for col in ("isl", "osl", "engine"):
        v = t.num[col]
        bad = np.flatnonzero((v != np.round(v)) | (v < (0 if col == "engine" else 1)))
        if len(bad):
            raise ConfigError(path, col, f"row {int(bad[0]) + 2}: expected a whole number "
                              f"{'>= 0' if col == 'engine' else '>= 1'}, got {v[bad[0]]!r}")
    arr = t.num["arrival_s"]
    if (arr < 0).any():
        raise ConfigError(path, "arrival_s", f"row {int(np.argmax(arr < 0)) + 2}: must be >= 0")
    items = [
        ReplayItem(float(a), int(i), int(o), int(e))
        for a, i, o, e in zip(arr, t.num["isl"], t.num["osl"], t.num["engine"], strict=True)
    ]
    measured = {m: t.num.get(m, np.full(len(items), np.nan)) for m in METRICS}
    return Log(items, measured, path)


def _mape(pred: np.ndarray, meas: np.ndarray) -> tuple[float | None, int]:
    m = ~np.isnan(meas) & (meas > 0)
    if not m.any():
        return None, 0
    return float(np.mean(np.abs(pred[m] - meas[m]) / meas[m]) * 100.0), int(m.sum())


def compare(log: Log, res: ReplayResult) -> dict[str, Any]:
    """Per-metric MAPE (and totals) of the replay against the log's measurements."""
    sim = {
        "ttft_s": np.array([f.ttft_s for f in res.finished]),
        "tpot_s": np.array([f.tpot_s for f in res.finished]),
        "energy_j": np.array([f.energy_j for f in res.finished]),
    }
    osl = np.array([it.osl_tokens for it in log.items])
    metrics: dict[str, Any] = {}
    for m in METRICS:
        meas = log.measured[m].copy()
        if m == "tpot_s":
            meas[osl <= 1] = np.nan
        err, n = _mape(sim[m], meas)
        metrics[m] = {
            "mape_pct": None if err is None else round(err, 4),
            "n": n,
            "sim_mean": float(np.mean(sim[m][osl > 1] if m == "tpot_s" else sim[m])),
            "measured_mean": None if n == 0 else float(np.nanmean(meas)),
        }
    return {
        "log": log.path,
        "requests": len(log.items),
        "metrics": metrics,
        "sim_gpu_energy_j": res.gpu_energy_j,
        "sim_gpu_active_j": res.gpu_active_j,
        "sim_end_s": res.end_s,
    }


def replay_log(cal: Calibration, log: Log, n_engines: int | None = None) -> dict[str, Any]:
    if not log.items:
        raise InvalidInput("log", f"{log.path}: no requests")
    need = max(it.engine for it in log.items) + 1
    n = n_engines or need
    if n < need:
        raise InvalidInput("engines", f"log uses engine {need - 1} but only {n} engines given")
    items = sorted(range(len(log.items)), key=lambda k: log.items[k].arrival_s)
    ordered = [log.items[k] for k in items]
    res = replay(cal, ordered, n)
    # back to the log's row order
    back = [0] * len(items)
    for pos, k in enumerate(items):
        back[k] = pos
    res = ReplayResult([res.finished[back[k]] for k in range(len(items))],
                       res.gpu_active_j, res.gpu_idle_j, res.end_s)
    out = compare(log, res)
    out["setup"] = cal.setup
    out["engines"] = n
    return out


def log_rows(items: list[ReplayItem], res: ReplayResult) -> list[list[object]]:
    """Rows of a log (with measured columns) made from an emulated run."""
    return [
        [it.arrival_s, it.isl_tokens, it.osl_tokens, it.engine, f.ttft_s, f.tpot_s, f.energy_j]
        for it, f in zip(items, res.finished, strict=True)
    ]


LOG_HEADER = ["arrival_s", "isl", "osl", "engine", "ttft_s", "tpot_s", "energy_j"]
