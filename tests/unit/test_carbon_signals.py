"""Carbon signals in their providers' formats: Electricity Maps CSV exports and API JSON,
WattTime MOER CSV (the shipped 5-minute CAISO file); 5-minute steps in the CI source."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.model.carbon import HourlyTraceCI, ci_source_from_config
from services.model.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MOER = ROOT / "data/carbon/watttime_moer_caiso_north_2023-06_5min.csv"
EMAPS_HEADER = ("Datetime (UTC),Country,Zone Name,Zone Id,"
                "Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (Life cycle),"
                "Carbon-free energy percentage (CFE%),Renewable energy percentage (RE%),"
                "Data source,Data estimated,Data estimation method\n")


def _emaps_csv(tmp_path: Path, rows: list[tuple[str, str, float, float]]) -> Path:
    p = tmp_path / "em.csv"
    p.write_text(EMAPS_HEADER + "".join(
        f"{t},Netherlands,Netherlands,{z},{d},{lca},50,40,entsoe.eu,false,\n"
        for t, z, d, lca in rows))
    return p


def test_watttime_moer_file_is_read_in_grams_per_kwh_at_5_minute_steps() -> None:
    src = ci_source_from_config({"trace": str(MOER), "format": "watttime-csv"}, "ci")
    assert isinstance(src, HourlyTraceCI)
    assert src.step_s == 300.0
    # the file's first two rows: 425.01605069 and 432.27352861 lbs/MWh at 00:00 and 00:05
    assert src.at(0.0) == pytest.approx(425.01605069 * 0.45359237)
    assert src.at(299.0) == src.at(0.0)
    assert src.at(300.0) == pytest.approx(432.27352861 * 0.45359237)
    assert src.mean(0.0, 600.0) == pytest.approx((425.01605069 + 432.27352861) / 2 * 0.45359237)
    assert src.datetime_at(600.0) == datetime(2023, 6, 8, 0, 10, tzinfo=UTC)
    later = ci_source_from_config({"trace": str(MOER), "format": "watttime-csv",
                                   "start_hour": "2023-06-08T00:05:00Z"}, "ci")
    assert later.at(0.0) == src.at(300.0)


def test_emaps_csv_export_picks_the_zone_and_the_emission_factor(tmp_path: Path) -> None:
    p = _emaps_csv(tmp_path, [
        ("2024-03-01 00:00:00", "NL", 200.0, 260.0), ("2024-03-01 00:00:00", "BE", 90.0, 120.0),
        ("2024-03-01 00:05:00", "NL", 210.0, 270.0), ("2024-03-01 00:05:00", "BE", 95.0, 125.0),
        ("2024-03-01 00:10:00", "NL", 220.0, 280.0), ("2024-03-01 00:10:00", "BE", 99.0, 129.0),
    ])
    nl = ci_source_from_config({"trace": str(p), "format": "emaps-csv", "zone": "NL"}, "ci")
    assert [nl.at(t) for t in (0, 300, 600)] == [260.0, 270.0, 280.0]
    be = ci_source_from_config({"trace": str(p), "format": "emaps-csv", "zone": "BE",
                                "emission_factor": "direct"}, "ci")
    assert [be.at(t) for t in (0, 300, 600)] == [90.0, 95.0, 99.0]
    with pytest.raises(ConfigError, match="zones \\['BE', 'NL'\\]: name one"):
        ci_source_from_config({"trace": str(p), "format": "emaps-csv"}, "ci")
    with pytest.raises(ConfigError, match="zone 'FR' not in the file"):
        ci_source_from_config({"trace": str(p), "format": "emaps-csv", "zone": "FR"}, "ci")


def test_emaps_json_history_and_forecast(tmp_path: Path) -> None:
    for key in ("history", "forecast"):
        p = tmp_path / f"{key}.json"
        p.write_text(json.dumps({"zone": "DE", key: [
            {"zone": "DE", "carbonIntensity": 302, "datetime": "2024-05-21T00:00:00.000Z"},
            {"zone": "DE", "carbonIntensity": 310, "datetime": "2024-05-21T01:00:00.000Z"},
            {"zone": "DE", "carbonIntensity": 296, "datetime": "2024-05-21T02:00:00.000Z"}]}))
        src = ci_source_from_config({"trace": str(p), "format": "emaps-json", "zone": "DE"},
                                    "ci")
        assert src.step_s == 3600.0
        assert src.mean(0.0, 3 * 3600.0) == pytest.approx((302 + 310 + 296) / 3)
        assert src.at(3 * 3600.0) == 302.0  # wraps around, like the hourly traces


@pytest.mark.parametrize(("body", "where"), [
    ("2024-03-01 00:00:00,NL,1,2|2024-03-01 02:00:00,NL,1,2|2024-03-01 04:00:00,NL,1,2",
     "row 3"),  # 2-hour steps: coarser than hourly
    ("2024-03-01 00:00:00,NL,1,2|2024-03-01 00:05:00,NL,1,2|2024-03-01 00:15:00,NL,1,2",
     "row 4"),
    ("2024-03-01 00:00:00,NL,1,2|2024-03-01 00:05:00,NL,1,x", "row 3"),
    ("2024-03-01 00:00:00,NL,1,2|yesterday,NL,1,2", "row 3"),
])
def test_bad_signal_files_name_the_file_and_row(tmp_path: Path, body: str,
                                                where: str | None) -> None:
    rows = [r.split(",") for r in body.split("|")]
    p = _emaps_csv(tmp_path, [(t, z, float(d), lca) for t, z, d, lca in rows])  # type: ignore[misc]
    with pytest.raises(ConfigError) as exc:
        ci_source_from_config({"trace": str(p), "format": "emaps-csv", "zone": "NL"}, "ci")
    assert str(p) in str(exc.value)
    if where:
        assert where in str(exc.value)


def test_unknown_format_names_the_key() -> None:
    with pytest.raises(ConfigError, match="ci.format: expected one of"):
        ci_source_from_config({"trace": str(MOER), "format": "csv"}, "ci")
