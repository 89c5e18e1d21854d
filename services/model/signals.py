"""Carbon-signal files in the formats their providers export (sans-IO parsing of files).

A topology's DC takes one with ``ci: {trace: PATH, format: F, zone: Z, start_hour: ...}``
(`services.model.carbon`); every reader returns the series in gCO2/kWh, its step (5
minutes to an hour, equal throughout) and the UTC time of its first value:

* ``geoserve`` (the default): ``datetime_utc`` then one column per zone, hourly (the
  shipped ``data/carbon/ci_hourly_*.csv``).
* ``emaps-csv``: an Electricity Maps export: a ``Datetime (UTC)`` column, a ``Zone Id``
  column (rows of other zones are skipped; needed when the file has several) and a
  ``Carbon Intensity gCO₂eq/kWh (...)`` column: the life-cycle one by default, the direct
  one with ``emission_factor: direct``.
* ``emaps-json``: an Electricity Maps API answer (``carbon-intensity/history``,
  ``/forecast`` or ``/past-range``): ``{"zone": ..., "history" | "forecast" | "data":
  [{"datetime": ISO, "carbonIntensity": g}, ...]}``.
* ``watttime-csv``: a WattTime MOER series: a ``time`` (or ``point_time``) column and one
  value column in lbs CO2/MWh (converted: x 0.45359237 to gCO2/kWh); times without a zone
  are UTC.

Errors name the file and the row or key at fault (`ConfigError`).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from services.model.errors import ConfigError

FORMATS = ("geoserve", "emaps-csv", "emaps-json", "watttime-csv")
LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
MIN_STEP_S, MAX_STEP_S = 60.0, 3600.0


@dataclass(frozen=True)
class Signal:
    """A carbon signal as read: values (gCO2/kWh), step (s), UTC time of ``values[0]``."""

    values: np.ndarray
    step_s: float
    first_utc: datetime


def utc_time(text: str) -> datetime:
    """An ISO 8601 time as an aware UTC datetime (no zone: UTC); ValueError if it is none."""
    t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _utc(path: Path, where: str, text: str) -> datetime:
    try:
        return utc_time(text)
    except ValueError:
        raise ConfigError(str(path), where, f"not an ISO timestamp: {text!r}") from None


def _number(path: Path, where: str, text: Any, scale: float = 1.0) -> float:
    try:
        v = float(text) * scale
    except (TypeError, ValueError):
        raise ConfigError(str(path), where, f"not a number: {text!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise ConfigError(str(path), where, f"carbon intensity must be finite and >= 0: {v}")
    return v


def _series(path: Path, points: list[tuple[datetime, float, str]]) -> Signal:
    """Equally spaced points (time, value, where) -> a `Signal`."""
    if len(points) < 2:
        raise ConfigError(str(path), "", f"need at least two points, got {len(points)}")
    step = (points[1][0] - points[0][0]).total_seconds()
    if not MIN_STEP_S <= step <= MAX_STEP_S:
        raise ConfigError(str(path), points[1][2], f"steps of {MIN_STEP_S:g}-{MAX_STEP_S:g} s "
                                                   f"expected, got {step:g} s")
    for (t0, _, _), (t1, _, where) in zip(points, points[1:], strict=False):
        if (t1 - t0).total_seconds() != step:
            raise ConfigError(str(path), where, f"points must be {step:g} s apart; "
                                                f"{t0.isoformat()} -> {t1.isoformat()}")
    return Signal(np.asarray([v for _, v, _ in points], dtype=np.float64), step, points[0][0])


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            rows = [r for r in csv.reader(fh) if r]
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read: {exc.strerror}") from None
    if not rows:
        raise ConfigError(str(path), "", "empty file")
    return [h.strip() for h in rows[0]], rows[1:]


def read_emaps_csv(path: Path, zone: str | None, emission_factor: str = "lifecycle"
                   ) -> Signal:
    header, rows = _rows(path)
    low = [h.lower() for h in header]
    t_col = next((i for i, h in enumerate(low) if h.startswith("datetime")), None)
    if t_col is None:
        raise ConfigError(str(path), "header", "no 'Datetime (UTC)' column")
    want = ("direct",) if emission_factor == "direct" else ("life cycle", "lifecycle", "lca")
    ci_cols = [i for i, h in enumerate(low) if h.startswith("carbon intensity")]
    ci = next((i for i in ci_cols if any(w in low[i] for w in want)), None)
    if ci is None:
        raise ConfigError(str(path), "header", f"no {emission_factor} 'Carbon Intensity "
                                               f"gCO₂eq/kWh' column; columns: {header}")
    z_col = next((i for i, h in enumerate(low) if h == "zone id"), None)
    zones = {r[z_col] for r in rows} if z_col is not None else set()
    if zone is None and len(zones) > 1:
        raise ConfigError(str(path), "zone", f"the file has zones {sorted(zones)}: name one")
    if zone is not None and z_col is not None and zone not in zones:
        raise ConfigError(str(path), "zone", f"zone {zone!r} not in the file; zones: "
                                             f"{sorted(zones)}")
    points = []
    for n, r in enumerate(rows, start=2):
        if z_col is not None and zone is not None and r[z_col] != zone:
            continue
        where = f"row {n}"
        points.append((_utc(path, where, r[t_col]), _number(path, where, r[ci]), where))
    return _series(path, points)


def read_emaps_json(path: Path, zone: str | None) -> Signal:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), "", f"not a JSON document: {exc}") from None
    key = next((k for k in ("history", "forecast", "data") if isinstance(doc, dict)
                and isinstance(doc.get(k), list)), None)
    if key is None:
        raise ConfigError(str(path), "", "expected an object with a 'history', 'forecast' "
                                         "or 'data' list")
    if zone is not None and doc.get("zone") not in (None, zone):
        raise ConfigError(str(path), "zone", f"the file is zone {doc['zone']!r}, not {zone!r}")
    points = []
    for i, e in enumerate(doc[key]):
        where = f"{key}[{i}]"
        if not isinstance(e, dict) or "datetime" not in e or "carbonIntensity" not in e:
            raise ConfigError(str(path), where, "expected {datetime, carbonIntensity}")
        points.append((_utc(path, f"{where}.datetime", str(e["datetime"])),
                       _number(path, f"{where}.carbonIntensity", e["carbonIntensity"]), where))
    return _series(path, points)


def read_watttime_csv(path: Path) -> Signal:
    header, rows = _rows(path)
    low = [h.lower() for h in header]
    t_col = next((i for i, h in enumerate(low) if h in ("time", "point_time", "timestamp")),
                 None)
    if t_col is None or len(header) < 2:
        raise ConfigError(str(path), "header", "expected a 'time' column and a value column")
    v_col = next(i for i in range(len(header)) if i != t_col)
    points = []
    for n, r in enumerate(rows, start=2):
        where = f"row {n}"
        points.append((_utc(path, where, r[t_col]),
                       _number(path, where, r[v_col], LBS_PER_MWH_TO_G_PER_KWH), where))
    return _series(path, points)


def read_signal(path: Path, fmt: str, zone: str | None,
                emission_factor: str = "lifecycle") -> Signal:
    """The carbon signal of file `path` in format `fmt` (not ``geoserve``: see
    `services.model.carbon.load_ci_trace_with_times`)."""
    if fmt == "emaps-csv":
        return read_emaps_csv(path, zone, emission_factor)
    if fmt == "emaps-json":
        return read_emaps_json(path, zone)
    if fmt == "watttime-csv":
        return read_watttime_csv(path)
    raise ConfigError(str(path), "format", f"expected one of {list(FORMATS)}, got {fmt!r}")
