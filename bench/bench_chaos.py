"""Fault injection: kill or stop GeoServe processes at random times during a load and
check that every request still ends in exactly one recorded state.

Runs `geoserve run` on a topology; at random times in the load it picks a random service
process (a DC, a scheduler or the provisioner) and either kills it (SIGKILL) or stops it
(SIGSTOP) for a few seconds, then lets the run finish. Checks: the run writes its records
and summary (and exits 3 when a process was killed: a service died), emitted == completed
+ rejected + failed, one row per emitted request, every non-completed row has a reason.
Prints each fault and the outcome; exits 1 on a violation.

Usage: python bench/bench_chaos.py [--topology small] [--duration 40] [--rate 12]
       [--faults 4] [--seed 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runproc import children, start_run  # noqa: E402

KINDS = ("datacenter", "scheduler", "provisioner")


def _victims(pid: int) -> dict[int, str]:
    return {p: n for p, n in children(pid).items() if n.split()[0] in KINDS}


def chaos_run(topology: str, duration: float, rate: float, faults: int, seed: int,
              out: Path) -> dict:
    rng = random.Random(seed)
    done: list[dict] = []
    runner, log = start_run(["--topology", topology, "--duration", str(duration),
                             "--rate", str(rate)], out)
    try:
        t0 = time.monotonic()
        times = sorted(rng.uniform(1.0, max(duration - 3.0, 1.5)) for _ in range(faults))
        stopped: list[tuple[float, int]] = []
        for t in times:
            while time.monotonic() - t0 < t:
                for until, pid in list(stopped):
                    if time.monotonic() >= until:
                        os.kill(pid, signal.SIGCONT)
                        stopped.remove((until, pid))
                time.sleep(0.05)
            victims = _victims(runner.pid)
            if not victims:
                break
            pid = rng.choice(sorted(victims))
            action = rng.choice(["kill", "stop"])
            if action == "kill":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                stopped.append((time.monotonic() + rng.uniform(1.0, 3.0), pid))
            done.append({"t_s": round(time.monotonic() - t0, 2), "action": action,
                         "victim": victims[pid]})
        for _, pid in stopped:
            os.kill(pid, signal.SIGCONT)
        rc = runner.wait(timeout=duration + 300)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    summary = json.loads((out / "summary.json").read_text())
    with (out / "records.csv").open() as f:
        rows = list(csv.DictReader(f))
    rq = summary["requests"]
    problems = []
    if rq["emitted"] != rq["completed"] + rq["rejected"] + rq["failed"]:
        problems.append(f"conservation: {rq}")
    if len(rows) != rq["emitted"] or len({r["id"] for r in rows}) != len(rows):
        problems.append(f"{len(rows)} rows for {rq['emitted']} emitted requests")
    if any(r["state"] != "completed" and not r["reason"] for r in rows):
        problems.append("a non-completed request without a reason")
    killed = any(f["action"] == "kill" for f in done)
    if rc != (3 if killed else 0):
        problems.append(f"geoserve run exited {rc} "
                        f"({'a service was killed' if killed else 'nothing was killed'})")
    return {"rc": rc, "faults": done, "requests": rq, "problems": problems,
            "reasons": Counter(r["reason"] for r in rows if r["state"] != "completed")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="small")
    p.add_argument("--duration", type=float, default=40.0)
    p.add_argument("--rate", type=float, default=12.0)
    p.add_argument("--faults", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out) if a.out else Path(tmp) / "chaos"
        r = chaos_run(a.topology, a.duration, a.rate, a.faults, a.seed, out)
    for f in r["faults"]:
        print(f"  t={f['t_s']:6.2f} s  {f['action']:4s}  {f['victim']}")
    rq = r["requests"]
    print(f"geoserve run exit {r['rc']}; emitted {rq['emitted']} completed {rq['completed']} "
          f"rejected {rq['rejected']} failed {rq['failed']}")
    for reason, n in r["reasons"].most_common(5):
        print(f"  {n:5d}  {reason}")
    for prob in r["problems"]:
        print(f"VIOLATION: {prob}")
    return 1 if r["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
