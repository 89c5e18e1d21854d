"""``python -m services.scheduler``: run one region's scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from services.model.errors import GeoServeError, InvalidInput
from services.runtime.grpcutil import add_tls_args, apply_tls_args
from services.runtime.metrics import add_metrics_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.scheduler", description=__doc__)
    p.add_argument("--topology", required=True, help="topology YAML (or name in topologies/)")
    p.add_argument("--region", default=os.environ.get("GEOSERVE_REGION", ""))
    p.add_argument("--policy", default=os.environ.get("GEOSERVE_POLICY") or None,
                   help="override the topology's policy for this region")
    p.add_argument("--policy-config", default=os.environ.get("GEOSERVE_POLICY_CONFIG", ""),
                   help="policy settings as k=v,k=v (e.g. alpha=0.5)")
    p.add_argument("--peers", default=os.environ.get("PEER_ADDRS", ""),
                   help="REGION=HOST:PORT,... of the other regions' schedulers")
    p.add_argument("--dcs", default=os.environ.get("DC_ADDRS", ""),
                   help="DC=HOST:PORT,... of this region's datacenters")
    p.add_argument("--provisioner", default=os.environ.get("PROVISIONER_ADDR", ""))
    p.add_argument("--address", default=None,
                   help="listen address (default $GEOSERVE_ADDRESS or 127.0.0.1:$PORT)")
    p.add_argument("--dilation", type=float, default=None)
    p.add_argument("--epoch", type=float, default=None, help="run epoch, unix seconds")
    add_metrics_args(p)
    add_tls_args(p)
    return p


def parse_kv(text: str, field: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        k, sep, v = part.partition("=")
        if not sep:
            raise InvalidInput(field, f"expected key=value entries, got {part!r}")
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    apply_tls_args(args, "scheduler")
    from services.config.topology import load_topology
    from services.runtime.clock import WallClock
    from services.runtime.grpcutil import parse_addr_map
    from services.runtime.metrics import SchedulerMetrics, metrics_port, serve_metrics
    from services.scheduler.server import SchedulerRuntime, serve

    try:
        topo = load_topology(args.topology, check_ci=False)
        if args.policy or args.policy_config:
            spec = topo.region(args.region).scheduler
            topo = topo.with_overrides(policy=args.policy or spec.policy,
                                       policy_config=parse_kv(args.policy_config,
                                                              "--policy-config"))
        region = topo.region(args.region).name
        if not args.dcs:
            raise InvalidInput("--dcs / DC_ADDRS", "addresses of this region's DCs are required")
        dcs = parse_addr_map(args.dcs, "--dcs")
        peers = parse_addr_map(args.peers, "--peers")
        from services.runtime.grpcutil import listen_address

        address = listen_address(args.address, 50052)
        clock = WallClock(args.dilation or topo.dilation, args.epoch)
        metrics = SchedulerMetrics() if metrics_port(args.metrics_port) else None
        if metrics is not None:
            serve_metrics(metrics.registry, args.metrics_port, args.metrics_address, "scheduler")

        async def run() -> None:
            rt = SchedulerRuntime(topo, region, clock, peers, dcs, args.provisioner or None)
            await serve(rt, address, metrics)

        asyncio.run(run())
    except GeoServeError as exc:
        print(f"scheduler: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
