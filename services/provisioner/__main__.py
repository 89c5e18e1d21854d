"""``python -m services.provisioner``: poll every DC of a topology and broadcast snapshots.

DC addresses come from ``--dcs NAME=HOST:PORT,...`` or the ``DC_ADDRS`` environment
variable (same format); every DC of the topology needs one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from geoserve.v1 import common_pb2 as pb

from services.model.errors import GeoServeError, InvalidInput
from services.provisioner.core import ProvisionerCore
from services.provisioner.driver import core_for_topology
from services.provisioner.server import WallProvisioner, serve
from services.runtime.clock import WallClock
from services.runtime.grpcutil import add_tls_args, apply_tls_args, parse_addr_map
from services.runtime.metrics import (
    ProvisionerMetrics,
    add_metrics_args,
    metrics_port,
    serve_metrics,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.provisioner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default=os.environ.get("GEOSERVE_TOPOLOGY"),
                   help="topology YAML (path or name under topologies/)")
    p.add_argument("--dcs", default=None,
                   help="DC addresses NAME=HOST:PORT,... (default: $DC_ADDRS)")
    p.add_argument("--address", default=None,
                   help="listen address (default $GEOSERVE_ADDRESS or 127.0.0.1:$PORT)")
    p.add_argument("--period", type=float, default=None,
                   help="poll period Δp, emulated s (default: the topology's)")
    p.add_argument("--mode", choices=["sync", "async"], default=None,
                   help="poll mode (default: the topology's)")
    p.add_argument("--poll-timeout", type=float, default=None,
                   help="GetState deadline, emulated s (default min(0.5, Δp/2))")
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
    apply_tls_args(args, "provisioner")
    from services.config.topology import load_topology
    from services.runtime.grpcutil import listen_address

    try:
        if not args.topology:
            raise InvalidInput("--topology", "required (or set GEOSERVE_TOPOLOGY)")
        topo = load_topology(args.topology, check_ci=False)
        if args.dcs is not None:
            addrs = parse_addr_map(args.dcs, "--dcs")
        else:
            addrs = parse_addr_map(os.environ.get("DC_ADDRS", ""), "DC_ADDRS")
        names = [d.name for d in topo.dcs]
        missing = [n for n in names if n not in addrs]
        if missing:
            raise InvalidInput(
                "--dcs", f"no address for DC(s) {', '.join(missing)} of topology {topo.name}; "
                "pass --dcs NAME=HOST:PORT,... or set DC_ADDRS")
        unknown = sorted(set(addrs) - set(names))
        if unknown:
            raise InvalidInput(
                "--dcs", f"DC(s) {', '.join(unknown)} not in topology {topo.name}; "
                f"known: {', '.join(names)}")
        address = listen_address(args.address, 50051)
        clock = WallClock(args.dilation if args.dilation is not None else topo.dilation,
                          args.epoch)
        core: ProvisionerCore[pb.DcState] = core_for_topology(
            topo, clock.now(), args.period, args.mode)
        metrics = ProvisionerMetrics() if metrics_port(args.metrics_port) else None
        if metrics is not None:
            serve_metrics(metrics.registry, args.metrics_port, args.metrics_address, "provisioner")
        asyncio.run(_run(core, clock, addrs, args.poll_timeout, address, args.stop_grace,
                         metrics))
    except GeoServeError as exc:
        print(f"provisioner: error: {exc}", file=sys.stderr)
        return 2
    return 0


async def _run(
    core: ProvisionerCore[pb.DcState],
    clock: WallClock,
    addrs: dict[str, str],
    poll_timeout_s: float | None,
    address: str,
    stop_grace_s: float,
    metrics: ProvisionerMetrics | None = None,
) -> None:
    # channels bind to the running event loop: build the runtime inside it
    prov = WallProvisioner(core, clock, addrs, poll_timeout_s)
    await serve(prov, address, stop_grace_s, metrics=metrics)


if __name__ == "__main__":
    sys.exit(main())
