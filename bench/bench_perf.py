"""Performance of GeoServe at the paper's scale: one command, one page (docs/performance.md).

Parts (``--parts``, default all but ``wall``'s long ladder unless asked):

* ``virtual``: `geoserve sim`'s engine (`SimRun`, records and summary written as the CLI
  does) on base.yaml for 200 emulated s (15 s warm-up) per policy and rate: wall s,
  emulated s per wall s, CPU µs per request, peak RSS, decision time p50/p99.
* ``scale``: CPU µs per request as the topology grows (base, 2x and 4x its engines, by
  nodes per DC) at one rate, and as the rate grows on base -- the cost-per-request table
  and plot.
* ``decisions``: per-request decision time of round-robin, least-loaded and greedy on
  base's DCs with the scheduler's projection (`bench_policies`-style, in-process).
* ``wall``: `geoserve run --topology base` at k = 1 over a ladder of rates: start-to-load
  time, p99 wake-up lateness, resync ratio, faithful or not, CPU µs per request of each
  service (from /proc of every service process).

Every point runs in a fresh subprocess (its own peak RSS). Results go to a JSON file
(``--json``); ``--render-only`` rebuilds the page from it. Figures, not pass/fail tests.

Usage: .venv/bin/python bench/bench_perf.py [--parts virtual,scale,decisions,wall]
       [--duration 200] [--quick] [--json bench/results/perf.json] [--doc docs/performance.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = {
    ("round-robin", 4000.0): 5.0,
    ("round-robin", 1200.0): 10.0,
    ("greedy", 4000.0): 3.0,
    ("facility-milp", 4000.0): 1.0,
}


# ------------------------------------------------------------------------ one point
def _scaled(topo: Any, scale: int) -> Any:
    if scale == 1:
        return topo
    regions = tuple(
        dataclasses.replace(r, dcs=tuple(dataclasses.replace(d, nodes=d.nodes * scale)
                                         for d in r.dcs))
        for r in topo.regions)
    return dataclasses.replace(topo, regions=regions)


def point(spec: dict[str, Any]) -> dict[str, Any]:
    """One virtual run, in this process (called in a subprocess by `run_point`)."""
    from services.config.topology import load_topology
    from services.loadgen.runtime import write_outputs
    from services.sim.runtime import SimRun

    topo = load_topology(ROOT / "topologies" / f"{spec['topology']}.yaml").with_overrides(
        policy=spec["policy"], policy_config=spec.get("config") or None,
        rate_rps=spec["rate"], duration_s=spec["duration"], warmup_s=spec["warmup"],
        seed=spec.get("seed", 1))
    topo = _scaled(topo, spec.get("scale", 1))
    marks: dict[str, float] = {}
    t_build = time.perf_counter()
    c0, t0 = time.process_time(), time.perf_counter()

    def progress(t: float, emitted: int, done: int) -> None:
        if t >= spec["duration"] and "load_wall_s" not in marks:
            marks["load_wall_s"] = time.perf_counter() - t0
            marks["load_cpu_s"] = time.process_time() - c0

    with tempfile.TemporaryDirectory() as tmp:
        run = SimRun(topo, progress=progress, metrics_csv=Path(tmp) / "metrics.csv")
        build_s = time.perf_counter() - t_build
        c0, t0 = time.process_time(), time.perf_counter()  # the run itself
        summary = run.run()
        write_outputs(Path(tmp), run.records(), summary)
    wall = time.perf_counter() - t0 + build_s
    cpu = time.process_time() - c0
    n = summary["requests"]["emitted"]
    dec = summary["scheduler"]["decision_s"]
    engines = sum(d.nodes * d.gpus_per_node for d in topo.dcs)
    return {
        **spec,
        "engines_gpus": engines,
        "requests": n,
        "completed": summary["requests"].get("completed", 0),
        "wall_s": wall,
        "build_s": build_s,
        "cpu_s": cpu,
        "emulated_s": summary["emulation"]["emulated_s"],
        "load_wall_s": marks.get("load_wall_s", wall),
        "speed": spec["duration"] / marks.get("load_wall_s", wall),
        "cpu_us_per_request": cpu / max(n, 1) * 1e6,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "decision_p50_s": dec.get("p50"),
        "decision_p99_s": dec.get("p99"),
        "slo_violation": summary["slo"].get("violation_ratio"),
    }


def run_point(spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--point", json.dumps(spec)],
                         capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"point {spec} failed:\n{out.stderr[-3000:]}")
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  {res.get('label', res['policy']):14s} {res['topology']} x{res.get('scale', 1)} "
          f"{res['rate']:6.0f} req/s {res['duration']:5.0f} s: wall {res['wall_s']:6.1f} s, "
          f"{res['speed']:5.2f} emulated s/wall s, {res['cpu_us_per_request']:6.1f} CPU µs/req, "
          f"RSS {res['peak_rss_mib']:5.0f} MiB", flush=True)
    return res


# ------------------------------------------------------------------------ parts
def part_virtual(args: argparse.Namespace) -> list[dict[str, Any]]:
    print("== virtual runtime, base.yaml", flush=True)
    specs = [("round-robin", 1200.0), ("round-robin", 4000.0), ("greedy", 4000.0),
             ("facility-milp", 4000.0)]
    return [run_point({"topology": "base", "policy": pol, "rate": rate,
                       "duration": args.duration, "warmup": args.warmup})
            for pol, rate in specs]


def part_scale(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    print("== cost per request: topology size and rate (round-robin)", flush=True)
    d = args.scale_duration
    size = [run_point({"topology": "base", "policy": "round-robin", "rate": args.scale_rate,
                       "duration": d, "warmup": min(args.warmup, d / 4), "scale": k})
            for k in (1, 2, 4)]
    rate = [run_point({"topology": "base", "policy": "round-robin", "rate": r,
                       "duration": d, "warmup": min(args.warmup, d / 4)})
            for r in (600.0, 1200.0, 2400.0, 4000.0)]
    return {"size": size, "rate": rate}


def part_decisions(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per-request decisions through `SchedulerCore` (projection included) on base's DCs
    with a snapshot from a short virtual run."""
    import numpy as np

    from services.config.topology import load_topology
    from services.scheduler.driver import core_for_region
    from services.sim.runtime import SimRun

    print("== decisions (per request, base.yaml's 16 DCs)", flush=True)
    topo = load_topology(ROOT / "topologies" / "base.yaml").with_overrides(
        rate_rps=1200.0, duration_s=5.0, warmup_s=0.0, policy="round-robin")
    sim = SimRun(topo, charge_solver_time=False)
    sim.run()
    region = topo.regions[0].name
    snap = sim.schedulers[region].snapshot
    assert snap is not None
    from services.model.state import RequestView

    rng = np.random.default_rng(1)
    reqs = [RequestView(id=f"r{i}", model="", isl_tokens=int(rng.integers(50, 2000)),
                        osl_tokens=int(rng.integers(20, 500)), origin_region=region,
                        ttft_slo_s=3.0, tpot_slo_s=0.1, arrival_s=0.0)
            for i in range(args.decisions)]
    out = []
    for pol, cfg in (("round-robin", {}), ("least-loaded", {}), ("greedy", {"alpha": 0.5})):
        t2 = topo.with_overrides(policy=pol, policy_config=cfg or None)
        core = core_for_region(t2, region, time.perf_counter)
        core.on_snapshot(snap, 0.0)
        policy_s, total_s = [], []
        for k, r in enumerate(reqs):
            if k % 1000 == 0:
                core.on_snapshot(snap, 0.0)  # a fresh snapshot every 1000 requests
            t0 = time.perf_counter()
            d = core.submit(r, 0.0)
            total_s.append(time.perf_counter() - t0)
            policy_s.append(d[0].decision_s)
        ps, ts = np.asarray(policy_s), np.asarray(total_s)
        row = {"policy": pol, "n": len(reqs),
               "policy_p50_us": float(np.percentile(ps, 50) * 1e6),
               "policy_p99_us": float(np.percentile(ps, 99) * 1e6),
               "submit_p50_us": float(np.percentile(ts, 50) * 1e6),
               "submit_p99_us": float(np.percentile(ts, 99) * 1e6)}
        print(f"  {pol:14s} policy p50 {row['policy_p50_us']:7.1f} µs p99 "
              f"{row['policy_p99_us']:7.1f} µs | core.submit p50 {row['submit_p50_us']:7.1f} µs "
              f"p99 {row['submit_p99_us']:7.1f} µs", flush=True)
        out.append(row)
    return out


def part_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Every sweep policy at the sweep's three rates, on two worker processes, for
    `--sweep-duration` emulated s; the full base sweep's time (200 s points, 3 seeds, the
    ablation) is extrapolated from each point's load time (cost per request is flat)."""
    from concurrent.futures import ThreadPoolExecutor

    from services.sweep.run import ABLATION_LABELS, DEFAULT_POLICIES, Point

    d = args.sweep_duration
    print(f"== sweep: {len(DEFAULT_POLICIES)} policies x 3 rates, {d:g} s points, "
          f"{args.jobs} workers", flush=True)
    specs = [{"topology": "base", "policy": pol, "config": cfg, "label": label, "rate": rate,
              "duration": d, "warmup": min(args.warmup, d / 4)}
             for label, pol, cfg in DEFAULT_POLICIES for rate in (1200.0, 2400.0, 4000.0)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(run_point, specs))
    took = time.perf_counter() - t0
    full = Point.duration_s
    per_point = [r["wall_s"] + r["load_wall_s"] * (full / d - 1.0) for r in rows]
    ablated = [x for r, x in zip(rows, per_point, strict=True) if r["label"] in ABLATION_LABELS]
    seeds = 3
    est = (sum(per_point) + sum(ablated)) * seeds / args.jobs
    return {"rows": rows, "wall_s": took, "jobs": args.jobs, "duration": d,
            "full_duration": full, "seeds": seeds,
            "points_full": (len(rows) + len(ablated)) * seeds, "estimate_full_s": est}


def part_carm(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`bench/bench_carm.py`'s table (CA-RM formulations on the paper's 24 h instance)."""
    print(f"== CA-RM solve times ({args.carm_time_limit_s:g} s limit)", flush=True)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_carm.py"),
                          "--time-limit-s", str(args.carm_time_limit_s)],
                         capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"bench_carm.py failed:\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    head = lines[0].split()
    rows = []
    for line in lines[1:]:
        cells = line.split()
        if len(cells) != len(head):
            continue
        row: dict[str, Any] = dict(zip(head, cells, strict=True))
        for k in ("solve_s", "gap"):
            row[k] = float(row[k])
        rows.append(row)
        print(f"  {line}", flush=True)
    return rows


def _proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    tck = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tck


def part_wall(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`geoserve run --topology base` at k = 1 over a ladder of rates."""
    print("== wall runtime, base.yaml, k = 1", flush=True)
    rows = []
    for mode in [m for m in args.wall_modes.split(",") if m]:
        for rate in [float(r) for r in args.wall_rates.split(",") if r]:
            rows.append(_wall_point(rate, args.wall_duration, mode))
    for rate in [float(r) for r in args.wall_small_rates.split(",") if r]:
        rows.append(_wall_point(rate, args.wall_duration, "sync", "small"))
    return rows


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(p.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _service_of(cmd: str) -> str:
    for s in ("loadgen", "scheduler", "datacenter", "provisioner", "carm"):
        if f"services.{s}" in cmd:
            return s
    return "other"


def _wall_point(rate: float, duration: float, mode: str = "sync", name: str = "base"
                ) -> dict[str, Any]:
    """One wall run of a topology; `mode` the provisioner's polling (sync: every DC at
    the tick; async: spread over the period)."""
    topo = name
    variant = ROOT / "topologies" / f".bench-{name}-{mode}.yaml"
    if mode != "sync":
        text = (ROOT / "topologies" / f"{name}.yaml").read_text()
        variant.write_text(text.replace("mode: sync", f"mode: {mode}"))
        topo = str(variant)
    try:
        row = _wall_run(topo, rate, duration, mode)
        row["topology"] = name
        return row
    finally:
        variant.unlink(missing_ok=True)


def _wall_run(topo: str, rate: float, duration: float, mode: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "run", "--topology", topo, "--rate",
             str(rate), "--duration", str(duration), "--out", str(out)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        cpu: dict[int, tuple[str, float]] = {}
        load_at: float | None = None
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        buf = ""
        while proc.poll() is None:
            time.sleep(0.5)
            try:
                chunk = proc.stdout.read() or ""
            except (OSError, TypeError):
                chunk = ""
            buf += chunk
            if load_at is None and ("emitted" in buf or "load:" in buf):
                load_at = time.monotonic() - t0
            for c in _children(proc.pid):
                v = _proc_cpu_s(c)
                if v != v:
                    continue
                svc = cpu[c][0] if c in cpu else _service_of(_cmdline(c))
                cpu[c] = (svc, v)  # the name from the first look: an exiting one has none
        buf += proc.stdout.read() or ""
        took = time.monotonic() - t0
        summary = json.loads((out / "summary.json").read_text())
    n = summary["requests"]["emitted"]
    per: dict[str, dict[str, float]] = {}
    for svc, v in cpu.values():
        e = per.setdefault(svc, {"processes": 0, "cpu_s": 0.0})
        e["processes"] += 1
        e["cpu_s"] += v
    emu = summary["emulation"]
    m = re.search(r"all services healthy after ([0-9.]+) s", buf)
    row = {
        "rate": rate, "duration": duration, "mode": mode, "requests": n, "wall_s": took,
        "start_to_load_s": float(m.group(1)) if m else load_at,
        "lateness_p99_ms": emu["lateness_s_p99"] * 1e3,
        "lateness_max_ms": emu["lateness_s_max"] * 1e3,
        "faithful": emu["faithful"],
        "cpu_us_per_request": {k: v["cpu_s"] / max(n, 1) * 1e6 for k, v in per.items()},
        "processes": {k: v["processes"] for k, v in per.items()},
        "completed": summary["requests"].get("completed", 0),
        "slo_violation": summary["slo"].get("violation_ratio"),
    }
    per_txt = json.dumps({k: round(v) for k, v in row["cpu_us_per_request"].items()})
    print(f"  {mode:5s} {rate:6.0f} req/s: start-to-load {row['start_to_load_s']} s, p99 lateness "
          f"{row['lateness_p99_ms']:.2f} ms (max {row['lateness_max_ms']:.1f}), faithful "
          f"{row['faithful']}, CPU µs/req {per_txt}", flush=True)
    return row


# ------------------------------------------------------------------------ page
def _machine() -> str:
    return (f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
            f"Python {platform.python_version()}, {platform.system()}")


def render(res: dict[str, Any], doc: Path) -> None:
    lines = [
        "# Performance",
        "",
        "Generated by " + ", ".join(
            f"`{c}` ({', '.join(parts)})" for c, parts in _by_command(res).items())
        + f" on {res['machine']}, {res['date']}. "
        "Do not edit by hand: re-run the command (`make bench` runs it with its defaults); "
        f"the hand-written `{doc.stem}-notes.md` beside it is appended.",
        "",
        "Figures, not pass/fail tests: every target of the performance issue is listed "
        "beside the measured value. Each point runs in a fresh process.",
        "",
    ]
    v = res.get("virtual") or []
    if v:
        lines += ["## Virtual runtime at the paper's scale",
                  "",
                  f"base.yaml (16 DCs, 4 regions), {v[0]['duration']:g} emulated s of load "
                  f"({v[0]['warmup']:g} s warm-up), records and summary written as "
                  "`geoserve sim` does; solver time charged to emulated time. Speed = "
                  "emulated s of load per wall s of the run; wall s includes building the "
                  "topology; CPU µs per request covers the run, drain and outputs.",
                  "",
                  "| policy | req/s | requests | wall s | speed | target | CPU µs/request | "
                  "peak RSS MiB | decision p50 / p99 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in v:
            tgt = TARGETS.get((r["policy"], r["rate"]))
            lines.append(
                f"| {r['policy']} | {r['rate']:g} | {r['requests']} | {r['wall_s']:.1f} | "
                f"{r['speed']:.2f} | {f'≥ {tgt:g}' if tgt else ''} "
                f"{'(met)' if tgt and r['speed'] >= tgt else '(not met)' if tgt else ''} | "
                f"{r['cpu_us_per_request']:.0f} | {r['peak_rss_mib']:.0f} (≤ 1024) | "
                f"{_ms(r['decision_p50_s'])} / {_ms(r['decision_p99_s'])} |")
        lines.append("")
    sc = res.get("scale")
    if sc:
        lines += ["## Cost per request against topology size and rate", "",
                  "Round-robin, CPU µs per request of the run (load, drain, outputs; building "
                  "the topology excluded). Size: nodes per DC x 1, 2, 4 at the same rate.", "",
                  "| topology | engines (GPUs) | req/s | requests | CPU µs/request | speed |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in sc["size"] + sc["rate"]:
            lines.append(f"| base x{r.get('scale', 1)} | {r['engines_gpus']} | {r['rate']:g} | "
                         f"{r['requests']} | {r['cpu_us_per_request']:.1f} | {r['speed']:.2f} |")
        base = [r["cpu_us_per_request"] for r in sc["size"] + sc["rate"]]
        spread = (max(base) / min(base) - 1) * 100 if base else 0.0
        lines += ["", f"Spread of the cost per request over these points: {spread:.0f} % "
                  "(target: flat within 20 %).", ""]
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        img = doc.parent / "img" / "perf_cost.png"
        img.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
        ax[0].plot([r["engines_gpus"] for r in sc["size"]],
                   [r["cpu_us_per_request"] for r in sc["size"]], "o-")
        ax[0].set_xlabel("GPUs (engines) in the topology")
        ax[0].set_ylabel("CPU µs per request")
        ax[0].set_title(f"size, {sc['size'][0]['rate']:g} req/s")
        ax[0].set_ylim(bottom=0)
        ax[1].plot([r["rate"] for r in sc["rate"]],
                   [r["cpu_us_per_request"] for r in sc["rate"]], "o-")
        ax[1].set_xlabel("arrival rate, req/s")
        ax[1].set_title("rate, base.yaml")
        ax[1].set_ylim(bottom=0)
        fig.tight_layout()
        fig.savefig(img, dpi=110)
        plt.close(fig)
        lines += [f"![cost per request](img/{img.name})", ""]
    dd = res.get("decisions")
    if dd:
        lines += ["## Decisions", "",
                  "Per request through the regional scheduler core (the projection of its "
                  "own dispatches included), on a snapshot of base.yaml's 16 DCs. `policy` is "
                  "the time charged as decision time; `core.submit` adds the core's "
                  "bookkeeping.", "",
                  "| policy | policy p50 µs | policy p99 µs | target | core.submit p50 / p99 µs |",
                  "|---|---:|---:|---|---:|"]
        tg = {"round-robin": "≤ 5 (per request)", "least-loaded": "≤ 5 (per request)",
              "greedy": "p99 ≤ 50"}
        for r in dd:
            lines.append(f"| {r['policy']} | {r['policy_p50_us']:.1f} | "
                         f"{r['policy_p99_us']:.1f} | {tg.get(r['policy'], '')} | "
                         f"{r['submit_p50_us']:.1f} / {r['submit_p99_us']:.1f} |")
        fm = [r for r in v if r["policy"] == "facility-milp"]
        if fm:
            lines += ["", f"Facility MILP window decision time in the {fm[0]['rate']:g} req/s "
                      f"run above: p50 {_ms(fm[0]['decision_p50_s'])}, p99 "
                      f"{_ms(fm[0]['decision_p99_s'])} (target p99 ≤ 50 ms)."]
        lines.append("")
    sw = res.get("sweep")
    if sw:
        lines += ["## Sweeps", "",
                  f"Every policy of `geoserve sweep` ({len(sw['rows']) // 3} labels) at 1200, "
                  f"2400 and 4000 req/s: {len(sw['rows'])} points of {sw['duration']:g} "
                  f"emulated s took {sw['wall_s']:.0f} s on {sw['jobs']} worker processes. "
                  f"The full base sweep -- {sw['points_full']} points of "
                  f"{sw['full_duration']:g} s (3 seeds, the peer-projection ablation "
                  f"included), `geoserve sweep --seeds 1,2,3` -- is estimated at "
                  f"**{sw['estimate_full_s'] / 3600:.1f} h** here (each point's load time "
                  f"scaled to {sw['full_duration']:g} s: a point's speed is steady over its "
                  "run).", "",
                  "| label | req/s | wall s | speed | decision p99 |",
                  "|---|---:|---:|---:|---:|"]
        for r in sw["rows"]:
            lines.append(f"| {r.get('label', r['policy'])} | {r['rate']:g} | "
                         f"{r['wall_s']:.1f} | {r['speed']:.2f} | {_ms(r['decision_p99_s'])} |")
        lines.append("")
    w = res.get("wall")
    if w:
        lines += ["## Wall runtime at k = 1", "",
                  "`geoserve run --topology T --rate R` (base.yaml: 22 processes, small.yaml: "
                  "8, on loopback gRPC). Faithful: p99 wake-up lateness ≤ 5 ms (the DC "
                  "default) and ≤ 0.1 % resyncs. SLO violations show where a topology runs "
                  "out of capacity.",
                  "",
                  "| topology | polls | req/s | requests | start to load s | p99 lateness ms | "
                  "max ms | faithful | SLO violations | CPU µs/request by service |",
                  "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
        for r in w:
            per = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["cpu_us_per_request"].items()))
            viol = r.get("slo_violation")
            lines.append(f"| {r.get('topology', 'base')} | {r.get('mode', 'sync')} | "
                         f"{r['rate']:g} | {r['requests']} | {r['start_to_load_s']:.1f} | "
                         f"{r['lateness_p99_ms']:.2f} | {r['lateness_max_ms']:.1f} | "
                         f"{r['faithful']} | {'' if viol is None else f'{viol:.1%}'} | {per} |")
        top = max((r for r in w if r.get("topology", "base") == "base"),
                  key=lambda r: r["rate"])
        per_req = top["cpu_us_per_request"]
        cores = sum(per_req.values()) * 4000 / 1e6
        lines += ["", f"CPU per request at {top['rate']:g} req/s, summed over the services: "
                  f"{sum(per_req.values()):.0f} µs, so a k = 1 run at 4000 req/s needs about "
                  f"**{cores:.0f} cores** of this machine's kind for the emulator's own work "
                  "(plus headroom: a faithful run keeps every process's wake-ups on time, so "
                  "the cores must not be saturated; the paper used one 64-core server)."]
        lines.append("")
    lw = ROOT / "bench" / "results" / "wall_lateness.json"
    if lw.exists():
        wl = json.loads(lw.read_text())
        lines += ["## Where the wall runtime's lateness comes from", "",
                  f"`{wl['command']}`: every DC process traces each wake-up (a step's or "
                  "decode run's planned end, and how late it woke) and each provisioner poll "
                  "(`GEOSERVE_TRACE_DIR`). Wake-ups due within 30 ms after a poll compete "
                  "with the poll burst: the provisioner's 16 GetState calls, 16 DC answers "
                  "and 4 schedulers handling the snapshot, on 2 cores.", "",
                  "| polls | req/s | wake-ups | p50 ms | p99 ms | max ms | share near a poll "
                  "| p99 near a poll | p99 elsewhere | > 2 ms (near a poll) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in wl["rows"]:
            lines.append(
                f"| {r['mode']} | {r['rate']:g} | {r['wakeups']} | {r['p50_ms']:.2f} | "
                f"{r['p99_ms']:.2f} | {r['max_ms']:.2f} | {r['near_poll_share']:.0%} | "
                f"{r['near_p99_ms']:.2f} | {r['other_p99_ms']:.2f} | {r['late_2ms']} "
                f"({r['late_2ms_near_poll_share']:.0%}) |")
        lines.append("")
    cr = res.get("carm")
    if cr:
        lines += ["## CA-RM solve times", "",
                  "`bench/bench_carm.py`: each formulation on the paper's 24 h x 15-min "
                  "instance (100 nodes), HiGHS, 60 s limit per MILP. Target: Problem 1 "
                  "(carbon budget) within 1 % gap in 60 s on every workload.", "",
                  "| workload | formulation | status | solve s | MILPs | gap |",
                  "|---|---|---|---:|---:|---:|"]
        for r in cr:
            lines.append(f"| {r['workload']} | {r['formulation']} | {r['status']} | "
                         f"{r['solve_s']:.2f} | {r['MILPs']} | {r['gap']:.1e} |")
        lines.append("")
    notes = doc.with_name(f"{doc.stem}-notes.md")
    if notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    doc.write_text("\n".join(lines) + "\n")
    print(f"wrote {doc}")


def _by_command(res: dict[str, Any]) -> dict[str, list[str]]:
    """The command that produced each part (parts in the order they appear)."""
    cmds: dict[str, str] = res.get("commands") or {}
    out: dict[str, list[str]] = {}
    for part in ("virtual", "scale", "decisions", "sweep", "wall", "carm"):
        if part in res:
            out.setdefault(cmds.get(part, res.get("command", "?")), []).append(part)
    return out


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--point", help=argparse.SUPPRESS)
    ap.add_argument("--parts", default="virtual,scale,decisions,sweep,wall,carm")
    ap.add_argument("--duration", type=float, default=200.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--scale-duration", type=float, default=20.0)
    ap.add_argument("--scale-rate", type=float, default=1200.0)
    ap.add_argument("--decisions", type=int, default=5000)
    ap.add_argument("--sweep-duration", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--carm-time-limit-s", type=float, default=60.0)
    ap.add_argument("--wall-rates", default="2,50,300,600,1200")
    ap.add_argument("--wall-duration", type=float, default=20.0)
    ap.add_argument("--wall-small-rates", default="8,16,24,32,40")
    ap.add_argument("--wall-modes", default="sync",
                    help="provisioner polling modes to run the wall ladder with")
    ap.add_argument("--json", default="bench/results/perf.json")
    ap.add_argument("--doc", default="docs/performance.md")
    ap.add_argument("--render-only", action="store_true")
    args = ap.parse_args()
    if args.point:
        print(json.dumps(point(json.loads(args.point))))
        return
    jpath = ROOT / args.json
    res: dict[str, Any] = json.loads(jpath.read_text()) if jpath.exists() else {}
    if not args.render_only:
        parts = [p for p in args.parts.split(",") if p]
        for p in parts:
            if p not in ("virtual", "scale", "decisions", "wall", "sweep", "carm"):
                raise SystemExit(f"--parts: unknown part {p!r}")
            res[p] = globals()[f"part_{p}"](args)
        res["command"] = "python bench/bench_perf.py " + " ".join(sys.argv[1:])
        for p in parts:
            res.setdefault("commands", {})[p] = res["command"]
        res["machine"] = _machine()
        res["date"] = time.strftime("%Y-%m-%d")
        jpath.parent.mkdir(parents=True, exist_ok=True)
        jpath.write_text(json.dumps(res, indent=1) + "\n")
    render(res, ROOT / args.doc)


if __name__ == "__main__":
    main()
