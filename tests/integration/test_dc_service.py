"""The datacenter service as a real process over loopback gRPC."""

from __future__ import annotations

import asyncio
import signal

import grpc
import numpy as np
import pytest
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dg

from services.config.calibration import load_calibration
from services.datacenter.perfmodel import PerfModel
from services.datacenter.vdriver import ReplayItem, replay
from tests.procs import service

SETUP = "a100-40gb/llama-3.1-8b-tp1"
MODEL = "llama-3.1-8b"


def req(i: int | str, isl: int = 300, osl: int = 10, model: str = MODEL) -> pb.Request:
    return pb.Request(id=str(i), model=model, isl_tokens=isl, osl_tokens=osl)


async def stream_all(address: str, reqs: list[pb.Request], gaps_s: list[float] | None = None):
    """Submit over SubmitStream (optionally paced); FINISHED records by id, all events."""
    events: list[pb.RequestEvent] = []

    async def gen():
        for k, r in enumerate(reqs):
            if gaps_s:
                await asyncio.sleep(gaps_s[k])
            yield dpb.SubmitRequest(request=r)

    async with grpc.aio.insecure_channel(address) as ch:
        stub = dg.DatacenterStub(ch)
        async for ev in stub.SubmitStream(gen(), timeout=120):
            events.append(ev)
        state = await stub.GetState(dpb.GetStateRequest(include_engines=True), timeout=5)
    finished = {e.request_id: e.record for e in events if e.kind == pb.FINISHED}
    return finished, events, state


def test_stream_completes_every_request_with_its_tokens():
    with service("services.datacenter", "--dc", "dc-a", "--gpus-per-node", "2") as (_, addr):
        reqs = [req(i, isl=200 + 50 * i, osl=5 + i) for i in range(12)]
        finished, events, state = asyncio.run(stream_all(addr, reqs))
    assert set(finished) == {r.id for r in reqs}
    for r in reqs:
        rec = finished[r.id]
        assert rec.state == pb.COMPLETED
        assert rec.output_tokens == r.osl_tokens
        assert rec.prefill_tokens >= r.isl_tokens
        ts = rec.request.timestamps
        assert ts.dc_arrival_s <= ts.admitted_s <= ts.first_token_s <= ts.completed_s
        assert rec.engine.startswith("dc-a/")
    kinds = [e.kind for e in events]
    assert kinds.count(pb.ACCEPTED) == 12 and kinds.count(pb.FIRST_TOKEN) == 12
    s = state.state
    assert s.completed == 12 and s.in_flight == 0
    assert len(state.engines) == 2 and sum(e.steps for e in state.engines) > 0
    # energy by component adds up, facility = IT x PUE, carbon = grid energy x CI
    e = s.energy
    assert e.it_total_j == pytest.approx(e.gpu_active_j + e.gpu_idle_j + e.host_j + e.training_j)
    assert e.facility_j == pytest.approx(e.it_total_j * 1.1, rel=1e-6)
    assert s.carbon_g == pytest.approx(e.facility_j * 300.0 / 3.6e6, rel=1e-6)


async def _unary(address: str, r: pb.Request) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = dg.DatacenterStub(ch)
        try:
            await stub.Submit(dpb.SubmitRequest(request=r), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details()
        return grpc.StatusCode.OK, ""


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (req("isl0", isl=0), "isl_tokens"),
        (req("osl0", osl=0), "osl_tokens"),
        (req("ctx", isl=8000, osl=500), "isl_tokens"),
        (req("model", model="gpt-5"), "model"),
        (pb.Request(id="", model=MODEL, isl_tokens=10, osl_tokens=10), "request.id"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field_and_recorded(bad, field):
    with service("services.datacenter", "--dc", "dc-b", "--gpus-per-node", "1") as (_, addr):
        code, details = asyncio.run(_unary(addr, bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert field in details
        # the same request over the stream: a REJECTED record with the reason, stream goes on
        finished, _, state = asyncio.run(stream_all(addr, [bad, req("ok")]))
    rec = finished[bad.id]
    assert rec.state == pb.REJECTED and field in rec.reason
    assert rec.status_code == "INVALID_ARGUMENT"
    assert finished["ok"].state == pb.COMPLETED
    assert state.state.rejected == 2 and state.state.completed == 1


def test_full_queue_is_resource_exhausted_and_nothing_is_lost():
    args = ("--dc", "dc-q", "--gpus-per-node", "1", "--max-queue", "2")
    with service("services.datacenter", *args) as (_, addr):

        async def flood():
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = dg.DatacenterStub(ch)
                codes = []
                for i in range(8):
                    try:
                        await stub.Submit(dpb.SubmitRequest(request=req(i, isl=4000, osl=200)),
                                          timeout=5)
                        codes.append(grpc.StatusCode.OK)
                    except grpc.aio.AioRpcError as exc:
                        codes.append(exc.code())
                return codes

        codes = asyncio.run(flood())
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
        assert codes[0] == grpc.StatusCode.OK
        asyncio.run(_wait_idle(addr))
        # stream path: every request ends in exactly one record
        reqs = [req(f"s{i}", isl=4000, osl=50) for i in range(10)]
        finished, _, state = asyncio.run(stream_all(addr, reqs))
    assert set(finished) == {r.id for r in reqs}
    states = [finished[r.id].state for r in reqs]
    assert pb.REJECTED in states and pb.COMPLETED in states
    assert all(
        finished[r.id].status_code == "RESOURCE_EXHAUSTED"
        for r in reqs
        if finished[r.id].state == pb.REJECTED
    )


async def _wait_idle(address: str, timeout_s: float = 30.0) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = dg.DatacenterStub(ch)
        for _ in range(int(timeout_s / 0.1)):
            s = await stub.GetState(dpb.GetStateRequest(), timeout=5)
            if s.state.in_flight == 0:
                return
            await asyncio.sleep(0.1)
    raise TimeoutError("datacenter did not go idle")


def test_set_frequency_slows_decode_by_the_frequency_model():
    cal = load_calibration(SETUP)
    with service("services.datacenter", "--dc", "dc-f", "--gpus-per-node", "1") as (_, addr):

        async def run():
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = dg.DatacenterStub(ch)
                r = await stub.SetFrequency(dpb.SetFrequencyRequest(gpu_frequency_mhz=800),
                                            timeout=5)
                return r

        reply = asyncio.run(run())
        slow, _, state = asyncio.run(stream_all(addr, [req("slow", isl=100, osl=60)]))
    level = cal.frequency.snap(800)
    assert reply.gpu_frequency_mhz == level
    assert state.state.gpu_frequency_mhz == level
    t_factor, _ = cal.frequency.factors(level, "decode")
    base = PerfModel(cal)
    # mean decode step of a lone request at this frequency vs the model at max frequency
    ctx = 100 + np.arange(1, 60)
    expected = float(np.mean([base.decode_time(1, k) for k in ctx])) * t_factor
    assert slow["slow"].tpot_s == pytest.approx(expected, rel=0.05)


def test_sigterm_drains_then_fails_the_rest_with_a_reason():
    args = ("--dc", "dc-d", "--gpus-per-node", "1", "--drain-grace", "0.3")
    with service("services.datacenter", *args) as (proc, addr):

        async def run():
            events = []
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = dg.DatacenterStub(ch)
                q: asyncio.Queue = asyncio.Queue()

                async def gen():
                    for i in range(6):
                        yield dpb.SubmitRequest(request=req(i, isl=500, osl=2000 - 200 * i))
                    await q.get()  # keep the stream open until the server ends it

                call = stub.SubmitStream(gen(), timeout=60)
                async for ev in call:
                    events.append(ev)
                    if ev.kind == pb.FIRST_TOKEN and sum(
                        e.kind == pb.FIRST_TOKEN for e in events
                    ) == 6:
                        proc.send_signal(signal.SIGTERM)
                    if sum(e.kind == pb.FINISHED for e in events) == 6:
                        break
                q.put_nowait(None)
            return events

        events = asyncio.run(run())
        assert proc.wait(timeout=20) == 0
    finished = [e.record for e in events if e.kind == pb.FINISHED]
    assert len(finished) == 6
    failed = [r for r in finished if r.state == pb.FAILED]
    assert failed, "long requests must be cut by the drain"
    assert all("drained" in r.reason and r.status_code == "UNAVAILABLE" for r in failed)


def test_wall_clock_agrees_with_virtual_clock_at_light_load():
    """Same arrivals and engines: wall-clock TTFT/TPOT within 5 % of the virtual replay."""
    cal = load_calibration(SETUP)
    rng = np.random.default_rng(7)
    n = 60
    gaps = rng.exponential(1 / 8.0, n)  # 8 req/s on 4 engines: light load
    isl = rng.integers(100, 1500, n)
    osl = rng.integers(5, 60, n)
    reqs = [req(i, int(isl[i]), int(osl[i])) for i in range(n)]
    with service("services.datacenter", "--dc", "dc-w", "--gpus-per-node", "4") as (_, addr):
        finished, _, state = asyncio.run(stream_all(addr, reqs, list(gaps)))
    recs = [finished[r.id] for r in reqs]
    assert all(r.state == pb.COMPLETED for r in recs)
    t0 = min(r.request.timestamps.dc_arrival_s for r in recs)
    items = [
        ReplayItem(
            r.request.timestamps.dc_arrival_s - t0,
            r.request.isl_tokens,
            r.request.osl_tokens,
            int(r.engine.rsplit("/e", 1)[1]),
        )
        for r in recs
    ]
    virt = replay(cal, items, 4)
    wall_ttft = np.mean([r.request.timestamps.first_token_s - r.request.timestamps.dc_arrival_s
                         for r in recs])
    virt_ttft = np.mean([f.ttft_s for f in virt.finished])
    wall_tpot = np.mean([r.tpot_s for r in recs if r.output_tokens > 1])
    virt_tpot = np.mean([f.tpot_s for f in virt.finished if f.output_tokens > 1])
    assert wall_ttft == pytest.approx(virt_ttft, rel=0.05)
    assert wall_tpot == pytest.approx(virt_tpot, rel=0.05)
    assert state.state.faithful
