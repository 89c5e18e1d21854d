"""``geoserve sweep``: every policy at several loads on the virtual runtime -> docs/results.md."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from services.config.topology import ROOT
from services.model.errors import InvalidInput
from services.sweep.run import Point


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="policy x load sweep (virtual runtime) and results report",
                       description=__doc__)
    p.add_argument("--topology", default="topologies/base.yaml")
    p.add_argument("--rates", default="1200,2400,4000", help="req/s, comma-separated")
    p.add_argument("--policies", default="",
                   help="labels to run (default: all of paper 1 §V, greedy at 3 alphas)")
    p.add_argument("--duration", type=float, default=Point.duration_s,
                   help="emulated s per point (the paper: 200)")
    p.add_argument("--warmup", type=float, default=Point.warmup_s,
                   help="emulated s excluded from the statistics")
    p.add_argument("--seeds", default="1",
                   help="load seeds, comma-separated; with several, the report gives means "
                        "and standard deviations (default 1)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (local executor)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where points run: local worker processes, or one Ray task per "
                        "point (default local)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address HOST:PORT (--executor ray; default: start a "
                        "local Ray cluster)")
    p.add_argument("--deterministic", action="store_true",
                   help="do not charge solver time to emulated time: every point's summary "
                        "then depends on the point alone (equal on every executor)")
    p.add_argument("--out", default="results/sweep", help="folder of per-point summaries")
    p.add_argument("--doc", default="docs/results.md",
                   help="report to write; a hand-written NAME-notes.md beside it is appended")
    p.add_argument("--force", action="store_true", help="re-run points already done")
    p.add_argument("--wall-check", default="small:greedy-a0.5:12:60",
                   help="TOPOLOGY:LABEL:RATE:DURATION re-run on the wall runtime too "
                        "('' to skip)")
    p.add_argument("--report-only", action="store_true", help="rebuild the report only")
    p.add_argument("--no-ablation", action="store_true",
                   help="skip the re-runs of the carbon-aware policies with project_peers "
                        "off (own dispatches only)")
    p.set_defaults(func=cmd_sweep)


def _wall_check(spec: str, out: Path, policies: dict[str, tuple[str, dict[str, Any]]],
                seed: int, force: bool) -> dict[str, Any] | None:
    from services.config.topology import load_topology
    from services.sim.runtime import SimRun

    if not spec:
        return None
    try:
        topo_name, label, rate, duration = spec.split(":")
        policy, config = policies[label]
    except (ValueError, KeyError) as exc:
        raise InvalidInput("--wall-check", f"expected TOPOLOGY:LABEL:RATE:DURATION with a "
                           f"known label, got {spec!r}") from exc
    path = out / f"wallcheck_{topo_name}_{label}_{rate}.json"
    if path.exists() and not force:
        return dict(json.loads(path.read_text()))
    topo = load_topology(topo_name).with_overrides(
        policy=policy, policy_config=config, rate_rps=float(rate), duration_s=float(duration),
        seed=seed)
    print(f"wall check: {spec} on the virtual runtime, then as processes", flush=True)
    sim = SimRun(topo).run()
    wall_out = out / f"wallcheck_{topo_name}_{label}_{rate}_run"
    cfg = ",".join(f"{k}={v}" for k, v in config.items())
    cmd = [sys.executable, "-m", "services.cli", "run", "--topology", topo_name,
           "--policy", policy, "--rate", rate, "--duration", duration, "--seed", str(seed),
           "--out", str(wall_out)] + (["--policy-config", cfg] if cfg else [])
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = json.loads((wall_out / "summary.json").read_text())
    result = {"sim": sim, "wall": wall}
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def cmd_sweep(args: argparse.Namespace) -> int:
    from services.sweep.report import render
    from services.sweep.run import ABLATION_LABELS, DEFAULT_POLICIES, run_sweep

    known = {label: (policy, cfg) for label, policy, cfg in DEFAULT_POLICIES}
    labels = [s for s in args.policies.split(",") if s] or [lb for lb, _, _ in DEFAULT_POLICIES]
    unknown = [lb for lb in labels if lb not in known]
    if unknown:
        raise InvalidInput("--policies", f"unknown labels {unknown}; known: {sorted(known)}")
    if "round-robin" not in labels:
        labels.insert(0, "round-robin")  # savings are relative to it
    try:
        rates = [float(r) for r in args.rates.split(",") if r]
    except ValueError as exc:
        raise InvalidInput("--rates", f"expected numbers, got {args.rates!r}") from exc
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except ValueError as exc:
        raise InvalidInput("--seeds", f"expected integers, got {args.seeds!r}") from exc
    if not seeds or len(set(seeds)) != len(seeds):
        raise InvalidInput("--seeds", f"expected distinct integers, got {args.seeds!r}")
    if args.jobs < 1:
        raise InvalidInput("--jobs", f"expected at least 1, got {args.jobs}")
    if args.address and args.executor != "ray":
        raise InvalidInput("--address", "only with --executor ray")
    charge = not args.deterministic
    points = [
        Point(args.topology, lb, known[lb][0], known[lb][1], rate, args.duration, args.warmup,
              seed, charge_solver_time=charge)
        for seed in seeds
        for rate in rates
        for lb in labels
    ]
    if not args.no_ablation:
        points += [
            Point(args.topology, lb, known[lb][0], known[lb][1], rate, args.duration,
                  args.warmup, seed, project_peers=False, charge_solver_time=charge)
            for seed in seeds
            for rate in rates
            for lb in labels
            if lb in ABLATION_LABELS
        ]
    out = Path(args.out)
    t0 = time.monotonic()
    if args.report_only:
        summaries = [json.loads((out / f"{p.key}.json").read_text()) for p in points
                     if (out / f"{p.key}.json").exists()]
    else:
        summaries = run_sweep(points, out, jobs=args.jobs, force=args.force,
                              executor=args.executor, address=args.address)
    wall = _wall_check(args.wall_check, out, known, seeds[0], args.force)
    doc = Path(args.doc)
    # the command that re-creates this report: the settings that shape it, defaults left out
    parts = [("topology", args.topology), ("rates", args.rates),
             ("duration", f"{args.duration:g}"), ("warmup", f"{args.warmup:g}")]
    if args.policies:
        parts.append(("policies", args.policies))
    if seeds != [1]:
        parts.append(("seeds", args.seeds))
    if args.out != "results/sweep":
        parts.append(("out", args.out))
    if args.doc != "docs/results.md":
        parts.append(("doc", args.doc))
    if args.wall_check != "small:greedy-a0.5:12:60":
        parts.append(("wall-check", args.wall_check or "''"))
    command = "geoserve sweep " + " ".join(f"--{k} {v}" for k, v in parts) + (
        " --no-ablation" if args.no_ablation else "") + (
        " --deterministic" if args.deterministic else "")
    main = [s for s in summaries if s["point"].get("project_peers", True)]
    ablation = [s for s in summaries if not s["point"].get("project_peers", True)]
    render(main, doc, doc.parent / "img", command, wall, ablation)
    notes = doc.with_name(f"{doc.stem}-notes.md")  # docs/results.md <- docs/results-notes.md
    if notes.exists():
        with doc.open("a") as f:
            f.write("\n" + notes.read_text())
    print(f"sweep done in {time.monotonic() - t0:.0f} s: {doc}")
    return 0
