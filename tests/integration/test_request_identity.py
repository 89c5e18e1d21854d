"""Request identity and bad input at every entry, over real gRPC processes on loopback.

A duplicate id is refused with ALREADY_EXISTS wherever it enters (scheduler Submit and
Forward, a DC's stream and unary Submit) while the original still gets its record;
malformed requests are refused naming the field; undecodable bytes end the call with
INVALID_ARGUMENT at once.
"""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dg
from geoserve.v1 import scheduler_pb2_grpc as sg

from tests.procs import service

MODEL = "llama-3.1-8b"
TOPOLOGY = """
name: one
description: one region, one DC (request identity tests)
defaults:
  dc: {nodes: 1, gpus_per_node: 1, setup: a100-40gb/llama-3.1-8b-tp1, pue: 1.1}
regions:
  - name: eu-north
    aws_region: eu-north-1
    dcs:
      - {name: eu-a, zone: NL, ci: {constant: 300}}
provisioner: {period_s: 1.0, mode: sync}
load: {rate_rps: 1, dataset: cnn-dailymail, duration_s: 5, warmup_s: 0, seed: 1}
"""


def req(rid: str, osl: int = 20, **kw) -> pb.Request:
    return pb.Request(id=rid, model=kw.pop("model", MODEL), isl_tokens=200, osl_tokens=osl,
                      **kw)


async def _stream(call, msgs) -> list[pb.RequestEvent]:
    async def gen():
        for m in msgs:
            yield m
            await asyncio.sleep(0.01)

    return [ev async for ev in call(gen(), timeout=60)]


def _finals(events) -> list[tuple[str, int, str, str]]:
    return [(e.request_id, e.record.state, e.record.status_code, e.record.reason)
            for e in events if e.kind == pb.FINISHED]


@pytest.fixture(scope="module")
def topo_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("topo") / "one.yaml"
    p.write_text(TOPOLOGY)
    return str(p)


@pytest.fixture(scope="module")
def dc(topo_path):
    with service("services.datacenter", "--topology", topo_path, "--dc", "eu-a") as (_, addr):
        yield addr


@pytest.fixture(scope="module")
def scheduler(topo_path, dc):
    with service("services.scheduler", "--topology", topo_path, "--region", "eu-north",
                 "--dcs", f"eu-a={dc}") as (_, addr):
        yield addr


def test_dc_refuses_a_duplicate_id_in_flight_and_completes_the_original(dc):
    async def run():
        async with grpc.aio.insecure_channel(dc) as ch:
            stub = dg.DatacenterStub(ch)
            events = await _stream(stub.SubmitStream, [dpb.SubmitRequest(request=req("d1")),
                                                       dpb.SubmitRequest(request=req("d1"))])
            await stub.Submit(dpb.SubmitRequest(request=req("u1", osl=400)), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Submit(dpb.SubmitRequest(request=req("u1")), timeout=5)
            return events, err.value

    events, err = asyncio.run(run())
    finals = _finals(events)
    assert [(r, s, c) for r, s, c, _ in finals] == [("d1", pb.REJECTED, "ALREADY_EXISTS"),
                                                    ("d1", pb.COMPLETED, "")]
    assert "request.id" in finals[0][3]
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS


def test_dc_refuses_oversized_ids_naming_the_field_without_echoing_them(dc):
    async def run():
        async with grpc.aio.insecure_channel(dc) as ch:
            return await _stream(dg.DatacenterStub(ch).SubmitStream,
                                 [dpb.SubmitRequest(request=req("x" * 10_000))])

    (rid, state, code, reason), = _finals(asyncio.run(run()))
    assert state == pb.REJECTED and code == "INVALID_ARGUMENT"
    assert reason.startswith("request.id: expected at most 256 bytes")
    assert len(rid) == 256


@pytest.mark.parametrize("method", ["/geoserve.v1.Datacenter/SubmitStream",
                                    "/geoserve.v1.Scheduler/Submit"])
def test_undecodable_bytes_end_the_stream_with_invalid_argument(dc, scheduler, method):
    addr = dc if "Datacenter" in method else scheduler

    async def run():
        async with grpc.aio.insecure_channel(addr) as ch:
            call = ch.stream_stream(method, request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)

            async def gen():
                yield b"\xff\xff\xff\xff not a protobuf message"
                await asyncio.sleep(30)  # keep the stream open: the server must answer

            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call(gen(), timeout=10):
                    pass
            return err.value

    err = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "undecodable" in (err.details() or "")


def test_scheduler_refuses_duplicates_and_bad_values_naming_the_field(scheduler):
    msgs = [req("s1"), req("s1"),
            req("s2", slo=pb.Slo(ttft_s=math.nan)),
            req("s3", model="no-such-model"),
            req("s4", osl=0)]

    async def run():
        async with grpc.aio.insecure_channel(scheduler) as ch:
            return await _stream(sg.SchedulerStub(ch).Submit, msgs)

    finals = {(r, c): reason for r, _, c, reason in _finals(asyncio.run(run()))}
    assert ("s1", "ALREADY_EXISTS") in finals
    assert ("s1", "") in finals  # the original's record still arrives
    assert finals[("s2", "INVALID_ARGUMENT")].startswith("request.slo.ttft_s")
    assert finals[("s3", "INVALID_ARGUMENT")].startswith("request.model")
    assert finals[("s4", "INVALID_ARGUMENT")].startswith("request.osl_tokens")
    assert len(finals) == 5


def test_forward_refuses_an_id_in_flight_and_an_unknown_target_dc(scheduler):
    async def run():
        async with grpc.aio.insecure_channel(scheduler) as ch:
            stub = sg.SchedulerStub(ch)

            async def submit():
                return await _stream(stub.Submit, [req("f1", osl=300)])

            async def forward():
                await asyncio.sleep(0.2)  # f1 is in flight from the Submit
                return await _stream(stub.Forward, [req("f1", target_dc="eu-a"),
                                                    req("f2", target_dc="nowhere")])

            return await asyncio.gather(submit(), forward())

    sub, fwd = asyncio.run(run())
    assert [(r, s) for r, s, _, _ in _finals(sub)] == [("f1", pb.COMPLETED)]
    codes = {(r, c): reason for r, _, c, reason in _finals(fwd)}
    assert ("f1", "ALREADY_EXISTS") in codes
    assert codes[("f2", "INVALID_ARGUMENT")].startswith("request.target_dc")


@pytest.mark.parametrize(("call", "field"), [
    ("SetFrequency", "gpu_frequency_mhz"),
    ("ApplyCarmPlan", "training_power_w"),
    ("ApplyCarmPlan", "renewable_supply_w"),
    ("ApplyCarmPlan", "gpu_frequency_mhz"),
])
@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_dc_controls_refuse_non_finite_or_negative_values(dc, call, field, value):
    async def run():
        async with grpc.aio.insecure_channel(dc) as ch:
            stub = dg.DatacenterStub(ch)
            if call == "SetFrequency":
                msg = dpb.SetFrequencyRequest(gpu_frequency_mhz=value)
            else:
                msg = dpb.CarmSlotPlan(**{field: value})
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await getattr(stub, call)(msg, timeout=5)
            state = await stub.GetState(dpb.GetStateRequest(), timeout=5)
            return err.value, state.state

    err, state = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith(field)
    assert math.isfinite(state.carbon_g) and math.isfinite(state.power_w)
    assert state.gpu_frequency_mhz > 0
