"""Request arrival processes: Poisson at a rate, or replay of the Azure trace's own times.

Rules / theory of operation
---------------------------
* Output is a sorted ``float64`` array of arrival times in emulated seconds from the start of
  the run (t = 0), plus, for replays, the trace row of each arrival so the caller can pair it
  with that row's lengths (``datasets.TraceDataset.take`` / the same row index).
* **Poisson** (paper 1 §V-A: "Poisson arrivals at the rates in Table II"): the count on
  ``[0, duration_s)`` is ``Poisson(rate_rps · duration_s)`` and, given the count, the times are
  i.i.d. uniform — the exact conditional law of a homogeneous Poisson process, vectorised
  (no per-request Python loop). Gaps are exponential with mean ``1 / rate_rps``.
* **Trace replay**: the shared Azure LLM 2023 CSVs carry ``arrival_s``, seconds since the
  trace's first request (converted from its ``TIMESTAMP`` column; about one hour on
  2023-11-16; code ≈ 2.57 req/s and very bursty — gap CV ≈ 13 —, conversation ≈ 5.53 req/s,
  gap CV ≈ 1.1). Replay makes times relative to the first request and, when ``rate_rps`` is
  given, rescales time by ``native_rate / rate_rps`` so the mean rate is the target while the
  burst shape is kept; ``native_rate = (N − 1) / (t_last − t_first)``. With ``loop=True`` the
  trace repeats with period ``N / rate`` (its span plus one mean gap) until ``duration_s``.
* Randomness only through an injected ``numpy.random.Generator``; no clocks, no I/O except the
  explicit trace loader. Bad rate/duration → ``InvalidInput`` naming the field.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.model.errors import ConfigError, InvalidInput

DEFAULT_TRACE_DIR = Path(__file__).resolve().parents[2] / "data" / "request_traces"
ARRIVAL_COLUMN = "arrival_s"
#: Traces with their own arrival times: name → file in ``data/request_traces``.
REPLAY_TRACES = {
    "azure-code": "azure_llm_2023_code_tokens.csv",
    "azure-conv": "azure_llm_2023_conv_tokens.csv",
}


@dataclass(frozen=True)
class Arrivals:
    """Arrival times (s, sorted) and, for replays, the trace row of each arrival."""

    times_s: np.ndarray
    trace_rows: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.times_s.size)


def _check_rate(rate_rps: float) -> float:
    if isinstance(rate_rps, bool) or not isinstance(rate_rps, int | float | np.number):
        raise InvalidInput("rate_rps", f"must be a number, got {rate_rps!r}")
    r = float(rate_rps)
    if not (math.isfinite(r) and r > 0):
        raise InvalidInput("rate_rps", f"must be finite and > 0, got {rate_rps!r}")
    return r


def _check_duration(duration_s: float) -> float:
    if isinstance(duration_s, bool) or not isinstance(duration_s, int | float | np.number):
        raise InvalidInput("duration_s", f"must be a number, got {duration_s!r}")
    d = float(duration_s)
    if not (math.isfinite(d) and d >= 0):
        raise InvalidInput("duration_s", f"must be finite and >= 0, got {duration_s!r}")
    return d


def poisson_arrivals(
    rate_rps: float, duration_s: float, rng: np.random.Generator, start_s: float = 0.0
) -> np.ndarray:
    """Sorted arrival times of a homogeneous Poisson process on ``[start_s, start_s + dur)``."""
    rate = _check_rate(rate_rps)
    dur = _check_duration(duration_s)
    if not math.isfinite(start_s):
        raise InvalidInput("start_s", f"must be finite, got {start_s!r}")
    n = int(rng.poisson(rate * dur))
    times = np.sort(rng.uniform(0.0, dur, size=n)) + float(start_s)
    return times


def load_trace_arrivals(path: str | Path, column: str = ARRIVAL_COLUMN) -> np.ndarray:
    """Arrival times (s) of a CSV trace, relative to its first row; must be non-decreasing."""
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            if column not in header:
                raise ConfigError(str(p), column, f"column missing; header: {header}")
            col = header.index(column)
            vals: list[float] = []
            for i, rec in enumerate(reader, start=2):
                if not rec:
                    continue
                try:
                    vals.append(float(rec[col]))
                except (ValueError, IndexError):
                    raise ConfigError(str(p), f"{column} (row {i})", "not a number") from None
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read arrival trace: {exc.strerror or exc}") \
            from exc
    t = np.asarray(vals, dtype=np.float64)
    if t.size == 0:
        raise ConfigError(str(p), column, "arrival trace has no rows")
    if not np.all(np.isfinite(t)):
        raise ConfigError(str(p), column, "arrival times must be finite")
    bad = np.flatnonzero(np.diff(t) < 0)
    if bad.size:
        raise ConfigError(str(p), f"{column} (row {int(bad[0]) + 3})",
                          "arrival times must be non-decreasing")
    rel: np.ndarray = t - t[0]
    return rel


def trace_arrival_times(name: str, data_dir: str | Path | None = None) -> np.ndarray:
    """Arrival times of a shipped trace with timestamps (``REPLAY_TRACES``)."""
    if name not in REPLAY_TRACES:
        raise InvalidInput(
            "arrivals", f"no arrival times for trace {name!r}; known: {', '.join(REPLAY_TRACES)}"
        )
    d = Path(data_dir) if data_dir is not None else DEFAULT_TRACE_DIR
    if (d / "request_traces").is_dir():
        d = d / "request_traces"
    return load_trace_arrivals(d / REPLAY_TRACES[name])


def native_rate_rps(trace_times_s: np.ndarray) -> float:
    """Mean arrival rate of a trace: (N − 1) / span."""
    t = np.asarray(trace_times_s, dtype=np.float64)
    span = float(t[-1] - t[0]) if t.size else 0.0
    if t.size < 2 or span <= 0:
        raise InvalidInput("trace", "need at least two arrivals spread over time for a rate")
    return (t.size - 1) / span


def replay_arrivals(
    trace_times_s: np.ndarray,
    *,
    rate_rps: float | None = None,
    duration_s: float | None = None,
    loop: bool = False,
) -> Arrivals:
    """Replay a trace's arrival times from t = 0, optionally rescaled to ``rate_rps`` mean
    rate, cut at ``duration_s`` and, with ``loop``, repeated to fill ``duration_s``."""
    t = np.asarray(trace_times_s, dtype=np.float64)
    if t.ndim != 1 or t.size == 0 or np.any(np.diff(t) < 0) or not np.all(np.isfinite(t)):
        raise InvalidInput("trace", "arrival times must be a non-empty, finite, sorted 1-D array")
    t = t - t[0]
    native = native_rate_rps(t)
    scale = 1.0 if rate_rps is None else native / _check_rate(rate_rps)
    t = t * scale
    rows = np.arange(t.size, dtype=np.int64)
    dur = None if duration_s is None else _check_duration(duration_s)
    if loop:
        if dur is None:
            raise InvalidInput("duration_s", "required when loop=True")
        period = t.size / (native / scale)
        copies = max(1, math.ceil(dur / period))
        t = (t[None, :] + period * np.arange(copies)[:, None]).ravel()
        rows = np.tile(rows, copies)
    if dur is not None:
        keep = t < dur
        t, rows = t[keep], rows[keep]
    return Arrivals(t, rows)


# ------------------------------------------------------------------------------------------
# Registry of arrival processes (selection by name from config or CLI)

ArrivalFactory = Callable[[float, float, np.random.Generator, Path | None], Arrivals]


def _poisson(rate: float, dur: float, rng: np.random.Generator, d: Path | None) -> Arrivals:
    return Arrivals(poisson_arrivals(rate, dur, rng))


def _replay(name: str) -> ArrivalFactory:
    def factory(rate: float, dur: float, rng: np.random.Generator, d: Path | None) -> Arrivals:
        return replay_arrivals(trace_arrival_times(name, d), rate_rps=rate, duration_s=dur,
                               loop=True)

    return factory


ARRIVAL_PROCESSES: dict[str, tuple[str, ArrivalFactory]] = {
    "poisson": ("homogeneous Poisson arrivals at rate_rps (paper 1 §V-A)", _poisson),
    **{
        name: (f"replay of {file}'s own arrival times, rescaled to rate_rps and looped",
               _replay(name))
        for name, file in REPLAY_TRACES.items()
    },
}


def available() -> tuple[str, ...]:
    """Names of the arrival processes."""
    return tuple(ARRIVAL_PROCESSES)


def make_arrivals(
    process: str,
    rate_rps: float,
    duration_s: float,
    rng: np.random.Generator,
    data_dir: str | Path | None = None,
) -> Arrivals:
    """Arrivals on ``[0, duration_s)`` at mean rate ``rate_rps`` from the named process."""
    if process not in ARRIVAL_PROCESSES:
        raise InvalidInput(
            "arrivals", f"unknown arrival process {process!r}; known: {', '.join(available())}"
        )
    rate = _check_rate(rate_rps)
    dur = _check_duration(duration_s)
    return ARRIVAL_PROCESSES[process][1](rate, dur, rng,
                                         Path(data_dir) if data_dir is not None else None)
