"""Prometheus metrics of the GeoServe services, and their CSV sink for the virtual runtime.

Rules
-----
* Runtime side only: cores never import `prometheus_client`. Each component (datacenter,
  scheduler, provisioner, load generator) has a metrics object that owns an explicit
  `CollectorRegistry` (no default process/platform collectors, no multiprocess mode);
  a process serves its registry on one ``/metrics`` port (``--metrics-port`` /
  ``METRICS_PORT``; 0 or absent = off).
* Names: prefix ``geoserve_``, underscores, base units in the name (``_seconds``,
  ``_joules_total``, ``_grams_total``, ``_ratio``, ``_watts``, ``_hertz``, ``_tokens``);
  carbon intensity keeps the project's unit, ``_grams_per_kwh`` (gCO2/kWh). Labels are
  bounded — ``region``, ``dc``, ``engine``, ``policy``, ``model``, ``status``,
  ``component``, ``outcome`` — never a request id. Every time is emulated seconds.
* TTFT, TPOT, end-to-end and queue-time histograms use vLLM's buckets (v1
  ``vllm/v1/metrics/loggers.py``). A DC also exports vLLM's own engine series, with
  vLLM's names, labels and meanings (``vllm:*``, `services.runtime.vllm`), so tools that
  read a vLLM server read a GeoServe DC; ``/metrics`` is always served in the text format
  0.0.4, which keeps the ``:`` of those names (prometheus_client's OpenMetrics output
  rewrites it to ``_``).
* State-derived series (gauges, and counters the cores already keep monotone: energy,
  carbon, terminal requests, wake-ups) are read from the core at scrape time by a
  `StateCollector`, which runs the read on the service's asyncio loop thread (the cores
  are not thread-safe; the HTTP server runs in its own thread) and falls back to the
  previous scrape's values if the loop does not answer in time. Event-derived series
  (latency histograms, decision outcomes, poll latency, load-generator counts) are fed by
  small hooks in the runtimes: one call per finished request, decision or poll.
* The virtual runtime builds the same objects and writes their samples to CSV
  (`MetricsCsv`: ``time_s, metric, labels, value``); histogram buckets are left out of the
  CSV (``_count`` and ``_sum`` stay) — exact quantiles are in ``records.csv``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import csv
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.model.errors import InvalidInput

if TYPE_CHECKING:
    from services.datacenter.dc import Datacenter
    from services.loadgen.records import RecordRow
    from services.provisioner.core import ProvisionerCore
    from services.scheduler.core import Dispatch, SchedulerCore

log = logging.getLogger("geoserve.metrics")

# `*_created` series are noise for dashboards and break the unit-suffix rule.
prometheus_client.disable_created_metrics()

PREFIX = "geoserve_"
# vLLM v1 (vllm/v1/metrics/loggers.py) buckets, seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# Ours: a policy decides in microseconds (RR) to a quarter second (MILP time limit).
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
                    0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
WINDOW_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 300, 500, 1000)
POLL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

REQUEST_STATUSES = ("completed", "rejected", "failed")
DECISION_OUTCOMES = ("local", "forwarded", "fallback", "rejected")
ENERGY_COMPONENTS = ("gpu_active", "gpu_idle", "host", "training")
METRICS_PORT_ENV = "METRICS_PORT"
METRICS_ADDR_ENV = "METRICS_ADDR"


# ---------------------------------------------------------------------------- process
def add_metrics_args(p: Any) -> None:
    """Add ``--metrics-port`` / ``--metrics-address`` to a service's argument parser."""
    p.add_argument("--metrics-port", type=int, default=None,
                   help=f"serve Prometheus /metrics on this port (default ${METRICS_PORT_ENV};"
                        " 0 or unset: off)")
    p.add_argument("--metrics-address", default=None,
                   help=f"/metrics listen address (default ${METRICS_ADDR_ENV} or 127.0.0.1)")


def metrics_port(flag: int | None, env: dict[str, str] | None = None) -> int:
    """The metrics port from the flag, else ``METRICS_PORT``; 0 means disabled."""
    if flag is not None:
        port = flag
        source = "--metrics-port"
    else:
        text = (os.environ if env is None else env).get(METRICS_PORT_ENV, "").strip()
        source = METRICS_PORT_ENV
        if not text:
            return 0
        try:
            port = int(text)
        except ValueError:
            raise InvalidInput(source, f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise InvalidInput(source, f"expected a port in 0..65535, got {port}")
    return port


def serve_metrics(registry: CollectorRegistry, flag_port: int | None,
                  flag_address: str | None, component: str) -> WSGIServer | None:
    """Start the /metrics HTTP server (a daemon thread) when a port is set.

    Returns the server (``shutdown()`` stops it), or None when metrics are disabled.
    """
    port = metrics_port(flag_port)
    if not port:
        return None
    addr = flag_address or os.environ.get(METRICS_ADDR_ENV) or "127.0.0.1"
    app = prometheus_client.make_wsgi_app(registry)

    def text_format(environ: dict[str, Any], start_response: Any) -> Any:
        # Always the text format 0.0.4: prometheus_client's OpenMetrics output (which
        # Prometheus asks for first) rewrites ':' in sample names to '_', so vLLM's
        # `vllm:*` series would arrive as `vllm_*`; the text format keeps the names.
        return app({**environ, "HTTP_ACCEPT": "text/plain; version=0.0.4"}, start_response)

    try:
        server = make_server(addr, port, text_format, _ThreadingWSGIServer,
                             handler_class=_QuietHandler)
    except OSError as exc:
        raise InvalidInput("--metrics-port", f"cannot listen on {addr}:{port}: {exc}") from None
    threading.Thread(target=server.serve_forever, name=f"{component}-metrics",
                     daemon=True).start()
    log.info("%s metrics on http://%s:%d/metrics", component, addr, port)
    return server


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        """No access log per scrape."""


class StateCollector(Collector):
    """Builds metric families from a core's state at scrape time, on the loop's thread.

    Unbound (virtual runtime, tests) it calls `build` directly. Bound to an event loop it
    schedules `build` there with ``call_soon_threadsafe`` and waits up to ``timeout_s``;
    when the loop is gone or busy it serves the previous families.
    """

    def __init__(self, build: Callable[[], list[Metric]], timeout_s: float = 5.0) -> None:
        self._build = build
        self._loop: asyncio.AbstractEventLoop | None = None
        self.timeout_s = timeout_s
        self._last: list[Metric] = []

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def describe(self) -> Iterable[Metric]:
        return []

    def _families(self) -> list[Metric]:
        loop = self._loop
        if loop is None:
            return self._build()
        try:
            if asyncio.get_running_loop() is loop:
                return self._build()
        except RuntimeError:
            pass
        fut: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(self._build())
            except BaseException as exc:  # delivered to the scraping thread
                fut.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
            return fut.result(timeout=self.timeout_s)
        except (RuntimeError, TimeoutError):  # loop closed, or busy past the timeout
            fut.cancel()
            return self._last

    def collect(self) -> Iterator[Metric]:
        fams = self._families()
        self._last = fams
        yield from fams


class _Families:
    """Helper to build gauge/counter families with a fixed set of base labels."""

    def __init__(self, base: dict[str, str]) -> None:
        self.base = base
        self.out: list[Metric] = []

    def gauge(self, name: str, doc: str, value: float, **extra: str) -> None:
        self._add(GaugeMetricFamily, name, doc, [(extra, value)])

    def counter(self, name: str, doc: str, value: float, **extra: str) -> None:
        self._add(CounterMetricFamily, name, doc, [(extra, value)])

    def gauges(self, name: str, doc: str, rows: Sequence[tuple[dict[str, str], float]]) -> None:
        self._add(GaugeMetricFamily, name, doc, rows)

    def counters(self, name: str, doc: str,
                 rows: Sequence[tuple[dict[str, str], float]]) -> None:
        self._add(CounterMetricFamily, name, doc, rows)

    def _add(self, cls: Any, name: str, doc: str,
             rows: Sequence[tuple[dict[str, str], float]]) -> None:
        keys = [*self.base, *(rows[0][0] if rows else {})]
        fam = cls(name, doc, labels=keys)
        for extra, value in rows:
            fam.add_metric([*self.base.values(), *extra.values()], float(value))
        self.out.append(fam)


def _clock_families(f: _Families, component: str, now: float, dilation: float) -> None:
    comp = {"component": component}
    f.out.append(_single(GaugeMetricFamily, "geoserve_emulated_time_seconds",
                         "Emulated clock of this process (seconds since the run's epoch).",
                         comp, now))
    f.out.append(_single(GaugeMetricFamily, "geoserve_dilation_ratio",
                         "Wall seconds per emulated second (time dilation factor k).",
                         comp, dilation))


def _single(cls: Any, name: str, doc: str, labels: dict[str, str], value: float) -> Metric:
    fam = cls(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), float(value))
    return fam  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- datacenter
def _series(cache: dict[tuple[int, tuple[str, ...]], Any], metric: Any,
            labels: tuple[str, ...]) -> Any:
    """`metric.labels(*labels)`, looked up once per series (the hot paths call it per
    request)."""
    key = (id(metric), labels)
    child = cache.get(key)
    if child is None:
        child = cache[key] = metric.labels(*labels)
    return child


class Deferred:
    """Per-request metric updates collected and applied in bulk by `flush` -- for the
    virtual runtime, which reads its metrics only when it samples them: the counters get
    one ``inc`` per series, the histograms their bucket counts at once (prometheus_client's
    own bucket rule, ``value <= bound``)."""

    def __init__(self) -> None:
        self.incs: dict[Any, float] = {}
        self.obs: dict[Any, list[float]] = {}

    def inc(self, child: Any, amount: float = 1.0) -> None:
        self.incs[child] = self.incs.get(child, 0.0) + amount

    def observe(self, child: Any, value: float) -> None:
        vals = self.obs.get(child)
        if vals is None:
            self.obs[child] = [value]
        else:
            vals.append(value)

    def flush(self) -> None:
        import numpy as np

        for child, amount in self.incs.items():
            child.inc(amount)
        for child, vals in self.obs.items():
            bounds = getattr(child, "_upper_bounds", None)
            buckets = getattr(child, "_buckets", None)
            total = getattr(child, "_sum", None)
            if bounds is None or buckets is None or total is None:
                for v in vals:  # not the layout this was written for: one by one
                    child.observe(v)
                continue
            idx = np.searchsorted(np.asarray(bounds, dtype=np.float64),
                                  np.asarray(vals, dtype=np.float64), side="left")
            counts = np.bincount(idx, minlength=len(bounds) + 1)
            for i, c in enumerate(counts[: len(bounds)].tolist()):
                if c:
                    buckets[i].inc(c)
            total.inc(sum(vals))
        self.incs.clear()
        self.obs.clear()


class HotMetrics:
    """The per-request update paths of the metrics classes: at once, or `Deferred`."""

    _cache: dict[tuple[int, tuple[str, ...]], Any]
    deferred: Deferred | None = None

    def _inc(self, metric: Any, labels: tuple[str, ...], amount: float = 1.0) -> None:
        child = _series(self._cache, metric, labels)
        if self.deferred is None:
            child.inc(amount)
        else:
            self.deferred.inc(child, amount)

    def _observe(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        child = _series(self._cache, metric, labels)
        if self.deferred is None:
            child.observe(value)
        else:
            self.deferred.observe(child, value)


class DcMetrics(HotMetrics):
    """Datacenter and engine series: state from the `Datacenter` core, latency histograms
    from finished requests (times measured at the DC: TTFT from the arrival at the first
    scheduler to the first token at the DC, i.e. without the back-path RTT). With
    `per_engine` also vLLM's per-engine series (`services.runtime.vllm`)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 per_engine: bool = True) -> None:
        from services.runtime.vllm import VllmMetrics

        self.registry = registry if registry is not None else CollectorRegistry()
        self.vllm = VllmMetrics(self.registry) if per_engine else None
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.per_engine = per_engine
        self.dc: Datacenter | None = None
        self._now: Callable[[], float] = lambda: 0.0
        self.dilation = 1.0
        labels = ("dc", "region", "model")
        r = self.registry
        self.state = StateCollector(self._build)
        r.register(self.state)
        self.ttft = Histogram("geoserve_dc_time_to_first_token_seconds",
                              "Time to first token at the DC (from the first scheduler).",
                              labels, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("geoserve_dc_time_per_output_token_seconds",
                              "Mean decode step gap of a completed request (> 1 token).",
                              labels, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("geoserve_dc_e2e_request_latency_seconds",
                             "First scheduler arrival to completion at the DC.",
                             labels, buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("geoserve_dc_request_queue_time_seconds",
                               "Time a request waited in an engine queue before admission.",
                               labels, buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("geoserve_dc_prompt_tokens",
                                     "Prompt tokens of completed requests.", labels, registry=r)
        self.generation_tokens = Counter("geoserve_dc_generation_tokens",
                                         "Output tokens of completed requests.", labels,
                                         registry=r)

    def attach(self, dc: Datacenter, now: Callable[[], float], dilation: float = 1.0,
               loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.dc = dc
        self._now = now
        self.dilation = dilation
        lab = self._labels()
        for m in (self.ttft, self.tpot, self.e2e, self.queue, self.prompt_tokens,
                  self.generation_tokens):
            m.labels(*lab)  # every series exists from the start
        if self.vllm is not None:
            self.vllm.attach(dc, now)
            self.vllm.deferred = self.deferred
        if loop is not None:
            self.state.bind(loop)
            if self.vllm is not None:
                self.vllm.state.bind(loop)

    def _labels(self) -> tuple[str, str, str]:
        dc = self.dc
        assert dc is not None, "DcMetrics.attach() first"
        return dc.config.name, dc.config.region, dc.cal.model

    def on_completed(self, ttft_s: float, tpot_s: float, e2e_s: float, queue_s: float,
                     prompt_tokens: int, output_tokens: int) -> None:
        """One completed request (hook of the runtime's completion path)."""
        lab = self._labels()
        self._observe(self.ttft, lab, ttft_s)
        if output_tokens > 1:
            self._observe(self.tpot, lab, tpot_s)
        self._observe(self.e2e, lab, e2e_s)
        self._observe(self.queue, lab, queue_s)
        self._inc(self.prompt_tokens, lab, prompt_tokens)
        self._inc(self.generation_tokens, lab, output_tokens)

    def on_record(self, rec: Any) -> None:
        """A wall runtime's completed `RequestRecord` (protobuf)."""
        self.on_completed(rec.ttft_s, rec.tpot_s, rec.e2e_s, rec.queue_s,
                          rec.request.isl_tokens, rec.output_tokens)
        if self.vllm is not None:
            ts = rec.request.timestamps
            self.vllm.on_request(rec.engine, ts.dc_arrival_s, ts.admitted_s, ts.first_token_s,
                                 ts.completed_s, rec.request.isl_tokens, rec.output_tokens)

    def _build(self) -> list[Metric]:
        dc = self.dc
        if dc is None:
            return []
        now = self._now()
        c = dc.counters(now, per_engine=self.per_engine)
        name, region, model = self._labels()
        f = _Families({"dc": name, "region": region, "model": model})
        n = c.engines
        f.gauge("geoserve_dc_engines", "Engines (model replicas) in the DC.", n)
        f.gauge("geoserve_dc_running_requests",
                "Requests in the running batches of all engines.", c.active_batch * n)
        f.gauge("geoserve_dc_waiting_requests",
                "Requests waiting in the engine queues.", c.waiting_requests * n)
        f.gauge("geoserve_dc_queue_tokens",
                "Prompt tokens still to prefill (waiting and chunked), all engines.",
                c.queue_tokens * n)
        f.gauge("geoserve_dc_kv_cache_usage_ratio",
                "KV-cache occupancy, mean over engines (0-1).", c.kv_occupancy_ratio)
        f.gauge("geoserve_dc_prefill_duty_ratio",
                "Recent fraction of time spent in prefill steps, mean over engines.",
                c.prefill_duty_ratio)
        f.counters("geoserve_dc_requests", "Requests that reached a terminal state at the DC.",
                   [({"status": "completed"}, dc.completed), ({"status": "rejected"}, dc.rejected),
                    ({"status": "failed"}, dc.failed)])
        e = c.energy
        f.counters("geoserve_dc_energy_joules",
                   "IT energy by component (facility energy = IT energy x PUE).",
                   [({"component": "gpu_active"}, e.gpu_active_j),
                    ({"component": "gpu_idle"}, e.gpu_idle_j),
                    ({"component": "host"}, e.host_j),
                    ({"component": "training"}, e.training_j)])
        f.counter("geoserve_dc_facility_energy_joules", "Facility energy (IT x PUE).",
                  c.facility_j)
        f.counter("geoserve_dc_grid_energy_joules", "Facility energy drawn from the grid.",
                  e.grid_j)
        f.counter("geoserve_dc_renewable_energy_joules",
                  "Facility energy covered by on-site renewable supply.", e.renewable_j)
        f.counter("geoserve_dc_carbon_grams", "Operational carbon emitted, gCO2.", c.carbon_g)
        f.counter("geoserve_dc_preemptions",
                  "Recompute preemptions of running requests (KV cache full), all engines.",
                  sum(e.preemptions for e in dc.engines))
        f.gauge("geoserve_dc_power_watts", "Facility power now.", c.power_w)
        f.gauge("geoserve_dc_renewable_supply_watts", "On-site renewable supply now.",
                dc.renewable_w)
        f.gauge("geoserve_dc_training_power_watts", "Power of deferrable training jobs.",
                dc.training_w)
        f.gauge("geoserve_dc_grid_carbon_intensity_grams_per_kwh",
                "Grid carbon intensity now, gCO2/kWh.", c.grid_ci_g_per_kwh)
        f.gauge("geoserve_dc_effective_carbon_intensity_grams_per_kwh",
                "Carbon intensity of the DC's supply mix now (grid and renewables), gCO2/kWh.",
                c.effective_ci_g_per_kwh)
        f.gauge("geoserve_dc_pue_ratio", "Power usage effectiveness (facility / IT).",
                dc.config.pue)
        f.gauge("geoserve_dc_gpu_frequency_hertz", "Inference GPU clock.",
                c.gpu_frequency_mhz * 1e6)
        f.gauge("geoserve_dc_up", "1 while the DC accepts requests (0 when draining).",
                0.0 if dc.draining else 1.0)
        f.gauge("geoserve_dc_wakeup_lateness_p50_seconds",
                "Median lateness of the engines' step wake-ups (recent samples).",
                c.lateness_s_p50)
        f.gauge("geoserve_dc_wakeup_lateness_p99_seconds",
                "p99 lateness of the engines' step wake-ups (recent samples).", c.lateness_s_p99)
        f.gauge("geoserve_dc_wakeup_lateness_max_seconds", "Largest wake-up lateness so far.",
                c.lateness_s_max)
        f.counter("geoserve_dc_wakeups", "Step wake-ups of the wall runtime's engines.",
                  dc.lateness.count)
        f.counter("geoserve_dc_wakeup_resyncs",
                  "Wake-ups so late that the engine restarted its schedule.",
                  dc.lateness.resyncs)
        f.gauge("geoserve_dc_faithful",
                "1 while the emulation is faithful (p99 lateness and resyncs within bounds).",
                1.0 if c.faithful else 0.0)
        if c.per_engine:
            names = [eng.name for eng in dc.engines]
            for key, metric, doc in (
                ("running", "geoserve_engine_running_requests", "Requests in the batch."),
                ("waiting", "geoserve_engine_waiting_requests", "Requests in the queue."),
                ("kv_occupancy_ratio", "geoserve_engine_kv_cache_usage_ratio",
                 "KV-cache occupancy (0-1)."),
                ("prefill_duty_ratio", "geoserve_engine_prefill_duty_ratio",
                 "Recent fraction of time in prefill."),
            ):
                f.gauges(metric, doc, [({"engine": en}, row[key])
                                       for en, row in zip(names, c.per_engine, strict=True)])
        _clock_families(f, "datacenter", now, self.dilation)
        return f.out


# ---------------------------------------------------------------------------- scheduler
def decision_outcome(d: Dispatch) -> str:
    """The exclusive outcome of one decision: rejected, fallback, forwarded or local."""
    if not d.dc:
        return "rejected"
    if d.fallback:
        return "fallback"
    return "forwarded" if d.forward else "local"


class SchedulerMetrics(HotMetrics):
    """Regional scheduler series: decisions (hook), core statistics (scrape time)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.core: SchedulerCore | None = None
        self._now: Callable[[], float] = lambda: 0.0
        self._in_flight: Callable[[], int] = lambda: 0
        self.dilation = 1.0
        self._windows_seen = 0
        r = self.registry
        self.state = StateCollector(self._build)
        r.register(self.state)
        self.decisions = Counter("geoserve_scheduler_decisions",
                                 "Decisions for requests arriving at this region, by outcome.",
                                 ("region", "policy", "outcome"), registry=r)
        self.decision_s = Histogram("geoserve_scheduler_decision_seconds",
                                    "Policy decision time per request (window solve time for "
                                    "batch policies), wall seconds.", ("region", "policy"),
                                    buckets=DECISION_BUCKETS, registry=r)
        self.window = Histogram("geoserve_scheduler_window_size_requests",
                                "Requests decided together in one window.",
                                ("region", "policy"), buckets=WINDOW_BUCKETS, registry=r)

    def attach(self, core: SchedulerCore, now: Callable[[], float], dilation: float = 1.0,
               in_flight: Callable[[], int] | None = None,
               loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.core = core
        self._now = now
        self.dilation = dilation
        if in_flight is not None:
            self._in_flight = in_flight
        for outcome in DECISION_OUTCOMES:  # every outcome exists from the start
            self.decisions.labels(core.region, core.policy.name, outcome)
        self.decision_s.labels(core.region, core.policy.name)
        self.window.labels(core.region, core.policy.name)
        if loop is not None:
            self.state.bind(loop)

    def on_decision(self, d: Dispatch) -> None:
        """One decision for a request that arrived at this region (not a forwarded one)."""
        core = self.core
        assert core is not None, "SchedulerMetrics.attach() first"
        self._inc(self.decisions, (core.region, core.policy.name, decision_outcome(d)))
        self._observe(self.decision_s, (core.region, core.policy.name), d.decision_s)

    def _build(self) -> list[Metric]:
        core = self.core
        if core is None:
            return []
        now = self._now()
        st = core.stats
        region, policy = core.region, core.policy.name
        new = st.windows - self._windows_seen  # window sizes since the last scrape
        if new > 0:
            hist = self.window.labels(region, policy)
            for size in st.window_sizes[-new:] if new <= len(st.window_sizes) else st.window_sizes:
                hist.observe(size)
            self._windows_seen = st.windows
        f = _Families({"region": region, "policy": policy})
        age = core.snapshot_age(now)
        f.gauge("geoserve_scheduler_snapshot_age_seconds",
                "Age of the latest provisioner snapshot (+Inf before the first).",
                age if math.isfinite(age) else math.inf)
        f.gauge("geoserve_scheduler_snapshot_stale",
                "1 while the snapshot is older than the staleness bound (round-robin mode).",
                1.0 if core.stale(now) else 0.0)
        f.counters("geoserve_scheduler_solves", "Policy calls by solver status.",
                   [({"status": s}, n) for s, n in sorted(st.solver_status.items())]
                   or [({"status": "none"}, 0)])
        f.counter("geoserve_scheduler_stale_decisions",
                  "Decisions made round-robin because the snapshot was stale.",
                  st.stale_decisions)
        f.counter("geoserve_scheduler_forwarded_in_requests",
                  "Requests forwarded here by peer schedulers.", st.forwarded_in)
        f.counter("geoserve_scheduler_windows", "Scheduling windows decided.", st.windows)
        f.gauge("geoserve_scheduler_window_open_requests", "Requests in the open window.",
                len(core.window) + len(core.forward_window))
        f.gauge("geoserve_scheduler_in_flight_requests",
                "Requests this scheduler is tracking (origin and forwarded-in).",
                self._in_flight())
        _clock_families(f, "scheduler", now, self.dilation)
        return f.out


# ---------------------------------------------------------------------------- provisioner
class ProvisionerMetrics:
    """Provisioner series: poll latency (hook), DC up/down and snapshots (scrape time)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.core: ProvisionerCore[Any] | None = None
        self._now: Callable[[], float] = lambda: 0.0
        self._watchers: Callable[[], int] = lambda: 0
        self.dilation = 1.0
        self._region: dict[str, str] = {}
        r = self.registry
        self.state = StateCollector(self._build)
        r.register(self.state)
        self.poll_s = Histogram("geoserve_provisioner_poll_seconds",
                                "GetState round trip to a DC, emulated seconds.",
                                ("dc", "region", "outcome"), buckets=POLL_BUCKETS, registry=r)

    def attach(self, core: ProvisionerCore[Any], now: Callable[[], float],
               dilation: float = 1.0, watchers: Callable[[], int] | None = None,
               loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.core = core
        self._now = now
        self.dilation = dilation
        if watchers is not None:
            self._watchers = watchers
        self._region = {d.dc: d.region for d in core.dcs}
        for d in core.dcs:
            self.poll_s.labels(d.dc, d.region, "ok")
        if loop is not None:
            self.state.bind(loop)

    def on_poll(self, dc: str, latency_s: float, ok: bool) -> None:
        self.poll_s.labels(dc, self._region.get(dc, ""), "ok" if ok else "failed").observe(
            max(latency_s, 0.0))

    def _build(self) -> list[Metric]:
        core = self.core
        if core is None:
            return []
        now = self._now()
        f = _Families({})
        f.gauges("geoserve_provisioner_dc_up", "1 while the provisioner sees the DC up.",
                 [({"dc": d.dc, "region": d.region}, 1.0 if core.is_up(d.dc) else 0.0)
                  for d in core.dcs])
        st = core.stats()
        f.counter("geoserve_provisioner_polls", "GetState polls issued.", st.polls)
        f.counter("geoserve_provisioner_poll_failures", "Polls that failed or timed out.",
                  st.failures)
        f.counter("geoserve_provisioner_polls_skipped",
                  "Poll slots skipped (previous poll in flight, or overtaken).", st.skipped)
        latest = core.latest
        f.counter("geoserve_provisioner_snapshots",
                  "Snapshots published (= the latest sequence number).",
                  latest.seq if latest is not None else 0)
        f.gauge("geoserve_provisioner_snapshot_age_seconds",
                "Age of the latest published snapshot (+Inf before the first).",
                now - latest.time_s if latest is not None else math.inf)
        f.gauge("geoserve_provisioner_watchers", "Schedulers subscribed to the snapshots.",
                self._watchers())
        _clock_families(f, "provisioner", now, self.dilation)
        return f.out


# ---------------------------------------------------------------------------- load generator
class LoadgenMetrics(HotMetrics):
    """What the origin sees: emitted and finished requests, SLO violations, TTFT/TPOT/e2e
    (as recorded at the origin scheduler, so TTFT includes forwarding RTTs). SLO counts
    follow the summary's rules (a rejected or failed request violates both SLOs; TPOT is
    judged on requests with more than one output token) but include the warm-up."""

    def __init__(self, policy_of: dict[str, str],
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.policy_of = dict(policy_of)
        self._now: Callable[[], float] = lambda: 0.0
        self.dilation = 1.0
        r = self.registry
        lab = ("region", "policy")
        self.emitted = Counter("geoserve_loadgen_requests_emitted",
                               "Requests sent to their origin scheduler.", lab, registry=r)
        self.finished = Counter("geoserve_loadgen_requests",
                                "Requests that reached a terminal state, by status.",
                                (*lab, "status"), registry=r)
        self.violations = Counter("geoserve_loadgen_slo_violations",
                                  "Requests that missed their TTFT or TPOT SLO (or failed).",
                                  lab, registry=r)
        self.ttft_violations = Counter("geoserve_loadgen_ttft_slo_violations",
                                       "Requests that missed their TTFT SLO (or failed).",
                                       lab, registry=r)
        self.tpot_violations = Counter("geoserve_loadgen_tpot_slo_violations",
                                       "Requests that missed their TPOT SLO (or failed).",
                                       lab, registry=r)
        self.output_tokens = Counter("geoserve_loadgen_output_tokens",
                                     "Output tokens of completed requests.", lab, registry=r)
        self.ttft = Histogram("geoserve_loadgen_time_to_first_token_seconds",
                              "Time to first token at the origin (includes RTTs).", lab,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("geoserve_loadgen_time_per_output_token_seconds",
                              "Time per output token of completed requests (> 1 token).",
                              lab, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("geoserve_loadgen_e2e_request_latency_seconds",
                             "Arrival at the origin scheduler to completion seen there.", lab,
                             buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        self.state = StateCollector(self._build)
        r.register(self.state)
        for region, policy in self.policy_of.items():  # every series exists from the start
            self.emitted.labels(region, policy)
            for s in REQUEST_STATUSES:
                self.finished.labels(region, policy, s)
            for m in (self.violations, self.ttft_violations, self.tpot_violations,
                      self.output_tokens, self.ttft, self.tpot, self.e2e):
                m.labels(region, policy)

    def attach(self, now: Callable[[], float], dilation: float = 1.0) -> None:
        self._now = now
        self.dilation = dilation

    def _lab(self, region: str) -> tuple[str, str]:
        return region, self.policy_of.get(region, "")

    def on_emitted(self, region: str) -> None:
        self._inc(self.emitted, self._lab(region))

    def on_finished(self, row: RecordRow) -> None:
        lab = self._lab(row.origin_region)
        status = row.state if row.state in REQUEST_STATUSES else "failed"
        self._inc(self.finished, (*lab, status))
        done = row.state == "completed"
        ttft_bad = not done or row.ttft_s > row.ttft_slo_s
        tpot_bad = not done or (row.output_tokens > 1 and row.tpot_s > row.tpot_slo_s)
        if ttft_bad:
            self._inc(self.ttft_violations, lab)
        if tpot_bad:
            self._inc(self.tpot_violations, lab)
        if ttft_bad or tpot_bad:
            self._inc(self.violations, lab)
        if done:
            self._inc(self.output_tokens, lab, row.output_tokens)
            self._observe(self.ttft, lab, row.ttft_s)
            if row.output_tokens > 1:
                self._observe(self.tpot, lab, row.tpot_s)
            self._observe(self.e2e, lab, row.e2e_s)

    def _build(self) -> list[Metric]:
        f = _Families({})
        _clock_families(f, "loadgen", self._now(), self.dilation)
        return f.out


# ---------------------------------------------------------------------------- CSV sink
class _HasRegistry(Protocol):
    registry: CollectorRegistry


class MetricsCsv:
    """Samples registries into ``metrics.csv``: ``time_s, metric, labels, value``.

    ``labels`` is ``k=v`` pairs joined by ``;`` in label-name order; histogram buckets are
    left out (``_count`` and ``_sum`` stay).
    """

    HEADER = ("time_s", "metric", "labels", "value")

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(self.HEADER)
        self.rows = 0

    def sample(self, time_s: float, sources: Iterable[_HasRegistry]) -> None:
        for src in sources:
            for fam in src.registry.collect():
                for s in fam.samples:
                    if s.name.endswith("_bucket"):
                        continue
                    labels = ";".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                    self._w.writerow((f"{time_s:.6f}", s.name, labels, repr(float(s.value))))
                    self.rows += 1

    def close(self) -> None:
        self._f.close()
