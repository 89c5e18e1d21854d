"""``python -m services.loadgen``: emit a topology's load, collect records, write results."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from services.model.errors import GeoServeError, InvalidInput
from services.runtime.grpcutil import add_tls_args, apply_tls_args
from services.runtime.metrics import add_metrics_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.loadgen", description=__doc__)
    p.add_argument("--topology", required=True)
    p.add_argument("--schedulers", default=os.environ.get("SCHEDULER_ADDRS", ""),
                   help="REGION=HOST:PORT,... of the regional schedulers")
    p.add_argument("--dcs", default=os.environ.get("DC_ADDRS", ""),
                   help="DC=HOST:PORT,... (energy and carbon are read from them)")
    p.add_argument("--provisioner", default=os.environ.get("PROVISIONER_ADDR", ""),
                   help="HOST:PORT of the provisioner (poll and snapshot counts)")
    p.add_argument("--out", default=os.environ.get("GEOSERVE_OUT", ""), help="results folder")
    p.add_argument("--rate", type=float, default=None)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--policy", default=None, help="label of the policy (for the summary)")
    p.add_argument("--dilation", type=float, default=None)
    p.add_argument("--epoch", type=float, default=None)
    p.add_argument("--drain-limit", type=float, default=120.0,
                   help="emulated s to wait for records after the load ends")
    p.add_argument("--progress-every", type=float, default=5.0, help="wall s between lines")
    add_metrics_args(p)
    add_tls_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_tls_args(args, "loadgen")
    from services.config.topology import load_topology
    from services.loadgen.runtime import LoadGenerator
    from services.runtime.clock import WallClock
    from services.runtime.grpcutil import parse_addr_map
    from services.runtime.metrics import LoadgenMetrics, metrics_port, serve_metrics

    try:
        topo = load_topology(args.topology, check_ci=False).with_overrides(
            policy=args.policy, rate_rps=args.rate, duration_s=args.duration,
            dilation=args.dilation, seed=args.seed,
        )
        scheds = parse_addr_map(args.schedulers, "--schedulers")
        if not scheds:
            raise InvalidInput("--schedulers / SCHEDULER_ADDRS", "scheduler addresses required")
        dcs = parse_addr_map(args.dcs, "--dcs")
        clock = WallClock(topo.dilation, args.epoch)
        gen = LoadGenerator(topo, scheds, dcs, clock, Path(args.out) if args.out else None,
                            drain_limit_s=args.drain_limit, progress_every_s=args.progress_every,
                            provisioner=args.provisioner or None)
        if metrics_port(args.metrics_port):
            gen.metrics = LoadgenMetrics({r.name: r.scheduler.policy for r in topo.regions})
            gen.metrics.attach(clock.now, clock.dilation)
            serve_metrics(gen.metrics.registry, args.metrics_port, args.metrics_address,
                          "loadgen")
        async def run() -> dict[str, object]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):  # stop early, keep every record
                loop.add_signal_handler(sig, gen.interrupt, f"{signal.Signals(sig).name}")
            return await gen.run()

        summary = asyncio.run(run())
    except GeoServeError as exc:
        print(f"loadgen: error: {exc}", file=sys.stderr)
        return 2
    rq: dict[str, int] = summary["requests"]  # type: ignore[assignment]
    if rq["emitted"] != rq["completed"] + rq["rejected"] + rq["failed"]:
        print("loadgen: error: request conservation violated", file=sys.stderr)
        return 1
    if gen.interrupted:  # partial results are written; the exit says the run was cut short
        return 128 + int(getattr(signal, gen.interrupted, signal.SIGTERM))
    return 0


if __name__ == "__main__":
    sys.exit(main())
