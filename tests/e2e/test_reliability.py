"""Reliability of the wall runtime: real service processes on loopback, faults injected.

* A datacenter killed with SIGKILL mid-run: the run completes, its in-flight requests end
  FAILED naming it, the provisioner marks it down within 2 Δp, no request goes to it while
  it is down; restarted on the same address it rejoins and serves again.
* The provisioner killed mid-run: schedulers keep their last snapshot, report its growing
  age and past the staleness bound decide round-robin (fallback); the run completes.
* Ctrl-C / SIGTERM of ``geoserve run`` leaves no process of the run alive.
* RTT injection: forwarded requests' TTFT exceeds local ones' by the inter-region RTT.

Every run checks request conservation in ``summary.json`` and ``records.csv``. The
topologies are tiny (1 GPU per DC, a few req/s) so the whole file takes a few minutes
on two cores. Times in records are emulated seconds from the start of the load (t0); the
tests recover t0 from the load generator's "load:" line and use dilation 1, so a wall
instant ``w`` is emulated ``w - t0_wall`` in record time and ``w - epoch`` in the
services' clocks (snapshots, scheduler ages).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.config.topology import ROOT, Topology, load_topology
from services.runner.local import LocalRun

_GEOSERVE = Path(sys.executable).parent / "geoserve"
# the installed console script; `python -m services.cli` where it is not installed
GEOSERVE = [str(_GEOSERVE)] if _GEOSERVE.exists() else [sys.executable, "-m", "services.cli"]
PERIOD_S = 0.5       # provisioner Δp of every topology here


# ------------------------------------------------------------------------------ helpers
def write_topology(
    path: Path,
    regions: dict[str, list[str]],
    *,
    duration_s: float,
    rate_rps: float = 6.0,
    staleness_s: float = 5.0,
    rtt_ms: float | None = None,
    seed: int = 7,
) -> Path:
    aws = {"eu-north": "eu-north-1", "us-east": "us-east-1"}
    data: dict[str, Any] = {
        "name": path.stem,
        "defaults": {
            "dc": {"nodes": 1, "gpus_per_node": 1, "setup": "a100-40gb/llama-3.1-8b-tp1",
                   "pue": 1.1},
            "scheduler": {"policy": "round-robin", "window_s": 0.1, "window_max": 300,
                          "staleness_s": staleness_s},
        },
        "regions": [
            {"name": r, "aws_region": aws[r],
             "dcs": [{"name": d, "ci": {"constant": 100.0 + 50 * i}} for i, d in enumerate(dcs)]}
            for r, dcs in regions.items()
        ],
        "provisioner": {"period_s": PERIOD_S, "mode": "sync"},
        "load": {"rate_rps": rate_rps, "dataset": "cnn-dailymail", "duration_s": duration_s,
                 "warmup_s": 0, "seed": seed, "arrivals": "poisson"},
        "emulation": {"dilation": 1.0},
    }
    if rtt_ms is not None:
        names = list(regions)
        data["network"] = {"rtt_ms": {f"{names[0]}--{names[1]}": rtt_ms}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def f(row: dict[str, str], key: str) -> float:
    v = row[key]
    return float(v) if v not in ("", "nan", "None") else math.nan


def check_conservation(out: Path, topo: Topology) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """emitted == completed + rejected + failed in summary.json and records.csv."""
    summary = json.loads((out / "summary.json").read_text())
    rq = summary["requests"]
    with (out / "records.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a request id has more than one row"
    assert rq["emitted"] == len(rows)
    assert rq["emitted"] == rq["completed"] + rq["rejected"] + rq["failed"]
    states = {s: sum(r["state"] == s for r in rows) for s in ("completed", "rejected", "failed")}
    assert sum(states.values()) == len(rows), {r["state"] for r in rows}
    assert (states["completed"], states["rejected"], states["failed"]) == (
        rq["completed"], rq["rejected"], rq["failed"])
    # the Poisson load of the topology: about rate x duration requests
    expect = topo.load.rate_rps * topo.load.duration_s
    assert 0.6 * expect < len(rows) < 1.4 * expect
    for r in rows:
        if r["state"] != "completed":
            assert r["reason"], f"{r['id']} ended {r['state']} without a reason"
    return rows, summary


def get_snapshot(address: str) -> Any:
    import grpc
    from geoserve.v1 import provisioner_pb2, provisioner_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        return provisioner_pb2_grpc.ProvisionerStub(ch).GetSnapshot(
            provisioner_pb2.GetSnapshotRequest(), timeout=2.0)


def dc_state(address: str) -> Any:
    import grpc
    from geoserve.v1 import datacenter_pb2, datacenter_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        return datacenter_pb2_grpc.DatacenterStub(ch).GetState(
            datacenter_pb2.GetStateRequest(), timeout=2.0).state


def scheduler_info(address: str) -> Any:
    import grpc
    from geoserve.v1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        return scheduler_pb2_grpc.SchedulerStub(ch).Info(
            scheduler_pb2.SchedulerInfoRequest(), timeout=2.0)


def dc_up_in_snapshot(snap: Any, dc: str) -> bool:
    for d in snap.dcs:
        if d.dc == dc:
            return bool(d.up)
    raise AssertionError(f"{dc} not in the provisioner's snapshot")


def snapshot_where(address: str, dc: str, *, up: bool) -> Any:
    """The provisioner's latest snapshot if it shows `dc` up (or down), else None."""
    snap = get_snapshot(address)
    return snap if dc_up_in_snapshot(snap, dc) == up else None


def wait_for(pred: Any, timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def procs_mentioning(*needles: str) -> dict[int, str]:
    """Live processes (not zombies) whose command line contains any of `needles`."""
    me = os.getpid()
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        cl = cmdline(int(p.name))
        if cl and any(n in cl for n in needles):
            out[int(p.name)] = cl
    return out


@dataclass
class Run:
    """A `LocalRun` whose load generator the test drives itself."""

    runner: LocalRun
    topo: Topology
    out: Path
    loadgen: subprocess.Popen[bytes] | None = None
    t0_wall: float = 0.0

    @property
    def epoch(self) -> float:
        return float(self.runner.common[self.runner.common.index("--epoch") + 1])

    def rel(self, wall: float) -> float:
        """Record time (emulated s since the load started) of a wall instant."""
        return wall - self.t0_wall

    def svc(self, wall: float) -> float:
        """Service clock time (emulated s since the run's epoch) of a wall instant."""
        return wall - self.epoch

    def start_load(self, drain_limit_s: float = 20.0) -> None:
        r = self.runner
        args = [sys.executable, "-m", "services.loadgen", *r.common,
                "--schedulers", ",".join(f"{n}={a}" for n, a in r.sched_addrs.items()),
                "--dcs", ",".join(f"{n}={a}" for n, a in r.dc_addrs.items()),
                "--out", str(self.out), "--drain-limit", str(drain_limit_s),
                "--progress-every", "5"]
        log = self.out / "loadgen.log"
        with log.open("wb") as fh:
            self.loadgen = subprocess.Popen(args, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})

        def started() -> bool:
            assert self.loadgen is not None
            if self.loadgen.poll() is not None:
                raise AssertionError(f"loadgen exited early:\n{log.read_text()[-3000:]}")
            return "load:" in log.read_text()

        wait_for(started, 30, "the load to start", every_s=0.01)
        # the loadgen sets t0 = now + 0.2 s just before it prints the "load:" line
        self.t0_wall = time.time() + 0.2

    def sleep_until_rel(self, t_rel: float) -> None:
        delay = self.t0_wall + t_rel - time.time()
        if delay > 0:
            time.sleep(delay)

    def finish(self) -> tuple[list[dict[str, str]], dict[str, Any]]:
        assert self.loadgen is not None
        rc = self.loadgen.wait(timeout=self.topo.load.duration_s + 60)
        log = (self.out / "loadgen.log").read_text()
        assert rc == 0, f"loadgen exited with {rc}:\n{log[-3000:]}"
        return check_conservation(self.out, self.topo)


@contextlib.contextmanager
def local_run(topo_path: Path, out: Path) -> Iterator[Run]:
    topo = load_topology(topo_path)
    runner = LocalRun(topo, str(topo_path), out, startup_timeout_s=60)
    run = Run(runner, topo, out)
    try:
        runner.start()
        yield run
    finally:
        if run.loadgen is not None and run.loadgen.poll() is None:
            run.loadgen.kill()
            run.loadgen.wait()
        runner.stop()
        left = procs_mentioning(str(out))
        assert not left, f"processes of the run still alive: {left}"


# ------------------------------------------------------------------------------ DC kill
VICTIM = "eu-b"


@dataclass
class DcKill:
    """One run in which VICTIM is SIGKILLed 6 s into the load and restarted at 12 s."""

    rows: list[dict[str, str]]
    summary: dict[str, Any]
    in_flight_at_kill: int
    kill_rel: float          # record time of the kill
    down_after_s: float      # kill -> first snapshot with the DC down (service clock)
    down_rel: float          # record time of that snapshot
    restart_rel: float       # record time of the restart
    up_rel: float            # record time of the first snapshot with the DC up again
    crashed: list[str]
    provisioner_log: str


@pytest.fixture(scope="module")
def dc_kill(tmp_path_factory: pytest.TempPathFactory) -> DcKill:
    tmp = tmp_path_factory.mktemp("dckill")
    topo_path = write_topology(tmp / "dckill.yaml",
                               {"eu-north": ["eu-a", VICTIM], "us-east": ["us-a"]},
                               duration_s=24)
    out = tmp / "out"
    with local_run(topo_path, out) as run:
        proc = run.runner.procs[f"dc/{VICTIM}"]
        prov = run.runner.procs["provisioner"].address
        assert dc_up_in_snapshot(get_snapshot(prov), VICTIM)
        run.start_load(drain_limit_s=8.0)

        # kill it 6 s into the load, at a moment it has requests in flight
        run.sleep_until_rel(6.0)
        in_flight = wait_for(lambda: dc_state(proc.address).in_flight, 6.0,
                             f"requests in flight at {VICTIM}", every_s=0.02)
        assert proc.popen is not None
        old_pid = proc.popen.pid
        os.kill(old_pid, signal.SIGKILL)
        kill_wall = time.time()
        proc.popen.wait(timeout=5)
        snap = wait_for(lambda: snapshot_where(prov, VICTIM, up=False), 4 * PERIOD_S + 2,
                        f"{VICTIM} marked down")
        down_svc = snap.time_s
        wait_for(lambda: f"dc/{VICTIM}" in run.runner.crashed, 3, "the runner to notice")

        # restart it with the same arguments, on the same address
        run.sleep_until_rel(12.0)
        restart_wall = time.time()
        run.runner._spawn(proc)
        assert proc.popen is not None and proc.popen.pid != old_pid
        run.runner._wait_healthy(proc)
        snap = wait_for(lambda: snapshot_where(prov, VICTIM, up=True), 10, f"{VICTIM} up again")
        up_svc = snap.time_s
        rows, summary = run.finish()
        crashed = list(run.runner.crashed)

    kill_rel = run.rel(kill_wall)
    down_after = down_svc - run.svc(kill_wall)
    return DcKill(
        rows=rows, summary=summary, in_flight_at_kill=int(in_flight), kill_rel=kill_rel,
        down_after_s=down_after, down_rel=kill_rel + down_after,
        restart_rel=run.rel(restart_wall), up_rel=kill_rel + up_svc - run.svc(kill_wall),
        crashed=crashed, provisioner_log=(out / "logs" / "provisioner.log").read_text(),
    )


def test_dc_kill_run_completes(dc_kill: DcKill) -> None:
    # conservation was checked when the run ended; the runner reported the death
    assert dc_kill.crashed == [f"dc/{VICTIM}"]
    rq = dc_kill.summary["requests"]
    assert rq["rejected"] == 0
    assert rq["completed"] >= 0.9 * rq["emitted"]


def test_dc_kill_in_flight_requests_fail_naming_it(dc_kill: DcKill) -> None:
    assert dc_kill.in_flight_at_kill >= 1
    lost = [r for r in dc_kill.rows if r["state"] == "failed"
            and f(r, "emitted_s") < dc_kill.kill_rel + 0.1]
    assert lost, "no request failed although the DC had requests in flight when killed"
    for r in lost:
        assert VICTIM in r["reason"], r
        assert r["dc"] == VICTIM, r
        assert r["status_code"] == "UNAVAILABLE", r
    # nothing else that was sent before the kill failed
    assert all(r["dc"] == VICTIM for r in dc_kill.rows
               if r["state"] != "completed" and f(r, "emitted_s") < dc_kill.kill_rel)


def test_dc_kill_marked_down_within_two_poll_periods(dc_kill: DcKill) -> None:
    assert -0.05 <= dc_kill.down_after_s <= 2 * PERIOD_S + 0.05, dc_kill.down_after_s
    log = dc_kill.provisioner_log
    assert f"DC {VICTIM} is down" in log
    assert log.index(f"DC {VICTIM} is down") < log.rindex(f"DC {VICTIM} is up")


def test_dc_kill_no_request_goes_to_a_dead_dc(dc_kill: DcKill) -> None:
    k = dc_kill
    on_victim = [r for r in k.rows if r["dc"] == VICTIM and r["state"] == "completed"]
    assert any(f(r, "completed_s") < k.kill_rel for r in on_victim)  # it served before
    for r in on_victim:  # and did no work while dead
        assert not (k.kill_rel < f(r, "dc_arrival_s") < k.restart_rel), r
        assert not (k.kill_rel + 0.05 < f(r, "completed_s") < k.restart_rel), r
    # once the provisioner said it was down, no decision named it
    while_down = [r for r in k.rows if k.down_rel + 0.2 < f(r, "decided_s") < k.restart_rel]
    assert len(while_down) >= 10
    assert not [r for r in while_down if r["dc"] == VICTIM]
    assert all(r["state"] == "completed" for r in while_down)


def test_dc_restart_rejoins(dc_kill: DcKill) -> None:
    k = dc_kill
    assert k.restart_rel < k.up_rel < k.restart_rel + 10
    back = [r for r in k.rows if r["dc"] == VICTIM and r["state"] == "completed"
            and f(r, "decided_s") > k.up_rel]
    assert len(back) >= 3, f"{len(back)} requests served by {VICTIM} after it rejoined"


def test_dc_restart_loses_no_request(dc_kill: DcKill) -> None:
    late = [r for r in dc_kill.rows
            if r["state"] != "completed" and f(r, "emitted_s") >= dc_kill.kill_rel + 0.1]
    assert not late, [(r["id"], r["emitted_s"], r["reason"]) for r in late]


# ------------------------------------------------------------------------------ provisioner
def test_killed_provisioner_stale_snapshot_falls_back_to_round_robin(tmp_path: Path) -> None:
    staleness = 2.0
    topo_path = write_topology(tmp_path / "provkill.yaml",
                               {"eu-north": ["eu-a"], "us-east": ["us-a"]},
                               duration_s=16, staleness_s=staleness)
    out = tmp_path / "out"
    with local_run(topo_path, out) as run:
        scheds = {r: run.runner.procs[f"scheduler/{r}"].address for r in run.runner.sched_addrs}
        run.start_load()
        run.sleep_until_rel(4.0)
        before = {r: scheduler_info(a) for r, a in scheds.items()}
        for i in before.values():
            assert 0 <= i.snapshot_age_s <= 2 * PERIOD_S + 0.2, i
        prov = run.runner.procs["provisioner"]
        assert prov.popen is not None
        os.kill(prov.popen.pid, signal.SIGKILL)
        kill_wall = time.time()
        prov.popen.wait(timeout=5)

        time.sleep(1.0)
        t1 = time.monotonic()
        mid = {r: scheduler_info(a) for r, a in scheds.items()}
        time.sleep(3.0)
        t2 = time.monotonic()
        late = {r: scheduler_info(a) for r, a in scheds.items()}
        rows, summary = run.finish()

    for r in scheds:
        # the age grows with the clock, from the last snapshot before the kill
        assert 1.0 <= mid[r].snapshot_age_s <= 1.0 + PERIOD_S + 0.5, mid[r]
        assert late[r].snapshot_age_s - mid[r].snapshot_age_s == pytest.approx(t2 - t1, abs=0.25)
        assert late[r].snapshot_age_s > staleness
        assert mid[r].fallbacks == before[r].fallbacks == 0
        assert late[r].fallbacks > mid[r].fallbacks
        assert late[r].decisions > mid[r].decisions

    kill_rel = run.rel(kill_wall)
    assert summary["requests"]["failed"] == 0 and summary["requests"]["rejected"] == 0
    fresh = [r for r in rows if f(r, "decided_s") < kill_rel - 0.1]
    stale = [r for r in rows if f(r, "decided_s") > kill_rel + staleness + PERIOD_S + 0.3]
    assert len(fresh) >= 10 and len(stale) >= 20
    assert all(r["fallback"] == "False" for r in fresh)
    assert all(r["fallback"] == "True" for r in stale)
    # round-robin over both DCs: each gets a fair share of the stale decisions
    for dc in ("eu-a", "us-a"):
        assert sum(r["dc"] == dc for r in stale) >= 0.3 * len(stale)
    assert summary["requests"]["fallback"] == sum(r["fallback"] == "True" for r in rows)


# ------------------------------------------------------------------------------ Ctrl-C
# An interrupted run, or one whose load generator is killed, still writes records.csv and
# a partial summary.json: every emitted request in exactly one terminal state.
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "kill-loadgen"])
def test_interrupted_run_leaves_no_process(tmp_path: Path, how: str) -> None:
    topo_path = write_topology(tmp_path / f"interrupt-{how}.yaml",
                               {"eu-north": ["eu-a"], "us-east": ["us-a"]}, duration_s=60)
    out = tmp_path / f"out-{how}"
    needles = (str(out), str(topo_path))
    log = tmp_path / "geoserve.log"
    with log.open("wb") as fh:
        p = subprocess.Popen([*GEOSERVE, "run", "--topology", str(topo_path), "--out",
                              str(out)], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             start_new_session=True)
    try:
        wait_for(lambda: p.poll() is not None or "load:" in log.read_text(), 60,
                 "the load to start", every_s=0.05)
        assert p.poll() is None, log.read_text()[-3000:]
        time.sleep(2.0)
        running = procs_mentioning(*needles)
        # geoserve, 2 DCs, provisioner, 2 schedulers, loadgen
        assert len(running) >= 7, running
        if how == "ctrl-c":
            os.killpg(p.pid, signal.SIGINT)  # what a terminal does: the foreground group
        elif how == "sigterm":
            os.kill(p.pid, signal.SIGTERM)
        else:
            loadgen = [pid for pid, cmd in running.items() if "services.loadgen" in cmd]
            assert len(loadgen) == 1, running
            os.kill(loadgen[0], signal.SIGKILL)
        rc = p.wait(timeout=40)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert rc != 0, "an interrupted run must not report success"
    text = log.read_text()
    expected_rc = {"ctrl-c": 130, "sigterm": 143, "kill-loadgen": 137}[how]
    assert rc == expected_rc, text[-3000:]
    if how == "kill-loadgen":
        assert "the load generator was killed by SIGKILL" in text
        assert "rebuilt records.csv" in text
    summary = json.loads((out / "summary.json").read_text())
    with (out / "records.csv").open() as f:
        rows = list(csv.DictReader(f))
    partial = summary["partial"]
    assert partial is not None and 0 < partial["emitted"] < partial["planned"]
    rq = summary["requests"]
    assert rq["emitted"] == partial["emitted"] == len(rows) == len({r["id"] for r in rows})
    assert rq["emitted"] == rq["completed"] + rq["rejected"] + rq["failed"]
    assert rq["completed"] > 0
    assert {r["state"] for r in rows} <= {"completed", "rejected", "failed"}
    cut = [r for r in rows if r["state"] == "failed"]
    assert all(r["reason"] for r in cut)
    assert not (out / "records.journal.csv").exists()
    # geoserve waits for its services before it exits: nothing of the run is left
    left = procs_mentioning(*needles)
    assert not left, f"orphans after geoserve exited: {left}"
    for pid in running:
        assert not cmdline(pid), (pid, running[pid])


# ------------------------------------------------------------------------------ RTT
def test_forwarding_adds_the_inter_region_rtt_to_ttft(tmp_path: Path) -> None:
    topo_path = write_topology(tmp_path / "rtt.yaml", {"eu-north": ["eu-a"], "us-east": ["us-a"]},
                               duration_s=16, rate_rps=4.0, rtt_ms=300.0)
    out = tmp_path / "out"
    with local_run(topo_path, out) as run:
        rtt = run.topo.rtt_s[("eu-north", "us-east")]
        run.start_load()
        rows, summary = run.finish()
    assert rtt == pytest.approx(0.3)
    assert summary["requests"]["completed"] == len(rows)
    fwd = [r for r in rows if r["forwarded"] == "True"]
    local = [r for r in rows if r["forwarded"] == "False"]
    assert len(fwd) >= 15 and len(local) >= 15
    for r in fwd:
        assert r["dc_region"] != r["origin_region"]
    for r in local:
        assert r["dc_region"] == r["origin_region"]
    tol = 0.2 * rtt
    gap = statistics.median(f(r, "ttft_s") for r in fwd) - statistics.median(
        f(r, "ttft_s") for r in local)
    assert gap == pytest.approx(rtt, abs=tol), f"TTFT gap {gap:.3f} s, RTT {rtt:.3f} s"
    # per request: half the RTT on the way to the DC, half on the way back
    there = [f(r, "dc_arrival_s") - f(r, "decided_s") for r in fwd]
    back = [f(r, "first_token_origin_s") - f(r, "first_token_s") for r in fwd]
    assert statistics.median(there) == pytest.approx(rtt / 2, abs=tol / 2)
    assert statistics.median(back) == pytest.approx(rtt / 2, abs=tol / 2)
    assert min(there) >= rtt / 2 - 0.005 and min(back) >= rtt / 2 - 0.005
    assert statistics.median(f(r, "dc_arrival_s") - f(r, "decided_s") for r in local) < tol / 2
