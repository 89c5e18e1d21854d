"""CA-RM MILPs (Problems 1-3) against brute-force enumeration on tiny instances.

The expected optima are computed here by enumerating every clock assignment and every
worker allocation, with the paper's equations written out again in this file (eq. 1, 4,
11, 18, 19-25), not with the code under test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from services.carm import milp
from services.carm.evaluate import evaluate
from services.carm.models import EmissionFactors, InferenceProfile, TrainingProfile
from services.carm.problem import Instance, TrainingJob, tables

SLOT_S = 900.0
LEVELS = np.array([500.0, 1000.0, 2000.0])
INF = InferenceProfile("toy", a0_s_mhz=20.0, a1_s=0.01, alpha0_w_per_mhz=0.02,
                       alpha1_w_per_mhz=0.01, alpha2_w=40.0, alpha3_w=30.0,
                       latency_bound_s=0.06, network_delay_s=0.002)
TR_A = TrainingProfile("ta", alpha0_s_mhz=20000.0, alpha1_s=40.0, beta0_w_per_mhz=0.05,
                       beta1_w=150.0)
TR_B = TrainingProfile("tb", alpha0_s_mhz=60000.0, alpha1_s=20.0, beta0_w_per_mhz=0.08,
                       beta1_w=100.0)
FACT = EmissionFactors(solar_g_per_wh=0.05, wind_g_per_wh=0.034, grid_g_per_wh=0.96)
NMAX = 2
N_NODES = 2


def tiny(solar_w=(0.0, 900.0, 100.0), wind_w=(50.0, 50.0, 300.0), rate=(60.0, 120.0, 90.0),
         jobs=((0, 2, 15.0, 1.0), (1, 2, 20.0, 2.0))) -> Instance:
    js = tuple(
        TrainingJob(k, TR_A if k == 0 else TR_B, a, d, m, p, NMAX)
        for k, (a, d, m, p) in enumerate(jobs)
    )
    return Instance(
        slot_s=SLOT_S, levels_mhz=LEVELS, inf_profiles=(INF,),
        inf_workers=np.array([8]), rate_rps=np.array([rate], dtype=float), jobs=js,
        train_nodes=N_NODES, solar_j=np.array(solar_w) * SLOT_S,
        wind_j=np.array(wind_w) * SLOT_S, factors=FACT,
        grid_g_per_wh=np.full(3, 0.96), price_usd_per_kwh=np.array([0.1, 0.2, 0.3]),
    ).validate()


# --- the paper's equations, written out independently --------------------------------------

def lat(f, lam, m=8):
    mu = 1.0 / (INF.a0_s_mhz / f + INF.a1_s)
    assert m * mu > lam  # the toy loads never saturate
    return 1.0 / (m * mu - lam) + 1.0 / mu + INF.network_delay_s


def inf_energy_j(f, lam, m=8):
    mu = 1.0 / (INF.a0_s_mhz / f + INF.a1_s)
    u = lam / (m * mu)
    p = m * (INF.alpha0_w_per_mhz * f * u + INF.alpha1_w_per_mhz * f + INF.alpha2_w * u
             + INF.alpha3_w)
    return p * SLOT_S


def epochs(prof, n, f=LEVELS[-1]):
    return n * SLOT_S / (prof.alpha0_s_mhz / f + prof.alpha1_s)


def tr_energy_j(prof, n, f=LEVELS[-1]):
    return n * SLOT_S * (prof.beta0_w_per_mhz * f + prof.beta1_w)


def carbon_g(inst, demand_j):
    total = 0.0
    for t, d in enumerate(demand_j):
        w = min(inst.wind_j[t], d)  # lowest factor first
        s = min(inst.solar_j[t], d - w)
        g = d - w - s
        total += (0.034 * w + 0.05 * s + 0.96 * g) / 3600.0
    return total


def enumerate_plans(inst):
    """Yield (levels, workers, demand, carbon, latencies, completion slots) of every plan
    that runs each job >= its epochs (and at most one worker-slot more) after arrival."""
    t = inst.n_slots
    per_slot = [(a, b) for a in range(NMAX + 1) for b in range(NMAX + 1) if a + b <= N_NODES]
    profs = [j.profile for j in inst.jobs]
    for lv in itertools.product(range(len(LEVELS)), repeat=t):
        lats = [lat(LEVELS[lv[s]], inst.rate_rps[0, s]) for s in range(t)]
        e_inf = [inf_energy_j(LEVELS[lv[s]], inst.rate_rps[0, s]) for s in range(t)]
        for ws in itertools.product(per_slot, repeat=t):
            w = np.array(ws).T  # (J, T)
            ok = True
            done = []
            for j, job in enumerate(inst.jobs):
                if w[j, : job.arrival_slot].any():
                    ok = False
                    break
                tot = sum(epochs(profs[j], w[j, s]) for s in range(t))
                e1 = epochs(profs[j], 1)
                if not (job.epochs - 1e-9 <= tot <= job.epochs + e1 + 1e-9):
                    ok = False
                    break
                run = np.nonzero(w[j])[0]
                done.append(int(run.max()))
            if not ok:
                continue
            demand = [e_inf[s] + sum(tr_energy_j(profs[j], w[j, s])
                                     for j in range(len(inst.jobs))) for s in range(t)]
            yield lv, w, demand, carbon_g(inst, demand), lats, done


# --- Problem 2 -------------------------------------------------------------------------------

def test_performance_matches_brute_force():
    inst = tiny()
    best = None
    for lv, w, _demand, c, lats, done in enumerate_plans(inst):
        if any(x > INF.latency_bound_s for x in lats):
            continue
        if any(h > job.deadline_slot for h, job in zip(done, inst.jobs, strict=True)):
            continue
        if best is None or c < best[0]:
            best = (c, lv, w)
    assert best is not None
    plan = milp.solve_performance(inst, milp.MilpOptions(mip_rel_gap=0.0))
    assert plan.info.status == "optimal"
    assert plan.info.objective == pytest.approx(best[0], rel=1e-6)
    assert evaluate(inst, plan).summary.carbon_g == pytest.approx(best[0], rel=1e-6)
    assert plan.info.solve_s >= 0 and plan.info.mip_gap <= 1e-6


def test_performance_bound_forces_higher_clock():
    # at 500 MHz the toy latency is above the 0.06 s bound in every slot
    assert all(lat(500.0, r) > INF.latency_bound_s for r in (60.0, 120.0, 90.0))
    plan = milp.solve_performance(tiny(), milp.MilpOptions(mip_rel_gap=0.0))
    assert (plan.inf_level >= 1).all()


# --- Problem 1 -------------------------------------------------------------------------------

@pytest.mark.parametrize("budget_scale", [1.0, 0.93])
def test_carbon_constrained_matches_brute_force(budget_scale):
    inst = tiny(jobs=((0, 0, 15.0, 1.0), (1, 1, 20.0, 2.0)))
    plans = list(enumerate_plans(inst))
    c_min = min(p[3] for p in plans)
    c_free = min(p[3] for p in plans if all(x <= INF.latency_bound_s for x in p[4]))
    budget = c_min + budget_scale * (c_free - c_min) + 1e-6
    w_inf = 1.0 / INF.latency_bound_s

    def penalty(p):
        lv, w, demand, c, lats, done = p
        f_inf = sum(w_inf * max(x - INF.latency_bound_s, 0.0) for x in lats)
        f_tr = sum(job.priority * max(h - job.deadline_slot, 0)
                   for h, job in zip(done, inst.jobs, strict=True))
        return f_inf + f_tr

    feas = [p for p in plans if p[3] <= budget]
    best_pen = min(penalty(p) for p in feas)
    plan = milp.solve_carbon(inst, budget, milp.MilpOptions(mip_rel_gap=0.0))
    assert plan.info.status == "optimal"
    ev = evaluate(inst, plan).summary
    assert ev.carbon_g <= budget * (1 + 1e-9)
    # objective = penalty + 1e-3 * C / B tie-break (< 1e-3)
    assert plan.info.objective == pytest.approx(best_pen, abs=1.1e-3)
    # among the least-penalty plans, the least carbon one
    c_best = min(p[3] for p in feas if penalty(p) <= best_pen + 1e-9)
    assert ev.carbon_g == pytest.approx(c_best, rel=1e-6)


def test_carbon_budget_below_minimum_is_infeasible():
    inst = tiny()
    c_min = min(p[3] for p in enumerate_plans(inst))
    plan = milp.solve_carbon(inst, 0.9 * c_min)
    assert plan.info.status == "infeasible"
    assert "budget" in plan.info.note
    assert not plan.feasible


# --- Problem 3 -------------------------------------------------------------------------------

def test_ppc_dinkelbach_matches_brute_force():
    inst = tiny()
    w_inf = 0.5
    inv_max = sum(max(1.0 / lat(f, r) for f in LEVELS) for r in inst.rate_rps[0])
    best = -1.0
    for _lv, w, _demand, c, lats, _done in enumerate_plans(inst):
        perf_inf = sum(1.0 / x for x in lats) / inv_max
        perf_tr = np.mean([epochs(job.profile, w[j].sum()) / job.epochs
                           for j, job in enumerate(inst.jobs)])
        best = max(best, (w_inf * perf_inf + (1 - w_inf) * perf_tr) / c)
    plan = milp.solve_ppc(inst, w_inf, milp.MilpOptions(mip_rel_gap=0.0))
    assert plan.info.status == "optimal"
    assert plan.info.iterations >= 2
    # the MILP scales carbon by a constant; compare the achieved ratio directly
    ev = evaluate(inst, plan)
    lats = ev.latency_s[0]
    perf_inf = sum(1.0 / x for x in lats) / inv_max
    perf_tr = np.mean([epochs(job.profile, plan.train_workers[j].sum()) / job.epochs
                       for j, job in enumerate(inst.jobs)])
    ratio = (w_inf * perf_inf + (1 - w_inf) * perf_tr) / ev.summary.carbon_g
    assert ratio == pytest.approx(best, rel=1e-5)


# --- the linearisation ----------------------------------------------------------------------

def _row_activity(mdl, v):
    r = np.concatenate(mdl.rows_r)
    c = np.concatenate(mdl.rows_c)
    val = np.concatenate(mdl.rows_v)
    act = np.zeros(mdl.n_row)
    np.add.at(act, r, val * v[c])
    return act, np.concatenate(mdl.row_lo), np.concatenate(mdl.row_hi)


def test_linearisation_equals_nonlinear_model_on_random_integer_points():
    rng = np.random.default_rng(7)
    inst = tiny(jobs=((0, 2, 15.0, 1.0), (0, 2, 20.0, 2.0)))
    tab = tables(inst)
    ok_y = np.ones_like(tab.latency_s, dtype=bool)
    mdl, lay = milp.build(inst, tab, ok_y, milp.window(inst, False))
    mc_rows = None
    for _ in range(200):
        n = rng.integers(0, NMAX + 1, size=(2, 3))
        x = rng.integers(0, 2, size=(2, 3))
        lv = rng.integers(0, 3, size=3)
        v = np.zeros(mdl.n_col)
        v[lay.x] = x
        v[lay.n] = n
        v[lay.w] = n * x  # the product
        v[lay.y[0, np.arange(3), lv]] = 1.0
        act, lo, hi = _row_activity(mdl, v)
        # McCormick rows are the 5 x (J*T) rows after the H*T one-level rows
        mc_rows = slice(3, 3 + 5 * 6)
        exact_ok = np.all((act[mc_rows] >= lo[mc_rows] - 1e-9) & (act[mc_rows] <= hi[mc_rows]
                                                                     + 1e-9))
        # w = n x is admissible iff a running slot has >= 1 worker (w >= x) and an idle slot
        # has none (n <= n_max x)
        assert exact_ok == bool(np.all(((x == 0) & (n == 0)) | ((x == 1) & (n >= 1))))
        # any other integer w is rejected
        for j, s in itertools.product(range(2), range(3)):
            for alt in range(NMAX + 1):
                if alt == n[j, s] * x[j, s]:
                    continue
                v2 = v.copy()
                v2[lay.w[j, s]] = alt
                a2, _, _ = _row_activity(mdl, v2)
                assert not np.all((a2[mc_rows] >= lo[mc_rows] - 1e-9)
                                  & (a2[mc_rows] <= hi[mc_rows] + 1e-9))
        # energy-balance rows: linear demand equals eq. 11-18 evaluated directly
        demand_kwh = np.array([
            (inf_energy_j(LEVELS[lv[s]], inst.rate_rps[0, s])
             + tr_energy_j(TR_A, n[0, s] * x[0, s]) + tr_energy_j(TR_B, n[1, s] * x[1, s]))
            / 3.6e6 for s in range(3)])
        bal = act[-3:]  # us = uw = g = 0 here, so the row activity is the demand
        assert np.allclose(bal, demand_kwh, rtol=1e-12)
        # epochs rows: sum_t e_j w equals eq. 4 summed over slots
        ep_rows = act[3 + 30: 3 + 30 + 2]
        want = [sum(epochs(p, n[j, s] * x[j, s]) for s in range(3))
                for j, p in enumerate((TR_A, TR_B))]
        assert np.allclose(ep_rows, want, rtol=1e-12)
    assert mc_rows is not None


# --- Problem 1's aggregated model against the reference model -------------------------------

def small_paper_instance(workload="medium", n_jobs=6):
    """The paper's 24 h instance (4 sub-clusters, 5 clocks, real supply) with a few jobs."""
    from services.carm.workload import paper_instance

    return paper_instance(workload, 0, n_jobs=n_jobs)


def _budget(inst, frac):
    """C_min (reference model) + frac x (C of baseline-MAX - C_min), plus rounding room."""
    from services.carm import baselines

    c_min = milp.min_carbon_g(inst, EXACT, formulation="reference")
    c_max = evaluate(inst, baselines.fixed_clock(inst, -1, "baseline-max")).summary.carbon_g
    return c_min + frac * max(c_max - c_min, 0.0) + 1e-7 * c_min


EXACT = milp.MilpOptions(mip_rel_gap=0.0, time_limit_s=60.0)


@pytest.mark.parametrize("case", [("tiny", 1.0), ("tiny", 0.5), ("medium", 0.0),
                                  ("medium", 0.05), ("medium", 0.3), ("heavy", 0.0),
                                  ("heavy", 0.05)], ids=lambda c: f"{c[0]}-{c[1]:g}")
def test_tight_carbon_model_has_the_reference_optimum(case):
    """Problem 1 on the aggregated model (default) and on the reference model: same optimum.

    medium: one undominated clock per (i, t), so the lexicographic pair of MILPs; heavy and
    tiny: clock choices with different penalties, one MILP."""
    where, frac = case
    if where == "tiny":
        inst = tiny(jobs=((0, 0, 15.0, 1.0), (1, 1, 20.0, 2.0)))
        plans = list(enumerate_plans(inst))
        c_min = min(p[3] for p in plans)
        c_free = min(p[3] for p in plans if all(x <= INF.latency_bound_s for x in p[4]))
        budget = c_min + frac * (c_free - c_min) + 1e-6
    else:
        inst = small_paper_instance(where, 6 if where == "medium" else 8)
        budget = _budget(inst, frac)
    ref = milp.solve_carbon(inst, budget, EXACT, formulation="reference")
    new = milp.solve_carbon(inst, budget, EXACT)
    assert ref.info.status == "optimal" and new.info.status == "optimal"
    # HiGHS stops at an absolute gap of 1e-6 (its default) even with a zero relative gap
    assert new.info.objective == pytest.approx(ref.info.objective, rel=1e-7, abs=2e-6)
    ev_new, ev_ref = evaluate(inst, new).summary, evaluate(inst, ref).summary
    assert ev_new.carbon_g <= budget * (1 + 1e-9)
    if frac <= 0.05:
        # tight budgets trade tardiness for carbon, so the z/d part of the model matters
        assert ev_ref.training_deadlines_missed > 0 and ev_new.training_deadlines_missed > 0


def test_paper_instance_takes_the_lexicographic_path(monkeypatch):
    # medium-mix penalties: one undominated clock per (i, t), integer priorities
    inst = small_paper_instance("medium", 6)
    tab = tables(inst)
    pen = inst.inference_weights()[:, None, None] * np.maximum(
        tab.latency_s - inst.latency_bounds_s()[:, None, None], 0.0)
    keep = milp.undominated_levels(pen, tab.inf_energy_j)
    prio = np.array([j.priority for j in inst.jobs])
    assert milp._integral_penalties(pen, keep, prio)
    calls = []
    real = milp._solve_lexicographic

    def spy(*a, **k):
        out = real(*a, **k)
        calls.append(out[5])
        return out

    monkeypatch.setattr(milp, "_solve_lexicographic", spy)
    budget = _budget(inst, 0.05)
    ref = milp.solve_carbon(inst, budget, EXACT, formulation="reference")
    # default tolerances: F_tr's optimum is proven by MILP 1 and the tie-break (< 1e-3) is
    # inside the relative gap, so MILP 2 is skipped
    plan = milp.solve_carbon(inst, budget)
    assert calls == [1] and plan.info.iterations == 2  # least-carbon start + MILP 1
    assert plan.info.status == "optimal" and plan.info.mip_gap <= 1e-4
    assert plan.info.objective == pytest.approx(ref.info.objective, rel=1e-4)
    assert np.floor(plan.info.objective) == np.floor(ref.info.objective)  # same F_tr
    # a zero gap needs MILP 2 for the tie-break
    exact = milp.solve_carbon(inst, budget, EXACT)
    assert calls == [1, 2] and exact.info.iterations == 3
    assert exact.info.objective == pytest.approx(ref.info.objective, rel=1e-7, abs=2e-6)


def test_min_carbon_tight_equals_reference():
    for inst in (tiny(), small_paper_instance("medium"), small_paper_instance("heavy", 8)):
        ref = milp.min_carbon_g(inst, EXACT, formulation="reference")
        assert milp.min_carbon_g(inst, EXACT) == pytest.approx(ref, rel=1e-8)
    brute = min(p[3] for p in enumerate_plans(tiny()))
    assert milp.min_carbon_g(tiny(), EXACT) == pytest.approx(brute, rel=1e-6)


def test_every_reference_plan_is_a_point_of_the_tight_model():
    """The tail cuts and worker-slot rows remove no plan: every plan the brute force admits
    (all clocks allowed, any budget) satisfies every row of ``build_tight``."""
    inst = tiny(jobs=((0, 0, 15.0, 1.0), (1, 1, 20.0, 2.0)))
    tab = tables(inst)
    all_y = np.ones_like(tab.latency_s, dtype=bool)
    mdl, lay = milp.build_tight(inst, tab, all_y, milp.window(inst, False), tardiness=True)
    ref, lay_r = milp.build(inst, tab, all_y, milp.window(inst, False), tardiness=True)
    n = 0
    for lv, w, _demand, _c, _lats, done in enumerate_plans(inst):
        v = milp.start_vector(inst, tab, lay, mdl.n_col, np.array([lv]), w)
        assert milp.feasible_start(mdl, v), (lv, w.tolist())
        # ... and of the reference model (x = [w > 0], n = w)
        assert milp.feasible_start(ref, milp.start_vector(inst, tab, lay_r, ref.n_col,
                                                           np.array([lv]), w))
        # d is the number of slots after the deadline up to the job's last running slot
        want = [max(h - j.deadline_slot, 0) for h, j in zip(done, inst.jobs, strict=True)]
        assert v[lay.d].tolist() == want
        n += 1
    assert n > 50
    # and a point outside: job 0 never runs
    w_bad = np.array([[0, 0, 0], [0, 2, 0]])
    v = milp.start_vector(inst, tab, lay, mdl.n_col, np.array([[2, 2, 2]]), w_bad)
    assert not milp.feasible_start(mdl, v)


def test_undominated_levels():
    cost = np.array([[[3.0, 1.0, 0.0, 0.0, 2.0]]])
    energy = np.array([[[5.0, 4.0, 4.0, 6.0, 1.0]]])
    # level 0 is beaten by 1 and 2; level 1 by 2 (same energy, lower cost); level 3 by 2
    assert milp.undominated_levels(cost, energy).tolist() == [[[False, False, True, False,
                                                                True]]]
    # identical levels: the higher clock stays
    same = np.ones((1, 1, 3))
    assert milp.undominated_levels(same, same).tolist() == [[[False, False, True]]]
    # a level outside ``allowed`` dominates nothing (without level 2, level 3 has the least
    # cost) and is not kept
    allowed = np.array([[[True, True, False, True, True]]])
    assert milp.undominated_levels(cost, energy, allowed).tolist() == [[[False, True, False,
                                                                         True, True]]]


@pytest.mark.parametrize("which", ["tiny", "paper"])
def test_warm_start_is_feasible(which):
    inst = tiny() if which == "tiny" else small_paper_instance("heavy", 8)
    budget = (min(p[3] for p in enumerate_plans(inst)) * 1.05 if which == "tiny"
              else _budget(inst, 0.05))
    tab = tables(inst)
    pen = inst.inference_weights()[:, None, None] * np.maximum(
        tab.latency_s - inst.latency_bounds_s()[:, None, None], 0.0)
    keep = milp.undominated_levels(pen, tab.inf_energy_j)
    mdl, lay = milp.build_tight(inst, tab, keep, milp.window(inst, False), tardiness=True,
                                carbon_budget_g=budget)
    low = milp.min_carbon_plan(inst, EXACT)
    assert low.info.status == "optimal"
    v = milp.start_vector(inst, tab, lay, mdl.n_col, low.inf_level, low.train_workers, keep, pen)
    assert milp.feasible_start(mdl, v)
    assert mdl.max_violation(v) <= 1e-7
    # the point's carbon is the plan's carbon as the evaluator computes it
    c_start = float(milp.carbon_cost(inst, lay, mdl.n_col) @ v)
    assert c_start <= evaluate(inst, low).summary.carbon_g * (1 + 1e-9) <= budget
    # the same plan under a budget it breaks is not a valid start
    mdl2, lay2 = milp.build_tight(inst, tab, keep, milp.window(inst, False), tardiness=True,
                                  carbon_budget_g=0.99 * c_start)
    v2 = milp.start_vector(inst, tab, lay2, mdl2.n_col, low.inf_level, low.train_workers, keep,
                           pen)
    assert not milp.feasible_start(mdl2, v2)
    # Problem 1 from that start is no worse than the start
    cost = np.zeros(mdl.n_col)
    cost[lay.y] = pen
    cost[lay.d] = [j.priority for j in inst.jobs]
    cost += 1e-3 * milp.carbon_cost(inst, lay, mdl.n_col) / budget
    plan = milp.solve_carbon(inst, budget, EXACT, start=low)
    assert plan.info.status == "optimal"
    assert plan.info.objective <= float(cost @ v) + 1e-9



def test_carbon_at_its_time_limit_keeps_its_incumbent():
    # the paper's medium instance needs ~30 s; at 1.5 s MILP 1 stops with an incumbent (at
    # worst the least-carbon start) and its bound (-inf if the root LP did not finish), and
    # that is what Problem 1 reports
    from services.carm import methods
    from services.carm.workload import paper_instance

    inst = paper_instance("medium", 0)
    budget = methods.carbon_budget(inst, methods.MethodConfig())
    plan = milp.solve_carbon(inst, budget, milp.MilpOptions(time_limit_s=1.5))
    assert plan.info.status == "time_limit"
    assert plan.info.mip_gap > 0.0  # not NaN
    assert np.isfinite(plan.info.objective) and plan.info.solve_s < 10.0
    assert evaluate(inst, plan).summary.carbon_g <= budget * (1 + 1e-9)
