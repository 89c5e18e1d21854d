"""A service started on its own listens on loopback only (gRPC and /metrics) unless an
address is given explicitly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.procs import ROOT, free_port, wait_healthy


def _listeners(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp[6]) of the sockets listening on `port`."""
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            addr, hexport = f[1].rsplit(":", 1)
            if int(hexport, 16) == port and f[3] == "0A":  # LISTEN
                out.add(addr)
    return out


def _run_dc(explicit: bool) -> tuple[set[str], set[str]]:
    """Listening addresses of a DC's gRPC and /metrics ports, started with PORT and
    METRICS_PORT only, or also with GEOSERVE_ADDRESS / METRICS_ADDR on every interface."""
    grpc_port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GEOSERVE_ADDRESS", "METRICS_ADDR")}
    env.update(PORT=str(grpc_port), METRICS_PORT=str(metrics_port))
    if explicit:
        env.update(GEOSERVE_ADDRESS=f"0.0.0.0:{grpc_port}", METRICS_ADDR="0.0.0.0")
    p = subprocess.Popen([sys.executable, "-m", "services.datacenter", "--dc", "solo"],
                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(f"127.0.0.1:{grpc_port}", 30)
        deadline = time.monotonic() + 10
        while not _listeners(metrics_port) and time.monotonic() < deadline:
            time.sleep(0.1)
        return _listeners(grpc_port), _listeners(metrics_port)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=15)


# 127.0.0.1, ::1, ::ffff:127.0.0.1 (gRPC binds IPv4 loopback on a v6 socket)
LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
ANY = {"00000000", "00000000000000000000000000000000"}        # 0.0.0.0, ::


def test_a_service_on_its_own_listens_on_loopback_only():
    grpc_l, metrics_l = _run_dc(explicit=False)
    assert grpc_l and grpc_l <= LOOPBACK, grpc_l
    assert metrics_l and metrics_l <= LOOPBACK, metrics_l


def test_an_explicit_address_is_honoured():
    grpc_l, metrics_l = _run_dc(explicit=True)
    assert grpc_l and grpc_l <= ANY, grpc_l
    assert metrics_l and metrics_l <= ANY, metrics_l
