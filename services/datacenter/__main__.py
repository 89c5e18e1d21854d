"""``python -m services.datacenter``: run one datacenter service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from services.config.calibration import load_calibration
from services.datacenter.dc import DC_DEFAULTS, ROUTINGS, DcConfig
from services.model.carbon import ConstantCI
from services.model.errors import GeoServeError
from services.runtime.clock import WallClock
from services.runtime.grpcutil import add_tls_args, apply_tls_args
from services.runtime.metrics import add_metrics_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.datacenter", description=__doc__)
    p.add_argument("--topology", help="topology YAML; with --dc, take the DC's settings from it")
    p.add_argument("--dc", default=os.environ.get("GEOSERVE_DC", ""), help="DC name")
    p.add_argument("--region", default="local")
    p.add_argument("--zone", default="")
    p.add_argument("--setup", default=DC_DEFAULTS.setup, help="calibration setup")
    p.add_argument("--nodes", type=int, default=DC_DEFAULTS.nodes)
    p.add_argument("--gpus-per-node", type=int, default=DC_DEFAULTS.gpus_per_node)
    p.add_argument("--pue", type=float, default=DC_DEFAULTS.pue)
    p.add_argument("--ci", type=float, default=300.0, help="constant grid CI, gCO2/kWh")
    p.add_argument("--routing", default=DC_DEFAULTS.routing, choices=list(ROUTINGS))
    p.add_argument("--max-queue", type=int, default=DC_DEFAULTS.max_queue_per_engine,
                   help="waiting requests per engine")
    p.add_argument("--address", default=None,
                   help="listen address (default $GEOSERVE_ADDRESS or 127.0.0.1:$PORT)")
    p.add_argument("--dilation", type=float, default=None, help="time dilation factor k >= 1")
    p.add_argument("--epoch", type=float, default=None, help="run epoch, unix seconds")
    p.add_argument("--drain-grace", type=float, default=5.0, help="SIGTERM drain, wall s")
    add_metrics_args(p)
    add_tls_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    apply_tls_args(args, "datacenter")
    from services.datacenter.dc import Datacenter
    from services.datacenter.server import serve
    from services.runtime.grpcutil import listen_address
    from services.runtime.metrics import DcMetrics, metrics_port, serve_metrics

    try:
        address = listen_address(args.address, 50051)
        if args.topology:
            from services.config.factory import build_datacenter
            from services.config.topology import load_topology

            topo = load_topology(args.topology, check_ci=False)
            clock = WallClock(args.dilation or topo.dilation, args.epoch)
            # energy counts from this process's start (a restarted DC starts afresh)
            dc = build_datacenter(topo, args.dc, start_s=clock.now())
        else:
            cal = load_calibration(args.setup)
            cfg = DcConfig(
                name=args.dc or "dc",
                region=args.region,
                zone=args.zone,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                setup=args.setup,
                pue=args.pue,
                routing=args.routing,
                max_queue_per_engine=args.max_queue,
            )
            clock = WallClock(args.dilation or 1.0, args.epoch)
            dc = Datacenter(cfg, cal, ConstantCI(args.ci), start_s=clock.now())
        metrics = DcMetrics() if metrics_port(args.metrics_port) else None
        if metrics is not None:
            serve_metrics(metrics.registry, args.metrics_port, args.metrics_address, "datacenter")
        asyncio.run(serve(dc, address, clock, args.drain_grace, metrics=metrics))
    except GeoServeError as exc:
        print(f"datacenter: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
