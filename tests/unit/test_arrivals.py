"""Arrival processes: Poisson statistics, Azure trace replay, field-named errors."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from services.loadgen.arrivals import (
    DEFAULT_TRACE_DIR,
    available,
    load_trace_arrivals,
    make_arrivals,
    native_rate_rps,
    poisson_arrivals,
    replay_arrivals,
    trace_arrival_times,
)
from services.model.errors import ConfigError, InvalidInput


def file_arrivals(name: str) -> np.ndarray:
    with (DEFAULT_TRACE_DIR / name).open(newline="") as fh:
        return np.array([float(r["arrival_s"]) for r in csv.DictReader(fh)])


def test_poisson_count_and_gaps() -> None:
    rate, dur = 1000.0, 50.0
    t = poisson_arrivals(rate, dur, np.random.default_rng(11))
    expected = rate * dur
    assert abs(t.size - expected) < 5 * math.sqrt(expected)
    assert np.all(np.diff(t) >= 0)
    assert t.min() >= 0.0 and t.max() < dur
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential: CV = 1
    assert np.mean(gaps > 1.0 / rate) == pytest.approx(math.exp(-1.0), abs=0.01)


def test_poisson_count_is_poisson_distributed() -> None:
    rng = np.random.default_rng(12)
    counts = np.array([poisson_arrivals(5.0, 10.0, rng).size for _ in range(400)])
    assert counts.mean() == pytest.approx(50.0, abs=1.2)
    assert counts.var(ddof=1) / counts.mean() == pytest.approx(1.0, abs=0.25)


def test_poisson_start_offset_and_zero_duration() -> None:
    t = poisson_arrivals(10.0, 20.0, np.random.default_rng(0), start_s=100.0)
    assert t.size > 0 and t.min() >= 100.0 and t.max() < 120.0
    assert poisson_arrivals(10.0, 0.0, np.random.default_rng(0)).size == 0


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf"), "fast", True])
def test_bad_rate_names_field(rate: object) -> None:
    with pytest.raises(InvalidInput) as ei:
        poisson_arrivals(rate, 1.0, np.random.default_rng(0))  # type: ignore[arg-type]
    assert ei.value.field == "rate_rps"


@pytest.mark.parametrize("dur", [-1.0, float("nan"), None])
def test_bad_duration_names_field(dur: object) -> None:
    with pytest.raises(InvalidInput) as ei:
        poisson_arrivals(1.0, dur, np.random.default_rng(0))  # type: ignore[arg-type]
    assert ei.value.field == "duration_s"


def test_azure_trace_has_timestamps_relative_to_first() -> None:
    raw = file_arrivals("azure_llm_2023_conv_tokens.csv")
    t = trace_arrival_times("azure-conv")
    assert t[0] == 0.0
    assert np.allclose(t, raw - raw[0])
    assert 3000.0 < t[-1] < 4000.0  # about one hour


def test_replay_native_and_rescaled() -> None:
    t = trace_arrival_times("azure-conv")
    same = replay_arrivals(t)
    assert np.array_equal(same.times_s, t)
    assert same.trace_rows is not None and same.trace_rows[5] == 5
    fast = replay_arrivals(t, rate_rps=1200.0)
    assert native_rate_rps(fast.times_s) == pytest.approx(1200.0, rel=1e-9)
    # burst shape kept: every gap scaled by the same factor
    factor = native_rate_rps(t) / 1200.0
    assert np.allclose(np.diff(fast.times_s), np.diff(t) * factor)


def test_replay_loop_fills_duration_and_pairs_rows() -> None:
    t = trace_arrival_times("azure-code")
    n = t.size
    a = replay_arrivals(t, rate_rps=1000.0, duration_s=30.0, loop=True)
    assert a.times_s.max() < 30.0 and np.all(np.diff(a.times_s) >= 0)
    assert a.trace_rows is not None
    assert a.times_s.size == pytest.approx(30_000, rel=0.05)  # mean rate over whole loops
    # the second copy starts at row 0 again, one period (N / rate) after the first
    second = int(np.flatnonzero(a.trace_rows == 0)[1])
    assert a.times_s[second] == pytest.approx(n / 1000.0)
    with pytest.raises(InvalidInput, match="duration_s"):
        replay_arrivals(t, loop=True)


def test_make_arrivals_registry() -> None:
    assert {"poisson", "azure-code", "azure-conv"} <= set(available())
    rng = np.random.default_rng(3)
    p = make_arrivals("poisson", 200.0, 10.0, rng)
    assert p.trace_rows is None and abs(len(p) - 2000) < 5 * math.sqrt(2000)
    r = make_arrivals("azure-conv", 200.0, 10.0, rng)
    assert r.trace_rows is not None and len(r) == r.trace_rows.size
    with pytest.raises(InvalidInput, match="known:"):
        make_arrivals("hawkes", 1.0, 1.0, rng)
    with pytest.raises(InvalidInput) as ei:
        make_arrivals("azure-code", -5.0, 1.0, rng)
    assert ei.value.field == "rate_rps"


def test_bad_trace_file_errors_name_file(tmp_path: Path) -> None:
    p = tmp_path / "back_in_time.csv"
    p.write_text("arrival_s,x\n0.0,1\n2.0,1\n1.0,1\n")
    with pytest.raises(ConfigError, match=r"back_in_time.csv.*row 4"):
        load_trace_arrivals(p)
    q = tmp_path / "no_time.csv"
    q.write_text("input_tokens,output_tokens\n1,2\n")
    with pytest.raises(ConfigError, match=r"no_time.csv.*arrival_s"):
        load_trace_arrivals(q)
