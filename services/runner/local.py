"""Local runner: every service of a topology as its own OS process on 127.0.0.1.

Start order: datacenters, the CA-RM service when the topology has a ``carm:`` section,
provisioner, schedulers (each waited for until its gRPC health
check says SERVING), then the load generator in the foreground. All processes share one
epoch and dilation factor, so their emulated clocks agree. Teardown sends SIGTERM, then
SIGKILL to whatever is left; children also get SIGTERM if the runner itself dies
(PR_SET_PDEATHSIG), so no process outlives a run — also on Ctrl-C or a crash.
A service that dies during the run is reported; the run goes on (its requests end FAILED).

Metrics: every process (load generator included) gets a free loopback port for its
Prometheus ``/metrics``; ``<out>/prometheus.yml`` (one job per process, named like the
compose services: ``dc-<dc>``, ``scheduler-<region>``, ``provisioner``, ``loadgen``) and
``<out>/rules.yml`` are written before anything starts. With ``prometheus=True`` a real
Prometheus server (``prometheus`` on PATH) scrapes the run into ``<out>/prom``;
``linger_s`` keeps the services up that long after the load so the last scrapes see
their final counters.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.config.topology import ROOT, Topology
from services.model.errors import Unavailable
from services.runtime.grpcutil import open_channel

PR_SET_PDEATHSIG = 1
# GRPC_ENABLE_FORK_SUPPORT=false is set in services/runner/__init__.py, before grpc loads


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


# The provisioner's poll burst (a gRPC call per DC each period, about 100 ms of CPU per
# period at base.yaml's 16 DCs) must not delay the DCs' step wake-ups, which decide
# whether the emulation is faithful; a late poll only ages a snapshot by as much.
BACKGROUND_NICE = 10


def _background() -> None:  # the provisioner: below the DCs and schedulers on the CPU
    _die_with_parent()
    os.nice(BACKGROUND_NICE)


_GIVEN: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux), else 32768."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range: a port the kernel
    picks (bind 0) can be handed to some process's outgoing connection before the service
    that should listen on it binds it -- a start-up failure seen in chaos runs."""
    import random

    low = _ephemeral_low()
    if low > 12_000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(10_000, low)
            if port in _GIVEN:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _GIVEN.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    args: list[str]
    address: str = ""
    popen: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    expected_exit: bool = False


@dataclass
class LocalRun:
    topo: Topology
    topology_arg: str
    out_dir: Path
    policy: str | None = None
    policy_config: str = ""
    rate: float | None = None
    duration: float | None = None
    seed: int | None = None
    startup_timeout_s: float = 60.0
    metrics: bool = True
    prometheus: bool = False
    prometheus_port: int = 0
    carbon_api_port: int = 0     # > 0: serve the emulated grid there (geoserve carbon-api)
    linger_s: float = 0.0        # keep services (and /metrics) up after the load, wall s
    procs: dict[str, Proc] = field(default_factory=dict)
    crashed: list[str] = field(default_factory=list)
    metrics_ports: dict[str, int] = field(default_factory=dict)

    def _spawn(self, p: Proc) -> None:
        assert p.log is not None
        logf = p.log.open("ab")
        p.popen = subprocess.Popen(
            [sys.executable, "-m", *p.args],
            cwd=ROOT,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=_background if p.name == "provisioner" else _die_with_parent,
        )
        logf.close()

    def _wait_healthy(self, p: Proc) -> None:
        import asyncio

        from services.runtime.grpcutil import wait_healthy

        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert p.popen is not None
            if p.popen.poll() is not None:
                tail = p.log.read_text()[-2000:] if p.log and p.log.exists() else ""
                raise Unavailable(f"{p.name} exited during start-up:\n{tail}")
            try:
                asyncio.run(wait_healthy(p.address, timeout_s=1.0))
                return
            except TimeoutError:
                continue
        raise Unavailable(f"{p.name} not healthy after {self.startup_timeout_s}s")

    def start(self) -> None:
        topo = self.topo
        logs = self.out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        epoch = f"{time.time():.6f}"
        common = ["--topology", self.topology_arg, "--epoch", epoch,
                  "--dilation", str(topo.dilation)]
        dcs = {d.name: f"127.0.0.1:{free_port()}" for d in topo.dcs}
        scheds = {r.name: f"127.0.0.1:{free_port()}" for r in topo.regions}
        prov = f"127.0.0.1:{free_port()}"
        self.dc_addrs, self.sched_addrs, self.prov_addr = dcs, scheds, prov
        self.common = common
        for name, addr in dcs.items():
            self.procs[f"dc/{name}"] = Proc(f"dc/{name}", ["services.datacenter", *common,
                                            "--dc", name, "--address", addr], addr)
        dc_list = ",".join(f"{n}={a}" for n, a in dcs.items())
        if topo.carm is not None:
            carm = f"127.0.0.1:{free_port()}"
            self.procs["carm"] = Proc("carm", ["services.carm", *common, "--dcs", dc_list,
                                               "--address", carm], carm)
        self.procs["provisioner"] = Proc("provisioner", ["services.provisioner", *common,
                                         "--dcs", dc_list, "--address", prov], prov)
        for r in topo.regions:
            local = ",".join(f"{d.name}={dcs[d.name]}" for d in r.dcs)
            peers = ",".join(f"{n}={a}" for n, a in scheds.items() if n != r.name)
            extra = ["--policy", self.policy] if self.policy else []
            if self.policy_config:
                extra += ["--policy-config", self.policy_config]
            self.procs[f"scheduler/{r.name}"] = Proc(
                f"scheduler/{r.name}",
                ["services.scheduler", *common, "--region", r.name, "--dcs", local,
                 "--peers", peers, "--provisioner", prov, "--address", scheds[r.name], *extra],
                scheds[r.name],
            )
        for p in self.procs.values():
            p.log = logs / f"{p.name.replace('/', '-')}.log"
        if self.metrics:
            self._metrics_setup()
        order = [p for p in self.procs.values() if p.name.startswith("dc/")]
        for p in order:
            self._spawn(p)
        self._wait_all(order)
        if "carm" in self.procs:
            self._spawn(self.procs["carm"])
            self._wait_all([self.procs["carm"]])
        # the schedulers start with the provisioner: they retry its snapshot stream until it
        # serves (every 0.5 s), and the load waits for a snapshot at every scheduler
        sched_procs = [p for p in self.procs.values() if p.name.startswith("scheduler/")]
        for p in [self.procs["provisioner"], *sched_procs]:
            self._spawn(p)
        self._wait_all([self.procs["provisioner"], *sched_procs])
        self._wait_snapshots()
        if self.carbon_api_port:
            self._start_carbon_api(logs)
        if self.prometheus:
            self._wait_scrapes()
        self._monitor = threading.Thread(target=self._watch, daemon=True)
        self._stop_watch = threading.Event()
        self._monitor.start()

    def _start_carbon_api(self, logs: Path) -> None:
        """`geoserve carbon-api` on the run's epoch and dilation; ready when /health is."""
        import urllib.request

        addr = f"127.0.0.1:{self.carbon_api_port}"
        p = Proc("carbon-api", ["services.cli", "carbon-api", "--topology", self.topology_arg,
                                "--address", addr, *self.common[2:]], addr)
        p.log = logs / "carbon-api.log"
        self.procs["carbon-api"] = p
        self._spawn(p)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"http://{addr}/health", timeout=1).close()
                return
            except OSError:
                assert p.popen is not None
                if p.popen.poll() is not None or time.monotonic() > deadline:
                    tail = p.log.read_text()[-2000:] if p.log.exists() else ""
                    raise Unavailable(f"carbon-api did not start:\n{tail}") from None
                time.sleep(0.1)

    def _metrics_setup(self) -> None:
        """A /metrics port per process, the scrape config, optionally Prometheus itself."""
        from services.deploy.prometheus import recording_rules, render_prometheus_config

        for p in [*self.procs.values(), Proc("loadgen", [])]:
            job = p.name.replace("/", "-")
            self.metrics_ports[job] = port = free_port()
            p.args += ["--metrics-port", str(port), "--metrics-address", "127.0.0.1"]
        targets = {job: [f"127.0.0.1:{port}"] for job, port in self.metrics_ports.items()}
        (self.out_dir / "prometheus.yml").write_text(render_prometheus_config(targets))
        (self.out_dir / "rules.yml").write_text(recording_rules())
        if self.prometheus:
            import shutil

            binary = shutil.which("prometheus")
            if binary is None:
                raise Unavailable("--prometheus: no `prometheus` on PATH "
                                  "(deploy/ensure-prometheus.sh installs it)")
            self.prometheus_port = self.prometheus_port or free_port()
            p = Proc("prometheus", [])
            p.log = self.out_dir / "logs" / "prometheus.log"
            with p.log.open("ab") as logf:
                p.popen = subprocess.Popen(
                    [binary, f"--config.file={self.out_dir / 'prometheus.yml'}",
                     f"--storage.tsdb.path={self.out_dir / 'prom'}",
                     f"--web.listen-address=127.0.0.1:{self.prometheus_port}"],
                    stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            self.procs["prometheus"] = p

    def _wait_snapshots(self, timeout_s: float = 20.0) -> None:
        """Wait until every scheduler holds a provisioner snapshot, so the load does not
        start on a blind (round-robin fallback) scheduler."""
        import asyncio

        import grpc
        from geoserve.v1 import scheduler_pb2, scheduler_pb2_grpc

        async def ready(addr: str) -> bool:
            async with open_channel(addr) as ch:
                try:
                    info = await scheduler_pb2_grpc.SchedulerStub(ch).Info(
                        scheduler_pb2.SchedulerInfoRequest(), timeout=2.0)
                except grpc.aio.AioRpcError:
                    return False
                return bool(info.snapshot_age_s < 1e8)

        deadline = time.monotonic() + timeout_s
        pending = dict(self.sched_addrs)
        while pending and time.monotonic() < deadline:
            for region, addr in list(pending.items()):
                if asyncio.run(ready(addr)):
                    del pending[region]
            if pending:
                time.sleep(0.2)
        if pending:
            print(f"runner: no snapshot yet at {sorted(pending)}; starting anyway",
                  file=sys.stderr, flush=True)

    def _wait_scrapes(self, timeout_s: float = 60.0, scrapes: int = 2) -> None:
        """Wait until Prometheus has scraped every target (up) at least `scrapes` times, so
        counters have a baseline before the load starts."""
        import json
        import urllib.parse
        import urllib.request

        n_targets = len([j for j in self.metrics_ports if j != "loadgen"])  # not started yet
        q = urllib.parse.quote(f"count_over_time(up[5m]) >= {scrapes} and up == 1")
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/query?query={q}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    got = len(json.loads(r.read())["data"]["result"])
                if got >= n_targets:
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.25)
        print("runner: Prometheus has not scraped every target yet; starting anyway",
              file=sys.stderr, flush=True)

    def _wait_all(self, procs: list[Proc]) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
            for f in [ex.submit(self._wait_healthy, p) for p in procs]:
                f.result()

    def _watch(self) -> None:
        """Name every service that exits on its own during the run (the load generator's
        exit is the end of the load: `geoserve run` reports how it ended)."""
        while not self._stop_watch.wait(0.5):
            for p in list(self.procs.values()):
                if p.name == "loadgen":
                    continue
                if p.popen is not None and p.popen.poll() is not None and not p.expected_exit:
                    if p.name not in self.crashed:
                        self.crashed.append(p.name)
                        print(f"runner: {p.name} exited with {p.popen.returncode} "
                              f"(log: {p.log}); the run goes on", file=sys.stderr, flush=True)

    def run_load(self) -> int:
        topo = self.topo
        args = ["services.loadgen", *self.common,
                "--schedulers", ",".join(f"{n}={a}" for n, a in self.sched_addrs.items()),
                "--dcs", ",".join(f"{n}={a}" for n, a in self.dc_addrs.items()),
                "--provisioner", self.prov_addr,
                "--out", str(self.out_dir)]
        for flag, val in (("--rate", self.rate), ("--duration", self.duration),
                          ("--seed", self.seed), ("--policy", self.policy)):
            if val is not None:
                args += [flag, str(val)]
        if "loadgen" in self.metrics_ports:
            args += ["--metrics-port", str(self.metrics_ports["loadgen"]),
                     "--metrics-address", "127.0.0.1"]
        del topo
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=_die_with_parent)
        self.procs["loadgen"] = Proc("loadgen", args, popen=proc)
        rc = proc.wait()
        if self.linger_s > 0:  # let a scraper see the final (idle) counters
            time.sleep(self.linger_s)
        return rc

    def stop_load(self, signame: str, timeout_s: float = 30.0) -> None:
        """Ask the load generator to stop early (it records every request emitted so far
        and writes the partial results), and wait for it, bounded."""
        p = self.procs.get("loadgen")
        if p is None or p.popen is None or p.popen.poll() is not None:
            return
        p.expected_exit = True
        try:
            p.popen.send_signal(getattr(signal, signame, signal.SIGTERM))
            p.popen.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            print(f"runner: the load generator did not stop within {timeout_s:.0f} s",
                  file=sys.stderr, flush=True)

    def loadgen_exit(self) -> int | None:
        """The load generator's exit status (None: not started or still running)."""
        p = self.procs.get("loadgen")
        return p.popen.poll() if p is not None and p.popen is not None else None

    def stop(self) -> None:
        if getattr(self, "_stop_watch", None) is not None:
            self._stop_watch.set()
        live = [p for p in self.procs.values() if p.popen is not None and p.popen.poll() is None]
        for p in live:
            p.expected_exit = True
            assert p.popen is not None
            try:
                p.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for p in live:
            assert p.popen is not None
            try:
                p.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
