"""Grid carbon-intensity (CI) sources: constant values and hourly Electricity Maps traces.

Rules / theory of operation
---------------------------
* A CI source answers two questions in emulated seconds: ``at(t_s)``, the CI in gCO2/kWh in
  force at time ``t_s``, and ``mean(t0_s, t1_s)``, the exact time-average over ``[t0_s, t1_s]``.
  Multiply an energy in kWh by either to get grams of CO2.
* An hourly trace is piecewise constant: value ``values[k]`` holds on ``[k h, (k+1) h)``
  (paper 1 §V-A: hourly CI is the finest granularity the data offer). Emulated ``t = 0`` is
  the trace's hour ``start_hour``; the series wraps around at its end (and before its start
  for negative times), so a year-long trace never runs out.
* ``mean`` integrates the step function exactly via a prefix sum; it is O(1) per call.
* Sources are immutable and deterministic; no clocks, no I/O. The loaders
  (``load_ci_trace``, ``find_zone_trace``, ``ci_source_from_config``) read CSV files once at
  start-up and raise ``ConfigError`` naming the file, zone or config key at fault.
* CSV layout (``data/carbon/ci_hourly_*.csv``): column ``datetime_utc`` (ISO hour, e.g.
  ``2022-01-01T00:00Z``) then one column per Electricity Maps zone id; consecutive rows are
  one hour apart. Data © Electricity Maps, ODbL (see ``data/README.md``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from services.model.errors import ConfigError, InvalidInput, UsageError
from services.model.signals import FORMATS, read_signal, utc_time

SECONDS_PER_HOUR = 3600.0
TIME_COLUMN = "datetime_utc"
#: Default folder of the shipped traces (repo ``data/carbon``).
DEFAULT_CARBON_DIR = Path(__file__).resolve().parents[2] / "data" / "carbon"


class CISource(Protocol):
    """What a datacenter, the provisioner or the carbon accountant needs from a CI signal."""

    def at(self, t_s: float) -> float:
        """CI in gCO2/kWh in force at emulated time ``t_s``."""
        ...

    def mean(self, t0_s: float, t1_s: float) -> float:
        """Exact time-average CI in gCO2/kWh over ``[t0_s, t1_s]``."""
        ...


def _check_interval(t0_s: float, t1_s: float) -> None:
    if not (math.isfinite(t0_s) and math.isfinite(t1_s)):
        raise UsageError(f"mean(): non-finite interval [{t0_s}, {t1_s}]")
    if t1_s < t0_s:
        raise UsageError(f"mean(): t1_s={t1_s} is before t0_s={t0_s}")


@dataclass(frozen=True)
class ConstantCI:
    """A CI that never changes (the paper's per-run constant CI, or a test fixture)."""

    value: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value >= 0):
            raise InvalidInput("ci", f"constant CI must be finite and >= 0, got {self.value!r}")

    def at(self, t_s: float) -> float:
        return float(self.value)

    def mean(self, t0_s: float, t1_s: float) -> float:
        _check_interval(t0_s, t1_s)
        return float(self.value)


@dataclass(frozen=True)
class HourlyTraceCI:
    """A piecewise-constant series of steps of ``step_s`` seconds (an hour by default, down
    to Electricity Maps' and WattTime's 5 minutes); emulated t=0 is step ``start_hour``
    (an hour for hourly traces); wraps around. ``origin_utc``, when known, is the UTC time
    of ``values[0]``: the trace's calendar (`datetime_at`)."""

    values: np.ndarray
    start_hour: int = 0
    step_s: float = SECONDS_PER_HOUR
    origin_utc: datetime | None = None
    _prefix: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        arr = np.asarray(self.values, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0:
            raise InvalidInput("ci.values", f"need a non-empty 1-D series, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise InvalidInput("ci.values", "CI values must be finite and >= 0")
        if isinstance(self.start_hour, bool) or not isinstance(self.start_hour, int | np.integer):
            raise InvalidInput("ci.start_hour", f"must be an integer, got {self.start_hour!r}")
        if not 0 <= int(self.start_hour) < arr.size:
            raise InvalidInput(
                "ci.start_hour", f"must be in [0, {arr.size}) for a {arr.size}-step trace, "
                f"got {self.start_hour}"
            )
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise InvalidInput("ci.step_s", f"must be a finite number > 0, got {self.step_s}")
        arr.setflags(write=False)
        prefix = np.concatenate(([0.0], np.cumsum(arr)))
        prefix.setflags(write=False)
        object.__setattr__(self, "values", arr)
        object.__setattr__(self, "start_hour", int(self.start_hour))
        object.__setattr__(self, "step_s", float(self.step_s))
        object.__setattr__(self, "_prefix", prefix)

    @property
    def hours(self) -> int:
        """Length of the series in steps (the wrap-around period; hours when hourly)."""
        return int(self.values.size)

    def _hours_since_origin(self, t_s: float) -> float:
        return self.start_hour + t_s / self.step_s

    def at(self, t_s: float) -> float:
        if not math.isfinite(t_s):
            raise UsageError(f"at(): non-finite time {t_s}")
        k = math.floor(self._hours_since_origin(t_s)) % self.hours
        return float(self.values[k])

    def step_start_s(self, t_s: float) -> float:
        """Emulated start of the step in force at ``t_s``."""
        return (math.floor(self._hours_since_origin(t_s)) - self.start_hour) * self.step_s

    def datetime_at(self, t_s: float) -> datetime | None:
        """The trace's UTC time at emulated ``t_s`` (None without an origin)."""
        if self.origin_utc is None:
            return None
        return self.origin_utc + timedelta(seconds=self.start_hour * self.step_s + t_s)

    def _integral(self, h: float) -> float:
        """Integral of the wrapped step function from step 0 to step ``h`` (gCO2/kWh·step)."""
        n = self.hours
        cycles = math.floor(h / n)
        rem = h - cycles * n  # in [0, n)
        k = min(int(math.floor(rem)), n - 1)
        frac = rem - k
        return cycles * float(self._prefix[n]) + float(self._prefix[k]) + frac * float(
            self.values[k]
        )

    def mean(self, t0_s: float, t1_s: float) -> float:
        _check_interval(t0_s, t1_s)
        if t1_s == t0_s:
            return self.at(t0_s)
        h0 = self._hours_since_origin(t0_s)
        h1 = self._hours_since_origin(t1_s)
        return (self._integral(h1) - self._integral(h0)) / (h1 - h0)


def step_of(src: CISource) -> float:
    """The step (s) on which a source changes value: a trace's, an hour for constants."""
    return float(getattr(src, "step_s", SECONDS_PER_HOUR))


@dataclass(frozen=True)
class CIForecast:
    """Forecasts of a CI source with a relative error that grows with the lead time.

    ``forecast(now_s, t0_s, t1_s)`` is ``mean(t0_s, t1_s) * (1 + error * z *
    sqrt(lead_h))``, clipped at 0, where ``lead_h`` is the lead time in hours (at least one
    step) and ``z`` a standard normal drawn once per (``seed``, step of ``t0_s``) -- the same
    future step gets the same draw whoever asks, so forecasts are deterministic. With
    ``error == 0`` a forecast is the trace itself (an oracle)."""

    source: CISource
    error: float = 0.0
    seed: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.error) and 0.0 <= self.error <= 10.0):
            raise InvalidInput("forecast_error", f"expected a relative error in [0, 10], "
                                                 f"got {self.error}")

    def forecast(self, now_s: float, t0_s: float, t1_s: float) -> float:
        step = step_of(self.source)
        k0 = math.floor(t0_s / step)
        # within one step: its value itself (the prefix-sum mean would round it)
        same = t1_s <= t0_s or k0 == math.floor(math.nextafter(t1_s, -math.inf) / step)
        true = self.source.at(t0_s) if same else self.source.mean(t0_s, t1_s)
        if self.error == 0.0:
            return true
        lead_h = max(t0_s - now_s, step) / SECONDS_PER_HOUR
        z = float(np.random.default_rng([self.seed, abs(k0), k0 < 0]).standard_normal())
        return max(0.0, true * (1.0 + self.error * z * math.sqrt(lead_h)))


# ------------------------------------------------------------------------------------------
# Loaders


def _read_header(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), None)
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read CI trace: {exc.strerror or exc}") from exc
    if not header or header[0] != TIME_COLUMN:
        raise ConfigError(str(path), TIME_COLUMN, f"first column must be {TIME_COLUMN!r}")
    return header


def trace_zones(path: str | Path) -> tuple[str, ...]:
    """Zone ids (columns after ``datetime_utc``) of one CI trace CSV."""
    return tuple(_read_header(Path(path))[1:])


def _parse_hour(path: Path, row: int, text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(
            str(path), f"{TIME_COLUMN} (row {row})", f"not an ISO timestamp: {text!r}"
        ) from exc


# Parsed trace files by (path, mtime, size): a topology's DCs share a few files, and
# both the DCs and the CA-RM controller read them.
_TRACE_FILES: dict[tuple[str, int, int], tuple[list[str], datetime, list[list[str]]]] = {}


def _trace_rows(p: Path) -> tuple[list[str], datetime, list[list[str]]]:
    """(header, first hour, data rows) of a CI trace file, its rows checked for field
    count and consecutive hours; parsed once per file version."""
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    hit = _TRACE_FILES.get(key)
    if hit is not None:
        return hit
    header = _read_header(p)
    rows: list[list[str]] = []
    first: datetime | None = None
    prev: datetime | None = None
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        next(reader)
        for i, rec in enumerate(reader, start=2):  # row 1 is the header
            if not rec:
                continue
            if len(rec) != len(header):
                raise ConfigError(
                    str(p), f"row {i}", f"{len(rec)} fields, header has {len(header)}"
                )
            stamp = _parse_hour(p, i, rec[0])
            if prev is not None and stamp - prev != timedelta(hours=1):
                raise ConfigError(
                    str(p), f"{TIME_COLUMN} (row {i})",
                    f"rows must be consecutive hours; {prev.isoformat()} -> {stamp.isoformat()}",
                )
            if first is None:
                first = stamp
            prev = stamp
            rec.append(str(i))  # the file row, for errors
            rows.append(rec)
    if first is None:
        raise ConfigError(str(p), "", "CI trace has no data rows")
    out = (header, first, rows)
    _TRACE_FILES[key] = out
    return out


def load_ci_trace_with_times(path: str | Path, zone: str) -> tuple[np.ndarray, datetime]:
    """Load one zone's hourly CI (gCO2/kWh) and the UTC time of its first hour."""
    p = Path(path)
    header = _read_header(p)
    try:
        col = header.index(zone, 1)
    except ValueError:
        raise ConfigError(
            str(p), zone, f"zone {zone!r} not in this CI trace; zones: {', '.join(header[1:])}"
        ) from None
    try:
        _, first, rows = _trace_rows(p)
    except ConfigError as exc:
        if exc.key:
            raise
        raise ConfigError(str(p), zone, exc.message) from None
    values: list[float] = []
    for rec in rows:
        try:
            v = float(rec[col])
        except ValueError:
            raise ConfigError(
                str(p), f"{zone} (row {rec[-1]})", f"not a number: {rec[col]!r}"
            ) from None
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(str(p), f"{zone} (row {rec[-1]})",
                              f"CI must be finite, >= 0: {v}")
        values.append(v)
    return np.asarray(values, dtype=np.float64), first


def load_ci_trace(path: str | Path, zone: str) -> np.ndarray:
    """Hourly CI (gCO2/kWh) of ``zone`` from a ``datetime_utc`` + one-column-per-zone CSV."""
    return load_ci_trace_with_times(path, zone)[0]


def find_zone_trace(zone: str, data_dir: str | Path = DEFAULT_CARBON_DIR) -> Path:
    """The first shipped CI CSV (in file-name order) that has a column for ``zone``.

    ``data_dir`` may be the carbon folder itself or the repository's ``data/`` folder.
    """
    d = Path(data_dir)
    if (d / "carbon").is_dir():
        d = d / "carbon"
    if not d.is_dir():
        raise ConfigError(str(d), zone, "CI data folder does not exist")
    seen: list[str] = []
    for p in sorted(d.glob("*.csv")):
        try:
            zones = trace_zones(p)
        except ConfigError:
            continue  # not a CI trace (e.g. a yearly-means table)
        if zone in zones:
            return p
        seen.extend(zones)
    known = ", ".join(sorted(set(seen))) or "none"
    raise ConfigError(str(d), zone, f"zone {zone!r} not in any CI trace; known zones: {known}")


def hour_index(path: str | Path, zone: str, when_utc: str) -> int:
    """Row index of the hour ``when_utc`` (ISO, e.g. ``2022-06-01T12:00Z``) in a trace."""
    _, first = load_ci_trace_with_times(path, zone)
    return _hour_offset(Path(path), first, when_utc, zone)


def _hour_offset(path: Path, first: datetime, when_utc: str, key: str) -> int:
    try:
        when = datetime.fromisoformat(when_utc)
    except ValueError:
        raise ConfigError(str(path), key, f"not an ISO timestamp: {when_utc!r}") from None
    if when.tzinfo is None:
        raise ConfigError(str(path), key, f"timestamp needs a UTC offset (e.g. 'Z'): {when_utc!r}")
    delta_h = (when - first).total_seconds() / SECONDS_PER_HOUR
    if delta_h != int(delta_h):
        raise ConfigError(str(path), key, f"{when_utc!r} is not on an hour boundary")
    return int(delta_h)


# ------------------------------------------------------------------------------------------
# Registry: build a source from a config mapping


CIBuilder = Callable[[Mapping[str, Any], str, str, Path | None], CISource]


@dataclass(frozen=True)
class CIKind:
    """One entry of the CI-source registry."""

    name: str
    help: str
    builder: CIBuilder


def _build_constant(
    m: Mapping[str, Any], key_path: str, source: str, base: Path | None
) -> CISource:
    extra = set(m) - {"constant"}
    if extra:
        raise ConfigError(source, key_path, f"unexpected keys with 'constant': {sorted(extra)}")
    v = m["constant"]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ConfigError(source, f"{key_path}.constant", f"must be a number >= 0, got {v!r}")
    return ConstantCI(float(v))


def _build_trace(
    m: Mapping[str, Any], key_path: str, source: str, base: Path | None
) -> CISource:
    extra = set(m) - {"trace", "zone", "start_hour", "format", "emission_factor"}
    if extra:
        raise ConfigError(source, key_path, f"unexpected keys with 'trace': {sorted(extra)}")
    fmt = m.get("format", "geoserve")
    if fmt not in FORMATS:
        raise ConfigError(source, f"{key_path}.format", f"expected one of {list(FORMATS)}, "
                                                        f"got {fmt!r}")
    if fmt != "geoserve":
        return _build_signal(m, key_path, source, base, fmt)
    zone = m.get("zone")
    if not isinstance(zone, str) or not zone:
        raise ConfigError(source, f"{key_path}.zone", "an Electricity Maps zone id is required")
    trace = m.get("trace")
    if trace in (None, "auto"):
        try:
            path = find_zone_trace(zone, base / "data" / "carbon" if base else DEFAULT_CARBON_DIR)
        except ConfigError as exc:
            raise ConfigError(source, f"{key_path}.zone", exc.message) from exc
    elif isinstance(trace, str | Path):
        path = Path(trace)
        if not path.is_absolute() and base is not None:
            path = base / path
        if not path.is_file():
            raise ConfigError(source, f"{key_path}.trace", f"CI trace file not found: {path}")
    else:
        raise ConfigError(source, f"{key_path}.trace", f"must be a file path, got {trace!r}")
    try:
        values, first = load_ci_trace_with_times(path, zone)
    except ConfigError as exc:
        raise ConfigError(source, f"{key_path}.zone", exc.args[0] + ": " + exc.message) from exc
    start = m.get("start_hour", 0)
    if isinstance(start, str):
        try:
            start = _hour_offset(path, first, start, f"{key_path}.start_hour")
        except ConfigError as exc:  # the error is in the config, not in the trace file
            raise ConfigError(source, f"{key_path}.start_hour",
                              f"{exc.message} (trace {path})") from exc
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < values.size:
        raise ConfigError(
            source, f"{key_path}.start_hour",
            f"must be an hour index in [0, {values.size}) or an ISO UTC hour, got {start!r}",
        )
    return HourlyTraceCI(values, start, origin_utc=first.replace(tzinfo=UTC)
                         if first.tzinfo is None else first)


def _build_signal(m: Mapping[str, Any], key_path: str, source: str, base: Path | None,
                  fmt: str) -> CISource:
    """A trace in a provider's format (`services.model.signals`): 5-minute to hourly."""
    trace = m.get("trace")
    if not isinstance(trace, str | Path) or trace == "auto":
        raise ConfigError(source, f"{key_path}.trace", f"a {fmt} file path is required")
    path = Path(trace)
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.is_file():
        raise ConfigError(source, f"{key_path}.trace", f"CI trace file not found: {path}")
    zone = m.get("zone")
    if zone is not None and (not isinstance(zone, str) or not zone):
        raise ConfigError(source, f"{key_path}.zone", f"expected a zone id, got {zone!r}")
    factor = m.get("emission_factor", "lifecycle")
    if factor not in ("lifecycle", "direct"):
        raise ConfigError(source, f"{key_path}.emission_factor",
                          f"expected lifecycle or direct, got {factor!r}")
    sig = read_signal(path, fmt, zone, factor)
    start = m.get("start_hour", 0)
    if isinstance(start, str):
        when = _parse_utc(source, f"{key_path}.start_hour", start)
        off = (when - sig.first_utc).total_seconds() / sig.step_s
        if off != int(off):
            raise ConfigError(source, f"{key_path}.start_hour",
                              f"{start} is not on a {sig.step_s:g} s step of {path}")
        start = int(off)
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < sig.values.size:
        raise ConfigError(source, f"{key_path}.start_hour",
                          f"must be a step index in [0, {sig.values.size}) or an ISO UTC time "
                          f"inside {path}, got {start!r}")
    return HourlyTraceCI(sig.values, start, sig.step_s, sig.first_utc)


def _parse_utc(source: str, key: str, text: str) -> datetime:
    try:
        return utc_time(text)
    except ValueError:
        raise ConfigError(source, key, f"not an ISO UTC time: {text!r}") from None


class CIRegistry:
    """String-keyed registry of CI-source kinds; duplicate names raise."""

    def __init__(self) -> None:
        self._kinds: dict[str, CIKind] = {}

    def register(self, kind: CIKind) -> None:
        if kind.name in self._kinds:
            raise UsageError(f"CI source kind {kind.name!r} registered twice")
        self._kinds[kind.name] = kind

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def help(self) -> dict[str, str]:
        return {k: v.help for k, v in self._kinds.items()}

    def build(
        self,
        mapping: Any,
        key_path: str,
        *,
        source: str = "<config>",
        base_dir: str | Path | None = None,
    ) -> CISource:
        if isinstance(mapping, bool):
            raise ConfigError(source, key_path, f"expected a mapping or a number, got {mapping!r}")
        if isinstance(mapping, int | float):
            mapping = {"constant": mapping}
        if not isinstance(mapping, Mapping):
            raise ConfigError(source, key_path, f"expected a mapping, got {type(mapping).__name__}")
        hits = [k for k in self._kinds if k in mapping]
        if len(hits) != 1:
            raise ConfigError(
                source, key_path,
                f"exactly one of {list(self._kinds)} is required, got keys {sorted(mapping)}",
            )
        base = Path(base_dir) if base_dir is not None else None
        return self._kinds[hits[0]].builder(mapping, key_path, source, base)


CI_SOURCES = CIRegistry()
CI_SOURCES.register(CIKind("constant", "constant CI in gCO2/kWh, e.g. {constant: 300}",
                           _build_constant))
CI_SOURCES.register(CIKind(
    "trace",
    "hourly EM trace: {trace: data/carbon/<file>.csv | auto, zone: NL, "
    "start_hour: 12 | '2022-06-01T12:00Z'}; or a provider's file, 5-minute to hourly: "
    "{trace: FILE, format: emaps-csv | emaps-json | watttime-csv, zone: Z, start_hour: "
    "INDEX | ISO time, emission_factor: lifecycle | direct}",
    _build_trace,
))


def ci_source_from_config(
    mapping: Any,
    key_path: str,
    *,
    source: str = "<config>",
    base_dir: str | Path | None = None,
) -> CISource:
    """Build a CI source from a config value (``{constant: 300}``, a bare number, or
    ``{trace: path|auto, zone: NL, start_hour: 12}``); errors name ``source`` and ``key_path``.

    Relative trace paths are resolved against ``base_dir`` (e.g. the repository root) when given.
    """
    return CI_SOURCES.build(mapping, key_path, source=source, base_dir=base_dir)
