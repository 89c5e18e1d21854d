"""Fault injection: kill or stop GeoServe processes at random times during a load and
check that every request still ends in exactly one recorded state.

Two targets:

* ``geoserve run`` (default): at random times in the load it picks a random service
  process (a DC, a scheduler or the provisioner) and either kills it (SIGKILL) or stops
  it (SIGSTOP) for a few seconds, then lets the run finish. The run must exit 3 when a
  process was killed (a service died), else 0.
* ``--compose``: the same on a Docker Compose deployment (``docker-compose.yml`` at the
  top of the repository, topology small; ``--compose-file`` for one that ``geoserve
  compose --topology T --out F`` wrote; image built with ``deploy/build-image.sh``): a
  random DC, scheduler or provisioner container is killed (``docker kill``) or frozen
  (``docker pause``, then ``unpause``); the load generator container must exit 0 with its
  results in ``--out``. The deployment runs under a project of its own and is taken
  ``down`` afterwards; the `--topology` flag does not apply.

Checks, both targets: records and summary are written, emitted == completed + rejected +
failed, one row per emitted request, every non-completed row has a reason. Prints each
fault and the outcome; exits 1 on a violation.

Usage: python bench/bench_chaos.py [--topology small] [--duration 40] [--rate 12]
       [--faults 4] [--seed 1] [--out DIR]
       [--compose [--compose-cli "docker compose"] [--compose-file F ...]]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runproc import ROOT, children, start_run  # noqa: E402

KINDS = ("datacenter", "scheduler", "provisioner")
COMPOSE_KINDS = ("dc-", "scheduler-", "provisioner")


def _inject(rng: random.Random, duration: float, faults: int, t0: float,
            victims: Callable[[], dict[str, str]], kill: Callable[[str], None],
            stop: Callable[[str], None], resume: Callable[[str], None]) -> list[dict]:
    """`faults` faults at random times in the load (started at monotonic `t0`): each a
    kill or a stop (resumed 1-3 s later) of a random victim (id -> name)."""
    done: list[dict] = []
    times = sorted(rng.uniform(1.0, max(duration - 3.0, 1.5)) for _ in range(faults))
    stopped: list[tuple[float, str]] = []
    for t in times:
        while time.monotonic() - t0 < t:
            for until, vid in list(stopped):
                if time.monotonic() >= until:
                    resume(vid)
                    stopped.remove((until, vid))
            time.sleep(0.05)
        live = victims()
        if not live:
            break
        vid = rng.choice(sorted(live))
        action = rng.choice(["kill", "stop"])
        if action == "kill":
            kill(vid)
        else:
            stop(vid)
            stopped.append((time.monotonic() + rng.uniform(1.0, 3.0), vid))
        done.append({"t_s": round(time.monotonic() - t0, 2), "action": action,
                     "victim": live[vid]})
    for _, vid in stopped:
        resume(vid)
    return done


def _check(out: Path) -> tuple[dict, list[str], Counter[str]]:
    """(requests of summary.json, violations, reasons of the non-completed rows)."""
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
    return rq, problems, Counter(r["reason"] for r in rows if r["state"] != "completed")


def _victims(pid: int) -> dict[int, str]:
    return {p: n for p, n in children(pid).items() if n.split()[0] in KINDS}


def chaos_run(topology: str, duration: float, rate: float, faults: int, seed: int,
              out: Path) -> dict:
    """Faults on a `geoserve run` of `topology`; results in `out`."""
    rng = random.Random(seed)
    runner, log = start_run(["--topology", topology, "--duration", str(duration),
                             "--rate", str(rate)], out)
    try:
        done = _inject(rng, duration, faults, time.monotonic(),
                       lambda: {str(p): n for p, n in children(runner.pid).items()
                                if n.split()[0] in KINDS},
                       lambda pid: os.kill(int(pid), signal.SIGKILL),
                       lambda pid: os.kill(int(pid), signal.SIGSTOP),
                       lambda pid: os.kill(int(pid), signal.SIGCONT))
        rc = runner.wait(timeout=duration + 300)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    rq, problems, reasons = _check(out)
    killed = any(f["action"] == "kill" for f in done)
    if rc != (3 if killed else 0):
        problems.append(f"geoserve run exited {rc} "
                        f"({'a service was killed' if killed else 'nothing was killed'})")
    return {"rc": rc, "faults": done, "requests": rq, "problems": problems,
            "reasons": reasons}


def _docker(*args: str, timeout: float = 60) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()}")
    return proc.stdout


def _docker_do(*args: str) -> None:
    _docker(*args)


def _project_containers(project: str, running_only: bool = True) -> dict[str, str]:
    """Containers of compose project `project`: id -> service name."""
    out = _docker("ps", *([] if running_only else ["-a"]), "--filter",
                  f"label=com.docker.compose.project={project}", "--format",
                  '{{.ID}} {{.Label "com.docker.compose.service"}}')
    return dict(line.split(maxsplit=1) for line in out.splitlines() if line.strip())


def compose_chaos_run(compose_cmd: list[str], duration: float, rate: float, faults: int,
                      seed: int, out: Path, env: dict[str, str] | None = None,
                      files: list[Path] | None = None) -> dict:
    """Faults on a compose deployment (`files`, default the committed docker-compose.yml)
    under a project of its own; the load generator writes its results to `out`."""
    rng = random.Random(seed)
    project = f"geoservechaos{os.getpid()}{seed}"
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o777)  # the load generator runs as uid 10001
    files = files or [ROOT / "docker-compose.yml"]
    base = {k: v for k, v in (env if env is not None else os.environ).items()
            if not k.startswith("COMPOSE_")}
    run_env = {**base, "COMPOSE_PROJECT_NAME": project, "RESULTS_DIR": str(out),
               "LOADGEN_ARGS": f"--duration {duration:g} --rate {rate:g}"}
    compose = [*compose_cmd, "-p", project, *(a for f in files for a in ("-f", str(f)))]

    def sh(*args: str, timeout: float = 300, check: bool = True) -> str:
        proc = subprocess.run([*compose, *args], cwd=ROOT, env=run_env, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: "
                               f"{proc.stderr[-2000:]}")
        return proc.stdout

    def loadgen() -> dict:
        ids = [i for i, n in _project_containers(project, False).items() if n == "loadgen"]
        return json.loads(_docker("inspect", ids[0]))[0]["State"] if ids else {}

    done: list[dict] = []
    try:
        # start everything but the load generator, then the load: t0 is the load's start
        sh("up", "-d", "--scale", "loadgen=0")
        sh("up", "-d", "--no-recreate", "loadgen")
        t0 = time.monotonic()
        done = _inject(rng, duration, faults, t0,
                       lambda: {i: n for i, n in _project_containers(project).items()
                                if n.startswith(COMPOSE_KINDS)},
                       lambda cid: _docker_do("kill", "-s", "KILL", cid),
                       lambda cid: _docker_do("pause", cid),
                       lambda cid: _docker_do("unpause", cid))
        deadline = time.monotonic() + duration + 240
        while loadgen().get("Status") != "exited":
            if time.monotonic() > deadline:
                raise TimeoutError("the load generator did not finish")
            time.sleep(1.0)
        rc = int(loadgen()["ExitCode"])
        logs = sh("logs", "--no-color", "--tail", "30", "loadgen", check=False)
    finally:
        sh("down", "-v", "--remove-orphans", "-t", "10", timeout=180, check=False)
    rq, problems, reasons = _check(out)
    if rc != 0:
        problems.append(f"the load generator exited {rc}: {logs[-1500:]}")
    left = _project_containers(project, False)
    if left:
        problems.append(f"containers left after down: {left}")
    return {"rc": rc, "faults": done, "requests": rq, "problems": problems,
            "reasons": reasons}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="small")
    p.add_argument("--duration", type=float, default=40.0)
    p.add_argument("--rate", type=float, default=12.0)
    p.add_argument("--faults", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--compose", action="store_true",
                   help="fault a compose deployment of docker-compose.yml instead")
    p.add_argument("--compose-cli", default="docker compose",
                   help="compose command (default 'docker compose'; or docker-compose)")
    p.add_argument("--compose-file", action="append", default=None,
                   help="compose file(s) of the deployment (default: docker-compose.yml)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out) if a.out else Path(tmp) / "chaos"
        if a.compose:
            files = [Path(f).resolve() for f in a.compose_file] if a.compose_file else None
            r = compose_chaos_run(shlex.split(a.compose_cli), a.duration, a.rate, a.faults,
                                  a.seed, out, files=files)
        else:
            r = chaos_run(a.topology, a.duration, a.rate, a.faults, a.seed, out)
    for f in r["faults"]:
        print(f"  t={f['t_s']:6.2f} s  {f['action']:4s}  {f['victim']}")
    rq = r["requests"]
    what = "load generator" if a.compose else "geoserve run"
    print(f"{what} exit {r['rc']}; emitted {rq['emitted']} completed {rq['completed']} "
          f"rejected {rq['rejected']} failed {rq['failed']}")
    for reason, n in r["reasons"].most_common(5):
        print(f"  {n:5d}  {reason}")
    for prob in r["problems"]:
        print(f"VIOLATION: {prob}")
    return 1 if r["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
