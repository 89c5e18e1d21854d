"""``python -m services.runtime.healthprobe [ADDR]``: exit 0 when a gRPC server is SERVING.

A tiny client of the standard gRPC health service (``grpc.health.v1.Health/Check``) for
container health checks (compose ``healthcheck``, Kubernetes ``exec`` probes), where no
``grpc_health_probe`` binary is installed. ADDR defaults to ``127.0.0.1:$PORT`` (``PORT``
defaults to 50051). Exit codes: 0 SERVING, 1 any other status or no answer within the
deadline, 2 bad arguments. One line on stderr says why a probe failed.
"""

from __future__ import annotations

import argparse
import os
import sys

from services.runtime.grpcutil import open_sync_channel


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.runtime.healthprobe",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("address", nargs="?", default=None,
                   help="HOST:PORT of the server (default 127.0.0.1:$PORT)")
    p.add_argument("--service", default="", help="service name to check ('' = the server)")
    p.add_argument("--timeout", type=float, default=3.0, help="deadline of the call, s")
    return p


def probe(address: str, service: str = "", timeout_s: float = 3.0) -> tuple[bool, str]:
    """One Health/Check call; returns (serving, a word on the outcome)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with open_sync_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service),
                               timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            name = code.name if code is not None else "ERROR"
            return False, f"{name}: {exc.details() if hasattr(exc, 'details') else exc}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    address = args.address or f"127.0.0.1:{os.environ.get('PORT') or '50051'}"
    if not args.timeout > 0:
        print("healthprobe: --timeout must be > 0", file=sys.stderr)
        return 2
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    ok, what = probe(address, args.service, args.timeout)
    if not ok:
        print(f"healthprobe: {address}: {what}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
