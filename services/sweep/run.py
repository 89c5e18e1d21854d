"""Policy x load sweeps on the virtual runtime, in parallel worker processes or on Ray.

Each point is one `SimRun` of the topology at one rate with one policy (and its config);
summaries are written as JSON under the sweep's folder so a report can be rebuilt
without re-running. Points already present are reused unless ``force`` is set.

Executors (`run_sweep`): ``local``, a pool of ``jobs`` worker processes on this machine,
and ``ray``, one Ray task per point on a Ray cluster (`services.sweep.ray_exec`). Either
way the sweep's own process writes each point's JSON once, when its result arrives, and
prints progress as points done / running / left. With ``charge_solver_time`` off
(``geoserve sweep --deterministic``) a point's summary depends on the point alone, so
every executor gives the same summaries (`deterministic_view`: all but the run's wall
time).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Callable, Iterable, Sequence
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
    # off: solver time is not charged to emulated time, and the point is deterministic
    charge_solver_time: bool = True

    @property
    def key(self) -> str:
        own = "" if self.project_peers else "_own-only"
        seed = "" if self.seed == 1 else f"_s{self.seed}"
        det = "" if self.charge_solver_time else "_det"
        return f"{Path(self.topology).stem}_{self.label}_{self.rate_rps:g}{own}{seed}{det}"


def run_point(p: Point) -> dict[str, Any]:
    topo = load_topology(p.topology).with_overrides(
        policy=p.policy, policy_config=p.config, rate_rps=p.rate_rps,
        duration_s=p.duration_s, warmup_s=p.warmup_s, seed=p.seed,
        project_peers=p.project_peers,
    )
    summary = SimRun(topo, charge_solver_time=p.charge_solver_time).run()
    summary["point"] = {"label": p.label, "policy": p.policy, "config": p.config,
                        "rate_rps": p.rate_rps, "topology": p.topology,
                        "project_peers": p.project_peers}
    return summary


# What a summary measures of the machine that ran it, not of the emulated system.
WALL_KEYS: tuple[tuple[str, ...], ...] = (("emulation", "wall_s"),)


def deterministic_view(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` without `WALL_KEYS`: equal for equal points when solver time is not
    charged, whichever executor or machine ran them."""
    out = json.loads(json.dumps(summary, default=str))
    for path in WALL_KEYS:
        node = out
        for k in path[:-1]:
            node = node.get(k, {})
        node.pop(path[-1], None)
    return dict(out)


def timed_point(p: Point) -> tuple[str, float, str]:
    """Run `p`; (key, wall s, summary JSON). The task every executor runs."""
    t0 = time.monotonic()
    text = json.dumps(run_point(p), indent=1, default=str) + "\n"
    return p.key, time.monotonic() - t0, text


class Progress:
    """Points done / running / left, printed as each result arrives."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.t0 = time.monotonic()

    def line(self, running: int, key: str = "", took: float | None = None) -> str:
        left = self.total - self.done - running
        what = f" {key}: {took:.0f} s" if key and took is not None else ""
        return (f"  [done {self.done}/{self.total} | running {running} | left {left}]{what} "
                f"(elapsed {time.monotonic() - self.t0:.0f} s)")


# runs points; yields (key, wall s, summary JSON, points running now) as each finishes,
# or (None, 0, "", running) as a heartbeat while none does
Executor = Callable[[Sequence[Point]], Iterable[tuple[str | None, float, str, int]]]


def local_executor(jobs: int) -> Executor:
    """A pool of `jobs` worker processes; yields (key, s, JSON, points still running)."""

    def run(todo: Sequence[Point]) -> Iterable[tuple[str | None, float, str, int]]:
        ctx = mp.get_context("spawn")
        with ctx.Pool(jobs) as pool:
            for n, (key, took, text) in enumerate(pool.imap_unordered(timed_point, todo), 1):
                yield key, took, text, min(jobs, len(todo) - n)

    return run


def run_sweep(points: Sequence[Point], out_dir: Path, jobs: int = 2,
              force: bool = False, executor: str = "local",
              address: str | None = None) -> list[dict[str, Any]]:
    """Run the points not yet in `out_dir` on `executor` (``local``: `jobs` processes;
    ``ray``: the Ray cluster at `address`, or a local one when None); returns every
    point's summary in the order of `points`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [p for p in points if force or not (out_dir / f"{p.key}.json").exists()]
    if len({p.key for p in todo}) != len(todo):
        raise ValueError("two points of the sweep have the same key")
    if executor == "ray":
        from services.sweep.ray_exec import ray_executor

        run, where = ray_executor(address)
    elif executor == "local":
        run, where = local_executor(jobs), f"{jobs} local workers"
    else:
        raise ValueError(f"unknown executor {executor!r} (local, ray)")
    print(f"sweep: {len(points)} points, {len(points) - len(todo)} already done, "
          f"{len(todo)} to run on {where} -> {out_dir}", flush=True)
    if todo:
        progress = Progress(len(todo))
        for key, took, text, running in run(todo):
            if key is None:
                print(progress.line(running), flush=True)
                continue
            (out_dir / f"{key}.json").write_text(text)
            progress.done += 1
            print(progress.line(running, key, took), flush=True)
    return [json.loads((out_dir / f"{p.key}.json").read_text()) for p in points]
