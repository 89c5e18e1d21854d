"""CA-RM over gRPC: frequency plans reach the engines; the carm service drives two DCs.

Expected values come from the calibration's frequency model, the profiles' coefficients and
the renewable traces, computed here -- never from the code under test.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from geoserve.v1 import carm_pb2 as cpb
from geoserve.v1 import carm_pb2_grpc as cg
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dg

from services.carm.renewables import load_site, site_supply
from services.config.calibration import load_calibration
from services.datacenter.perfmodel import PerfModel
from tests.procs import ROOT, service

SETUP = "a100-40gb/llama-3.1-8b-tp1"


def _decode_factor(mhz: float) -> float:
    """Decode time factor of the calibration's frequency model, written out."""
    fm = load_calibration(SETUP).frequency
    cf = fm.decode.compute_fraction
    return cf * fm.levels_mhz[-1] / mhz + (1.0 - cf)


async def _one_request(addr: str, rid: str, plan: dpb.CarmSlotPlan, isl: int, osl: int):
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = dg.DatacenterStub(ch)
        ack = await stub.ApplyCarmPlan(plan, timeout=5)

        async def gen():
            yield dpb.SubmitRequest(request=pb.Request(id=rid, model="llama-3.1-8b",
                                                       isl_tokens=isl, osl_tokens=osl))

        recs = [e.record async for e in stub.SubmitStream(gen(), timeout=60)
                if e.kind == pb.FINISHED]
        state = await stub.GetState(dpb.GetStateRequest(), timeout=5)
    return ack, recs[0], state.state


def test_apply_carm_plan_sets_the_engines_clock_and_their_step_time():
    cal = load_calibration(SETUP)
    low = cal.frequency.levels_mhz[1]
    top = cal.frequency.levels_mhz[-1]
    isl, osl = 100, 40
    base = PerfModel(cal)  # at the top clock
    decode_top = float(np.mean([base.decode_time(1, isl + k) for k in range(1, osl)]))
    with service("services.datacenter", "--dc", "dc-f", "--gpus-per-node", "1") as (_, addr):
        plan_low = dpb.CarmSlotPlan(gpu_frequency_mhz=low + 7, training_power_w=250.0,
                                    renewable_supply_w=100.0)
        ack_low, rec_low, st_low = asyncio.run(_one_request(addr, "low", plan_low, isl, osl))
        plan_top = dpb.CarmSlotPlan(gpu_frequency_mhz=top, training_power_w=0.0,
                                    renewable_supply_w=0.0)
        ack_top, rec_top, st_top = asyncio.run(_one_request(addr, "top", plan_top, isl, osl))
    # the DC snaps to its nearest level and reports what it applied
    assert ack_low.gpu_frequency_mhz == low and st_low.gpu_frequency_mhz == low
    assert st_low.training_w == 250.0 and st_low.renewable_w == 100.0
    assert ack_top.gpu_frequency_mhz == top and st_top.training_w == 0.0
    assert rec_low.state == pb.COMPLETED and rec_top.state == pb.COMPLETED
    assert rec_top.tpot_s == pytest.approx(decode_top, rel=0.05)
    assert rec_low.tpot_s == pytest.approx(decode_top * _decode_factor(low), rel=0.05)
    assert rec_low.tpot_s > rec_top.tpot_s * 1.1


def _topology(tmp_path: Path, slot_s: float) -> Path:
    topo = {
        "name": "carm-two",
        "defaults": {"dc": {"nodes": 1, "gpus_per_node": 2, "setup": SETUP, "pue": 1.1}},
        "regions": [
            {"name": "eu-north", "aws_region": "eu-north-1",
             "dcs": [{"name": "eu-a", "zone": "NL", "ci": {"constant": 300}}]},
            {"name": "us-east", "aws_region": "us-east-1",
             "dcs": [{"name": "us-a", "zone": "US-MIDA-PJM", "ci": {"constant": 400}}]},
        ],
        "load": {"rate_rps": 4, "dataset": "cnn-dailymail", "duration_s": 20, "warmup_s": 0},
        "carm": {
            "slot_s": slot_s, "horizon_slots": 3, "trace_start_hour": 12,
            "renewables": {"pv_peak_w": 2000.0},
            "training": {"nodes": 1,
                         "jobs": [{"model": "vgg16", "epochs": 1, "deadline_s": 600}]},
            "dcs": {"us-a": {"renewables": {"pv_peak_w": 500.0, "wind_peak_w": 1000.0}}},
        },
    }
    p = tmp_path / "carm-two.yaml"
    p.write_text(yaml.safe_dump(topo, sort_keys=False))
    return p


async def _status_and_states(carm: str, dcs: dict[str, str]):
    async with grpc.aio.insecure_channel(carm) as ch:
        st = await cg.CarmStub(ch).Status(cpb.CarmStatusRequest(), timeout=5)
    states = {}
    for name, addr in dcs.items():
        async with grpc.aio.insecure_channel(addr) as ch:
            states[name] = (await dg.DatacenterStub(ch).GetState(dpb.GetStateRequest(),
                                                                  timeout=5)).state
    return st, states


async def _junk_status(addr: str) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(addr) as ch:
        call = ch.unary_unary("/geoserve.v1.Carm/Status", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
        try:
            await call(b"\xff\xff\xff junk", timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc
    raise AssertionError("junk bytes were accepted")


def test_carm_service_plans_two_dc_processes_slot_by_slot(tmp_path):
    slot_s = 2.5
    topo = _topology(tmp_path, slot_s)
    epoch = f"{time.time():.6f}"
    common = ["--topology", str(topo), "--epoch", epoch]
    cal = load_calibration(SETUP)
    site = load_site()
    sup = site_supply(site, 60.0, 1440)
    nameplate = site["solar"]["area_m2"] * site["solar"]["efficiency"] * 1000.0
    pv_noon = sup.solar_j[720] / 60.0 / nameplate          # the first minute past 12:00
    wind_noon = sup.wind_j[720] / 60.0 / site["wind"]["rated_w"]
    with (service("services.datacenter", *common, "--dc", "eu-a") as (_, a),
          service("services.datacenter", *common, "--dc", "us-a") as (_, b)):
        dcs = {"eu-a": a, "us-a": b}
        with service("services.carm", *common, "--dcs", f"eu-a={a},us-a={b}",
                     log=tmp_path / "carm.log") as (_, carm):
            time.sleep(3 * slot_s)
            st, states = asyncio.run(_status_and_states(carm, dcs))
            junk = asyncio.run(_junk_status(carm))
    # a Status call of undecodable bytes is refused at once, naming why
    assert junk.code() == grpc.StatusCode.INVALID_ARGUMENT, junk
    assert (junk.details() or "").startswith("undecodable request message")
    assert st.formulation == "performance-constrained"
    assert st.slot >= 3
    assert {p.dc for p in st.plans} == {"eu-a", "us-a"}
    assert 0 < st.last_slot_latency_s < slot_s
    for p in st.plans:
        s = states[p.dc]
        assert p.plan.gpu_frequency_mhz in cal.frequency.levels_mhz
        assert s.gpu_frequency_mhz == p.plan.gpu_frequency_mhz   # the DC applied the plan
        assert s.renewable_w == pytest.approx(p.plan.renewable_supply_w)
        assert s.training_w == pytest.approx(p.plan.training_power_w)
        assert p.plan.slot_length_s == slot_s
        assert p.solver_status
    by = {p.dc: p.plan for p in st.plans}
    assert by["eu-a"].renewable_supply_w == pytest.approx(2000.0 * pv_noon, rel=1e-6)
    assert by["us-a"].renewable_supply_w == pytest.approx(500.0 * pv_noon + 1000.0 * wind_noon,
                                                          rel=1e-6)
    # one epoch of vgg16 takes ~14 s on one node: still running, within one node's power
    vgg = {"beta0": 0.012243, "beta1": 386.210}  # data/carm/profiles.yaml, vgg16 training
    cap_w = vgg["beta0"] * cal.frequency.levels_mhz[-1] + vgg["beta1"]
    assert all(0 <= p.plan.training_power_w <= cap_w + 1e-6 for p in st.plans)
    assert st.training_deadlines_missed == 0


def test_carm_service_refuses_a_topology_without_a_carm_section():
    out = subprocess.run([sys.executable, "-m", "services.carm", "--topology", "small",
                          "--dcs", "eu-nl=127.0.0.1:1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "no carm section" in out.stderr
