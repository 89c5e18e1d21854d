"""Scrape-time state collection: the core is read on its event loop's thread, the page is
served over real HTTP, and a dead or busy loop still yields the previous values."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from services.model.errors import InvalidInput
from services.runtime.metrics import StateCollector, serve_metrics
from tests.procs import free_port


def _loop_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    return loop, t


def test_scrape_reads_state_on_the_loop_thread_over_http() -> None:
    loop, thread = _loop_thread()
    readers: list[int] = []
    value = [0.25]

    def build() -> list[Metric]:
        readers.append(threading.get_ident())
        return [GaugeMetricFamily("geoserve_probe_ratio", "a probe", value=value[0])]

    registry = CollectorRegistry()
    collector = StateCollector(build)
    collector.bind(loop)
    registry.register(collector)
    port = free_port()
    server = serve_metrics(registry, port, "127.0.0.1", "test")
    assert server is not None
    try:
        for want in (0.25, 0.75):
            value[0] = want
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            assert fams["geoserve_probe_ratio"].samples[0].value == want
        assert readers == [thread.ident, thread.ident]  # never the HTTP server's thread
    finally:
        server.shutdown()
        server.server_close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_a_stopped_or_closed_loop_serves_the_previous_scrape() -> None:
    loop, thread = _loop_thread()
    calls = [0]

    def build() -> list[Metric]:
        calls[0] += 1
        return [GaugeMetricFamily("geoserve_probe_ratio", "a probe", value=float(calls[0]))]

    collector = StateCollector(build, timeout_s=0.2)
    collector.bind(loop)
    first = [s.value for m in collector.collect() for s in m.samples]
    assert first == [1.0]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    t0 = time.monotonic()
    stale = [s.value for m in collector.collect() for s in m.samples]  # stopped: times out
    assert stale == [1.0] and time.monotonic() - t0 < 2.0
    loop.close()
    assert [s.value for m in collector.collect() for s in m.samples] == [1.0]  # closed
    assert calls[0] == 1


def test_unbound_collector_builds_in_the_caller() -> None:
    collector = StateCollector(lambda: [GaugeMetricFamily("geoserve_x_ratio", "x", value=1)])
    assert [m.name for m in collector.collect()] == ["geoserve_x_ratio"]


def test_disabled_or_busy_port() -> None:
    registry = CollectorRegistry()
    assert serve_metrics(registry, 0, "127.0.0.1", "test") is None
    port = free_port()
    server = serve_metrics(registry, port, "127.0.0.1", "test")
    assert server is not None
    try:
        with pytest.raises(InvalidInput) as exc:
            serve_metrics(registry, port, "127.0.0.1", "test")
        assert exc.value.field == "--metrics-port"
    finally:
        server.shutdown()
        server.server_close()
