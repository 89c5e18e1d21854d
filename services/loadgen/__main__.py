"""``python -m services.loadgen``: emit a topology's load, collect records, write results."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
from pathlib import Path

from services.model.errors import GeoServeError, InvalidInput, Unavailable
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
    p.add_argument("--wait-ready", type=float,
                   default=float(os.environ.get("GEOSERVE_WAIT_READY_S") or 0.0),
                   help="wall s to wait for every scheduler, DC and the provisioner to report "
                        "SERVING (gRPC health) before the load starts; 0: do not wait "
                        "(default $GEOSERVE_WAIT_READY_S or 0; for deployments without a "
                        "start order, e.g. a Swarm stack)")
    add_metrics_args(p)
    add_tls_args(p)
    return p


async def wait_all_ready(addrs: dict[str, str], timeout_s: float) -> None:
    """Until every server in `addrs` (name -> HOST:PORT) reports SERVING, at most
    `timeout_s`; raises `Unavailable` naming those that did not."""
    from services.runtime.grpcutil import wait_healthy

    async def one(name: str, addr: str) -> str | None:
        try:
            await wait_healthy(addr, timeout_s)
            return None
        except TimeoutError:
            return f"{name} ({addr})"

    missing = [m for m in await asyncio.gather(*(one(n, a) for n, a in addrs.items())) if m]
    if missing:
        raise Unavailable(f"not ready after {timeout_s:g} s: {', '.join(missing)}")
    print(f"loadgen: {len(addrs)} servers ready", flush=True)


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
        if not (math.isfinite(args.wait_ready) and 0 <= args.wait_ready <= 3600):
            raise InvalidInput("--wait-ready", f"expected 0..3600 s, got {args.wait_ready}")
        peers = {**{f"scheduler {k}": v for k, v in scheds.items()},
                 **{f"datacenter {k}": v for k, v in dcs.items()},
                 **({"provisioner": args.provisioner} if args.provisioner else {})}

        async def run() -> dict[str, object]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):  # stop early, keep every record
                loop.add_signal_handler(sig, gen.interrupt, f"{signal.Signals(sig).name}")
            if args.wait_ready > 0:
                await wait_all_ready(peers, args.wait_ready)
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
