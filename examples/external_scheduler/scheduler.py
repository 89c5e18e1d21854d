"""A regional scheduler written outside GeoServe, against the protos alone.

It uses only grpcio, grpcio-health-checking and the generated `geoserve.v1` modules (any
language with a gRPC stack could do the same from `protos/geoserve/v1/*.proto`). Policy:
send every request to the region's datacenter with the lowest carbon intensity in the
latest provisioner snapshot (round-robin before the first snapshot); never forward.
Requests forwarded by peer schedulers go to their `target_dc`.

    python examples/external_scheduler/scheduler.py --address 127.0.0.1:PORT \
        --region eu-north --dcs eu-nl=HOST:PORT,eu-lt=HOST:PORT --provisioner HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time

import grpc
from geoserve.v1 import common_pb2 as pb
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dgrpc
from geoserve.v1 import provisioner_pb2 as ppb
from geoserve.v1 import provisioner_pb2_grpc as pgrpc
from geoserve.v1 import scheduler_pb2 as spb
from geoserve.v1 import scheduler_pb2_grpc as sgrpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


class External(sgrpc.SchedulerServicer):
    def __init__(self, region: str, dcs: dict[str, str], provisioner: str, epoch: float,
                 dilation: float) -> None:
        self.region = region
        self.dcs = dcs
        self.provisioner = provisioner
        self.epoch, self.dilation = epoch, dilation
        self.ci: dict[str, float] = {}
        self.rr = itertools.cycle(sorted(dcs))
        self.queues: dict[str, asyncio.Queue[dpb.SubmitRequest]] = {}
        self.sinks: dict[str, asyncio.Queue[pb.RequestEvent]] = {}
        self.decisions = 0

    def now(self) -> float:
        return (time.time() - self.epoch) / self.dilation

    async def start(self) -> None:
        for name, addr in self.dcs.items():
            self.queues[name] = asyncio.Queue()
            asyncio.create_task(self._dc_link(name, addr))
        asyncio.create_task(self._snapshots())

    async def _snapshots(self) -> None:
        while True:
            try:
                async with grpc.aio.insecure_channel(self.provisioner) as ch:
                    async for snap in pgrpc.ProvisionerStub(ch).Watch(
                        ppb.WatchRequest(subscriber=f"external/{self.region}")
                    ):
                        self.ci = {d.dc: d.effective_ci_g_per_kwh or d.grid_ci_g_per_kwh
                                   for d in snap.dcs if d.up and d.dc in self.dcs}
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.5)

    async def _dc_link(self, name: str, addr: str) -> None:
        q = self.queues[name]

        async def gen():
            while True:
                yield await q.get()

        async with grpc.aio.insecure_channel(addr) as ch:
            async for ev in dgrpc.DatacenterStub(ch).SubmitStream(gen()):
                sink = self.sinks.get(ev.request_id)
                if sink is not None and ev.kind != pb.ACCEPTED:
                    if ev.kind == pb.FINISHED:
                        self.sinks.pop(ev.request_id, None)
                        rec = ev.record
                        ts = rec.request.timestamps
                        if rec.state == pb.COMPLETED and ts.scheduler_arrival_s > 0:
                            ts.first_token_origin_s = ts.first_token_s
                            ts.completed_origin_s = ts.completed_s
                            rec.ttft_s = ts.first_token_s - ts.scheduler_arrival_s
                            rec.e2e_s = ts.completed_s - ts.scheduler_arrival_s
                    sink.put_nowait(ev)

    def _choose(self) -> str:
        if self.ci:
            return min(self.ci, key=lambda d: (self.ci[d], d))
        return next(self.rr)

    async def _serve(self, it, origin: bool):
        out: asyncio.Queue[pb.RequestEvent] = asyncio.Queue()
        pending: set[str] = set()
        done = False

        async def reader():
            nonlocal done
            async for req in it:
                pending.add(req.id)
                if origin:
                    req.timestamps.scheduler_arrival_s = self.now()
                    req.timestamps.decided_s = req.timestamps.scheduler_arrival_s
                    req.policy = "external-lowest-ci"
                    req.target_dc = self._choose()
                    req.target_region = self.region
                    self.decisions += 1
                self.sinks[req.id] = out
                self.queues[req.target_dc].put_nowait(dpb.SubmitRequest(request=req))
            done = True

        task = asyncio.create_task(reader())
        try:
            while not (done and not pending):
                try:
                    ev = await asyncio.wait_for(out.get(), 0.5)
                except TimeoutError:
                    continue
                if ev.kind == pb.FINISHED:
                    pending.discard(ev.request_id)
                yield ev
        finally:
            task.cancel()

    async def Submit(self, request_iterator, context):  # noqa: N802
        async for ev in self._serve(request_iterator, origin=True):
            yield ev

    async def Forward(self, request_iterator, context):  # noqa: N802
        async for ev in self._serve(request_iterator, origin=False):
            yield ev

    async def Info(self, request, context):  # noqa: N802
        return spb.SchedulerInfo(region=self.region, policy="external-lowest-ci",
                                 decisions=self.decisions)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", required=True)
    ap.add_argument("--region", required=True)
    ap.add_argument("--dcs", required=True)
    ap.add_argument("--provisioner", required=True)
    ap.add_argument("--epoch", type=float, default=time.time())
    ap.add_argument("--dilation", type=float, default=1.0)
    args, _ = ap.parse_known_args()
    dcs = dict(p.split("=", 1) for p in args.dcs.split(","))
    svc = External(args.region, dcs, args.provisioner, args.epoch, args.dilation)
    await svc.start()
    server = grpc.aio.server()
    sgrpc.add_SchedulerServicer_to_server(svc, server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    server.add_insecure_port(args.address)
    await server.start()
    await hs.set("", health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
