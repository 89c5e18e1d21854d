"""Policy x load sweeps on the virtual runtime, in parallel worker processes.

Each point is one `SimRun` of the topology at one rate with one policy (and its config);
summaries are written as JSON under the sweep's folder so a report can be rebuilt
without re-running. Points already present are reused unless ``force`` is set.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.config.topology import load_topology
from services.sim.runtime import SimRun

# (label, policy, config): the policies of paper 1 §V, greedy at three alphas
DEFAULT_POLICIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("round-robin", "round-robin", {}),
    ("least-loaded", "least-loaded", {}),
    ("greedy-a0", "greedy", {"alpha": 0.0}),
    ("greedy-a0.5", "greedy", {"alpha": 0.5}),
    ("greedy-a0.9", "greedy", {"alpha": 0.9}),
    ("moer", "moer", {}),
    ("green-llm", "green-llm", {}),
    ("ilp", "ilp", {}),
    ("iterative-ilp", "iterative-ilp", {}),
    ("facility-milp", "facility-milp", {}),
)

# Carbon-aware policies re-run with ``project_peers: false`` (own dispatches only) for
# the report's ablation of the peer projection.
ABLATION_LABELS: tuple[str, ...] = ("greedy-a0", "moer", "ilp", "iterative-ilp",
                                    "facility-milp")


@dataclass(frozen=True)
class Point:
    topology: str
    label: str
    policy: str
    config: dict[str, Any] = field(default_factory=dict)
    rate_rps: float = 1200.0
    duration_s: float = 200.0   # the paper's 200 s per point
    warmup_s: float = 15.0
    seed: int = 1
    project_peers: bool = True

    @property
    def key(self) -> str:
        own = "" if self.project_peers else "_own-only"
        seed = "" if self.seed == 1 else f"_s{self.seed}"
        return f"{Path(self.topology).stem}_{self.label}_{self.rate_rps:g}{own}{seed}"


def run_point(p: Point) -> dict[str, Any]:
    topo = load_topology(p.topology).with_overrides(
        policy=p.policy, policy_config=p.config, rate_rps=p.rate_rps,
        duration_s=p.duration_s, warmup_s=p.warmup_s, seed=p.seed,
        project_peers=p.project_peers,
    )
    summary = SimRun(topo).run()
    summary["point"] = {"label": p.label, "policy": p.policy, "config": p.config,
                        "rate_rps": p.rate_rps, "topology": p.topology,
                        "project_peers": p.project_peers}
    return summary


def _worker(args: tuple[Point, str]) -> tuple[str, float]:
    p, out = args
    t0 = time.monotonic()
    s = run_point(p)
    Path(out, f"{p.key}.json").write_text(json.dumps(s, indent=1, default=str) + "\n")
    return p.key, time.monotonic() - t0


def run_sweep(points: Sequence[Point], out_dir: Path, jobs: int = 2,
              force: bool = False) -> list[dict[str, Any]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [p for p in points if force or not (out_dir / f"{p.key}.json").exists()]
    print(f"sweep: {len(points)} points, {len(points) - len(todo)} already done, "
          f"{len(todo)} to run on {jobs} workers -> {out_dir}", flush=True)
    t0 = time.monotonic()
    if todo:
        ctx = mp.get_context("spawn")
        with ctx.Pool(jobs) as pool:
            for n, (key, took) in enumerate(
                pool.imap_unordered(_worker, [(p, str(out_dir)) for p in todo]), 1
            ):
                print(f"  [{n}/{len(todo)}] {key}: {took:.0f} s "
                      f"(elapsed {time.monotonic() - t0:.0f} s)", flush=True)
    return [json.loads((out_dir / f"{p.key}.json").read_text()) for p in points]
