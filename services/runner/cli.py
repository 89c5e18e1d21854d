"""``geoserve run`` (processes on loopback, wall clock) and ``geoserve sim`` (virtual clock)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from services.config.topology import ROOT, Topology, load_topology
from services.model.errors import InvalidInput
from services.runtime.grpcutil import add_tls_args


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default="topologies/small.yaml",
                   help="topology YAML, or a name in topologies/ (default: small)")
    p.add_argument("--policy", default=None, help="scheduling policy of every region")
    p.add_argument("--policy-config", default="",
                   help="policy settings as k=v,k=v (e.g. alpha=0.5)")
    p.add_argument("--rate", type=float, default=None, help="arrival rate, req/s")
    p.add_argument("--duration", type=float, default=None, help="load duration, emulated s")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default=None, help="results folder (default results/<run>)")


def register(sub: Any) -> None:
    run = sub.add_parser("run", help="run a topology as local processes (wall clock)",
                         description=__doc__)
    _add_common(run)
    run.add_argument("--dilation", type=float, default=None, help="time dilation factor k >= 1")
    add_tls_args(run)
    run.add_argument("--prometheus", action="store_true",
                     help="also run a Prometheus server (prometheus on PATH) scraping every "
                          "service into <out>/prom")
    run.add_argument("--carbon-api", type=int, default=0, metavar="PORT",
                     help="also serve the emulated grid as carbon-signal APIs (Carbon Aware "
                          "SDK, Electricity Maps shapes) on 127.0.0.1:PORT")
    run.add_argument("--prometheus-port", type=int, default=0,
                     help="Prometheus web port with --prometheus (default: a free port)")
    run.add_argument("--linger", type=float, default=None,
                     help="keep the services and their /metrics up this many wall seconds "
                          "after the load (default 2 with --prometheus, else 0)")
    run.set_defaults(func=cmd_run)
    rb = sub.add_parser("rebuild", help="rebuild the records and a partial summary of a run "
                                        "whose load generator died, from its journal")
    _add_common(rb)
    rb.add_argument("--reason", default="load generator died before the request finished",
                    help="reason recorded for emitted requests without a record")
    rb.set_defaults(func=cmd_rebuild)
    sim = sub.add_parser("sim", help="run a topology on the virtual clock (one process)")
    _add_common(sim)
    sim.add_argument("--no-solver-time", action="store_true",
                     help="do not charge policy wall time to emulated time (deterministic)")
    sim.add_argument("--metrics-per-engine", action="store_true",
                     help="also write every engine's series to metrics.csv")
    sim.set_defaults(func=cmd_sim)


def _topology(args: argparse.Namespace) -> Topology:
    from services.scheduler.__main__ import parse_kv

    topo = load_topology(args.topology)
    cfg = parse_kv(args.policy_config, "--policy-config") if args.policy_config else None
    return topo.with_overrides(
        policy=args.policy, policy_config=cfg, rate_rps=args.rate, duration_s=args.duration,
        dilation=getattr(args, "dilation", None), seed=args.seed,
    )


def _out_dir(args: argparse.Namespace, topo: Topology, runtime: str) -> Path:
    if args.out:
        return Path(args.out)
    policy = args.policy or topo.regions[0].scheduler.policy
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return ROOT / "results" / f"{topo.name}-{policy}-{runtime}-{stamp}"


EXIT_SERVICE_DIED = 3  # the run finished and wrote its results, but a service died in it


def cmd_rebuild(args: argparse.Namespace) -> int:
    """Rebuild records.csv and a partial summary.json of a run whose load generator died."""
    from services.loadgen.runtime import rebuild_outputs
    from services.loadgen.summary import format_table

    if not args.out:
        raise InvalidInput("--out", "the run's results folder is required")
    topo = _topology(args)
    out = Path(args.out)
    summary = rebuild_outputs(out, topo, args.reason)
    print(format_table(summary))
    print(f"\nrebuilt: {out} (partial: {summary['partial']['reason']})")
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    from services.loadgen.runtime import write_outputs
    from services.loadgen.summary import format_table
    from services.sim.runtime import SimRun

    topo = _topology(args)
    out = _out_dir(args, topo, "sim")
    t0 = time.monotonic()

    def progress(t: float, emitted: int, done: int) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s wall | t={t:7.1f}s emulated] emitted {emitted} "
              f"finished {done}", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    run = SimRun(topo, charge_solver_time=not args.no_solver_time, progress=progress,
                 metrics_csv=out / "metrics.csv", metrics_per_engine=args.metrics_per_engine)
    summary = run.run()
    write_outputs(out, run.records(), summary)
    print(format_table(summary))
    print(f"\nresults: {out}")
    return 0


def _print_metrics(runner: Any, out: Path) -> None:
    ports = runner.metrics_ports
    if not ports:
        return
    listing = ", ".join(f"{job} :{port}" for job, port in ports.items())
    print(f"metrics: http://127.0.0.1:PORT/metrics ({listing}); scrape config "
          f"{out / 'prometheus.yml'}", flush=True)
    if runner.prometheus:
        print(f"prometheus: http://127.0.0.1:{runner.prometheus_port} "
              f"(data in {out / 'prom'})", flush=True)
    if runner.carbon_api_port:
        print(f"carbon-api: http://127.0.0.1:{runner.carbon_api_port}"
              "/emissions/bylocation?location=DC (and /v3/carbon-intensity/latest?zone=Z)",
              flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from services.loadgen.records import RecordJournal
    from services.loadgen.runtime import rebuild_outputs
    from services.runner.local import LocalRun
    from services.runtime.grpcutil import apply_tls_args

    apply_tls_args(args)  # every service inherits it: mutual TLS on every link

    topo = _topology(args)
    if not topo.regions:
        raise InvalidInput("topology", "no regions")
    if not 0 <= args.carbon_api <= 65535:
        raise InvalidInput("--carbon-api", f"expected a port 1..65535, got {args.carbon_api}")
    out = _out_dir(args, topo, "run")
    out.mkdir(parents=True, exist_ok=True)
    n_proc = len(topo.dcs) + len(topo.regions) + 2
    print(f"geoserve run: {topo.name} ({len(topo.regions)} regions, {len(topo.dcs)} DCs, "
          f"{n_proc} processes), policy {args.policy or topo.regions[0].scheduler.policy}, "
          f"dilation {topo.dilation}; logs in {out / 'logs'}", flush=True)
    runner = LocalRun(topo, args.topology, out, policy=args.policy,
                      policy_config=args.policy_config, rate=args.rate,
                      duration=args.duration, seed=args.seed, prometheus=args.prometheus,
                      carbon_api_port=args.carbon_api,
                      prometheus_port=args.prometheus_port,
                      linger_s=args.linger if args.linger is not None
                      else (2.0 if args.prometheus else 0.0))

    stopped_by: list[str] = []

    def on_term(signum: int, frame: Any) -> None:
        stopped_by.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    old_int = signal.signal(signal.SIGINT, on_term)
    rc = 1
    try:
        t0 = time.monotonic()
        runner.start()
        print(f"all services healthy after {time.monotonic() - t0:.1f} s", flush=True)
        _print_metrics(runner, out)
        rc = runner.run_load()
    except KeyboardInterrupt:
        sig = stopped_by[0] if stopped_by else "SIGINT"
        print(f"geoserve run: interrupted ({sig}); the load generator writes what it has, "
              "then every service stops", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not lose the run
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        runner.stop_load(sig)
        rc = 128 + int(getattr(signal, sig))
    finally:
        runner.stop()
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)
    if runner.crashed:
        print(f"geoserve run: services that died during the run: "
              f"{', '.join(runner.crashed)} (see their logs in {out / 'logs'}); the results "
              "are written, the exit status says the run was not clean (3)", file=sys.stderr)
        rc = rc or EXIT_SERVICE_DIED
    summary_path = out / "summary.json"
    lg = runner.loadgen_exit()
    if lg is not None and lg != 0 and rc == 0:
        rc = lg
    if rc < 0:  # killed by a signal: the shell's convention, 128 + signal number
        rc = 128 - rc
    if lg is not None and lg < 0:
        print(f"geoserve run: the load generator was killed by {signal.Signals(-lg).name}",
              file=sys.stderr)
    if not summary_path.exists() and RecordJournal.exists(out):
        reason = ("load generator died before the request finished" if lg is None or lg < 0
                  else f"load generator exited with {lg} before the request finished")
        rebuild_outputs(out, topo, reason)
        print(f"geoserve run: rebuilt records.csv and a partial summary.json from the "
              f"load generator's journal in {out}", file=sys.stderr)
        rc = rc or 1
    if summary_path.exists():
        s = json.loads(summary_path.read_text())
        s["runner"] = {"crashed": runner.crashed}
        summary_path.write_text(json.dumps(s, indent=2) + "\n")
        if s.get("partial"):
            print(f"geoserve run: partial results ({s['partial']['reason']}): "
                  f"{s['requests']['emitted']} emitted requests recorded", file=sys.stderr)
        print(f"\nresults: {out}")
    return rc
