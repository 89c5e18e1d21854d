"""Helpers to run GeoServe services as real OS processes on loopback ports in tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from services.runner.local import free_port

ROOT = Path(__file__).resolve().parents[1]


def wait_healthy(address: str, timeout_s: float = 30.0) -> None:
    from services.runtime.grpcutil import wait_healthy as _wait

    asyncio.run(_wait(address, timeout_s))


@contextlib.contextmanager
def service(
    module: str, *args: str, log: Path | None = None, address: str | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Start `python -m module args` on `address` (default: a fresh loopback port), healthy
    before it is yielded as (process, address); SIGTERM, then SIGKILL, afterwards. A caller
    that passes the address can restart a killed service on the same port."""
    address = address or f"127.0.0.1:{free_port()}"
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--address", address, *args],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{module} exited early with {proc.returncode}")
            try:
                wait_healthy(address, timeout_s=1.0)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        yield proc, address
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]
