"""Soak: a long `geoserve run` near capacity, with zero lost requests and flat memory.

Runs small.yaml (by default) at `--rate` (default 60 req/s, about 80 % of its 8 engines'
capacity of about 77 req/s on CNN-DailyMail lengths) for `--duration` emulated seconds
(default 600) and samples the resident memory (VmRSS) of every process of the run every
`--every` wall seconds. Reports requests by state, lost requests (emitted without exactly
one record), faithfulness, and RSS at start (after the first sample in the load) and end
per process, with the growth. Exits 1 when a request is lost.

Usage: python bench/bench_soak.py [--topology small] [--rate 60] [--duration 600]
       [--every 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runproc import children, start_run  # noqa: E402


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def soak(topology: str, rate: float, duration: float, every: float, out: Path) -> dict:
    samples: dict[str, list[tuple[float, int]]] = {}
    runner, _ = start_run(["--topology", topology, "--rate", str(rate), "--duration",
                           str(duration)], out)
    try:
        t0 = time.monotonic()
        while runner.poll() is None:
            for pid, name in {runner.pid: "geoserve run", **children(runner.pid)}.items():
                kib = _rss_kib(pid)
                if kib is not None:
                    samples.setdefault(name, []).append((time.monotonic() - t0, kib))
            time.sleep(every)
        rc = runner.wait()
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    summary = json.loads((out / "summary.json").read_text())
    with (out / "records.csv").open() as f:
        ids = [r["id"] for r in csv.DictReader(f)]
    rq = summary["requests"]
    lost = rq["emitted"] - len(set(ids)) + (len(ids) - len(set(ids)))
    return {"rc": rc, "requests": rq, "lost": lost, "emulation": summary["emulation"],
            "ttft_s": summary["ttft_s"], "rss": samples}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="small")
    p.add_argument("--rate", type=float, default=60.0)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--every", type=float, default=10.0)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out) if a.out else Path(tmp) / "soak"
        r = soak(a.topology, a.rate, a.duration, a.every, out)
    rq, em = r["requests"], r["emulation"]
    print(f"soak: {a.topology} at {a.rate} req/s for {a.duration:.0f} s; geoserve run exit "
          f"{r['rc']}")
    print(f"requests emitted {rq['emitted']} completed {rq['completed']} rejected "
          f"{rq['rejected']} failed {rq['failed']}; lost {r['lost']}")
    print(f"faithful {em['faithful']}, p99 wake-up lateness {em['lateness_s_p99'] * 1e3:.2f} ms;"
          f" TTFT p50 {r['ttft_s']['p50'] * 1e3:.0f} ms p99 {r['ttft_s']['p99'] * 1e3:.0f} ms")
    print(f"{'process':24s} {'RSS start MiB':>14s} {'RSS end MiB':>12s} {'growth %':>9s}")
    for name, s in sorted(r["rss"].items()):
        if len(s) < 2:
            continue
        first, last = s[1][1] if len(s) > 2 else s[0][1], s[-1][1]
        print(f"{name:24s} {first / 1024:14.1f} {last / 1024:12.1f} "
              f"{100 * (last - first) / first:9.1f}")
    return 1 if r["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
