"""CA-RM models and data: the paper's stated figures, hand-computed equations, PV/wind, carbon."""

from __future__ import annotations

import numpy as np
import pytest

from services.carm import models
from services.carm.profiles import load_profiles
from services.carm.renewables import load_site, pv_power_w, site_supply, slot_energy_j
from services.model.errors import InvalidInput

PAPER_MODELS = ("vgg16", "inceptionv4", "resnet152", "stochasticdepth101")


@pytest.fixture(scope="module")
def prof():
    return load_profiles()


def test_rtx4090_levels_are_the_papers(prof):
    assert prof.gpu("rtx4090").frequency_levels_mhz == (210, 810, 1410, 2010, 2760)
    a100 = prof.gpu("a100").frequency_levels_mhz
    assert a100[0] == 210 and a100[-1] == 1410


def test_epoch_times_agree_with_paper_text(prof):
    inc = prof.model("inceptionv4").training
    vgg = prof.model("vgg16").training
    # paper §5.4: inceptionv4 > 220 s at 210 MHz, < 100 s at 2760 MHz; vgg16 20 s -> 13 s
    assert models.epoch_time_s(inc, 210) > 220
    assert models.epoch_time_s(inc, 2760) < 100
    assert models.epoch_time_s(vgg, 210) == pytest.approx(20, abs=0.5)
    assert models.epoch_time_s(vgg, 2760) == pytest.approx(13, abs=0.5)
    # "performance gain of more than 50 %" for inceptionv4, "about 35 %" for vgg16
    assert 1 - models.epoch_time_s(inc, 2760) / models.epoch_time_s(inc, 210) > 0.5
    assert 1 - 13 / 20 == pytest.approx(
        1 - models.epoch_time_s(vgg, 2760) / models.epoch_time_s(vgg, 210), abs=0.03)


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_minimum_energy_at_2010_mhz(prof, name):
    m = prof.model(name)
    levels = np.array(prof.gpu("rtx4090").frequency_levels_mhz)
    e_tr = models.training_power_per_worker_w(m.training, levels) * models.epoch_time_s(
        m.training, levels)
    assert levels[np.argmin(e_tr)] == 2010
    # inference at full load: energy per request = power(u=1) / service rate
    mu = models.service_rate_rps(m.inference, levels)
    p = models.inference_power_w(m.inference, levels, mu, 1)
    assert levels[np.argmin(p / mu)] == 2010
    # 210 and 2760 are both worse than every intermediate level (paper Fig. 2c,d)
    assert e_tr[0] > e_tr[1:4].max() and e_tr[-1] > e_tr[3]


def test_status_is_reconstructed(prof):
    assert all(prof.model(n).status == "reconstructed" for n in PAPER_MODELS)


def test_latency_eq1_by_hand():
    p = models.InferenceProfile("t", a0_s_mhz=100.0, a1_s=0.0, alpha0_w_per_mhz=0,
                                alpha1_w_per_mhz=0, alpha2_w=0, alpha3_w=0,
                                latency_bound_s=1, network_delay_s=0.01)
    # mu = f/100 = 10 req/s per worker; m = 2, lambda = 15: 1/(20-15) + 1/10 + 0.01
    assert models.latency_s(p, 1000.0, 15.0, 2, 900.0) == pytest.approx(0.2 + 0.1 + 0.01)
    # saturated (capacity 20 < 40): fluid backlog over half a slot
    assert models.latency_s(p, 1000.0, 40.0, 2, 900.0) == pytest.approx(
        0.5 * 900 / 2 + 0.1 + 0.01)


def test_power_eq11_by_hand():
    p = models.InferenceProfile("t", a0_s_mhz=100.0, a1_s=0.0, alpha0_w_per_mhz=0.1,
                                alpha1_w_per_mhz=0.02, alpha2_w=50.0, alpha3_w=30.0,
                                latency_bound_s=1, network_delay_s=0)
    # f=1000, m=4, mu=10, lambda=20 -> u=0.5; per node 0.1*1000*0.5 + 20 + 25 + 30 = 125
    assert models.inference_power_w(p, 1000.0, 20.0, 4) == pytest.approx(4 * 125.0)


def test_training_eq4_eq18_by_hand():
    t = models.TrainingProfile("t", alpha0_s_mhz=2000.0, alpha1_s=8.0, beta0_w_per_mhz=0.1,
                               beta1_w=200.0)
    # f=1000: 10 s/epoch; 3 workers x 900 s -> 270 epochs; power 300 W/worker
    assert models.epochs_per_slot(t, 1000.0, 3, 900.0) == pytest.approx(270.0)
    assert models.training_energy_j(t, 1000.0, 3, 1, 900.0) == pytest.approx(3 * 900 * 300.0)
    assert models.training_energy_j(t, 1000.0, 3, 0, 900.0) == 0.0


def test_dispatch_renewables_first_and_table1_factors():
    f = models.EmissionFactors(0.05, 0.034, 0.96)
    d = models.dispatch(np.array([3600.0, 7200.0]), np.array([1800.0, 0.0]),
                        np.array([900.0, 0.0]), f)
    # slot 0: 900 J wind + 1800 J solar + 900 J grid; slot 1: all grid
    assert d.carbon_g[0] == pytest.approx((900 * 0.034 + 1800 * 0.05 + 900 * 0.96) / 3600)
    assert d.carbon_g[1] == pytest.approx(2 * 0.96)
    assert np.allclose(d.solar_j + d.wind_j + d.grid_j, [3600, 7200])


def test_pv_model_by_hand():
    # GHI 1000, T_air 25, NOCT 45: T_cell = 25 + 25/800*1000 = 56.25; derate 1 - 0.004*31.25
    p = pv_power_w(np.array([1000.0, -5.0]), np.array([25.0, 0.0]), 10.0, 0.2, 0.004, 45.0)
    assert p[0] == pytest.approx(10 * 0.2 * 1000 * (1 - 0.004 * 31.25))
    assert p[1] == 0.0


def test_slot_energy_and_short_trace():
    e = slot_energy_j(np.array([100.0, 300.0, 50.0, 50.0]), 60.0, 120.0, 2)
    assert np.allclose(e, [200.0 * 120, 50.0 * 120])
    with pytest.raises(InvalidInput) as ei:
        slot_energy_j(np.ones(3), 60.0, 120.0, 2)
    assert ei.value.field == "supply_trace"


def test_site_supply_from_real_traces():
    site = load_site()
    s = site_supply(site, 900.0, 96)
    assert s.solar_j.shape == (96,) and (s.solar_j >= 0).all() and (s.wind_j >= 0).all()
    # night at the NREL site (MST): no PV before 05:00, PV around noon
    assert s.solar_j[:20].sum() == 0.0 and s.solar_j[44:52].min() > 0
    assert s.wind_j.max() <= site["wind"]["rated_w"] * 900.0
    for src in ("solcast", "entsoe"):
        alt = dict(site, solar=dict(site["solar"], source=src))
        a = site_supply(alt, 900.0, 96).solar_j
        assert a.max() > 0 and a.max() <= site["solar"]["peak_w"] * 900.0 + 1e-6
