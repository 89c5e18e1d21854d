"""Datacenter core: routing, energy breakdown, carbon accounting, CA-RM inputs, errors.

Expected values come from the DC docstring's rules and the calibration coefficients:
host power per node, idle power per GPU, facility = IT x PUE, carbon = grid energy x CI /
3.6e6 (J per kWh).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.config.calibration import Calibration, parse_calibration
from services.datacenter.dc import Datacenter, DcConfig
from services.datacenter.driver import DcDriver
from services.datacenter.engine import EngineRequest, Finished
from services.model.carbon import ConstantCI
from services.model.errors import InvalidInput, Unavailable
from services.runtime.vclock import VirtualClock

J_PER_KWH = 3.6e6


class HourlyCI:
    """Piecewise-constant CI, one value per hour from t = 0 (wraps around)."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def at(self, t_s: float) -> float:
        return self.values[int(t_s // 3600) % len(self.values)]

    def mean(self, t0_s: float, t1_s: float) -> float:
        if t1_s <= t0_s:
            return self.at(t0_s)
        total, t = 0.0, t0_s
        while t < t1_s:
            edge = min((math.floor(t / 3600) + 1) * 3600.0, t1_s)
            total += self.at(t) * (edge - t)
            t = edge
        return total / (t1_s - t0_s)


def make_dc(cal: Calibration, ci=None, **kw) -> Datacenter:
    cfg = DcConfig(name=kw.pop("name", "dc"), **kw)
    return Datacenter(cfg, cal, ci or ConstantCI(400.0))


def idle_power_w(cal: Calibration, nodes: int, gpus_per_node: int) -> float:
    """Standing power of an idle DC: host per node + idle per GPU (all engines idle)."""
    return nodes * cal.energy.host_w_per_node + nodes * gpus_per_node * cal.energy.idle_w_per_gpu


def req(rid: str, isl: int = 50, osl: int = 4) -> EngineRequest:
    return EngineRequest(rid, isl, osl, 0.0)


# ---------------------------------------------------------------------------- routing
@pytest.mark.parametrize(("nodes", "gpus"), [(1, 8), (2, 4), (3, 2), (4, 8)])
def test_round_robin_alternates_nodes_then_engines(llama_cal, nodes, gpus) -> None:
    dc = make_dc(llama_cal, nodes=nodes, gpus_per_node=gpus)
    epn = gpus // llama_cal.tp
    assert len(dc.engines) == nodes * epn
    n_req = 3 * nodes * epn
    got = [dc.submit(req(str(k)), "", 0.0) for k in range(n_req)]
    # k-th request: node k mod nodes, and that node's (k div nodes)-th engine in turn
    expected = [(k % nodes) * epn + (k // nodes) % epn for k in range(n_req)]
    assert got == expected
    assert Counter(got) == {i: 3 for i in range(nodes * epn)}
    assert [dc.engine_node[i] for i in got[:nodes]] == list(range(nodes))
    assert [len(e.waiting) for e in dc.engines] == [3] * (nodes * epn)


def test_least_loaded_picks_least_loaded_engine(llama_cal) -> None:
    dc = make_dc(llama_cal, nodes=2, gpus_per_node=2, routing="least-loaded")
    preload = [3, 1, 0, 2]
    for i, n in enumerate(preload):
        for k in range(n):
            dc.engines[i].enqueue(req(f"pre{i}-{k}"), 0.0)
    loads = list(preload)
    for k in range(6):
        lo = min(loads)
        expected = loads.index(lo)                 # lowest index among the least loaded
        assert dc.submit(req(f"r{k}"), "", 0.0) == expected
        loads[expected] += 1
    assert loads == [len(e.waiting) + len(e.running) for e in dc.engines]
    assert max(loads) - min(loads) <= 1


# ---------------------------------------------------------------------------- validation
def test_unknown_model_is_invalid_input_naming_model(llama_cal) -> None:
    dc = make_dc(llama_cal)
    with pytest.raises(InvalidInput) as exc:
        dc.submit(req("x"), "not-" + llama_cal.model, 0.0)
    assert exc.value.field == "model"
    assert dc.in_flight() == 0
    assert dc.submit(req("y"), llama_cal.model, 0.0) in range(len(dc.engines))


def test_bad_request_fields_are_invalid_input(llama_cal) -> None:
    dc = make_dc(llama_cal)
    with pytest.raises(InvalidInput) as exc:
        dc.submit(EngineRequest("x", 0, 3, 0.0), "", 0.0)
    assert exc.value.field == "isl_tokens"
    with pytest.raises(InvalidInput) as exc:
        dc.submit(EngineRequest("x", 3, 0, 0.0), "", 0.0)
    assert exc.value.field == "osl_tokens"
    assert dc.in_flight() == 0


def test_draining_dc_is_unavailable(llama_cal) -> None:
    dc = make_dc(llama_cal)
    dc.draining = True
    with pytest.raises(Unavailable) as exc:
        dc.submit(req("x"), "", 0.0)
    assert exc.value.status_code == "UNAVAILABLE"
    assert dc.in_flight() == 0


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"nodes": 0}, "nodes"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"pue": 0.9}, "pue"),
        ({"pue": float("nan")}, "pue"),
        ({"routing": "random"}, "routing"),
    ],
)
def test_bad_dc_config_is_invalid_input(llama_cal, kw, field) -> None:
    with pytest.raises(InvalidInput) as exc:
        make_dc(llama_cal, **kw)
    assert exc.value.field == field


def test_gpus_per_node_must_be_a_multiple_of_tp(tiny_cal_data) -> None:
    d = tiny_cal_data()
    d["tp"] = 2
    cal2 = parse_calibration(d, "tp2")
    with pytest.raises(InvalidInput) as exc:
        make_dc(cal2, gpus_per_node=3)
    assert exc.value.field == "gpus_per_node"
    assert len(make_dc(cal2, nodes=2, gpus_per_node=4).engines) == 4


# ---------------------------------------------------------------------------- energy & carbon
def test_idle_dc_energy_and_carbon_fixed_ci(llama_cal) -> None:
    nodes, gpus, pue, ci = 2, 8, 1.2, 350.0
    dc = make_dc(llama_cal, ConstantCI(ci), nodes=nodes, gpus_per_node=gpus, pue=pue)
    t = 1800.0
    dc.accrue(t)
    e = dc.energy
    assert e.host_j == pytest.approx(nodes * llama_cal.energy.host_w_per_node * t)
    assert e.gpu_idle_j == pytest.approx(nodes * gpus * llama_cal.energy.idle_w_per_gpu * t)
    assert e.gpu_active_j == 0.0 and e.training_j == 0.0
    it = idle_power_w(llama_cal, nodes, gpus) * t
    assert e.it_total_j == pytest.approx(it)
    assert dc.facility_j == pytest.approx(it * pue)
    assert e.grid_j == pytest.approx(it * pue) and e.renewable_j == 0.0
    assert dc.carbon_g == pytest.approx(it * pue * ci / J_PER_KWH)
    assert dc.power_w() == pytest.approx(idle_power_w(llama_cal, nodes, gpus) * pue)


class DcRun:
    """Drives a DC on a virtual clock through `DcDriver`, tracking for each engine
    the time its pipeline was empty (from the submissions and Finished events it sees)."""

    def __init__(self, dc: Datacenter) -> None:
        self.dc = dc
        self.clock = VirtualClock(dc.start_s)
        self.finished: list = []
        self.empty_since: list[float | None] = [dc.start_s] * len(dc.engines)
        self.empty_s = [0.0] * len(dc.engines)
        self.rt = DcDriver(dc, self.clock, self._on_events)

    def _on_events(self, idx: int, events) -> None:
        for ev in events:
            if isinstance(ev, Finished):
                self.finished.append(ev)
                if not self.dc.engines[idx].has_work:
                    self.empty_since[idx] = self.clock.now()

    def _submit(self, rid: str, isl: int, osl: int) -> None:
        idx = self.rt.submit(EngineRequest(rid, isl, osl, self.clock.now()))
        since = self.empty_since[idx]
        if since is not None:
            self.empty_s[idx] += self.clock.now() - since
            self.empty_since[idx] = None

    def run(self, arrivals: list[tuple[float, int, int]]) -> DcRun:
        for k, (t, isl, osl) in enumerate(arrivals):
            self.clock.call_at(t, self._submit, str(k), isl, osl)
        self.clock.run()
        return self

    def empty_until(self, t: float) -> list[float]:
        pairs = zip(self.empty_s, self.empty_since, strict=True)
        return [e + (t - s if s is not None else 0.0) for e, s in pairs]


def run_dc(dc: Datacenter, arrivals: list[tuple[float, int, int]]) -> DcRun:
    return DcRun(dc).run(arrivals)


def test_energy_breakdown_adds_up_with_load_and_training(llama_cal) -> None:
    pue, ci = 1.1, 420.0
    dc = make_dc(llama_cal, ConstantCI(ci), nodes=1, gpus_per_node=4, pue=pue)
    arrivals = [(0.1 * k, 200 + 50 * k, 16) for k in range(12)]
    r = run_dc(dc, arrivals)
    fin = r.finished
    assert len(fin) == 12
    t_train = r.clock.now()
    dc.apply_carm(t_train, training_w=1500.0, renewable_w=0.0)
    t_end = t_train + 100.0
    dc.accrue(t_end)
    e = dc.energy
    assert e.it_total_j == pytest.approx(e.gpu_active_j + e.gpu_idle_j + e.host_j + e.training_j)
    assert e.gpu_active_j == pytest.approx(sum(eng.energy.active_j for eng in dc.engines))
    assert e.gpu_active_j == pytest.approx(sum(ev.finished.energy_j for ev in fin))
    assert e.host_j == pytest.approx(llama_cal.energy.host_w_per_node * t_end)
    assert e.training_j == pytest.approx(1500.0 * 100.0)
    assert dc.facility_j == pytest.approx(e.it_total_j * pue)
    assert e.grid_j + e.renewable_j == pytest.approx(dc.facility_j)
    assert dc.carbon_g == pytest.approx(dc.facility_j * ci / J_PER_KWH)
    # every engine was busy for part of the run, so its idle energy is below idle_w * t
    for eng in dc.engines:
        assert eng.idle_energy_j(t_end) < llama_cal.energy.idle_w_per_gpu * t_end
    c = dc.counters(t_end)
    assert c.energy.it_total_j == pytest.approx(e.it_total_j)
    assert c.carbon_g == pytest.approx(dc.carbon_g) and c.in_flight == 0


def test_accrual_is_additive(llama_cal) -> None:
    """Accruing at many instants gives the same totals as accruing once at the end."""
    arrivals = [(0.05 * k, 300, 8) for k in range(10)]
    a = make_dc(llama_cal, ConstantCI(300.0), gpus_per_node=2)
    b = make_dc(llama_cal, ConstantCI(300.0), gpus_per_node=2)
    run_dc(a, arrivals)
    run_dc(b, arrivals)
    for t in (1.0, 2.5, 4.0, 7.0):
        a.accrue(t)
    b.accrue(7.0)
    assert a.facility_j == pytest.approx(b.facility_j)
    assert a.carbon_g == pytest.approx(b.carbon_g)


@pytest.mark.parametrize(("t0", "t1"), [(3000.0, 4200.0), (0.0, 7200.0), (3500.0, 10900.0)])
def test_carbon_integrates_hourly_ci_across_boundaries(llama_cal, t0, t1) -> None:
    values = [100.0, 500.0, 250.0, 50.0]
    dc = Datacenter(DcConfig("dc", nodes=1, gpus_per_node=8, pue=1.3), llama_cal,
                    HourlyCI(values), start_s=t0)
    dc.accrue(t1)
    p = idle_power_w(llama_cal, 1, 8) * 1.3
    # integrate hour by hour by hand
    expected, t = 0.0, t0
    while t < t1:
        h = int(t // 3600)
        edge = min((h + 1) * 3600.0, t1)
        expected += p * (edge - t) * values[h % len(values)] / J_PER_KWH
        t = edge
    assert dc.carbon_g == pytest.approx(expected, rel=1e-9)
    # a CI constant at the hour-0 value would give a different answer across a boundary
    assert dc.carbon_g != pytest.approx(p * (t1 - t0) * values[int(t0 // 3600)] / J_PER_KWH)


def test_carbon_follows_accrual_points_within_hours(llama_cal) -> None:
    """Accruing at the hour boundary and after gives the same result as one accrual."""
    ci = HourlyCI([200.0, 600.0])
    one = Datacenter(DcConfig("a"), llama_cal, ci, start_s=3000.0)
    many = Datacenter(DcConfig("b"), llama_cal, ci, start_s=3000.0)
    one.accrue(4500.0)
    for t in (3300.0, 3600.0, 3900.0, 4500.0):
        many.accrue(t)
    p = idle_power_w(llama_cal, 1, 8) * 1.1
    expected = p * (600.0 * 200.0 + 900.0 * 600.0) / J_PER_KWH
    assert one.carbon_g == pytest.approx(expected) and many.carbon_g == pytest.approx(expected)


# ---------------------------------------------------------------------------- CA-RM inputs
def test_renewable_supply_reduces_grid_energy_and_carbon(llama_cal) -> None:
    arrivals = [(0.02 * k, 400, 12) for k in range(20)]
    base = make_dc(llama_cal, ConstantCI(500.0), gpus_per_node=2, pue=1.2)
    green = make_dc(llama_cal, ConstantCI(500.0), gpus_per_node=2, pue=1.2)
    supply_w = 400.0
    green.apply_carm(0.0, training_w=0.0, renewable_w=supply_w)
    run_dc(base, arrivals)
    run_dc(green, arrivals)
    t = 30.0
    base.accrue(t)
    green.accrue(t)
    assert green.facility_j == pytest.approx(base.facility_j)       # same load, same energy
    assert green.energy.grid_j + green.energy.renewable_j == pytest.approx(green.facility_j)
    # supply < demand throughout: the supply is used, never more than it delivers
    # (exactly supply * t: see the accrual-frequency test below)
    assert 0.99 * supply_w * t <= green.energy.renewable_j <= supply_w * t * (1 + 1e-12)
    assert green.energy.grid_j == pytest.approx(base.energy.grid_j - green.energy.renewable_j)
    # renewable energy is charged at renewable_ci_g_per_kwh = 0
    assert green.carbon_g == pytest.approx(base.carbon_g * green.energy.grid_j / base.energy.grid_j)
    assert green.carbon_g < base.carbon_g
    assert green.effective_ci(t) < base.effective_ci(t) == 500.0


def test_renewable_share_does_not_depend_on_accrual_frequency(llama_cal) -> None:
    supply_w = 500.0

    def run(points: list[float]) -> tuple[Datacenter, float]:
        dc = Datacenter(DcConfig("d", gpus_per_node=1, pue=1.0), llama_cal, ConstantCI(500.0))
        dc.apply_carm(0.0, training_w=0.0, renewable_w=supply_w)
        dc.submit(EngineRequest("r", 8000, 2, 0.0), "", 0.0)
        eng = dc.engines[0]
        plan = eng.next_step(0.0)
        # the DC draws host power plus the step's mean power, above the supply throughout
        assert llama_cal.energy.host_w_per_node + plan.energy_j / plan.duration_s > supply_w
        for t in points:
            if t < plan.end_s:
                dc.accrue(t)
        eng.complete_step(plan.end_s)
        dc.accrue(plan.end_s)
        assert dc.energy.renewable_j <= supply_w * plan.end_s * (1 + 1e-12)
        return dc, plan.end_s

    once, end = run([])
    often, _ = run([0.01 * k for k in range(1, 100)])       # e.g. a runtime polling at 100 Hz
    assert once.energy.renewable_j == pytest.approx(supply_w * end)
    assert often.energy.renewable_j == pytest.approx(once.energy.renewable_j, rel=1e-6)
    assert often.carbon_g == pytest.approx(once.carbon_g, rel=1e-6)


def test_surplus_renewable_covers_all_facility_energy(llama_cal) -> None:
    dc = make_dc(llama_cal, ConstantCI(500.0), gpus_per_node=1, pue=1.5)
    dc.apply_carm(0.0, training_w=0.0, renewable_w=1e6)
    dc.accrue(60.0)
    assert dc.energy.grid_j == 0.0
    assert dc.energy.renewable_j == pytest.approx(dc.facility_j)
    assert dc.carbon_g == 0.0
    assert dc.effective_ci(60.0) == 0.0


def test_renewable_energy_charged_at_renewable_ci(llama_cal) -> None:
    dc = Datacenter(DcConfig("r", gpus_per_node=1, pue=1.0, renewable_ci_g_per_kwh=30.0),
                    llama_cal, ConstantCI(500.0))
    supply = 100.0
    dc.apply_carm(0.0, 0.0, supply)
    dc.accrue(3600.0)
    p = idle_power_w(llama_cal, 1, 1)
    assert p > supply
    expected = (supply * 3600.0 * 30.0 + (p - supply) * 3600.0 * 500.0) / J_PER_KWH
    assert dc.carbon_g == pytest.approx(expected)


@pytest.mark.parametrize(
    ("training_w", "renewable_w", "field"),
    [(0.0, -1.0, "renewable_supply_w"), (-5.0, 0.0, "training_power_w")],
)
def test_negative_carm_inputs_are_invalid(llama_cal, training_w, renewable_w, field) -> None:
    dc = make_dc(llama_cal)
    with pytest.raises(InvalidInput) as exc:
        dc.apply_carm(10.0, training_w, renewable_w)
    assert exc.value.field == field
    assert dc.training_w == 0.0 and dc.renewable_w == 0.0


def test_dc_frequency_applies_to_every_engine(llama_cal) -> None:
    dc = make_dc(llama_cal, nodes=2, gpus_per_node=2)
    lo = llama_cal.frequency.levels_mhz[0]
    assert dc.set_frequency(lo) == lo
    assert all(e.perf.frequency_mhz == lo for e in dc.engines)
    assert dc.counters(0.0).gpu_frequency_mhz == lo


def test_fail_all_accounts_for_every_request(llama_cal) -> None:
    dc = make_dc(llama_cal, gpus_per_node=4)
    for k in range(10):
        dc.submit(req(str(k)), "", 0.0)
    lost = dc.fail_all(1.0)
    assert sorted(r.id for _, r in lost) == sorted(str(k) for k in range(10))
    assert all(0 <= i < len(dc.engines) and r.blocks == 0 for i, r in lost)
    assert dc.in_flight() == 0


# ---------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=st.lists(
        st.tuples(
            st.floats(0.0, 5.0, allow_nan=False),
            st.integers(1, 3000),
            st.integers(2, 64),
        ),
        min_size=1,
        max_size=30,
    ),
    nodes=st.integers(1, 2),
    gpus=st.sampled_from([1, 2, 4]),
    routing=st.sampled_from(["round-robin", "least-loaded"]),
    tail_s=st.floats(0.0, 50.0, allow_nan=False),
)
def test_dc_energy_floor_and_accounting(llama_cal, arrivals, nodes, gpus, routing, tail_s) -> None:
    pue, ci = 1.25, 380.0
    dc = make_dc(llama_cal, ConstantCI(ci), nodes=nodes, gpus_per_node=gpus, pue=pue,
                 routing=routing)
    r = run_dc(dc, arrivals)
    assert len(r.finished) == len(arrivals) == dc.completed
    assert {ev.finished.output_tokens for ev in r.finished} <= {a[2] for a in arrivals}
    assert dc.in_flight() == 0
    t_end = r.clock.now() + tail_s
    dc.accrue(t_end)
    e = dc.energy
    host_floor = llama_cal.energy.host_w_per_node * nodes * t_end
    assert e.host_j == pytest.approx(host_floor)
    # idle power is drawn exactly while an engine's pipeline is empty
    idle_w = llama_cal.energy.idle_w_per_gpu * llama_cal.tp
    empty = r.empty_until(t_end)
    idle_floor = idle_w * sum(empty)
    assert e.gpu_idle_j == pytest.approx(idle_floor, rel=1e-9, abs=1e-6)
    for eng, emp in zip(dc.engines, empty, strict=True):
        assert eng.energy.active_j + eng.idle_energy_j(t_end) >= idle_w * emp * (1 - 1e-12)
    assert e.it_total_j >= (host_floor + idle_floor) * (1 - 1e-12)
    assert e.it_total_j == pytest.approx(e.gpu_active_j + e.gpu_idle_j + e.host_j + e.training_j)
    assert e.gpu_active_j == pytest.approx(sum(ev.finished.energy_j for ev in r.finished))
    assert len(dc.engines) == nodes * gpus
    assert dc.facility_j == pytest.approx(e.it_total_j * pue)
    assert dc.carbon_g == pytest.approx(dc.facility_j * ci / J_PER_KWH)
