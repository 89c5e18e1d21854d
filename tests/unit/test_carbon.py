"""Carbon-intensity sources: lookup, exact means vs brute force, wrap-around, loader errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.model.carbon import (
    ConstantCI,
    HourlyTraceCI,
    ci_source_from_config,
    find_zone_trace,
    load_ci_trace,
    trace_zones,
)
from services.model.errors import ConfigError, InvalidInput, UsageError

REPO = Path(__file__).resolve().parents[2]
EUROPE = REPO / "data" / "carbon" / "ci_hourly_2022_lca_emaps_europe.csv"
AMERICAS_ASIA = REPO / "data" / "carbon" / "ci_hourly_2022_lca_emaps_americas_asia.csv"


def brute_mean(
    values: np.ndarray, start_hour: int, t0: float, t1: float, n: int = 200_001
) -> float:
    """Average of the wrapped step function on a fine grid (midpoint rule)."""
    edges = np.linspace(t0, t1, n)
    mids = 0.5 * (edges[:-1] + edges[1:])
    idx = (start_hour + np.floor(mids / 3600.0).astype(np.int64)) % values.size
    return float(values[idx].mean())


def test_constant_ci() -> None:
    c = ConstantCI(300.0)
    assert c.at(0.0) == 300.0
    assert c.at(1e7) == 300.0
    assert c.mean(5.0, 5000.0) == 300.0
    with pytest.raises(InvalidInput):
        ConstantCI(-1.0)


def test_hourly_lookup_and_start_hour() -> None:
    s = HourlyTraceCI(np.array([10.0, 20.0, 30.0, 40.0]), start_hour=1)
    assert s.at(0.0) == 20.0
    assert s.at(3599.9) == 20.0
    assert s.at(3600.0) == 30.0
    assert s.at(2 * 3600.0 + 1) == 40.0


def test_hourly_wraps_around_both_ways() -> None:
    s = HourlyTraceCI(np.array([10.0, 20.0, 30.0, 40.0]), start_hour=2)
    assert s.at(2 * 3600.0) == 10.0  # hour 4 -> wraps to 0
    assert s.at(3 * 3600.0 + 10) == 20.0  # hour 5 -> 1
    assert s.at(5 * 3600.0 + 10) == 40.0  # hour 7 -> 3
    assert s.at(-1.0) == 20.0  # just before t=0 is hour 1
    # a whole period averages to the series mean regardless of phase
    assert s.mean(1234.0, 1234.0 + 4 * 3600.0) == pytest.approx(25.0)


@pytest.mark.parametrize(
    ("start_hour", "t0", "t1"),
    [(0, 0.0, 3600.0), (3, 1000.0, 1800.0), (5, 900.0, 9 * 3600.0 + 77.0),
     (7, 3 * 3600.0 - 5, 30 * 3600.0 + 11)],
)
def test_mean_matches_brute_force(start_hour: int, t0: float, t1: float) -> None:
    rng = np.random.default_rng(7)
    values = rng.uniform(20.0, 700.0, size=9)
    s = HourlyTraceCI(values, start_hour=start_hour)
    assert s.mean(t0, t1) == pytest.approx(brute_mean(values, start_hour, t0, t1), rel=1e-4)


def test_mean_of_empty_interval_is_point_value_and_reversed_raises() -> None:
    s = HourlyTraceCI(np.array([1.0, 2.0]))
    assert s.mean(4000.0, 4000.0) == 2.0
    with pytest.raises(UsageError):
        s.mean(10.0, 5.0)


def test_bad_start_hour_rejected() -> None:
    with pytest.raises(InvalidInput, match="start_hour"):
        HourlyTraceCI(np.array([1.0, 2.0]), start_hour=2)


def test_load_real_trace_and_year_mean() -> None:
    nl = load_ci_trace(EUROPE, "NL")
    assert nl.shape == (8760,)
    # data/README.md: the 2022 LCA mean for NL is 398 g (matches umass mean_stats within 0.5 g)
    assert nl.mean() == pytest.approx(398.0, abs=1.0)
    s = HourlyTraceCI(nl, start_hour=0)
    assert s.at(0.0) == nl[0]
    assert s.mean(0.0, 8760 * 3600.0) == pytest.approx(float(nl.mean()), rel=1e-9)
    # a day from noon of day 10: brute force on the real data
    t0, t1 = 10 * 86400.0 + 43200.0, 11 * 86400.0 + 50000.0
    assert s.mean(t0, t1) == pytest.approx(brute_mean(nl, 0, t0, t1), rel=1e-4)


def test_unknown_zone_error_names_file_and_zone() -> None:
    with pytest.raises(ConfigError) as ei:
        load_ci_trace(EUROPE, "XX-NOPE")
    assert "XX-NOPE" in str(ei.value)
    assert EUROPE.name in str(ei.value)


def test_missing_file_error_names_file(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_trace.csv"
    with pytest.raises(ConfigError, match="no_such_trace.csv"):
        load_ci_trace(missing, "NL")


def test_malformed_value_error_names_zone_and_row(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("datetime_utc,AA\n2022-01-01T00:00Z,1.0\n2022-01-01T01:00Z,oops\n")
    with pytest.raises(ConfigError, match=r"bad.csv.*AA \(row 3\)"):
        load_ci_trace(p, "AA")


def test_non_consecutive_hours_rejected(tmp_path: Path) -> None:
    p = tmp_path / "gap.csv"
    p.write_text("datetime_utc,AA\n2022-01-01T00:00Z,1.0\n2022-01-01T02:00Z,2.0\n")
    with pytest.raises(ConfigError, match="consecutive"):
        load_ci_trace(p, "AA")


def test_find_zone_trace() -> None:
    assert find_zone_trace("LT", REPO / "data").name == EUROPE.name
    assert find_zone_trace("JP-TK", REPO / "data" / "carbon").name == AMERICAS_ASIA.name
    assert "BR-CS" in trace_zones(find_zone_trace("BR-CS"))
    with pytest.raises(ConfigError, match="ATLANTIS"):
        find_zone_trace("ATLANTIS")


def test_config_constant_and_trace() -> None:
    c = ci_source_from_config({"constant": 300}, "dcs.a.ci")
    assert c.at(0.0) == 300.0
    t = ci_source_from_config(
        {"trace": "data/carbon/ci_hourly_2022_lca_emaps_europe.csv", "zone": "NL",
         "start_hour": 12}, "dcs.nl.ci", base_dir=REPO)
    nl = load_ci_trace(EUROPE, "NL")
    assert t.at(0.0) == nl[12]
    assert t.at(3600.0) == nl[13]
    # ISO start hour and automatic file lookup
    iso = ci_source_from_config({"trace": "auto", "zone": "NL",
                                 "start_hour": "2022-01-01T12:00Z"}, "x")
    assert iso.at(0.0) == nl[12]


@pytest.mark.parametrize(
    ("cfg", "key"),
    [({"constant": -3}, "dcs.a.ci.constant"),
     ({"trace": "data/carbon/none.csv", "zone": "NL"}, "dcs.a.ci.trace"),
     ({"trace": "data/carbon/ci_hourly_2022_lca_emaps_europe.csv", "zone": "ZZ"}, "dcs.a.ci.zone"),
     ({"trace": "data/carbon/ci_hourly_2022_lca_emaps_europe.csv", "zone": "NL",
       "start_hour": 9000}, "dcs.a.ci.start_hour"),
     ({"foo": 1}, "dcs.a.ci"),
     ({"constant": 1, "trace": "x"}, "dcs.a.ci")],
)
def test_config_errors_name_key_path(cfg: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        ci_source_from_config(cfg, "dcs.a.ci", source="topo.yaml", base_dir=REPO)
    assert key in str(ei.value)
    assert "topo.yaml" in str(ei.value)
