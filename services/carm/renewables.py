"""Renewable supply per slot from real traces: PV from irradiance, wind from ENTSO-E.

Rules / theory of operation
---------------------------
* PV model (pure): ``T_cell = T_air + (NOCT - 20)/800 * GHI`` and
  ``P = area * eta * GHI * (1 - gamma * (T_cell - 25))`` with negative GHI (night-time sensor
  offset) clipped to 0 and P clipped at 0.
* Wind: an ENTSO-E national wind-generation series divided by its maximum over the file (a
  capacity proxy, giving a 0-1 capacity factor) times the farm's rated power.
* A trace is turned into per-slot energy (J) by averaging the samples that fall in each slot
  (``slot_energy_j``); an hourly series is held constant within the hour. Slot 0 starts at the
  trace day's local midnight (MST for NREL MIDC, UTC for ENTSO-E and Solcast).
* Loaders read CSV files named in ``data/carm/site.yaml`` once; bad files raise ``ConfigError``.
  Site parameters and provenance are in that file; the traces are in ``data/renewables/``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.carm.models import FloatArray
from services.carm.profiles import CARM_DIR, DATA_DIR, read_yaml
from services.model.errors import ConfigError, InvalidInput


def pv_power_w(
    ghi_w_m2: FloatArray,
    t_air_c: FloatArray,
    area_m2: float,
    efficiency: float,
    temp_coeff_per_k: float,
    noct_c: float,
) -> FloatArray:
    """DC power of a PV array from global horizontal irradiance and air temperature."""
    ghi = np.clip(np.asarray(ghi_w_m2, dtype=np.float64), 0.0, None)
    t_cell = np.asarray(t_air_c, dtype=np.float64) + (noct_c - 20.0) / 800.0 * ghi
    p = area_m2 * efficiency * ghi * (1.0 - temp_coeff_per_k * (t_cell - 25.0))
    return np.asarray(np.clip(p, 0.0, None), dtype=np.float64)


def slot_energy_j(
    power_w: FloatArray, sample_s: float, slot_s: float, n_slots: int
) -> FloatArray:
    """Energy per slot (J) from a regularly sampled power series starting at slot 0.

    Each slot gets the mean of the samples whose start falls in it, times ``slot_s``; a series
    coarser than the slot is held constant. Missing tail samples are an error.
    """
    p = np.asarray(power_w, dtype=np.float64)
    t0 = np.arange(n_slots) * slot_s
    out = np.empty(n_slots)
    for s in range(n_slots):
        lo = int(np.floor(t0[s] / sample_s))
        hi = max(lo + 1, int(np.ceil((t0[s] + slot_s) / sample_s)))
        if hi > len(p):
            raise InvalidInput("supply_trace", f"trace too short for {n_slots} slots")
        out[s] = p[lo:hi].mean() * slot_s
    return out


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read: {exc}") from exc


def _col(path: Path, rows: list[dict[str, str]], col: str) -> FloatArray:
    try:
        return np.array([float(r[col]) for r in rows], dtype=np.float64)
    except KeyError as exc:
        raise ConfigError(str(path), col, "no such column") from exc
    except ValueError as exc:
        raise ConfigError(str(path), col, f"non-numeric value: {exc}") from exc


def _day_rows(path: Path, rows: list[dict[str, str]], time_col: str, day: str) -> list[dict]:
    sel = [r for r in rows if r[time_col].startswith(day)]
    if not sel:
        raise ConfigError(str(path), time_col, f"no rows for day {day}")
    return sel


@dataclass(frozen=True)
class Supply:
    """Renewable energy available per slot (J) and what it came from."""

    solar_j: FloatArray
    wind_j: FloatArray
    solar_source: str
    wind_source: str


def solar_from_site(site: dict[str, Any], slot_s: float, n_slots: int) -> tuple[FloatArray, str]:
    cfg = site["solar"]
    src = str(cfg.get("source", "nrel_midc"))
    if src == "nrel_midc":
        path = DATA_DIR / cfg["nrel_file"]
        rows = _read_csv(path)
        p = pv_power_w(
            _col(path, rows, "ghi_global_psp_w_m2"),
            _col(path, rows, "temp_2m_c"),
            float(cfg["area_m2"]),
            float(cfg["efficiency"]),
            float(cfg["temp_coeff_per_k"]),
            float(cfg["noct_c"]),
        )
        return slot_energy_j(p, 60.0, slot_s, n_slots), f"NREL MIDC GHI+T PV model ({path.name})"
    if src == "solcast":
        path = DATA_DIR / cfg["solcast_file"]
        rows = _day_rows(path, _read_csv(path), "datetime", str(cfg["solcast_day"]))
        p = np.clip(_col(path, rows, str(cfg["solcast_column"])), 0, None) * float(cfg["peak_w"])
        return slot_energy_j(p, 300.0, slot_s, n_slots), f"Solcast normalised PV ({path.name})"
    if src == "entsoe":
        path = DATA_DIR / cfg["entsoe_file"]
        allrows = _read_csv(path)
        cap = float(_col(path, allrows, "FR_solar_mw").max())
        rows = _day_rows(path, allrows, "datetime_utc_hour_start", str(cfg["entsoe_day"]))
        p = _col(path, rows, "FR_solar_mw") / cap * float(cfg["peak_w"])
        return slot_energy_j(p, 3600.0, slot_s, n_slots), f"ENTSO-E FR solar ({path.name})"
    raise ConfigError("site.yaml", "solar.source", f"unknown source {src!r}")


def wind_from_site(site: dict[str, Any], slot_s: float, n_slots: int) -> tuple[FloatArray, str]:
    cfg = site["wind"]
    path = DATA_DIR / cfg["file"]
    allrows = _read_csv(path)
    col = str(cfg["column"])
    cap = float(_col(path, allrows, col).max())
    rows = _day_rows(path, allrows, "datetime_utc_hour_start", str(cfg["day"]))
    p = _col(path, rows, col) / cap * float(cfg["rated_w"])
    return slot_energy_j(p, 3600.0, slot_s, n_slots), f"ENTSO-E {col} scaled ({path.name})"


def load_site(path: Path | None = None) -> dict[str, Any]:
    return read_yaml(path or CARM_DIR / "site.yaml")


def site_supply(site: dict[str, Any], slot_s: float, n_slots: int) -> Supply:
    """Per-slot solar and wind energy for the site described by ``site.yaml``."""
    s, s_src = solar_from_site(site, slot_s, n_slots)
    w, w_src = wind_from_site(site, slot_s, n_slots)
    return Supply(s, w, s_src, w_src)
