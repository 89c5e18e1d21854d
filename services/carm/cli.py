"""``geoserve carm ...``: the standalone CA-RM reproduction (paper 2 §5).

``geoserve carm simulate --workload light|medium|heavy --method NAME [--json] [--seed N]`` builds
the paper's 24 h x 15-min instance, runs one method and prints its metrics;
``geoserve carm report`` runs every method on every workload and writes
``docs/carm-results.md`` with plots in ``docs/img/``;
``geoserve carm joint [--out docs/carm-joint.md]`` runs the joint geo-scheduling x CA-RM
experiment on ``topologies/joint.yaml`` in the virtual runtime (``services/carm/joint.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from services.carm import methods
from services.carm.milp import MilpOptions
from services.model.errors import InvalidInput

WORKLOADS = ("light", "medium", "heavy")


def _silence_highs_banner() -> None:
    """HiGHS prints a banner on stdout (C level) at the first ``Highs()``; keep --json clean."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def method_config(args: argparse.Namespace) -> methods.MethodConfig:
    from services.carm.renewables import load_site

    site = load_site()
    if args.carbon_budget_g is not None and not args.carbon_budget_g > 0:
        raise InvalidInput("carbon_budget_g", f"expected > 0, got {args.carbon_budget_g}")
    if args.power_cap_w is not None and not args.power_cap_w > 0:
        raise InvalidInput("power_cap_w", f"expected > 0, got {args.power_cap_w}")
    if not args.time_limit_s > 0:
        raise InvalidInput("time_limit_s", f"expected > 0, got {args.time_limit_s}")
    return methods.MethodConfig(
        carbon_budget_g=args.carbon_budget_g,
        carbon_budget_fraction=float(site["carbon_budget_fraction"]),
        power_cap_w=args.power_cap_w,
        power_cap_fraction=float(site["power_cap_fraction"]),
        milp=MilpOptions(time_limit_s=args.time_limit_s),
    )


def simulate_one(workload: str, method: str, seed: int, cfg: methods.MethodConfig
                 ) -> dict[str, Any]:
    from services.carm.evaluate import evaluate
    from services.carm.workload import paper_instance

    methods.get(method)  # validate the name before building anything
    inst = paper_instance(workload, seed)
    plan = methods.run(method, inst, cfg)
    out = evaluate(inst, plan).summary.as_dict()
    out["seed"] = seed
    return out


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.workload not in WORKLOADS:
        raise InvalidInput("workload", f"unknown workload {args.workload!r}; expected {WORKLOADS}")
    methods.get(args.method)
    if args.seed < 0:
        raise InvalidInput("seed", f"expected >= 0, got {args.seed}")
    cfg = method_config(args)
    _silence_highs_banner()
    res = simulate_one(args.workload, args.method, args.seed, cfg)
    infeasible = res["status"] in ("infeasible", "no_solution", "model_error")
    if args.json:
        print(json.dumps(_clean(res), indent=2))
    else:
        print(f"CA-RM {args.method} on the {args.workload} workload (seed {args.seed})")
        print(f"  status                 {res['status']}  {res['note']}")
        print(f"  carbon                 {res['carbon_g']:.0f} gCO2e")
        ren_kwh, grid_kwh = res["renewable_used_j"] / 3.6e6, res["grid_j"] / 3.6e6
        print(f"  energy                 {res['energy_j'] / 3.6e6:.1f} kWh "
              f"(renewable {ren_kwh:.1f}, grid {grid_kwh:.1f})")
        print(f"  PPC inference/training {res['ppc_inference']:.4g} (1/s)/g, "
              f"{res['ppc_training']:.4g} epochs/g")
        print(f"  SLA violation ratio    {res['sla_violation_ratio']:.3f} (inference "
              f"{res['inference_sla_violation_ratio']:.3f}, deadlines missed "
              f"{res['training_deadlines_missed']}/{res['training_jobs']})")
        print(f"  solve                  {res['solve_s']:.2f} s, gap {res['mip_gap']:.2g}, "
              f"{res['iterations']} MILP(s)")
    if infeasible:
        print(f"geoserve: carm: {args.method} is infeasible: {res['note']}", file=sys.stderr)
        return 3
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from services.carm.report import write_report

    cfg = method_config(args)
    _silence_highs_banner()
    path = write_report(args.out, args.img_dir, args.seed, cfg, progress=sys.stderr)
    print(f"wrote {path}")
    return 0


def cmd_joint(args: argparse.Namespace) -> int:
    from pathlib import Path

    from services.carm.joint import run_joint, verdict_text, write_joint
    from services.config.topology import load_topology

    if args.duration is not None and not args.duration > 0:
        raise InvalidInput("duration", f"expected > 0, got {args.duration}")
    cfg: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in args.policy_config.split(","))):
        k, sep, v = item.partition("=")
        if not sep:
            raise InvalidInput("policy_config", f"expected KEY=VALUE, got {item!r}")
        try:
            cfg[k.strip()] = float(v)
        except ValueError:
            cfg[k.strip()] = v.strip()
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput("--seeds", f"expected integers, got {args.seeds!r}") from None
    if len(set(seeds)) != len(seeds):
        raise InvalidInput("--seeds", f"expected distinct integers, got {args.seeds!r}")
    _silence_highs_banner()
    from services.carm.joint import mean_rows

    per_seed = run_joint(args.topology, args.policy, cfg or None, args.duration,
                         progress=lambda m: print(m, file=sys.stderr, flush=True),
                         seeds=seeds or None)
    rows = mean_rows(per_seed)
    topo = load_topology(args.topology)
    if args.duration is not None:
        topo = topo.with_overrides(duration_s=args.duration)
    from services.carm.joint import seed_consistency

    verdict = verdict_text(rows)
    if seed_consistency(per_seed):
        verdict += "\n\n" + seed_consistency(per_seed)
    print(verdict)
    if args.json:
        print(json.dumps(per_seed, indent=2, default=str))
    if args.out:
        out = Path(args.out)
        img = Path(args.img_dir) / "carm_joint.png"
        write_joint(rows, topo, out, img, verdict, per_seed)
        print(f"wrote {out} and {img}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="workload generator seed (default 0)")
    p.add_argument("--time-limit-s", type=float, default=MilpOptions().time_limit_s,
                   help=f"HiGHS time limit per MILP (default {MilpOptions().time_limit_s:g})")
    p.add_argument("--carbon-budget-g", type=float, default=None,
                   help="Problem 1 budget B in gCO2e (default: from data/carm/site.yaml)")
    p.add_argument("--power-cap-w", type=float, default=None,
                   help="PowerCap budget in W (default: from data/carm/site.yaml)")


def register(subparsers: Any) -> None:
    carm = subparsers.add_parser("carm", help="carbon-aware resource management (paper 2)")
    sub = carm.add_subparsers(dest="carm_command", metavar="SUBCOMMAND")
    carm.set_defaults(func=lambda a: (carm.print_help(), 2)[1])
    sim = sub.add_parser("simulate", help="run one method on the paper's 24 h instance")
    sim.add_argument("--workload", required=True, help="light | medium | heavy")
    sim.add_argument("--method", required=True,
                     help="one of: " + ", ".join(methods.REGISTRY))
    sim.add_argument("--json", action="store_true", help="print the metrics as JSON")
    _common(sim)
    sim.set_defaults(func=cmd_simulate)
    rep = sub.add_parser("report", help="run every method x workload, write docs/carm-results.md")
    rep.add_argument("--out", default="docs/carm-results.md")
    rep.add_argument("--img-dir", default="docs/img")
    _common(rep)
    rep.set_defaults(func=cmd_report)
    jo = sub.add_parser("joint", help="geo-scheduling x CA-RM on topologies/joint.yaml "
                                      "(virtual runtime, 4 runs)")
    jo.add_argument("--topology", default="joint", help="topology with a carm section")
    jo.add_argument("--policy", default="greedy", help="the geo-scheduler (default greedy)")
    jo.add_argument("--policy-config", default="",
                    help="KEY=VALUE,... for the geo-scheduler (default alpha=0.5 for greedy)")
    jo.add_argument("--duration", type=float, default=None,
                    help="emulated seconds of load (default: the topology's)")
    jo.add_argument("--seeds", default="",
                    help="load seeds, comma-separated (default: the topology's); the report "
                         "gives means over them and each seed's runs")
    jo.add_argument("--out", default=None, help="write the markdown here (e.g. "
                                                "docs/carm-joint.md) and the PNG to --img-dir")
    jo.add_argument("--img-dir", default="docs/img")
    jo.add_argument("--json", action="store_true", help="print every run's figures as JSON")
    jo.set_defaults(func=cmd_joint)
