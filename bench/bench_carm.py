"""Solve time per CA-RM formulation on the paper's 24 h x 15-min instance (100 nodes).

Usage: .venv/bin/python bench/bench_carm.py [--workloads light,medium,heavy] [--time-limit-s 60]
                                            [--reference]
Prints, per workload and formulation: HiGHS status, solve seconds (HiGHS run time, summed over
the MILPs of one method: Dinkelbach iterations for PPC, the two lexicographic MILPs of Problem 1),
number of MILPs, relative MIP gap and the size of the model the formulation solves (Problem 1:
the aggregated model of ``milp.build_tight``; the others: ``milp.build``). ``--reference`` adds
Problem 1 on the reference model (``carbon-ref``, the formulation before the aggregated one).
Problem 1's budget (least carbon + 5 % of the way to baseline-MAX) is computed first and not
counted. Figures, not a pass/fail test.
"""

from __future__ import annotations

import argparse

import numpy as np

from services.carm import methods, milp
from services.carm.problem import Instance, tables
from services.carm.workload import paper_instance


def _size(inst: Instance, name: str, budget: float) -> tuple[int, int, int]:
    tab = tables(inst)
    all_y = np.ones_like(tab.latency_s, dtype=bool)
    if name == "carbon":
        pen = inst.inference_weights()[:, None, None] * np.maximum(
            tab.latency_s - inst.latency_bounds_s()[:, None, None], 0.0)
        mdl, _ = milp.build_tight(inst, tab, milp.undominated_levels(pen, tab.inf_energy_j),
                                  milp.window(inst, False), tardiness=True,
                                  carbon_budget_g=budget)
    elif name == "carbon-ref":
        mdl, _ = milp.build(inst, tab, all_y, milp.window(inst, False), tardiness=True,
                            carbon_budget_g=budget)
    else:
        mdl, _ = milp.build(inst, tab, all_y, milp.window(inst, False))
    return mdl.n_col, mdl.n_row, int(np.concatenate(mdl.integer).sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="light,medium,heavy")
    ap.add_argument("--time-limit-s", type=float, default=milp.MilpOptions().time_limit_s)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true",
                    help="also solve Problem 1 on the reference model (carbon-ref)")
    args = ap.parse_args()
    opts = milp.MilpOptions(time_limit_s=args.time_limit_s)
    cfg = methods.MethodConfig(milp=opts)
    print(f"{'workload':8s} {'formulation':16s} {'status':10s} {'solve_s':>8s} {'MILPs':>5s} "
          f"{'gap':>8s} {'objective':>12s} {'cols':>6s} {'rows':>6s} {'int':>6s}")
    names = ["carbon"] + (["carbon-ref"] if args.reference else []) + [
        "performance", "ppc", "energycost"]
    for wl in args.workloads.split(","):
        inst = paper_instance(wl, args.seed)
        budget = methods.carbon_budget(inst, cfg)
        for name in names:
            if name == "carbon-ref":
                p = milp.solve_carbon(inst, budget, opts, formulation="reference")
            else:
                p = methods.run(name, inst, cfg)
            n_col, n_row, n_int = _size(inst, name, budget)
            print(f"{wl:8s} {name:16s} {p.info.status:10s} {p.info.solve_s:8.2f} "
                  f"{p.info.iterations:5d} {p.info.mip_gap:8.1e} {p.info.objective:12.6g} "
                  f"{n_col:6d} {n_row:6d} {n_int:6d}", flush=True)


if __name__ == "__main__":
    main()
