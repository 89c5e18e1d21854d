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


@pytest.fixture(scope="module")
def provisioner(topo_path, dc):
    with service("services.provisioner", "--topology", topo_path,
                 "--dcs", f"eu-a={dc}") as (_, addr):
        yield addr


UNARY = [("dc", "/geoserve.v1.Datacenter/Submit"), ("dc", "/geoserve.v1.Datacenter/GetState"),
         ("dc", "/geoserve.v1.Datacenter/SetFrequency"),
         ("dc", "/geoserve.v1.Datacenter/ApplyCarmPlan"), ("dc", "/geoserve.v1.Datacenter/Drain"),
         ("scheduler", "/geoserve.v1.Scheduler/Info"),
         ("provisioner", "/geoserve.v1.Provisioner/GetSnapshot"),
         ("provisioner", "/geoserve.v1.Provisioner/GetStats"),
         ("provisioner", "/geoserve.v1.Provisioner/Watch")]


@pytest.mark.parametrize(("who", "method"), UNARY, ids=[m.rsplit(".", 1)[1] for _, m in UNARY])
def test_undecodable_unary_requests_get_invalid_argument(request, who, method):
    addr = request.getfixturevalue(who)

    async def run():
        async with grpc.aio.insecure_channel(addr) as ch:
            if method.endswith("/Watch"):
                call = ch.unary_stream(method, request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in call(b"\xff\xff\xff\xff junk", timeout=10):
                        pass
            else:
                call = ch.unary_unary(method, request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(b"\xff\xff\xff\xff junk", timeout=10)
            return err.value

    err = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert (err.details() or "").startswith("undecodable request message")


@pytest.mark.parametrize(("msg", "field"), [
    (dpb.DrainRequest(grace_s=math.nan), "grace_s"),
    (dpb.DrainRequest(grace_s=math.inf), "grace_s"),
    (dpb.DrainRequest(grace_s=-1.0), "grace_s"),
    (dpb.DrainRequest(grace_s=1e9), "grace_s"),
    (dpb.SetFrequencyRequest(gpu_frequency_mhz=1e300), "gpu_frequency_mhz"),
    (dpb.CarmSlotPlan(gpu_frequency_mhz=1e300), "gpu_frequency_mhz"),
    (dpb.CarmSlotPlan(training_power_w=1e300), "training_power_w"),
    (dpb.CarmSlotPlan(renewable_supply_w=1e12), "renewable_supply_w"),
    (dpb.CarmSlotPlan(slot_start_s=math.nan), "slot_start_s"),
    (dpb.CarmSlotPlan(slot_length_s=-5.0), "slot_length_s"),
], ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_dc_controls_refuse_out_of_range_values_and_stay_usable(dc, msg, field):
    method = {"DrainRequest": "Drain", "SetFrequencyRequest": "SetFrequency",
              "CarmSlotPlan": "ApplyCarmPlan"}[type(msg).__name__]

    async def run():
        async with grpc.aio.insecure_channel(dc) as ch:
            stub = dg.DatacenterStub(ch)
            before = (await stub.GetState(dpb.GetStateRequest(), timeout=5)).state
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await getattr(stub, method)(msg, timeout=5)
            after = (await stub.GetState(dpb.GetStateRequest(), timeout=5)).state
            # not draining, clock unchanged: a new request still completes
            events = await _stream(stub.SubmitStream,
                                   [dpb.SubmitRequest(request=req(f"after-{method}-{field}",
                                                                  osl=5))])
            return err.value, before, after, events

    err, before, after, events = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert (err.details() or "").startswith(f"{field}: expected a finite")
    assert after.gpu_frequency_mhz == before.gpu_frequency_mhz
    assert math.isfinite(after.carbon_g) and math.isfinite(after.power_w)
    assert [s for _, s, _, _ in _finals(events)] == [pb.COMPLETED]


def test_dc_frequency_above_the_top_level_but_in_range_snaps_to_the_top(dc):
    # A100 levels: 210 ... 1410 MHz; values up to twice the top level are accepted and
    # snap to the nearest level, which above the range is the top one (not the lowest)
    async def run():
        async with grpc.aio.insecure_channel(dc) as ch:
            stub = dg.DatacenterStub(ch)
            low = await stub.SetFrequency(dpb.SetFrequencyRequest(gpu_frequency_mhz=100.0),
                                          timeout=5)
            high = await stub.SetFrequency(dpb.SetFrequencyRequest(gpu_frequency_mhz=2820.0),
                                           timeout=5)
            return low.gpu_frequency_mhz, high.gpu_frequency_mhz

    assert asyncio.run(run()) == (210.0, 1410.0)


@pytest.mark.parametrize(("since", "until", "field"), [
    (math.nan, 0.0, "since_s"), (0.0, math.inf, "until_s"), (-1.0, 0.0, "since_s"),
    (5.0, 1.0, "until_s"), (1e300, 0.0, "since_s"),
])
def test_provisioner_stats_refuse_bad_windows_naming_the_field(provisioner, since, until,
                                                               field):
    from geoserve.v1 import provisioner_pb2 as ppb
    from geoserve.v1 import provisioner_pb2_grpc as pg

    async def run():
        async with grpc.aio.insecure_channel(provisioner) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pg.ProvisionerStub(ch).GetStats(
                    ppb.GetStatsRequest(since_s=since, until_s=until), timeout=5)
            ok = await pg.ProvisionerStub(ch).GetStats(ppb.GetStatsRequest(), timeout=5)
            return err.value, ok

    err, ok = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert (err.details() or "").startswith(f"{field}: expected")
    assert ok.mode == "sync" and ok.period_s == 1.0


def test_provisioner_watch_refuses_an_oversized_subscriber_name(provisioner):
    from geoserve.v1 import provisioner_pb2 as ppb
    from geoserve.v1 import provisioner_pb2_grpc as pg

    async def run():
        async with grpc.aio.insecure_channel(provisioner) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in pg.ProvisionerStub(ch).Watch(
                        ppb.WatchRequest(subscriber="x" * 100_000), timeout=10):
                    pass
            return err.value

    err = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert err.details() == "subscriber: expected at most 256 bytes, got 100000"
