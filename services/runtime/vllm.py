"""vLLM-compatible engine metrics of a DC, beside its ``geoserve_`` series.

vLLM's names (``vllm:*``), label sets (``model_name``, ``engine``) and buckets, so that
dashboards, alerts and routers that read a vLLM server's metrics read a GeoServe DC's too.
``model_name`` is the model of the DC's calibration (e.g. ``llama-3.1-8b``) and ``engine``
the engine's index in the DC (``"0"``, ``"1"``, ...), as vLLM labels its data-parallel
engines. Times are emulated seconds at the engine, as vLLM measures them:

* gauges, read from the engines at scrape time: ``vllm:num_requests_running`` (running
  batch), ``vllm:num_requests_waiting`` (queue), ``vllm:kv_cache_usage_perc`` (KV blocks in
  use / all blocks, 0..1);
* counters, counted per engine step: ``vllm:prompt_tokens_total`` (prefill tokens
  computed, recomputation after a preemption included), ``vllm:generation_tokens_total``
  (tokens produced, first tokens included), ``vllm:num_preemptions_total``;
* ``vllm:inter_token_latency_seconds``: every token's gap to the previous token of its
  request (kept by the engine, `services.datacenter.engine.TokenGaps`);
* observed when a request completes: ``vllm:time_to_first_token_seconds`` (arrival at the
  engine to first token: no network, unlike ``geoserve_dc_time_to_first_token_seconds``),
  ``vllm:e2e_request_latency_seconds`` (arrival to last token), ``vllm:request_queue_time_
  seconds`` (arrival to admission into the batch), ``vllm:request_prefill_time_seconds``
  (admission to first token), ``vllm:request_decode_time_seconds`` (first to last token),
  ``vllm:request_inference_time_seconds`` (admission to last token),
  ``vllm:request_time_per_output_token_seconds`` (decode time / (tokens - 1), requests of
  more than one token), ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens`` (lengths, 1-2-5 buckets up to the model's context),
  and ``vllm:request_success_total{finished_reason="stop"}``: a request ends at its output
  length as a model that emits its end-of-sequence token there.

Not emulated, so absent: prefix caching, LoRA, speculative decoding, multi-modal and
per-request sampling-parameter series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from services.datacenter.engine import TokenGaps
from services.runtime.metrics import (
    REQUEST_LATENCY_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    HotMetrics,
    StateCollector,
)

if TYPE_CHECKING:
    from services.datacenter.dc import Datacenter

LABELS = ("model_name", "engine")
ITL_BUCKETS = TPOT_BUCKETS  # vLLM uses one list for inter-token and per-output-token time


def buckets_1_2_5(max_value: int) -> list[float]:
    """vLLM's length buckets: 1, 2, 5, 10, 20, 50, ... while <= `max_value`."""
    out: list[float] = []
    exp = 1
    while True:
        for m in (1, 2, 5):
            v = m * exp
            if v > max_value:
                return out
            out.append(float(v))
        exp *= 10


class VllmMetrics(HotMetrics):
    """The ``vllm:`` series of one DC (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.dc: Datacenter | None = None
        self._now: Callable[[], float] = lambda: 0.0
        self._index: dict[str, str] = {}
        self.model = ""
        self._metrics: dict[str, Any] = {}
        self.state = StateCollector(self._build)  # bound to the DC's loop with its own
        registry.register(self.state)

    def attach(self, dc: Datacenter, now: Callable[[], float]) -> None:
        """Start counting for `dc` (before its first request: token gaps start here)."""
        self.dc = dc
        self._now = now
        self.model = dc.cal.model
        self._index = {e.name: str(i) for i, e in enumerate(dc.engines)}
        for e in dc.engines:
            e.token_gaps = TokenGaps(ITL_BUCKETS)
        r = self.registry
        lengths = buckets_1_2_5(dc.cal.engine.max_model_len)
        m = self._metrics

        def hist(name: str, doc: str, buckets: Any) -> None:
            m[name] = Histogram(f"vllm:{name}", doc, LABELS, buckets=buckets, registry=r)

        hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             TTFT_BUCKETS)
        hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             REQUEST_LATENCY_BUCKETS)
        hist("request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        hist("request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        hist("request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        hist("request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        hist("request_time_per_output_token_seconds",
             "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        hist("request_prompt_tokens", "Number of prefill tokens processed.", lengths)
        hist("request_generation_tokens", "Number of generation tokens processed.", lengths)
        m["request_success"] = Counter("vllm:request_success",
                                       "Count of successfully processed requests.",
                                       (*LABELS, "finished_reason"), registry=r)
        for i in self._index.values():  # every series exists from the start
            for name, metric in m.items():
                if name == "request_success":
                    metric.labels(self.model, i, "stop")
                else:
                    metric.labels(self.model, i)

    def on_request(self, engine: str, arrival_s: float, admitted_s: float,
                   first_token_s: float, completed_s: float, prompt_tokens: int,
                   output_tokens: int) -> None:
        """A completed request's engine-local times (emulated s) and lengths."""
        idx = self._index.get(engine)
        if idx is None:
            return
        lab = (self.model, idx)
        m, obs = self._metrics, self._observe
        decode = completed_s - first_token_s
        obs(m["time_to_first_token_seconds"], lab, first_token_s - arrival_s)
        obs(m["e2e_request_latency_seconds"], lab, completed_s - arrival_s)
        obs(m["request_queue_time_seconds"], lab, admitted_s - arrival_s)
        obs(m["request_prefill_time_seconds"], lab, first_token_s - admitted_s)
        obs(m["request_decode_time_seconds"], lab, decode)
        obs(m["request_inference_time_seconds"], lab, completed_s - admitted_s)
        if output_tokens > 1:
            obs(m["request_time_per_output_token_seconds"], lab, decode / (output_tokens - 1))
        obs(m["request_prompt_tokens"], lab, prompt_tokens)
        obs(m["request_generation_tokens"], lab, output_tokens)
        self._inc(m["request_success"], (*lab, "stop"))

    def _build(self) -> list[Metric]:
        dc = self.dc
        if dc is None:
            return []
        now = self._now()
        keys = list(LABELS)
        running = GaugeMetricFamily("vllm:num_requests_running",
                                    "Number of requests in model execution batches.",
                                    labels=keys)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting",
                                    "Number of requests waiting to be processed.", labels=keys)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc",
                               "KV-cache usage. 1 means 100 percent usage.", labels=keys)
        prompt = CounterMetricFamily("vllm:prompt_tokens",
                                     "Number of prefill tokens processed.", labels=keys)
        gen = CounterMetricFamily("vllm:generation_tokens",
                                  "Number of generation tokens processed.", labels=keys)
        pre = CounterMetricFamily("vllm:num_preemptions",
                                  "Cumulative number of preemption from the engine.",
                                  labels=keys)
        itl = HistogramMetricFamily("vllm:inter_token_latency_seconds",
                                    "Histogram of inter-token latency in seconds.",
                                    labels=keys)
        for e in dc.engines:
            c = e.counters(now)
            lab = [self.model, self._index[e.name]]
            running.add_metric(lab, c.running)
            waiting.add_metric(lab, c.waiting)
            kv.add_metric(lab, c.kv_occupancy_ratio)
            prompt.add_metric(lab, e.prompt_tokens)
            gen.add_metric(lab, e.generation_tokens)
            pre.add_metric(lab, e.preemptions)
            g = e.token_gaps
            if g is not None:
                cum = g.counts.cumsum().tolist()
                bounds = [*(floatToGoString(b) for b in g.edges.tolist()), "+Inf"]
                itl.add_metric(lab, list(zip(bounds, cum, strict=True)), g.sum)
        return [running, waiting, kv, prompt, gen, pre, itl]
