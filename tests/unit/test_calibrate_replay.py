"""Replay reproduces an emulated run; validation and the CLI produce the documented shapes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from services.calibrate import replay as rp
from services.calibrate import validate as val
from services.calibrate.csvio import write_rows
from services.calibrate.workload import CNN_DAILYMAIL, poisson_stream
from services.cli import main
from services.config.calibration import load_calibration
from services.datacenter.vdriver import replay
from services.model.errors import ConfigError

SETUP = "a100-40gb/llama-3.1-8b-tp1"


def _emulated_log(tmp_path, rate=12.0, duration=20.0, seed=5):
    cal = load_calibration(SETUP)
    s = poisson_stream(np.random.default_rng(seed), rate, duration, 3)
    items = val.items_from_stream(s)
    res = replay(cal, items, 3)
    path = tmp_path / "log.csv"
    write_rows(path, rp.LOG_HEADER, rp.log_rows(items, res))
    return path, res


def test_emulated_log_replays_with_zero_error(tmp_path):
    path, res = _emulated_log(tmp_path)
    out = rp.replay_log(load_calibration(SETUP), rp.read_log(str(path)))
    for m in rp.METRICS:
        assert out["metrics"][m]["n"] > 100
        assert out["metrics"][m]["mape_pct"] < 1e-3, m
    assert out["sim_gpu_energy_j"] == pytest.approx(res.gpu_energy_j, rel=1e-6)


def test_replay_detects_a_different_calibration(tmp_path):
    path, _ = _emulated_log(tmp_path)
    out = rp.replay_log(load_calibration("a100-40gb/qwen2.5-7b-tp1"), rp.read_log(str(path)))
    assert out["metrics"]["tpot_s"]["mape_pct"] > 2.0


def test_replay_log_errors_name_file_and_column(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("arrival_s,isl,osl\n0.0,10,5\n")
    with pytest.raises(ConfigError) as e:
        rp.read_log(str(p))
    assert str(p) in str(e.value) and "engine" in str(e.value)
    p.write_text("arrival_s,isl,osl,engine\n0.0,10.5,5,0\n")
    with pytest.raises(ConfigError, match="isl"):
        rp.read_log(str(p))


def test_workload_matches_documented_means():
    s = poisson_stream(np.random.default_rng(0), 50.0, 400.0, 3)
    assert s.isl.mean() == pytest.approx(CNN_DAILYMAIL.isl.mean, rel=0.03)
    assert s.osl.mean() == pytest.approx(CNN_DAILYMAIL.osl.mean, rel=0.03)
    assert len(s.arrival_s) == pytest.approx(50 * 400, rel=0.03)
    assert list(s.engine[:6]) == [0, 1, 2, 0, 1, 2]
    again = poisson_stream(np.random.default_rng(0), 50.0, 400.0, 3)
    assert np.array_equal(s.isl, again.isl)


def test_validate_json_shape_and_queueing_behaviour(capsys):
    rc = main(["calibrate", "validate", "--setup", SETUP, "--json", "--rates", "2,50"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"setup", "points", "capacity_rps", "paper_capacity_rps"}
    assert report["paper_capacity_rps"] == 27.58
    low, high = report["points"]
    assert set(low) == {"rate_rps", "ttft_mean_s", "tpot_mean_s", "paper_ttft_s", "paper_tpot_s"}
    assert low["paper_ttft_s"] == 0.071 and low["paper_tpot_s"] == 0.0155
    # overload: queueing dominates TTFT, prefills stall decode
    assert high["ttft_mean_s"] > 100 * low["ttft_mean_s"]
    assert high["tpot_mean_s"] > 2 * low["tpot_mean_s"]
    # the shipped llama file is tuned to the paper's anchors (README): within 10 %
    for name, _paper, _ours, err in val.anchor_errors(report):
        assert abs(err) < 10.0, name


def test_cli_errors_exit_2(tmp_path, capsys):
    assert main(["calibrate", "fit", "--measurements", str(tmp_path / "none.csv"),
                 "--setup", SETUP]) == 2
    assert "none.csv" in capsys.readouterr().err
    assert main(["calibrate", "validate", "--setup", "a100-40gb/nope"]) == 2


def test_cli_roofline_and_fit_round_trip(tmp_path, capsys):
    out = tmp_path / "h100.yaml"
    assert main(["calibrate", "roofline", "--gpu", "h100", "--model", "llama-3.1-8b",
                 "--out", str(out)]) == 0
    from services.config.calibration import load_calibration_file

    cal = load_calibration_file(out)
    assert cal.derived == "roofline" and cal.gpu == "h100-80gb"
    steps = "calibration/measurements/derived/a100-40gb__llama-3.1-8b-tp1-steps.csv"
    fitted = tmp_path / "fit.yaml"
    assert main(["calibrate", "fit", "--measurements", steps, "--setup", SETUP,
                 "--out", str(fitted)]) == 0
    text = capsys.readouterr().out
    assert "prefill_time" in text and "MAPE" in text
    assert load_calibration_file(fitted).derived == "fit"
