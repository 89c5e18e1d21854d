"""Solve time per CA-RM formulation on the paper's 24 h x 15-min instance (100 nodes).

Usage: .venv/bin/python bench/bench_carm.py [--workloads light,medium,heavy] [--time-limit-s 120]
Prints, per workload and formulation: HiGHS status, solve seconds (HiGHS run time, summed over
Dinkelbach iterations for PPC), number of MILPs, relative MIP gap and the model size.
Figures, not a pass/fail test.
"""

from __future__ import annotations

import argparse

import numpy as np

from services.carm import methods, milp
from services.carm.problem import tables
from services.carm.workload import paper_instance


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="light,medium,heavy")
    ap.add_argument("--time-limit-s", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    opts = milp.MilpOptions(time_limit_s=args.time_limit_s)
    cfg = methods.MethodConfig(milp=opts)
    print(f"{'workload':8s} {'formulation':16s} {'status':10s} {'solve_s':>8s} {'MILPs':>5s} "
          f"{'gap':>8s} {'cols':>6s} {'rows':>6s} {'int':>6s}")
    for wl in args.workloads.split(","):
        inst = paper_instance(wl, args.seed)
        tab = tables(inst)
        mdl, _ = milp.build(inst, tab, np.ones_like(tab.latency_s, dtype=bool),
                            milp.window(inst, False))
        n_int = int(np.concatenate(mdl.integer).sum())
        for name in ("carbon", "performance", "ppc", "energycost"):
            p = methods.run(name, inst, cfg)
            print(f"{wl:8s} {name:16s} {p.info.status:10s} {p.info.solve_s:8.2f} "
                  f"{p.info.iterations:5d} {p.info.mip_gap:8.1e} {mdl.n_col:6d} {mdl.n_row:6d} "
                  f"{n_int:6d}", flush=True)


if __name__ == "__main__":
    main()
