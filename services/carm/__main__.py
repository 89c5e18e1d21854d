"""``python -m services.carm``: the CA-RM controller service of a topology with a ``carm:``
section. Every slot it reads each DC's state, plans, and sends each DC its slot plan.

DC addresses come from ``--dcs NAME=HOST:PORT,...`` or the ``DC_ADDRS`` environment
variable (same format); every DC of the topology needs one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time

from services.model.errors import GeoServeError, InvalidInput
from services.runtime.clock import WallClock
from services.runtime.grpcutil import add_tls_args, apply_tls_args
from services.runtime.metrics import add_metrics_args, serve_metrics


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.carm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default=os.environ.get("GEOSERVE_TOPOLOGY"),
                   help="topology YAML with a carm section (path or name under topologies/)")
    p.add_argument("--dcs", default=None, help="DC addresses NAME=HOST:PORT,... "
                                               "(default: $DC_ADDRS)")
    p.add_argument("--address", default=None,
                   help="listen address (default $GEOSERVE_ADDRESS or 127.0.0.1:$PORT)")
    p.add_argument("--call-timeout", type=float, default=None,
                   help="deadline of each DC call, emulated s (default min(1, slot/4))")
    p.add_argument("--dilation", type=float, default=None,
                   help="time dilation factor k >= 1 (default: the topology's)")
    p.add_argument("--epoch", type=float, default=None, help="run epoch, unix seconds")
    p.add_argument("--stop-grace", type=float, default=1.0, help="SIGTERM stop grace, wall s")
    add_metrics_args(p)
    add_tls_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    apply_tls_args(args, "carm")
    from services.carm.live import CarmLive
    from services.carm.server import CarmMetrics, WallCarm, serve
    from services.config.topology import load_topology
    from services.runtime.grpcutil import listen_address, parse_addr_map

    try:
        if not args.topology:
            raise InvalidInput("--topology", "required (or set GEOSERVE_TOPOLOGY)")
        topo = load_topology(args.topology)
        if topo.carm is None:
            raise InvalidInput("--topology", f"{topo.path} has no carm section")
        if args.dcs is not None:
            addrs = parse_addr_map(args.dcs, "--dcs")
        else:
            addrs = parse_addr_map(os.environ.get("DC_ADDRS", ""), "DC_ADDRS")
        address = listen_address(args.address, 50051)
        clock = WallClock(args.dilation if args.dilation is not None else topo.dilation,
                          args.epoch)
        live = CarmLive(topo, perf_clock=time.perf_counter)
        metrics = CarmMetrics()
        serve_metrics(metrics.registry, args.metrics_port, args.metrics_address, "carm")

        async def run() -> None:  # channels bind to the running loop: build inside it
            rt = WallCarm(live, clock, addrs, args.call_timeout, metrics)
            await serve(rt, address, args.stop_grace)

        asyncio.run(run())
    except GeoServeError as exc:
        print(f"carm: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
