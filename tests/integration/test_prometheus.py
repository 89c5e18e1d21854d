"""A real Prometheus scrapes a real `geoserve run`; every dashboard query returns data.

One short run of topologies/small.yaml (every service a process with its /metrics port)
is scraped every second by a real `prometheus` (loopback, temporary storage) using the
scrape config and recording rules the runner wrote. Then:

* every query of every panel of every committed dashboard, run through the HTTP API at
  the last instant the load generator was up (``$__rate_interval`` = 30s), returns data;
* the DCs' carbon counters in Prometheus agree with ``summary.json`` within 1 % over the
  load window. The summary counts carbon between two GetState reads (load start and
  end) and keeps, in its ``window`` block, each DC's absolute counter and emulated time
  at both reads. Prometheus has the same counters at its scrape instants, together with
  each DC's emulated clock (``geoserve_emulated_time_seconds``) from the same scrape. A DC
  is idle before the load starts and after its last request (the run lingers 3 s after
  the load, so Prometheus scrapes that idle tail), so its counter grows linearly there:
  the test extrapolates each DC's counter to the two read times from the two scrapes on
  the idle side (before the start, after the end), and compares the summed increase with
  ``carbon_g.total``;
* it prints the series each service exports and the scrape durations (figures for the
  issue note).

`prometheus` must be on PATH (``deploy/ensure-prometheus.sh`` installs it; ``make test``
runs that script); without it the test fails and says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from services.deploy.dashboards import DASHBOARDS, dashboard, panel_queries
from tests.procs import ROOT, free_port

pytestmark = pytest.mark.prometheus

DURATION_S = 20
LINGER_S = 3.0
RATE_INTERVAL = "30s"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not on PATH: the real-Prometheus tests need it; run "
                    "deploy/ensure-prometheus.sh (make test does) or install Prometheus")
    return path


def _api(base: str, path: str, **params: Any) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def _query(base: str, expr: str, at: float) -> list[dict[str, Any]]:
    data = _api(base, "/api/v1/query", query=expr, time=f"{at:.3f}")
    return list(data["result"])


def _wait(cond: Any, timeout_s: float, what: str, step_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    prom_bin = _binary("prometheus")
    tmp = tmp_path_factory.mktemp("prom")
    out = tmp / "run"
    t0 = time.monotonic()
    run_log = (tmp / "run.log").open("wb")
    # the runner starts a real Prometheus for the run (scraping every process each second)
    # and starts the load only once every target has been scraped twice
    run = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "run", "--topology", "small",
         "--duration", str(DURATION_S), "--out", str(out), "--linger", str(LINGER_S),
         "--prometheus"],
        cwd=ROOT, stdout=run_log, stderr=subprocess.STDOUT,
    )
    prom: subprocess.Popen[bytes] | None = None
    prom_log = (tmp / "prometheus.log").open("wb")
    try:
        rc = run.wait(timeout=300)
        assert rc == 0, (tmp / "run.log").read_text()[-4000:]
        # reopen the run's Prometheus database read-back (same server binary and config;
        # the dead targets it would scrape now add nothing before the queries' times)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        prom = subprocess.Popen(
            [prom_bin, f"--config.file={out / 'prometheus.yml'}",
             f"--storage.tsdb.path={out / 'prom'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdout=prom_log, stderr=subprocess.STDOUT,
        )
        _wait(lambda: _ready(base) or prom.poll() is not None, 60, "Prometheus ready")
        assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
        # the load generator has been scraped while it ran: its last up=1 sample is the
        # instant at which every service was alive (later scrapes mark series stale)
        ups = _query(base, 'up{job="loadgen"}[10m]', time.time())
        assert ups, "the load generator was never scraped"
        alive = [float(t) for t, v in ups[0]["values"] if v == "1"]
        assert alive, f"the load generator was never up when scraped: {ups}"
        yield {"base": base, "at": max(alive), "out": out, "t0": t0,
               "summary": json.loads((out / "summary.json").read_text())}
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(timeout=30)
        if prom is not None and prom.poll() is None:
            prom.terminate()
            prom.wait(timeout=30)
        run_log.close()
        prom_log.close()


def test_promtool_accepts_the_generated_config_and_rules(scraped_run: Any) -> None:
    promtool = _binary("promtool")
    out = scraped_run["out"]
    for args in (["check", "config", str(out / "prometheus.yml")],
                 ["check", "rules", str(out / "rules.yml")]):
        proc = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_dashboard_query_returns_data(scraped_run: Any) -> None:
    base, at = scraped_run["base"], scraped_run["at"]
    checked, empty = 0, []
    for key in DASHBOARDS:
        for title, expr in panel_queries(dashboard(key)):
            q = expr.replace("$__rate_interval", RATE_INTERVAL)
            assert "$" not in q, f"unsubstituted variable in {key}/{title}: {expr}"
            if not _query(base, q, at):
                empty.append(f"{key} / {title}: {q}")
            checked += 1
    assert checked > 40
    assert not empty, "queries without data:\n" + "\n".join(empty)


def _samples(base: str, expr: str) -> dict[float, float]:
    res = _query(base, f"{expr}[15m]", time.time())
    assert len(res) == 1, f"{expr}: expected one series, got {len(res)}"
    return {float(t): float(v) for t, v in res[0]["values"]}


def _idle_extrapolation(points: list[tuple[float, float]], x: float, side: str) -> float:
    """The counter at `x` on the straight line through the two scrapes just before
    (``side="before"``) or just after (``"after"``) `x`; points are sorted."""
    pair = [p for p in points if p[0] <= x][-2:] if side == "before" else \
        [p for p in points if p[0] >= x][:2]
    assert len(pair) == 2, f"fewer than two scrapes {side} t={x:.3f}: {points}"
    (x0, y0), (x1, y1) = pair
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def test_carbon_in_prometheus_matches_the_summary(scraped_run: Any) -> None:
    base, summary = scraped_run["base"], scraped_run["summary"]
    window = summary["window"]["dc_carbon_g"]
    assert set(window) == set(summary["carbon_g"]["per_dc"])
    total = 0.0
    for dc, w in window.items():
        carbon = _samples(base, f'geoserve_dc_carbon_grams_total{{dc="{dc}"}}')
        clock = _samples(base, f'geoserve_emulated_time_seconds{{job="dc-{dc}"}}')
        pts = sorted((clock[t], carbon[t]) for t in carbon if t in clock)
        assert len(pts) >= DURATION_S // 2, f"{dc}: only {len(pts)} scrapes"
        start = _idle_extrapolation(pts, w["start_time_s"], "before")
        end = _idle_extrapolation(pts, w["end_time_s"], "after")
        # the absolute counters agree too, not only their difference
        assert start == pytest.approx(w["start"], rel=0.01), dc
        assert end == pytest.approx(w["end"], rel=0.01), dc
        total += end - start
    expected = summary["carbon_g"]["total"]
    print(f"\ncarbon over the load window: Prometheus {total:.4f} g, summary {expected:.4f} g "
          f"({(total / expected - 1) * 100:+.3f} %)")
    assert total == pytest.approx(expected, rel=0.01)


def test_series_per_service_and_scrape_duration(scraped_run: Any) -> None:
    base, at = scraped_run["base"], scraped_run["at"]
    series = {r["metric"]["job"]: float(r["value"][1])
              for r in _query(base, "scrape_samples_scraped", at)}
    geoserve = {r["metric"]["job"]: float(r["value"][1])
                for r in _query(base, 'count by (job) ({__name__=~"geoserve_.+"})', at)}
    dur = {r["metric"]["job"]: float(r["value"][1])
           for r in _query(base, "max_over_time(scrape_duration_seconds[10m])", at)}
    mean = {r["metric"]["job"]: float(r["value"][1])
            for r in _query(base, "avg_over_time(scrape_duration_seconds[10m])", at)}
    lines = [f"{'job':<22}{'samples':>9}{'geoserve_*':>12}{'scrape ms mean':>16}{'max':>8}"]
    for job in sorted(series):
        lines.append(f"{job:<22}{series[job]:>9.0f}{geoserve.get(job, 0):>12.0f}"
                     f"{mean[job] * 1e3:>16.2f}{dur[job] * 1e3:>8.2f}")
    lines.append(f"run + scrape + queries so far: {time.monotonic() - scraped_run['t0']:.1f} s")
    print("\n" + "\n".join(lines))
    jobs = set(json_jobs(scraped_run["out"] / "prometheus.yml"))
    assert set(series) == jobs
    assert all(geoserve[j] > 0 for j in jobs), geoserve
    # an instant scrape: a /metrics page is built in well under the 1 s scrape timeout
    assert max(dur.values()) < 1.0


def json_jobs(config: Path) -> list[str]:
    import yaml

    doc = yaml.safe_load(config.read_text())
    return [j["job_name"] for j in doc["scrape_configs"]]


VLLM_NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
              "vllm:generation_tokens_total", "vllm:num_preemptions_total",
              "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
              "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
              "vllm:request_queue_time_seconds_bucket", "vllm:request_prefill_time_seconds_bucket",
              "vllm:request_decode_time_seconds_bucket",
              "vllm:request_inference_time_seconds_bucket",
              "vllm:request_time_per_output_token_seconds_bucket",
              "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket")


def test_every_dc_serves_the_vllm_series_per_engine(scraped_run: Any) -> None:
    """Each DC job has every vLLM series for each of its engines (model_name, engine), and
    the completions Prometheus counted match the summary's."""
    base, at, summary = scraped_run["base"], scraped_run["at"], scraped_run["summary"]
    dcs = set(summary["carbon_g"]["per_dc"])
    for name in VLLM_NAMES:
        res = _query(base, f"count by (job, model_name, engine) ({name})", at)
        got = {(r["metric"]["job"], r["metric"]["engine"]) for r in res}
        assert {job for job, _ in got} == {f"dc-{d}" for d in dcs}, (name, got)
        assert all(r["metric"]["model_name"] == "llama-3.1-8b" for r in res), name
        assert {e for _, e in got} == {"0", "1"}, (name, got)  # small: 2 engines per DC
    done = _query(base, "sum(vllm:request_success_total)", time.time())
    assert float(done[0]["value"][1]) == summary["requests"]["completed"]
