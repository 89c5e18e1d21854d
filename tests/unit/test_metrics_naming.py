"""Naming rules of every exported metric, and what the metrics objects count.

The series come from the real metrics objects over real cores: a short virtual run of
topologies/small.yaml (datacenter, scheduler and load-generator metrics fed by the
runtime's hooks) and a provisioner core driven through a poll cycle.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric

from services.config.topology import load_topology
from services.provisioner.core import DcInfo, ProvisionerCore
from services.runtime.metrics import (
    LoadgenMetrics,
    ProvisionerMetrics,
    metrics_port,
)
from services.sim.runtime import SimRun

ALLOWED_LABELS = {"region", "dc", "engine", "policy", "model", "status", "component",
                  "outcome", "model_name", "finished_reason"}
# vLLM's engine series (V1 engine names; the docs' metrics list), as exposed
VLLM_SERIES = {
    "gauge": {"vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc"},
    "counter": {"vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                "vllm:num_preemptions_total", "vllm:request_success_total"},
    "histogram": {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                  "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                  "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                  "vllm:request_inference_time_seconds",
                  "vllm:request_time_per_output_token_seconds",
                  "vllm:request_prompt_tokens", "vllm:request_generation_tokens"},
}
UNITS = ("_seconds", "_joules", "_grams", "_ratio", "_watts", "_hertz", "_tokens",
         "_grams_per_kwh", "_bytes")
# dimensionless gauges: counts of things and 0/1 flags
COUNT_NOUNS = ("_requests", "_engines", "_watchers")
FLAGS = ("_up", "_faithful", "_stale")
# a word in the name -> the unit the name must end with (before _total)
UNIT_OF = {"energy": "_joules", "carbon_grams": "_grams", "latency": "_seconds",
           "time": "_seconds", "age": "_seconds", "lateness": "_seconds",
           "duration": "_seconds", "power": "_watts", "frequency": "_hertz",
           "usage": "_ratio", "duty": "_ratio", "intensity": "_grams_per_kwh",
           "supply": "_watts"}
# vLLM v1 (vllm/v1/metrics/loggers.py)
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0]
VLLM_REQUEST = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def _provisioner_metrics() -> ProvisionerMetrics:
    dcs = [DcInfo("a", "north"), DcInfo("b", "south")]
    rtt = {("north", "south"): 0.1, ("south", "north"): 0.1}
    core: ProvisionerCore[dict[str, float]] = ProvisionerCore(
        dcs, rtt, period_s=1.0, mode="sync", start_s=0.0)
    m = ProvisionerMetrics()
    t = [0.0]
    m.attach(core, lambda: t[0], watchers=lambda: 2)
    for poll in core.due(0.0):
        if poll.dc == "a":
            core.on_poll_ok(poll, {"x": 1.0}, 0.01)
            m.on_poll(poll.dc, 0.01, True)
        else:
            core.on_poll_failed(poll, 0.5, "DEADLINE_EXCEEDED")
            m.on_poll(poll.dc, 0.5, False)
    t[0] = 0.75
    return m


def exercise(duration_s: float, csv_path: Path) -> tuple[SimRun, list[Any]]:
    """A short virtual run with metrics; returns it and every metrics object."""
    topo = load_topology("small").with_overrides(duration_s=duration_s)
    run = SimRun(topo, charge_solver_time=False, metrics_csv=csv_path,
                 metrics_per_engine=True)
    run.run()
    m = run._m
    assert m is not None
    return run, [*m.dc.values(), *m.sched.values(), m.lg, _provisioner_metrics()]


def families(objs: list[Any]) -> list[Metric]:
    return [fam for o in objs for fam in o.registry.collect()]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimRun, list[Metric], Path]:
    path = tmp_path_factory.mktemp("metrics") / "metrics.csv"
    run, objs = exercise(6.0, path)
    return run, families(objs), path


def test_names_are_prefixed_snake_case_with_units(exported: Any) -> None:
    _, fams, _ = exported
    names = {f.name for f in fams}
    assert len(names) > 50
    bad = []
    for fam in fams:
        exposed = fam.name + "_total" if fam.type == "counter" else fam.name
        if exposed.startswith("vllm:"):  # vLLM's own names: test_vllm_series_...
            continue
        if not re.fullmatch(r"geoserve_[a-z0-9]+(_[a-z0-9]+)*", exposed):
            bad.append(f"{exposed}: not geoserve_ snake case")
            continue
        stem = fam.name  # counters: prometheus_client keeps the name without _total
        words = f"_{stem}_"
        for word, unit in UNIT_OF.items():
            if f"_{word}_" in words and not stem.endswith(unit):
                bad.append(f"{exposed}: mentions {word!r} but does not end in {unit}")
        if fam.type in ("gauge", "histogram") and not stem.endswith(UNITS + COUNT_NOUNS + FLAGS):
            bad.append(f"{exposed}: a {fam.type} needs a unit or count suffix")
        for s in fam.samples:
            if fam.type == "counter" and not (s.name.endswith("_total")):
                bad.append(f"{s.name}: counter sample without _total")
            if fam.type == "histogram" and not s.name.endswith(("_bucket", "_count", "_sum")):
                bad.append(f"{s.name}: unexpected histogram sample")
            if s.name.endswith("_created"):
                bad.append(f"{s.name}: _created series exported")
    assert not bad, "\n".join(bad)


def test_vllm_series_have_vllms_names_types_and_labels(exported: Any) -> None:
    _, fams, _ = exported
    got: dict[str, set[str]] = {}
    for fam in fams:
        if fam.name.startswith("vllm:"):
            exposed = fam.name + "_total" if fam.type == "counter" else fam.name
            got.setdefault(fam.type, set()).add(exposed)
            for smp in fam.samples:
                want = {"model_name", "engine"} | (
                    {"finished_reason"} if exposed == "vllm:request_success_total" else set())
                assert set(smp.labels) - {"le"} == want, (smp.name, smp.labels)
                assert smp.labels["model_name"] == "llama-3.1-8b"
    assert got == VLLM_SERIES


def test_labels_are_bounded_and_never_request_ids(exported: Any) -> None:
    run, fams, _ = exported
    ids = set(run.emitted)
    assert ids
    for fam in fams:
        for s in fam.samples:
            extra = set(s.labels) - ALLOWED_LABELS - {"le"}
            assert not extra, f"{s.name}: unbounded label(s) {extra}"
            for v in s.labels.values():
                assert v not in ids, f"{s.name}: a request id as a label value"


def test_series_do_not_grow_with_the_number_of_requests(tmp_path: Path) -> None:
    def series(duration: float) -> tuple[set[tuple[str, tuple[tuple[str, str], ...]]], int]:
        run, objs = exercise(duration, tmp_path / f"{duration}.csv")
        keys = {(s.name, tuple(sorted(s.labels.items())))
                for fam in families(objs) for s in fam.samples}
        return keys, len(run.emitted)

    few, n_few = series(2.0)
    many, n_many = series(12.0)
    assert n_many > 3 * n_few
    assert few == many


def test_latency_histograms_use_vllm_buckets(exported: Any) -> None:
    _, fams, _ = exported

    def bounds(name: str) -> list[float]:
        fam = next(f for f in fams if f.name == name)
        first = fam.samples[0].labels
        same = [s for s in fam.samples if s.name.endswith("_bucket")
                and {k: v for k, v in s.labels.items() if k != "le"} ==
                {k: v for k, v in first.items() if k != "le"}]
        return [float(s.labels["le"]) for s in same if s.labels["le"] != "+Inf"]

    for side in ("dc", "loadgen"):
        assert bounds(f"geoserve_{side}_time_to_first_token_seconds") == VLLM_TTFT
        assert bounds(f"geoserve_{side}_time_per_output_token_seconds") == VLLM_TPOT
        assert bounds(f"geoserve_{side}_e2e_request_latency_seconds") == VLLM_REQUEST
    assert bounds("geoserve_dc_request_queue_time_seconds") == VLLM_REQUEST


def _value(fams: list[Metric], sample: str, **labels: str) -> float:
    got = [s.value for f in fams for s in f.samples
           if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert got, f"no {sample} {labels}"
    return float(sum(got))


def test_counts_agree_with_the_cores_and_the_records(exported: Any) -> None:
    run, fams, _ = exported
    rows = run.records()
    states = Counter(r.state for r in rows)
    for st in ("completed", "rejected", "failed"):
        assert _value(fams, "geoserve_loadgen_requests_total", status=st) == states[st]
    assert _value(fams, "geoserve_loadgen_requests_emitted_total") == len(rows)
    slo = run.topo.slo
    ttft_miss = sum(r.state != "completed" or r.ttft_s > slo.ttft_s for r in rows)
    tpot_miss = sum(r.state != "completed" or (r.output_tokens > 1 and r.tpot_s > slo.tpot_s)
                    for r in rows)
    assert _value(fams, "geoserve_loadgen_ttft_slo_violations_total") == ttft_miss
    assert _value(fams, "geoserve_loadgen_tpot_slo_violations_total") == tpot_miss
    assert _value(fams, "geoserve_loadgen_slo_violations_total") == sum(
        not r.slo_met for r in rows)
    assert _value(fams, "geoserve_loadgen_output_tokens_total") == sum(
        r.output_tokens for r in rows if r.state == "completed")
    assert _value(fams, "geoserve_loadgen_time_to_first_token_seconds_count") == \
        states["completed"]
    for name, dc in run.dcs.items():
        assert _value(fams, "geoserve_dc_requests_total", dc=name, status="completed") == \
            dc.completed == sum(r.dc == name and r.state == "completed" for r in rows)
        assert _value(fams, "geoserve_dc_carbon_grams_total", dc=name) == \
            pytest.approx(dc.carbon_g)
        it = _value(fams, "geoserve_dc_energy_joules_total", dc=name)
        assert _value(fams, "geoserve_dc_facility_energy_joules_total", dc=name) == \
            pytest.approx(it * dc.config.pue)
        assert _value(fams, "geoserve_dc_engines", dc=name) == len(dc.engines)
        assert _value(fams, "geoserve_dc_gpu_frequency_hertz", dc=name) == \
            pytest.approx(dc.perf.frequency_mhz * 1e6)
    for region, core in run.schedulers.items():
        decided = _value(fams, "geoserve_scheduler_decisions_total", region=region)
        assert decided == core.stats.decisions == sum(r.origin_region == region for r in rows)
        assert _value(fams, "geoserve_scheduler_decisions_total", region=region,
                      outcome="forwarded") == sum(r.origin_region == region and r.forwarded
                                                  and not r.fallback for r in rows)
        assert _value(fams, "geoserve_scheduler_window_size_requests_sum", region=region) == \
            sum(core.stats.window_sizes)


def test_provisioner_series(exported: Any) -> None:
    _, fams, _ = exported
    assert _value(fams, "geoserve_provisioner_dc_up", dc="a") == 1.0
    assert _value(fams, "geoserve_provisioner_dc_up", dc="b") == 0.0
    assert _value(fams, "geoserve_provisioner_poll_seconds_count", outcome="failed") == 1
    assert _value(fams, "geoserve_provisioner_snapshots_total") == 1
    assert _value(fams, "geoserve_provisioner_snapshot_age_seconds") == pytest.approx(0.25)
    assert _value(fams, "geoserve_provisioner_watchers") == 2


def test_metrics_csv_samples_every_provisioner_period(exported: Any) -> None:
    run, _, path = exported
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["time_s", "metric", "labels", "value"]
    assert not any(r["metric"].endswith("_bucket") for r in rows)
    carbon = [r for r in rows if r["metric"] == "geoserve_dc_carbon_grams_total"]
    times = sorted({float(r["time_s"]) for r in carbon})
    period = run.topo.provisioner.period_s
    load = [t for t in times if t <= run.topo.load.duration_s]
    assert load == pytest.approx([k * period for k in range(len(load))])
    assert len(load) == int(run.topo.load.duration_s / period) + 1
    assert times[-1] == pytest.approx(run.end_s)
    last = {r["labels"]: float(r["value"]) for r in carbon if float(r["time_s"]) == times[-1]}
    by_dc = {dict(kv.split("=") for kv in k.split(";"))["dc"]: v for k, v in last.items()}
    assert by_dc == pytest.approx({n: dc.carbon_g for n, dc in run.dcs.items()})
    per_series: dict[str, list[float]] = {}
    for r in carbon:
        per_series.setdefault(r["labels"], []).append(float(r["value"]))
    assert all(v == sorted(v) for v in per_series.values())  # counters never go down


def test_an_unknown_terminal_state_counts_as_failed() -> None:
    from services.loadgen.records import RecordRow

    m = LoadgenMetrics({"r": "greedy"})
    row = RecordRow(id="req-1", origin_region="r", dataset="d", isl_tokens=1, osl_tokens=1,
                    state="weird", ttft_slo_s=1.0, tpot_slo_s=0.1)
    m.on_finished(row)
    fams = list(m.registry.collect())
    assert _value(fams, "geoserve_loadgen_requests_total", status="failed") == 1
    statuses = {s.labels["status"] for f in fams for s in f.samples if "status" in s.labels}
    assert statuses == {"completed", "rejected", "failed"}
    assert not math.isnan(_value(fams, "geoserve_loadgen_slo_violations_total"))


@pytest.mark.parametrize(("flag", "env", "want"), [
    (None, {}, 0),
    (None, {"METRICS_PORT": ""}, 0),
    (None, {"METRICS_PORT": "9100"}, 9100),
    (9200, {"METRICS_PORT": "9100"}, 9200),
    (0, {"METRICS_PORT": "9100"}, 0),
])
def test_metrics_port_from_flag_then_env(flag: int | None, env: dict[str, str],
                                         want: int) -> None:
    assert metrics_port(flag, env) == want


@pytest.mark.parametrize(("flag", "env", "field"), [
    (None, {"METRICS_PORT": "nine"}, "METRICS_PORT"),
    (None, {"METRICS_PORT": "70000"}, "METRICS_PORT"),
    (-1, {}, "--metrics-port"),
])
def test_bad_metrics_port_names_its_source(flag: int | None, env: dict[str, str],
                                           field: str) -> None:
    from services.model.errors import InvalidInput

    with pytest.raises(InvalidInput) as exc:
        metrics_port(flag, env)
    assert exc.value.field == field


@pytest.mark.parametrize(("module", "required"), [
    ("services.datacenter.__main__", []),
    ("services.scheduler.__main__", ["--topology", "small"]),
    ("services.provisioner.__main__", []),
    ("services.loadgen.__main__", ["--topology", "small"]),
])
def test_every_service_main_takes_metrics_flags(module: str, required: list[str]) -> None:
    import importlib

    parser = importlib.import_module(module).build_parser()
    args = parser.parse_args([*required, "--metrics-port", "9100",
                              "--metrics-address", "127.0.0.1"])
    assert (args.metrics_port, args.metrics_address) == (9100, "127.0.0.1")
    assert parser.parse_args(required).metrics_port is None  # then METRICS_PORT decides


def test_vllm_series_count_what_the_records_say(exported: Any) -> None:
    """At the end of a drained run, per DC: one e2e observation and one success per
    completed request, generation tokens = their output tokens, one inter-token gap per
    token after a request's first, and gaps adding up to the decode times."""
    run, _, _ = exported
    rows = [r for r in run.records() if r.state == "completed"]
    assert rows and len(rows) == len(run.emitted)
    assert run._m is not None
    for dc_name, dc in run.dcs.items():
        by_name = {f.name: f for f in run._m.dc[dc_name].registry.collect()}
        engines = {str(i) for i in range(len(dc.engines))}

        def total(fam: str, sample: str, dc_engines: set[str]) -> float:
            return sum(s.value for s in by_name[fam].samples  # noqa: B023 (this DC's)
                       if s.name == sample and s.labels["engine"] in dc_engines)

        mine = [r for r in rows if r.dc == dc_name]
        assert mine
        assert total("vllm:e2e_request_latency_seconds",
                     "vllm:e2e_request_latency_seconds_count", engines) == len(mine)
        assert total("vllm:request_success", "vllm:request_success_total", engines) == len(mine)
        assert total("vllm:generation_tokens", "vllm:generation_tokens_total",
                     engines) == sum(r.output_tokens for r in mine)
        assert total("vllm:inter_token_latency_seconds",
                     "vllm:inter_token_latency_seconds_count",
                     engines) == sum(r.output_tokens - 1 for r in mine)
        assert total("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_sum",
                     engines) == pytest.approx(sum(r.completed_s - r.first_token_s
                                                   for r in mine), rel=1e-9)
        assert total("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum",
                     engines) == sum(r.isl_tokens for r in mine)
        assert total("vllm:num_requests_running", "vllm:num_requests_running", engines) == 0
