"""``geoserve carbon-api``: the emulated grid over HTTP, in the shapes of the Carbon Aware
SDK Web API and Electricity Maps' API (`services.carbonapi.core`).

A stdlib threading HTTP server: JSON answers, 400 with ``{"error": "FIELD: ..."}`` for bad
input, 404 for an unknown path. It shares the run's epoch and dilation (``--epoch``,
``--dilation``; as a process of ``geoserve run`` it gets them from the runner), so a
carbon-aware application under test sees the values of the emulated now. Listens on
loopback unless an address says otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from services.carbonapi.core import CarbonApi, Site, route
from services.config.factory import build_ci
from services.config.topology import Topology, load_topology
from services.model.carbon import CIForecast
from services.model.errors import InvalidInput
from services.runtime.clock import WallClock

log = logging.getLogger("geoserve.carbonapi")


def build_api(topo: Topology, clock: WallClock, forecast_error: float = 0.0,
              seed: int = 1) -> CarbonApi:
    sites = []
    for d in topo.dcs:
        src = build_ci(topo, d)
        sites.append(Site(d.name, d.zone, src, CIForecast(src, forecast_error, seed)))
    return CarbonApi(sites, clock.now, datetime.fromtimestamp(clock.epoch_unix, UTC))


def make_server(api: CarbonApi, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            try:
                body: Any = route(api, url.path, parse_qs(url.query))
                code = 200
            except KeyError:
                body, code = {"error": f"no such endpoint: {url.path}"}, 404
            except InvalidInput as exc:
                body, code = {"error": str(exc)}, 400
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """No access log."""

    return ThreadingHTTPServer((host, port), Handler)


def register(sub: Any) -> None:
    p = sub.add_parser("carbon-api", help="serve the emulated grid as carbon-signal APIs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="topologies/small.yaml")
    p.add_argument("--address", default="127.0.0.1:8090", help="HOST:PORT (default loopback)")
    p.add_argument("--epoch", type=float, default=None, help="run epoch, unix s (default now)")
    p.add_argument("--dilation", type=float, default=None,
                   help="time dilation k (default: the topology's)")
    p.add_argument("--forecast-error", type=float, default=0.0,
                   help="relative error of the forecasts (0: the trace itself)")
    p.add_argument("--seed", type=int, default=1, help="seed of the forecast errors")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    topo = load_topology(args.topology)
    host, sep, port = args.address.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidInput("--address", f"expected HOST:PORT, got {args.address!r}")
    dilation = args.dilation if args.dilation is not None else topo.dilation
    if not (dilation >= 1.0):
        raise InvalidInput("--dilation", f"expected >= 1, got {dilation}")
    api = build_api(topo, WallClock(dilation, args.epoch), args.forecast_error, args.seed)
    try:
        server = make_server(api, host or "127.0.0.1", int(port))
    except OSError as exc:
        raise InvalidInput("--address", f"cannot listen on {args.address}: {exc}") from None
    print(f"carbon-api: {len(api.sites)} DCs of {topo.name} on http://{args.address} "
          "(/emissions/..., /v3/carbon-intensity/...)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
