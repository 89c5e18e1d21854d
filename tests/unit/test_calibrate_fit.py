"""The fit tool recovers known coefficients from noisy synthetic step measurements."""

from __future__ import annotations

import numpy as np
import pytest

from services.calibrate import fit as fitmod
from services.calibrate.csvio import write_rows
from services.model.errors import ConfigError, InvalidInput

# Chosen "true" coefficients (not taken from any shipped file).
TRUE_PRE = dict(b0=0.011, b1=0.0004, b2=1.5e-9, s_lo=3.0e-5, s_hi=7.0e-5, knee=300.0)
TRUE_ALPHA = (0.012, 1.5e-4, 8.0e-7)
TRUE_BETA = (2.0e-7, 9.0e-8, 0.0)
TRUE_EPRE = (3.0, 0.028, 6.0e-7)
TRUE_EDEC = (3.2, 0.11, 3.0e-5)


def _prefill_truth(n, reqs, ssq):
    p = TRUE_PRE
    tok = np.where(n <= p["knee"], p["s_lo"] * n,
                   p["s_lo"] * p["knee"] + p["s_hi"] * (n - p["knee"]))
    return tok + p["b0"] + p["b1"] * reqs + p["b2"] * ssq


def _decode_truth(b, kv):
    ell = kv / b
    a, be = TRUE_ALPHA, TRUE_BETA
    return (a[0] + be[0] * ell) + (a[1] + be[1] * ell) * b + (a[2] + be[2] * ell) * b * b


def _synthetic(rng, noise=0.01):
    n_each = rng.integers(16, 2048, 400).astype(float)
    reqs = rng.integers(1, 5, 400).astype(float)
    n = n_each * reqs
    ssq = reqs * n_each**2
    t_pre = _prefill_truth(n, reqs, ssq) * (1 + noise * rng.standard_normal(400))
    e_pre = (TRUE_EPRE[0] + TRUE_EPRE[1] * n + TRUE_EPRE[2] * ssq) * (
        1 + noise * rng.standard_normal(400))
    b = rng.integers(1, 41, 400).astype(float)
    kv = b * rng.uniform(64, 4096, 400)
    t_dec = _decode_truth(b, kv) * (1 + noise * rng.standard_normal(400))
    e_dec = (TRUE_EDEC[0] + TRUE_EDEC[1] * b + TRUE_EDEC[2] * kv) * (
        1 + noise * rng.standard_normal(400))
    return n, reqs, ssq, t_pre, e_pre, b, kv, t_dec, e_dec


def test_nnls_matches_unconstrained_when_solution_is_positive():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, (50, 3))
    x_true = np.array([1.0, 2.0, 0.5])
    x = fitmod.nnls(a, a @ x_true)
    np.testing.assert_allclose(x, x_true, rtol=1e-8)
    # a negative true coefficient is clamped to zero
    x2 = fitmod.nnls(a, a @ np.array([1.0, -2.0, 0.5]))
    assert (x2 >= 0).all() and x2[1] == 0.0


def test_fit_recovers_coefficients_from_noisy_csv(tmp_path):
    rng = np.random.default_rng(7)
    n, reqs, ssq, t_pre, e_pre, b, kv, t_dec, e_dec = _synthetic(rng)
    rows = [["prefill", n[i], reqs[i], ssq[i], "", "", t_pre[i], e_pre[i]] for i in range(len(n))]
    rows += [["decode", "", "", "", b[i], kv[i], t_dec[i], e_dec[i]] for i in range(len(b))]
    path = tmp_path / "steps.csv"
    write_rows(path, list(fitmod.STEP_COLUMNS), rows)
    res = fitmod.fit_steps(fitmod.read_steps(str(path)))
    p = res.prefill
    assert p is not None and res.decode is not None
    assert p.knee_tokens == pytest.approx(TRUE_PRE["knee"], rel=0.15)
    assert p.tok_slope_above_s == pytest.approx(TRUE_PRE["s_hi"], rel=0.05)
    assert p.b0_s == pytest.approx(TRUE_PRE["b0"], rel=0.1)
    assert p.b2_s == pytest.approx(TRUE_PRE["b2"], rel=0.2)
    # 1 % multiplicative noise: MAPE of a good fit is ~0.8 %
    assert p.mape_pct < 1.5 and res.decode.mape_pct < 1.5
    # decode: compare predictions over the domain (individual terms trade off)
    bb, ll = np.meshgrid(np.arange(1.0, 41.0), np.linspace(64, 4096, 9))
    pred = res.decode.predict(bb.ravel(), (bb * ll).ravel())
    truth = _decode_truth(bb.ravel(), (bb * ll).ravel())
    assert np.max(np.abs(pred / truth - 1)) < 0.03
    pe, de = res.prefill_energy, res.decode_energy
    assert pe is not None and de is not None
    assert pe.e1_j == pytest.approx(TRUE_EPRE[1], rel=0.05)
    assert de.e1_j == pytest.approx(TRUE_EDEC[1], rel=0.1)
    assert de.e2_j == pytest.approx(TRUE_EDEC[2], rel=0.1)
    assert pe.mape_pct < 1.5 and de.mape_pct < 1.5


def test_prefill_knee_found_without_noise():
    n = np.geomspace(16, 16384, 80).round()
    ones = np.ones_like(n)
    t = _prefill_truth(n, ones, n * n)
    p = fitmod.fit_prefill(n, ones, n * n, t)
    assert p.mape_pct < 0.5
    assert abs(p.knee_tokens - TRUE_PRE["knee"]) / TRUE_PRE["knee"] < 0.1
    assert p.tok_slope_above_s > p.tok_slope_s


def test_merge_keeps_base_and_loads(tmp_path):
    from pathlib import Path

    import yaml

    from services.config.calibration import load_calibration, parse_calibration

    base = yaml.safe_load(Path(load_calibration("a100-40gb/llama-3.1-8b-tp1").path).read_text())
    rng = np.random.default_rng(3)
    n, reqs, ssq, t_pre, *_ = _synthetic(rng)
    res = fitmod.FitResult(fitmod.fit_prefill(n, reqs, ssq, t_pre), None, None, None)
    merged = fitmod.merge_fit(base, res, "synthetic")
    cal = parse_calibration(merged, "merged", "x")
    assert cal.decode.alpha_s == tuple(float(v) for v in base["decode"]["alpha_s"])
    assert cal.prefill.knee_tokens == pytest.approx(TRUE_PRE["knee"], rel=0.15)


def test_csv_errors_name_file_and_column(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("phase,n_tokens,n_requests,time_s\nprefill,10,1,0.01\n")
    with pytest.raises(ConfigError) as e:
        fitmod.fit_steps(fitmod.read_steps(str(p)))
    assert str(p) in str(e.value) and "sum_sq" in str(e.value)
    p.write_text("phase,time_s\nprefill,abc\n")
    with pytest.raises(ConfigError) as e:
        fitmod.read_steps(str(p))
    assert "time_s" in str(e.value) and "row 2" in str(e.value)
    p.write_text("phase,batch,kv_tokens,time_s\nwarmup,1,10,0.01\n")
    with pytest.raises(ConfigError, match="phase"):
        fitmod.fit_steps(fitmod.read_steps(str(p)))
    with pytest.raises(ConfigError, match="cannot read"):
        fitmod.read_steps(str(tmp_path / "missing.csv"))
    with pytest.raises(InvalidInput):
        fitmod.fit_prefill(np.ones(2), np.ones(2), np.ones(2), np.ones(2))
