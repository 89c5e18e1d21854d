"""gRPC runtime helpers: server assembly, error mapping, health, shutdown, addresses.

* `ErrorMappingInterceptor` maps domain errors (`services.model.errors`) raised by
  unary-request handlers to status codes: InvalidInput -> INVALID_ARGUMENT,
  CapacityExceeded -> RESOURCE_EXHAUSTED, Unavailable -> UNAVAILABLE, UsageError ->
  FAILED_PRECONDITION; an undecodable request -> INVALID_ARGUMENT.
* `start_server` adds the standard health service (aio servicer) and reflection.
* `install_signal_handlers` runs a coroutine on SIGTERM/SIGINT (drain, then stop).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.model.errors import GeoServeError, InvalidInput

STATUS = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
    "INTERNAL": grpc.StatusCode.INTERNAL,
}

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]


def status_of(exc: GeoServeError) -> grpc.StatusCode:
    return STATUS.get(exc.status_code, grpc.StatusCode.INTERNAL)


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Turns domain errors of unary handlers into gRPC status codes, and requests that
    cannot be decoded into ``INVALID_ARGUMENT`` (not grpc's UNKNOWN and a logged
    traceback): the request of a unary-request call is decoded here, not by grpc.
    Streamed requests are decoded as they are read (`serve_event_stream`)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        decode = handler.request_deserializer

        async def request_of(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            if decode is None:
                return raw
            try:
                return decode(raw)
            except DecodeError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"undecodable request message: {exc}")

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                request = await request_of(raw, context)
                try:
                    return await inner(request, context)
                except GeoServeError as exc:
                    await context.abort(status_of(exc), str(exc))

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=None,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def streamed(raw: bytes, context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[Any]:
                request = await request_of(raw, context)
                try:
                    async for reply in inner_stream(request, context):
                        yield reply
                except GeoServeError as exc:
                    await context.abort(status_of(exc), str(exc))

            return grpc.unary_stream_rpc_method_handler(
                streamed, request_deserializer=None,
                response_serializer=handler.response_serializer)
        return handler


# ---------------------------------------------------------------------------- mutual TLS
TLS_ENV = {"cert": "GEOSERVE_TLS_CERT", "key": "GEOSERVE_TLS_KEY", "ca": "GEOSERVE_TLS_CA"}


@dataclass(frozen=True)
class TlsFiles:
    """PEM contents of this service's certificate chain, its key and the CA that signs
    every service's certificate (servers require a client certificate from that CA)."""

    cert: bytes
    key: bytes
    ca: bytes


def tls_from_env(env: Mapping[str, str] | None = None) -> TlsFiles | None:
    """Mutual TLS from ``GEOSERVE_TLS_CERT/KEY/CA`` (file paths): all three or none."""
    e = os.environ if env is None else env
    paths = {k: e.get(v, "") for k, v in TLS_ENV.items()}
    if not any(paths.values()):
        return None
    missing = [TLS_ENV[k] for k, v in paths.items() if not v]
    if missing:
        raise InvalidInput(missing[0], "mutual TLS needs a certificate, its key and the CA "
                                       f"({', '.join(TLS_ENV.values())})")
    data = {}
    for k, path in paths.items():
        try:
            data[k] = Path(path).read_bytes()
        except OSError as exc:
            raise InvalidInput(TLS_ENV[k], f"cannot read {path}: {exc.strerror}") from None
    return TlsFiles(**data)


def add_tls_args(p: Any) -> None:
    """``--tls-cert/--tls-key/--tls-ca``: mutual TLS for this service's server and every
    channel it opens (default: ``$GEOSERVE_TLS_CERT`` etc.; none: plaintext)."""
    for k, var in TLS_ENV.items():
        p.add_argument(f"--tls-{k}", default=None, help=f"PEM file (default ${var})")


def apply_tls_args(args: Any, prog: str = "") -> None:
    """Export the TLS flags to the environment, so every channel of the process uses them.
    With `prog` (a service's main), a bad setting ends the process with status 2 and a
    message naming the flag or variable; without, it raises `InvalidInput`."""
    for k, var in TLS_ENV.items():
        v = getattr(args, f"tls_{k}", None)
        if v:
            os.environ[var] = v
    try:
        tls_from_env()  # fail now, naming the variable, rather than at the first call
    except InvalidInput as exc:
        if not prog:
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def open_channel(address: str, options: Sequence[tuple[str, Any]] | None = None
                 ) -> grpc.aio.Channel:
    """An aio channel to a GeoServe service: mutual TLS when configured, else plaintext."""
    opts = list(CHANNEL_OPTIONS if options is None else options)
    tls = tls_from_env()
    if tls is None:
        return grpc.aio.insecure_channel(address, options=opts)
    creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key,
                                         certificate_chain=tls.cert)
    return grpc.aio.secure_channel(address, creds, options=opts)


def open_sync_channel(address: str) -> grpc.Channel:
    """The blocking-API twin of `open_channel` (health probes)."""
    tls = tls_from_env()
    if tls is None:
        return grpc.insecure_channel(address)
    creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key,
                                         certificate_chain=tls.cert)
    return grpc.secure_channel(address, creds)


def add_port(server: grpc.aio.Server, address: str) -> int:
    """Bind `address`: with mutual TLS, clients must present a certificate from the CA."""
    tls = tls_from_env()
    if tls is None:
        return server.add_insecure_port(address)
    creds = grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca,
                                        require_client_auth=True)
    return server.add_secure_port(address, creds)


async def start_server(
    adders: Sequence[tuple[Callable[[Any, grpc.aio.Server], None], Any]],
    service_names: Sequence[str],
    address: str,
    ready: Callable[[], Awaitable[None]] | None = None,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """Create, populate and start an aio server; returns (server, health, bound port).

    With `ready`, the server listens at once but reports NOT_SERVING until `ready()`
    returns (e.g. a scheduler whose links to its DCs and peers are not up yet)."""
    server = grpc.aio.server(interceptors=[ErrorMappingInterceptor()], options=CHANNEL_OPTIONS)
    for add, servicer in adders:
        add(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    port = add_port(server, address)
    if port == 0:
        raise InvalidInput("address", f"cannot bind {address!r}")
    await server.start()
    if ready is not None:
        for name in [*service_names, ""]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await ready()
    for name in [*service_names, ""]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, port


async def set_not_serving(health_servicer: health.aio.HealthServicer) -> None:
    await health_servicer.enter_graceful_shutdown()


def install_signal_handlers(on_stop: Callable[[], Coroutine[Any, Any, None]]) -> None:
    loop = asyncio.get_running_loop()
    fired = False

    def handler() -> None:
        nonlocal fired
        if not fired:
            fired = True
            loop.create_task(on_stop())

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler)


def env_or(name: str, default: str | None) -> str:
    """An address/port from the environment, failing clearly when required and missing."""
    value = os.environ.get(name, default)
    if value is None or value == "":
        raise InvalidInput(name, "required environment variable is not set")
    return value


async def wait_healthy(address: str, timeout_s: float = 30.0, service: str = "") -> None:
    """Poll a server's health service until SERVING or the timeout passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Exception | None = None
    async with open_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while loop.time() < deadline:
            try:
                r = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError as exc:
                last = exc
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{address} not healthy after {timeout_s}s: {last}")


ADDRESS_ENV = "GEOSERVE_ADDRESS"


def listen_address(flag: str | None, default_port: int = 50051) -> str:
    """Where a service listens for gRPC: ``--address``, else ``$GEOSERVE_ADDRESS``, else
    loopback on ``$PORT`` — a service started on its own is not reachable from other
    hosts unless an address says so (compose sets ``GEOSERVE_ADDRESS=0.0.0.0:PORT``)."""
    return (flag or os.environ.get(ADDRESS_ENV)
            or f"127.0.0.1:{os.environ.get('PORT') or default_port}")


def parse_addr_map(text: str, field: str) -> dict[str, str]:
    """Parse ``name=host:port,name=host:port`` (field names the flag or env variable)."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, addr = part.partition("=")
        name, addr = name.strip(), addr.strip()
        if not sep or not name or ":" not in addr:
            raise InvalidInput(field, f"expected NAME=HOST:PORT entries, got {part!r}")
        if name in out:
            raise InvalidInput(field, f"{name!r} given twice")
        out[name] = addr
    return out


async def serve_event_stream(
    request_iterator: AsyncIterator[Any],
    intake: Callable[[Any, Callable[[Any], None]], Any | None],
    is_final: Callable[[Any], bool],
    request_id: Callable[[Any], str],
    context: grpc.aio.ServicerContext | None = None,
) -> AsyncIterator[Any]:
    """Serve a stream of requests that answers with a stream of events (the scheduler's
    `Submit`/`Forward`, the DC's `SubmitStream`).

    Each incoming message goes to ``intake(msg, sink)``: it returns an event that refuses
    the message (sent at once; nothing stays pending) or None to accept it, in which case
    its events come later through `sink`. The stream ends once the client has
    half-closed and every accepted request has had its final event (`is_final`; events
    name their request in ``request_id``, messages through `request_id(msg)`). Pending
    requests are counted per id, so a refused duplicate never ends the wait for the
    original. A message that cannot be decoded ends the call at once with
    ``INVALID_ARGUMENT`` (through `context`), never a hang or a traceback."""
    out: asyncio.Queue[tuple[bool, Any] | None] = asyncio.Queue()
    pending: Counter[str] = Counter()
    reading_done = False

    def sink(ev: Any) -> None:
        out.put_nowait((False, ev))

    bad: list[str] = []

    async def reader() -> None:
        nonlocal reading_done
        try:
            async for msg in request_iterator:
                rid = request_id(msg)
                pending[rid] += 1
                refusal = intake(msg, sink)
                if refusal is not None:
                    pending[rid] -= 1
                    out.put_nowait((True, refusal))
        except DecodeError as exc:
            bad.append(f"undecodable request message: {exc}")
        reading_done = True
        out.put_nowait(None)

    def settled() -> bool:
        return reading_done and not +pending and out.empty()

    task = asyncio.create_task(reader())
    try:
        while True:
            item = await out.get()
            if bad:
                if context is not None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad[0])
                raise InvalidInput("request", bad[0])
            if item is not None:
                refused, ev = item
                if not refused and is_final(ev):
                    rid = ev.request_id
                    if pending[rid] > 0:
                        pending[rid] -= 1
                yield ev
            if settled():
                break
    finally:
        task.cancel()
