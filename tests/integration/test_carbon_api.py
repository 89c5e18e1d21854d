"""`geoserve carbon-api` as a real HTTP server on loopback: the emulated grid in the shapes
of the Carbon Aware SDK Web API and Electricity Maps' API, at the emulated now.

The expected values are read from the trace files with the csv module (not through
GeoServe's loaders): an hourly Electricity Maps trace (NL from 2022-06-01T12:00Z), the
5-minute WattTime MOER file (lbs/MWh x 0.45359237) and a constant DC. The server's epoch
is set 5550 s in the past, so the emulated now is 5550 s (+ the test's own seconds): hour
13:00 of the NL trace and the 5-minute step 01:30 of the MOER file.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from services.runner.local import free_port

ROOT = Path(__file__).resolve().parents[2]
EMAPS = ROOT / "data/carbon/ci_hourly_2022_lca_emaps_europe.csv"
MOER = ROOT / "data/carbon/watttime_moer_caiso_north_2023-06_5min.csv"
TOPOLOGY = f"""
name: carbon-api
defaults:
  dc: {{nodes: 1, gpus_per_node: 1, setup: a100-40gb/llama-3.1-8b-tp1, pue: 1.1}}
regions:
  - name: eu-north
    aws_region: eu-north-1
    dcs:
      - {{name: flat, zone: LT, ci: {{constant: 300}}}}
      - {{name: nl, zone: NL, ci: {{trace: {EMAPS}, start_hour: '2022-06-01T12:00Z'}}}}
  - name: us-west
    aws_region: us-west-1
    dcs:
      - {{name: caiso, zone: US-CAL-CISO, ci: {{trace: {MOER}, format: watttime-csv,
          start_hour: '2023-06-08T00:00:00Z'}}}}
load: {{rate_rps: 1, dataset: cnn-dailymail, duration_s: 5, warmup_s: 0}}
"""
NOW_S = 5550.0


def _nl(hour: str) -> float:
    with EMAPS.open() as f:
        return float(next(r["NL"] for r in csv.DictReader(f) if r["datetime_utc"] == hour))


def _moer(when: str) -> float:
    with MOER.open() as f:
        return float(next(r["Caiso_North"] for r in csv.DictReader(f)
                          if r["time"] == when)) * 0.45359237


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    topo = tmp_path_factory.mktemp("capi") / "t.yaml"
    topo.write_text(TOPOLOGY)
    port = free_port()
    epoch = time.time() - NOW_S
    log = (topo.parent / "carbon-api.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "carbon-api", "--topology",
                             str(topo), "--address", f"127.0.0.1:{port}", "--epoch", str(epoch),
                             "--dilation", "1"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, (topo.parent / "carbon-api.log").read_text()
            assert time.monotonic() < deadline, "carbon-api did not start"
            time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def _get(base: str, path: str, **q: Any) -> tuple[int, Any]:
    url = f"{base}{path}?{urllib.parse.urlencode(q, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_carbon_aware_sdk_emissions_at_the_emulated_now(api: str) -> None:
    code, nl = _get(api, "/emissions/bylocation", location="nl")
    assert code == 200 and len(nl) == 1
    assert nl[0] == {"location": "nl", "time": "2022-06-01T13:00:00Z",
                     "rating": _nl("2022-06-01T13:00Z"), "duration": "01:00:00"}
    _, ca = _get(api, "/emissions/bylocation", location="caiso")
    assert ca[0]["time"] == "2023-06-08T01:30:00Z" and ca[0]["duration"] == "00:05:00"
    assert ca[0]["rating"] == pytest.approx(_moer("2023-06-08 01:30:00"))
    _, flat = _get(api, "/emissions/bylocation", location="LT")  # by zone id
    assert flat[0]["rating"] == 300.0
    # a window: the three hours from 13:00
    _, win = _get(api, "/emissions/bylocation", location="NL", time="2022-06-01T13:00:00Z",
                  toTime="2022-06-01T16:00:00Z")
    assert [w["rating"] for w in win] == [_nl(f"2022-06-01T{h}:00Z") for h in (13, 14, 15)]
    _, best = _get(api, "/emissions/bylocations/best", location=["nl", "flat"])
    assert best[0]["location"] == ("flat" if 300.0 < nl[0]["rating"] else "nl")
    assert best[0]["rating"] == min(300.0, nl[0]["rating"])


def test_average_and_forecast(api: str) -> None:
    _, avg = _get(api, "/emissions/average-carbon-intensity", location="nl",
                  startTime="2022-06-01T13:00:00Z", endTime="2022-06-01T15:00:00Z")
    assert avg["carbonIntensity"] == pytest.approx(
        (_nl("2022-06-01T13:00Z") + _nl("2022-06-01T14:00Z")) / 2)
    _, (fc,) = _get(api, "/emissions/forecasts/current", location="nl", windowSize=120)
    data = fc["forecastData"]
    assert len(data) == 24 and data[0]["timestamp"] == "2022-06-01T13:00:00Z"
    expected = [_nl(f"2022-06-{13 + k >= 24 and '02' or '01'}T{(13 + k) % 24:02d}:00Z")
                for k in range(24)]
    assert [d["value"] for d in data] == expected  # forecast error 0: the trace itself
    pairs = [(expected[i] + expected[i + 1]) / 2 for i in range(23)]
    opt = fc["optimalDataPoints"][0]
    assert fc["windowSize"] == 120 and opt["duration"] == 120
    assert opt["value"] == pytest.approx(min(pairs))
    assert opt["timestamp"] == data[pairs.index(min(pairs))]["timestamp"]


def test_electricity_maps_latest_history_forecast(api: str) -> None:
    _, latest = _get(api, "/v3/carbon-intensity/latest", zone="NL")
    assert latest["zone"] == "NL" and latest["datetime"] == "2022-06-01T13:00:00Z"
    assert latest["carbonIntensity"] == _nl("2022-06-01T13:00Z")
    assert latest["emissionFactorType"] == "lifecycle"
    _, hist = _get(api, "/v3/carbon-intensity/history", zone="NL")
    assert hist["history"][-1]["datetime"] == "2022-06-01T13:00:00Z"
    assert hist["history"][-2]["carbonIntensity"] == _nl("2022-06-01T12:00Z")
    _, fc = _get(api, "/v3/carbon-intensity/forecast", zone="US-CAL-CISO")
    assert len(fc["forecast"]) == 24 * 12  # 5-minute steps over 24 h
    assert fc["forecast"][1]["carbonIntensity"] == pytest.approx(_moer("2023-06-08 01:35:00"))


@pytest.mark.parametrize(("path", "q", "code", "field"), [
    ("/emissions/bylocation", {"location": "mars"}, 400, "location: unknown location"),
    ("/emissions/bylocation", {}, 400, "location: required"),
    ("/emissions/bylocation", {"location": "nl", "time": "noon"}, 400, "time: expected an ISO"),
    ("/emissions/average-carbon-intensity", {"location": "nl"}, 400, "startTime: required"),
    ("/emissions/forecasts/current", {"location": "nl", "windowSize": "x"}, 400, "windowSize"),
    ("/v3/carbon-intensity/latest", {"zone": "ZZ"}, 400, "zone: unknown location"),
    ("/nowhere", {}, 404, "no such endpoint"),
])
def test_bad_requests_name_the_parameter(api: str, path: str, q: dict[str, str], code: int,
                                         field: str) -> None:
    got, body = _get(api, path, **q)
    assert got == code and body["error"].startswith(field), body


def test_geoserve_run_serves_the_grid_its_dcs_account_with(tmp_path: Path) -> None:
    """`geoserve run --carbon-api PORT`: during the run the API answers every DC of
    small.yaml with the CI that the DC's carbon books use (the run stays inside one hour
    of the traces, so each DC's mean CI in summary.json is that hour's value)."""
    port = free_port()
    log = (tmp_path / "run.log").open("wb")
    run = subprocess.Popen([sys.executable, "-m", "services.cli", "run", "--topology", "small",
                            "--duration", "8", "--carbon-api", str(port), "--out",
                            str(tmp_path / "run")], cwd=ROOT, stdout=log,
                           stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    seen: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 120
        while run.poll() is None and time.monotonic() < deadline and len(seen) < 4:
            try:
                _, health = _get(base, "/health")
            except OSError:
                time.sleep(0.2)
                continue
            for loc in ("eu-nl", "eu-lt", "us-pjm", "us-nyiso"):
                assert loc in health["locations"]
                seen[loc] = _get(base, "/emissions/bylocation", location=loc)[1][0]["rating"]
        assert run.wait(timeout=180) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        log.close()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    books = {d["dc"]: d["mean_ci_g_per_kwh"] for d in summary["dcs"]}
    assert set(seen) == set(books)
    for dc, v in seen.items():
        assert v == pytest.approx(books[dc], rel=1e-9), dc
    assert "carbon-api: http://127.0.0.1:" in (tmp_path / "run.log").read_text()
