"""Plug-in points: a third-party policy through an entry point, and a scheduler written
outside the project (protos only) running as its own process in place of a region's."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.config.factory import build_ci
from services.config.topology import ROOT, load_topology
from tests.procs import free_port, wait_healthy

EXAMPLES = ROOT / "examples"


def _lowest_ci_dc_per_region(topo) -> dict[str, str]:
    out = {}
    for r in topo.regions:
        out[r.name] = min(r.dcs, key=lambda d: build_ci(topo, d).at(0.0)).name
    return out


def test_third_party_policy_through_entry_point(tmp_path):
    dist = tmp_path / "site"
    info = dist / "geoserve_nearest-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: geoserve-nearest\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[geoserve.policies]\nnearest-lowest-ci = geoserve_nearest:spec\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(dist), str(EXAMPLES / "third_party_policy"), str(ROOT)])}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "sim", "--topology", "small", "--policy",
         "nearest-lowest-ci", "--duration", "10", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["requests"]["completed"] == s["requests"]["emitted"] > 0
    assert s["requests"]["forwarded"] == 0
    topo = load_topology("small")
    expected = _lowest_ci_dc_per_region(topo)
    with (out / "records.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["policy"] == "nearest-lowest-ci" for r in rows)
    assert all(r["dc"] == expected[r["origin_region"]] for r in rows)


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen(args, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)


def test_external_scheduler_process_replaces_a_region(tmp_path):
    topo = load_topology("small")
    epoch = f"{time.time():.6f}"
    common = ["--topology", "small", "--epoch", epoch]
    dcs = {d.name: f"127.0.0.1:{free_port()}" for d in topo.dcs}
    scheds = {r.name: f"127.0.0.1:{free_port()}" for r in topo.regions}
    prov = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen[bytes]] = []
    py = sys.executable
    try:
        for name, addr in dcs.items():
            procs.append(_spawn([py, "-m", "services.datacenter", *common, "--dc", name,
                                 "--address", addr], tmp_path / f"dc-{name}.log"))
        for addr in dcs.values():
            wait_healthy(addr)
        dc_list = ",".join(f"{n}={a}" for n, a in dcs.items())
        procs.append(_spawn([py, "-m", "services.provisioner", *common, "--dcs", dc_list,
                             "--address", prov], tmp_path / "prov.log"))
        wait_healthy(prov)
        ext_region, own_region = topo.regions[0].name, topo.regions[1].name
        ext_dcs = ",".join(f"{d.name}={dcs[d.name]}" for d in topo.regions[0].dcs)
        procs.append(_spawn([py, str(EXAMPLES / "external_scheduler" / "scheduler.py"),
                             "--address", scheds[ext_region], "--region", ext_region,
                             "--dcs", ext_dcs, "--provisioner", prov, "--epoch", epoch],
                            tmp_path / "external.log"))
        own_dcs = ",".join(f"{d.name}={dcs[d.name]}" for d in topo.regions[1].dcs)
        procs.append(_spawn([py, "-m", "services.scheduler", *common, "--region", own_region,
                             "--dcs", own_dcs, "--peers", f"{ext_region}={scheds[ext_region]}",
                             "--provisioner", prov, "--address", scheds[own_region],
                             "--policy", "round-robin"], tmp_path / "sched.log"))
        for addr in scheds.values():
            wait_healthy(addr)
        time.sleep(1.5)  # first snapshots
        out = tmp_path / "out"
        lg = subprocess.run(
            [py, "-m", "services.loadgen", *common, "--duration", "12",
             "--schedulers", ",".join(f"{n}={a}" for n, a in scheds.items()),
             "--dcs", dc_list, "--out", str(out), "--drain-limit", "30"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert lg.returncode == 0, lg.stdout[-2000:] + lg.stderr[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    s = json.loads((out / "summary.json").read_text())
    rq = s["requests"]
    assert rq["emitted"] == rq["completed"] > 0
    with (out / "records.csv").open() as f:
        rows = list(csv.DictReader(f))
    ext_rows = [r for r in rows if r["origin_region"] == ext_region]
    own_rows = [r for r in rows if r["origin_region"] == own_region]
    assert ext_rows and own_rows
    # the external scheduler decided its region's requests and kept them local, on the
    # region's lowest-CI DC (CI from the topology's trace at the run's hour)
    lowest = _lowest_ci_dc_per_region(topo)[ext_region]
    assert all(r["policy"] == "external-lowest-ci" for r in ext_rows)
    assert all(r["dc"] == lowest for r in ext_rows)
    # our round-robin scheduler forwarded part of its load into the external one's region
    fwd = [r for r in own_rows if r["forwarded"] == "True"]
    assert fwd and all(r["dc_region"] == ext_region for r in fwd)
    assert all(float(r["ttft_s"]) > 0 for r in rows)
