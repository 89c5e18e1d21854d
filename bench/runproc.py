"""Helpers of the benchmarks that drive a `geoserve run` from outside: start it, list the
processes it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_run(args: list[str], out: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`geoserve run ARGS --out OUT` in its own session, its output in OUT.log; returns once
    the load has started (or the run has ended)."""
    log = out.parent / f"{out.name}.log"
    with log.open("wb") as fh:
        runner = subprocess.Popen([sys.executable, "-m", "services.cli", "run", *args,
                                   "--out", str(out)],
                                  cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                  start_new_session=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while "load:" not in log.read_text() and runner.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the load did not start (see {log})")
        time.sleep(0.1)
    return runner, log


def children(pid: int) -> dict[int, str]:
    """Processes started by `pid`: pid -> 'component name' (e.g. 'datacenter eu-nl')."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args = [a.decode(errors="replace")
                    for a in (p / "cmdline").read_bytes().split(b"\0") if a]
        except (OSError, IndexError, ValueError):
            continue
        if ppid != pid:
            continue
        mod = next((a for a in args if a.startswith("services.")), "?")
        name = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--dc", "--region")),
                    "")
        out[int(p.name)] = f"{mod.split('.')[-1]} {name}".strip()
    return out
