"""The provisioner as a real process polling real DC processes over loopback gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import provisioner_pb2 as ppb
from geoserve.v1 import provisioner_pb2_grpc as pg

from services.config.topology import load_topology
from services.provisioner.core import DcInfo, ProvisionerCore
from services.provisioner.server import WallProvisioner
from services.runtime.clock import WallClock
from tests.procs import ROOT, free_port, service

TOPOLOGY = """\
name: tiny-prov
description: two regions x one DC of one GPU, constant CI
defaults:
  dc: {{nodes: 1, gpus_per_node: 1, setup: a100-40gb/llama-3.1-8b-tp1, pue: 1.1}}
regions:
  - name: eu-north
    aws_region: eu-north-1
    dcs:
      - {{name: dc-clean, zone: SE, ci: {{constant: 100}}}}
  - name: us-east
    aws_region: us-east-1
    dcs:
      - {{name: dc-dirty, zone: US, ci: {{constant: 400}}}}
provisioner: {{period_s: {period_s}, mode: {mode}}}
load: {{rate_rps: 1, dataset: cnn-dailymail, duration_s: 5}}
"""

CI = {"dc-clean": 100.0, "dc-dirty": 400.0}
REGION = {"dc-clean": "eu-north", "dc-dirty": "us-east"}


def write_topology(tmp_path: Path, period_s: float, mode: str) -> Path:
    p = tmp_path / f"tiny-{mode}.yaml"
    p.write_text(TOPOLOGY.format(period_s=period_s, mode=mode))
    return p


@contextlib.contextmanager
def proc_at(module: str, address: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m module --address address args` on the caller's address, so a killed
    service can be restarted on the same port."""
    with service(module, *args, address=address) as (proc, _):
        yield proc


def addr() -> str:
    return f"127.0.0.1:{free_port()}"


def dc_args(topo: Path, name: str, *extra: str) -> tuple[str, ...]:
    return ("--topology", str(topo), "--dc", name, *extra)


class Watcher:
    """Collects a provisioner's Watch stream in a background thread's event loop."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.snaps: list[tuple[float, pb.Snapshot]] = []  # (monotonic arrival, snapshot)
        self.ended = False
        self._loop = asyncio.new_event_loop()
        import threading

        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._run(),), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as ch:
            stub = pg.ProvisionerStub(ch)
            self._call = stub.Watch(ppb.WatchRequest(subscriber="test"), timeout=120)
            try:
                async for snap in self._call:
                    self.snaps.append((time.monotonic(), snap))
            except asyncio.CancelledError:
                pass  # close() cancelled the call
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    raise
        self.ended = True

    def wait_for(self, pred, timeout_s: float, since: int = 0) -> pb.Snapshot:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, s in self.snaps[since:]:
                if pred(s):
                    return s
            time.sleep(0.02)
        last = self.snaps[-1][1] if self.snaps else None
        raise AssertionError(f"no matching snapshot within {timeout_s}s; last: {last}")

    def close(self) -> None:
        if not self.ended:
            self._loop.call_soon_threadsafe(self._call.cancel)
        self._thread.join(timeout=10)
        self._loop.close()


def by_dc(snap: pb.Snapshot) -> dict[str, pb.DcState]:
    return {d.dc: d for d in snap.dcs}


def get_snapshot(address: str) -> tuple[grpc.StatusCode, pb.Snapshot | None]:
    async def run():
        async with grpc.aio.insecure_channel(address) as ch:
            try:
                s = await pg.ProvisionerStub(ch).GetSnapshot(ppb.GetSnapshotRequest(), timeout=5)
                return grpc.StatusCode.OK, s
            except grpc.aio.AioRpcError as exc:
                return exc.code(), None

    return asyncio.run(run())


# ---------------------------------------------------------------------------------------
def test_sync_snapshots_every_period_and_a_killed_dc_goes_down_and_comes_back(tmp_path):
    period_s = 0.3
    topo = write_topology(tmp_path, period_s, "sync")
    a_addr, b_addr, p_addr = addr(), addr(), addr()
    dcs = f"dc-clean={a_addr},dc-dirty={b_addr}"
    with (
        proc_at("services.datacenter", a_addr, *dc_args(topo, "dc-clean")),
        proc_at("services.datacenter", b_addr, *dc_args(topo, "dc-dirty")) as b_proc,
        proc_at("services.provisioner", p_addr, "--topology", str(topo), "--dcs", dcs) as prov,
    ):
        w = Watcher(p_addr)
        try:
            deadline = time.monotonic() + 10
            while len(w.snaps) < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(w.snaps) >= 8
            snaps = [s for _, s in w.snaps[:8]]
            seqs = [s.seq for s in snaps]
            assert seqs == list(range(seqs[0], seqs[0] + 8))
            # one snapshot per period, in emulated time and on arrival
            gaps = [b.time_s - a.time_s for a, b in zip(snaps[1:], snaps[2:], strict=False)]
            assert all(period_s * 0.5 < g < period_s * 1.5 for g in gaps), gaps
            arrivals = [t for t, _ in w.snaps[1:8]]
            mean_gap = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
            assert mean_gap == pytest.approx(period_s, rel=0.25)
            for s in snaps:
                assert s.poll_period_s == period_s
                states = by_dc(s)
                assert set(states) == set(CI)
                for name, st in states.items():
                    assert st.up, name
                    assert st.grid_ci_g_per_kwh == CI[name]
                    assert st.region == REGION[name]
                    assert st.engines == 1 and st.max_batch > 0
                rtt = {(e.from_region, e.to_region): e.rtt_s for e in s.rtt}
                assert rtt[("eu-north", "us-east")] == rtt[("us-east", "eu-north")] > 0.05
                assert rtt[("eu-north", "eu-north")] == 0.0
            code, latest = get_snapshot(p_addr)
            assert code == grpc.StatusCode.OK and latest.seq >= snaps[-1].seq

            # kill -9 one DC: within 2 periods a snapshot shows it down, the other up
            n_before = len(w.snaps)
            last_b = by_dc(w.snaps[-1][1])["dc-dirty"]
            b_proc.kill()
            b_proc.wait()
            t_kill = time.monotonic()
            down = w.wait_for(lambda s: not by_dc(s)["dc-dirty"].up, 4 * period_s, n_before)
            t_down = next(t for t, s in w.snaps if s.seq == down.seq)
            assert t_down - t_kill < 2 * period_s + 0.1
            assert by_dc(down)["dc-clean"].up
            # last known counters are kept while down
            kept = by_dc(down)["dc-dirty"]
            assert kept.grid_ci_g_per_kwh == 400.0 and kept.engines == 1
            assert kept.time_s >= last_b.time_s

            # restart it on the same port: it comes back up
            with proc_at("services.datacenter", b_addr, *dc_args(topo, "dc-dirty")):
                n_down = len(w.snaps)
                back = w.wait_for(lambda s: by_dc(s)["dc-dirty"].up, 10, n_down)
                assert by_dc(back)["dc-clean"].up
                assert by_dc(back)["dc-dirty"].grid_ci_g_per_kwh == 400.0
                # snapshots kept flowing with increasing seq through the outage
                seqs = [s.seq for _, s in w.snaps]
                assert seqs == sorted(set(seqs))

                # SIGTERM: the Watch stream ends and the process exits cleanly
                prov.send_signal(signal.SIGTERM)
                assert prov.wait(timeout=10) == 0
                deadline = time.monotonic() + 5
                while not w.ended and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert w.ended
        finally:
            w.close()


def test_async_mode_staggers_polls_under_time_dilation(tmp_path):
    period_s, k = 0.4, 2.0
    topo = write_topology(tmp_path, period_s, "async")
    a_addr, b_addr, p_addr = addr(), addr(), addr()
    clock_args = ("--dilation", str(k), "--epoch", str(time.time()))
    dcs = f"dc-clean={a_addr},dc-dirty={b_addr}"
    with (
        proc_at("services.datacenter", a_addr, *dc_args(topo, "dc-clean", *clock_args)),
        proc_at("services.datacenter", b_addr, *dc_args(topo, "dc-dirty", *clock_args)),
        proc_at("services.provisioner", p_addr, "--topology", str(topo), "--dcs", dcs,
                *clock_args),
    ):
        w = Watcher(p_addr)
        try:
            deadline = time.monotonic() + 15
            while len(w.snaps) < 9 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(w.snaps) >= 9
        finally:
            w.close()
    snaps = [s for _, s in w.snaps[2:9]]  # both DCs reached by now
    for s in snaps:
        states = by_dc(s)
        assert all(st.up for st in states.values())
        # DC 1 polled half a period after DC 0 (2 DCs): the states' times differ by Δp/2
        lag = abs(states["dc-dirty"].time_s - states["dc-clean"].time_s)
        assert lag == pytest.approx(period_s / 2, abs=0.08), lag
        # the DC's emulated clock and the provisioner's agree (shared epoch and dilation)
        assert 0 <= s.time_s - max(st.time_s for st in states.values()) < 0.1
    # a snapshot after each staggered poll: every Δp/2 emulated, i.e. k·Δp/2 wall
    gaps = [b.time_s - a.time_s for a, b in zip(snaps, snaps[1:], strict=False)]
    assert all(g == pytest.approx(period_s / 2, abs=0.08) for g in gaps), gaps
    arrivals = [t for t, _ in w.snaps[2:9]]
    assert (arrivals[-1] - arrivals[0]) / 6 == pytest.approx(k * period_s / 2, rel=0.25)


def test_unreachable_dcs_unavailable_until_the_first_round_then_down(tmp_path):
    """DCs that accept TCP but never answer: polls time out; no snapshot before that."""
    topo = write_topology(tmp_path, 8.0, "sync")
    holes = []
    for _ in range(2):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(8)  # never accepted: the HTTP/2 handshake never completes
        holes.append(s)
    try:
        dcs = ",".join(f"{n}=127.0.0.1:{h.getsockname()[1]}" for n, h in zip(CI, holes,
                                                                             strict=True))
        p_addr = addr()
        # the poll deadline outlasts the start-up health wait of proc_at
        args = ("--topology", str(topo), "--dcs", dcs, "--poll-timeout", "4")
        with proc_at("services.provisioner", p_addr, *args):
            code, _ = get_snapshot(p_addr)
            assert code == grpc.StatusCode.UNAVAILABLE
            deadline = time.monotonic() + 8
            while (code := get_snapshot(p_addr)[0]) != grpc.StatusCode.OK:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            _, snap = get_snapshot(p_addr)
    finally:
        for h in holes:
            h.close()
    states = by_dc(snap)
    assert set(states) == set(CI)
    for name, st in states.items():
        assert not st.up
        assert st.region == REGION[name]
        assert st.engines == 0 and st.time_s == 0.0  # never reached: no counters


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        ((), {}, "dc-clean, dc-dirty"),
        (("--dcs", "dc-clean=127.0.0.1:1"), {}, "dc-dirty"),
        ((), {"DC_ADDRS": "dc-clean=127.0.0.1:1"}, "dc-dirty"),
        (("--dcs", "dc-clean=127.0.0.1:1,dc-dirty=127.0.0.1:2,dc-x=h:3"), {}, "dc-x"),
        (("--dcs", "dc-clean"), {}, "NAME=HOST:PORT"),
    ],
)
def test_missing_or_bad_dc_addresses_fail_fast_naming_them(tmp_path, args, env, needle):
    topo = write_topology(tmp_path, 0.5, "sync")
    base = {k: v for k, v in os.environ.items() if k != "DC_ADDRS"}
    r = subprocess.run(
        [sys.executable, "-m", "services.provisioner", "--topology", str(topo), *args],
        cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    assert needle in r.stderr and "provisioner: error" in r.stderr


def test_dc_addresses_from_the_environment(tmp_path):
    topo = write_topology(tmp_path, 0.3, "sync")
    a_addr, b_addr, p_addr = addr(), addr(), addr()
    env_before = os.environ.get("DC_ADDRS")
    os.environ["DC_ADDRS"] = f"dc-clean={a_addr}, dc-dirty={b_addr}"
    try:
        with (
            proc_at("services.datacenter", a_addr, *dc_args(topo, "dc-clean")),
            proc_at("services.datacenter", b_addr, *dc_args(topo, "dc-dirty")),
            proc_at("services.provisioner", p_addr, "--topology", str(topo)),
        ):
            deadline = time.monotonic() + 5
            while True:
                code, snap = get_snapshot(p_addr)
                if code == grpc.StatusCode.OK and all(d.up for d in snap.dcs):
                    break
                assert time.monotonic() < deadline, (code, snap)
                time.sleep(0.1)
    finally:
        if env_before is None:
            del os.environ["DC_ADDRS"]
        else:
            os.environ["DC_ADDRS"] = env_before
    assert {d.dc: d.grid_ci_g_per_kwh for d in snap.dcs} == CI


def test_slow_subscriber_gets_the_latest_snapshot_not_a_backlog():
    topo = load_topology("small")

    async def run():
        core: ProvisionerCore[pb.DcState] = ProvisionerCore(
            [DcInfo(d.name, d.region) for d in topo.dcs], topo.rtt_s, period_s=1.0)
        prov = WallProvisioner(core, WallClock(), {d.name: addr() for d in topo.dcs})
        early = prov.subscribe()
        assert early.empty()  # nothing to send yet
        for seq in (1, 2, 3):
            prov.publish(pb.Snapshot(seq=seq))
        late = prov.subscribe()  # a new subscriber gets the latest at once
        got_early = [early.get_nowait().seq]
        got_late = [late.get_nowait().seq]
        assert early.empty() and late.empty()
        prov.publish(pb.Snapshot(seq=4))
        got_early.append(early.get_nowait().seq)
        await prov.stop()  # ends every stream
        end = early.get_nowait()
        return got_early, got_late, end

    got_early, got_late, end = asyncio.run(run())
    assert got_early == [3, 4] and got_late == [3]
    assert end is None
