"""CA-RM live glue (services/carm/live.py) and its virtual-runtime hook on a tiny topology.

Expectations come from the profiles' coefficients, the calibration and the renewable traces
(aggregated here at another resolution), never from the code under test.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from services.carm.controller import CarmController, DcSite
from services.carm.live import CarmLive
from services.carm.profiles import load_profiles
from services.carm.renewables import load_site, site_supply
from services.config.calibration import load_calibration
from services.config.topology import load_topology
from services.model.errors import ConfigError, InvalidInput
from services.sim.runtime import SimRun

SETUP = "a100-40gb/llama-3.1-8b-tp1"
SLOT_S = 900.0

TINY: dict[str, Any] = {
    "name": "carm-tiny",
    "defaults": {"dc": {"nodes": 1, "gpus_per_node": 2, "setup": SETUP, "pue": 1.2}},
    "regions": [{"name": "eu-north", "aws_region": "eu-north-1", "dcs": [
        {"name": "a", "zone": "NL", "ci": {"constant": 300}},
        {"name": "b", "zone": "LT", "ci": {"constant": 100}},
    ]}],
    "load": {"rate_rps": 6, "dataset": "cnn-dailymail", "duration_s": 60, "warmup_s": 0},
    "carm": {
        "slot_s": SLOT_S, "horizon_slots": 4, "trace_start_hour": 10,
        "renewables": {"pv_peak_w": 3000.0, "wind_peak_w": 500.0},
        "training": {"nodes": 2, "jobs": [
            {"model": "vgg16", "epochs": 20, "deadline_s": 3 * SLOT_S},
            # needs far longer than its deadline even on both nodes at the top clock
            {"model": "inceptionv4", "epochs": 200, "deadline_s": SLOT_S},
        ]},
        "dcs": {"b": {"renewables": {"pv_peak_w": 0.0}, "trace_start_hour": 0}},
    },
}


def _load(tmp_path: Path, data: dict[str, Any]):
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_topology(p)


def _run_slots(live: CarmLive, n: int, rate_rps: float) -> list[list[Any]]:
    out = []
    for k in range(n):
        now = k * SLOT_S
        for dc in live.sites:
            live.observe(dc, now, int(rate_rps * now))
        out.append(live.plan(now))
    live.finish(n * SLOT_S)
    return out


def test_plans_stay_within_levels_training_capacity_and_the_traces(tmp_path):
    topo = _load(tmp_path, TINY)
    live = CarmLive(topo)
    slots = _run_slots(live, 6, rate_rps=2.0)
    cal = load_calibration(SETUP)
    prof = load_profiles()
    top = cal.frequency.levels_mhz[-1]
    per_node_max = max(m.training.beta0_w_per_mhz * top + m.training.beta1_w
                       for m in prof.models.values() if m.training is not None)
    site = load_site()
    s900 = site_supply(site, SLOT_S, 96)   # 15-min slots of the same day
    nameplate = site["solar"]["area_m2"] * site["solar"]["efficiency"] * 1000.0
    for k, plans in enumerate(slots):
        assert {p.dc for p in plans} == {"a", "b"}
        for p in plans:
            assert p.gpu_frequency_mhz in cal.frequency.levels_mhz
            assert 0.0 <= p.training_power_w <= 2 * per_node_max + 1e-6
            assert p.training_workers <= 2
            assert p.renewable_supply_w >= 0.0
        a = next(p for p in plans if p.dc == "a")
        b = next(p for p in plans if p.dc == "b")
        slot = 40 + k  # 10:00 is 15-min slot 40 of the trace day
        exp_a = (3000.0 * s900.solar_j[slot] / SLOT_S / nameplate
                 + 500.0 * s900.wind_j[slot] / SLOT_S / site["wind"]["rated_w"])
        exp_b = 500.0 * s900.wind_j[k] / SLOT_S / site["wind"]["rated_w"]
        assert a.renewable_supply_w == pytest.approx(exp_a, rel=1e-9)
        assert b.renewable_supply_w == pytest.approx(exp_b, rel=1e-9)
        assert a.grid_ci_g_per_kwh == 300.0 and b.grid_ci_g_per_kwh == 100.0
        # the prior (6 rps over 2 DCs) until a rate has been observed, then the rate
        assert a.load_forecast_rps == pytest.approx(2.0 if k else 6.0 / 2)
    # vgg16: 20 epochs x ~14 s fits easily; inceptionv4: 200 x ~106 s / 2 nodes > 900 s
    assert live.counters.deadlines_met == 2
    assert live.counters.deadlines_missed == 2
    summary = live.summary()
    assert summary["training_jobs"] == 4 and summary["slots"] == 6


def test_training_does_the_jobs_epochs_and_no_more_than_one_worker_slot_extra(tmp_path):
    data = copy.deepcopy(TINY)
    data["carm"]["training"]["jobs"] = [{"model": "vgg16", "epochs": 30, "deadline_s": 7200}]
    live = CarmLive(_load(tmp_path, data))
    slots = _run_slots(live, 8, rate_rps=2.0)
    prof = load_profiles().model("vgg16").training
    assert prof is not None
    done = 0.0
    top = load_calibration(SETUP).frequency.levels_mhz[-1]
    for plans in slots:
        p = next(p for p in plans if p.dc == "a")
        if p.training_workers:
            # epochs this slot from the profile's epoch time at the planned training power
            f = (p.training_power_w / p.training_workers - prof.beta1_w) / prof.beta0_w_per_mhz
            done += p.training_workers * SLOT_S / (prof.alpha0_s_mhz / f + prof.alpha1_s)
    assert done >= 30 - 1e-6
    # never more than one worker-slot (at the top clock) past the requirement
    assert done <= 30 + SLOT_S / (prof.alpha0_s_mhz / top + prof.alpha1_s) + 1e-6
    assert live.counters.deadlines_met == 2 and live.counters.deadlines_missed == 0


def test_ewma_forecast_follows_the_observed_rate(tmp_path):
    data = copy.deepcopy(TINY)
    data["carm"]["forecast"] = "ewma"
    data["carm"]["ewma_alpha"] = 0.5
    live = CarmLive(_load(tmp_path, data))
    live.observe("a", 0.0, 0)
    live.observe("a", 100.0, 1000)          # 10 rps; prior 6 rps / 2 DCs = 3
    assert live.load["a"].rate_rps == pytest.approx(0.5 * 10 + 0.5 * 3)
    with pytest.raises(InvalidInput, match="arrived_total"):
        live.observe("a", 200.0, -1)
    with pytest.raises(InvalidInput, match="dc"):
        live.observe("zz", 200.0, 1)


def test_virtual_run_balances_renewable_and_grid_energy(tmp_path):
    data = copy.deepcopy(TINY)
    data["carm"]["slot_s"] = 20.0
    data["carm"]["training"]["jobs"] = [{"model": "vgg16", "epochs": 2, "deadline_s": 60}]
    data["load"]["duration_s"] = 60
    out = SimRun(_load(tmp_path, data), charge_solver_time=False).run()
    c = out["carm"]
    cal = load_calibration(SETUP)
    assert c["slots"] == 3
    assert c["training_energy_j"] > 0
    assert 0 < c["renewable_share"] <= 1
    for d in c["dcs"].values():
        assert d["renewable_energy_j"] + d["grid_energy_j"] == pytest.approx(
            d["facility_energy_j"], rel=1e-9)
        assert set(d["gpu_frequency_mhz_slots"]) <= set(cal.frequency.levels_mhz)
        assert d["renewable_energy_j"] >= 0 and d["grid_energy_j"] >= 0
    assert c["dcs"]["b"]["renewable_energy_j"] < c["dcs"]["a"]["renewable_energy_j"]
    assert out["energy_j"]["training"] == pytest.approx(c["training_energy_j"])
    assert out["requests"]["emitted"] == out["requests"]["completed"]


@pytest.mark.parametrize("path, value, key", [
    (("carm", "renewables", "pv_peak_w"), -5, "carm.renewables.pv_peak_w"),
    (("carm", "slot_s"), 0, "carm.slot_s"),
    (("carm", "formulation"), "problem-4", "carm.formulation"),
    (("carm", "trace_start_hour"), 24, "carm.trace_start_hour"),
    (("carm", "dcs", "b", "training"), {"nodez": 1}, "carm.dcs.b.training.nodez"),
    (("carm", "dcs", "nope"), {}, "carm.dcs.nope"),
    (("carm", "training", "workload"), "huge", "carm.training.workload"),
    (("carm", "training", "nodes"), 0, "carm.training.nodes"),
    (("carm", "training", "jobs"), [{"model": "llama3.1-8b", "epochs": 1, "deadline_s": 9}],
     "carm.training.jobs[0].model"),
    (("carm", "training", "jobs"), [{"model": "vgg16", "epochs": 1, "arrival_s": 50,
                                     "deadline_s": 10}], "carm.training.jobs[0].deadline_s"),
    (("carm", "colour"), "red", "carm.colour"),
])
def test_bad_carm_sections_name_the_key(tmp_path, path, value, key):
    data = copy.deepcopy(TINY)
    cur = data
    for part in path[:-1]:
        cur = cur.setdefault(part, {})
    cur[path[-1]] = value
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, data)
    assert f": {key}:" in str(exc.value)


def test_a_topology_without_carm_loads_with_none(tmp_path):
    data = copy.deepcopy(TINY)
    del data["carm"]
    topo = _load(tmp_path, data)
    assert topo.carm is None
    with pytest.raises(InvalidInput, match="carm"):
        CarmLive(topo)


def test_negative_supply_forecast_is_refused_naming_the_field():
    prof = load_profiles().model("llama3.1-8b").inference
    ctl = CarmController([DcSite("x", (210.0, 1410.0), prof, 2)], SLOT_S)
    with pytest.raises(InvalidInput, match=r"supply_forecast_w\[x\]"):
        ctl.plan_slot(0.0, {"x": [1.0, 1.0]}, {"x": [10.0, -1.0]})
    assert np.isfinite(prof.latency_bound_s)


@pytest.mark.parametrize("formulation", ["performance", "carbon", "ppc"])
def test_every_formulation_plans_live_and_is_reported(tmp_path, formulation):
    data = copy.deepcopy(TINY)
    data["carm"]["formulation"] = formulation
    data["carm"]["training"]["jobs"] = [{"model": "vgg16", "epochs": 20,
                                         "deadline_s": 3 * SLOT_S}]
    topo = _load(tmp_path, data)
    live = CarmLive(topo)
    plans = _run_slots(live, 3, 6.0)
    cal = load_calibration(SETUP)
    for slot in plans:
        assert {p.dc for p in slot} == {"a", "b"}
        for p in slot:
            # solved by the formulation itself, not the unbounded-budget fallback
            assert p.solver_status in ("optimal", "time_limit"), (formulation,
                                                                  p.solver_status)
            assert p.gpu_frequency_mhz in cal.frequency.levels_mhz
    assert live.summary()["formulation"] == formulation
    # each DC's job of 20 epochs is done by its deadline (3 slots) whatever the objective
    assert [j.state for j in live.jobs.values()] == ["met", "met"]
    assert all(j.finished_s <= 3 * SLOT_S for j in live.jobs.values())


def test_ci_forecast_error_changes_what_the_planner_sees_and_zero_is_the_trace(tmp_path):
    from services.model.carbon import CIForecast, ConstantCI

    exact = CIForecast(ConstantCI(300.0))
    assert exact.forecast(0.0, 3600.0, 7200.0) == 300.0
    noisy = CIForecast(ConstantCI(300.0), 0.2, seed=3)
    far = [noisy.forecast(0.0, k * 3600.0, (k + 1) * 3600.0) for k in range(1, 200)]
    # one draw per future step, whoever asks: from 10 h and from 9 h ahead the relative
    # error differs only by the lead-time factor sqrt(10 / 9)
    r10 = noisy.forecast(0.0, 36000.0, 39600.0) / 300.0 - 1.0
    r9 = noisy.forecast(3600.0, 36000.0, 39600.0) / 300.0 - 1.0
    assert r10 == pytest.approx(r9 * (10 / 9) ** 0.5)
    assert noisy.forecast(0.0, 36000.0, 39600.0) == noisy.forecast(0.0, 36000.0, 39600.0)
    rel = np.array(far) / 300.0 - 1.0
    assert rel.std() > 0.2  # lead times of 1-199 h: the error grows beyond one sigma
    assert min(far) >= 0.0
    data = copy.deepcopy(TINY)
    data["carm"]["ci_forecast_error"] = 0.5
    live = CarmLive(_load(tmp_path, data))
    assert live.ci_forecast["a"].error == 0.5
    plans = _run_slots(live, 2, 6.0)
    seen = [p.grid_ci_g_per_kwh for slot in plans for p in slot if p.dc == "a"]
    assert any(v != 300.0 for v in seen)  # the constant 300 g DC, seen through the error
