"""RTT matrix: units, symmetry, paper range, errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from services.config.rtt import (
    DEFAULT_RTT_PATH,
    PAPER_REGIONS,
    load_rtt_matrix,
    region_rtt,
    rtt_array,
)
from services.model.errors import ConfigError, InvalidInput


def raw_ms(src: str, dst: str) -> float:
    with DEFAULT_RTT_PATH.open(newline="") as fh:
        rows = list(csv.reader(fh))
    col = rows[0].index(dst)
    row = next(r for r in rows[1:] if r[0] == src)
    return float(row[col])


def test_matrix_is_in_seconds_and_complete() -> None:
    m = load_rtt_matrix()
    regions = {a for a, _ in m}
    assert len(regions) == 32
    assert len(m) == 32 * 32
    assert m[("us-east-1", "eu-north-1")] == pytest.approx(raw_ms("us-east-1", "eu-north-1") / 1e3)
    assert all(0.0 < v < 0.5 for v in m.values())


def test_paper_regions_symmetric_and_in_paper_range() -> None:
    rtt = region_rtt(PAPER_REGIONS)
    names = list(PAPER_REGIONS)
    assert len(rtt) == len(names) ** 2
    for a in names:
        assert rtt[(a, a)] == 0.0
        for b in names:
            assert rtt[(a, b)] == rtt[(b, a)]
            if a != b:
                # paper 1 Table II: inter-region RTT 85-280 ms (AWS p50)
                assert 0.085 <= rtt[(a, b)] <= 0.280, (a, b, rtt[(a, b)])


def test_symmetrised_as_mean_of_directions() -> None:
    rtt = region_rtt({"x": "sa-east-1", "y": "ap-northeast-1"})
    expected = 0.5 * (raw_ms("sa-east-1", "ap-northeast-1") + raw_ms("ap-northeast-1", "sa-east-1"))
    assert rtt[("x", "y")] == pytest.approx(expected / 1e3)


def test_two_regions_sharing_an_aws_region_get_intra_region_rtt() -> None:
    rtt = region_rtt({"a": "us-east-1", "b": "us-east-1"})
    assert rtt[("a", "b")] == pytest.approx(raw_ms("us-east-1", "us-east-1") / 1e3)
    assert rtt[("a", "a")] == 0.0


def test_unknown_aws_region_named() -> None:
    with pytest.raises(InvalidInput) as ei:
        region_rtt({"eu": "eu-north-1", "moon": "lunar-base-1"})
    assert "lunar-base-1" in str(ei.value)
    assert "regions.moon" in str(ei.value)


def test_rtt_array_order() -> None:
    rtt = region_rtt(PAPER_REGIONS)
    arr = rtt_array(rtt, ["us-east", "asia"])
    assert arr.shape == (2, 2)
    assert arr[0, 1] == rtt[("us-east", "asia")]
    assert arr[0, 0] == 0.0


def test_malformed_matrix_error_names_file_and_cell(tmp_path: Path) -> None:
    p = tmp_path / "rtt.csv"
    p.write_text("src_region,a,b\na,1,2\nb,x,1\n")
    with pytest.raises(ConfigError, match=r"rtt.csv.*b->a"):
        load_rtt_matrix(p)
    with pytest.raises(ConfigError, match="missing.csv"):
        load_rtt_matrix(tmp_path / "missing.csv")
