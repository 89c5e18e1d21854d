"""Committed deployment files equal the generated ones; dashboards and rules only use
series the services export; every panel names the provisioned datasource by uid."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from services.config.topology import ROOT, load_topology
from services.deploy.dashboards import DASHBOARDS, dashboard, generated_files, panel_queries
from services.deploy.prometheus import (
    compose_targets,
    recording_rules,
    render_prometheus_config,
)
from tests.unit.test_metrics_naming import exercise, families

UID = "geoserve-prometheus"          # the datasource uid the deployment issue fixes
GRAFANA = ROOT / "deploy" / "grafana"
PROMETHEUS = ROOT / "deploy" / "prometheus"
BUILTIN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "scalar", "avg", "min", "max",
                "le", "on", "group_left", "avg_over_time", "count", "increase"}


def test_committed_grafana_files_are_the_generated_ones() -> None:
    files = generated_files()
    assert {f"dashboards/{k}.json" for k in DASHBOARDS} <= set(files)
    stale = [rel for rel, text in files.items()
             if not (GRAFANA / rel).exists() or (GRAFANA / rel).read_text() != text]
    assert not stale, f"stale: {stale}; run `geoserve dashboards`"
    on_disk = {str(p.relative_to(GRAFANA)) for p in GRAFANA.rglob("*") if p.is_file()}
    assert on_disk == set(files), "files under deploy/grafana that nothing generates"


def test_committed_prometheus_files_are_the_generated_ones() -> None:
    topo = load_topology("small")
    assert (PROMETHEUS / "rules.yml").read_text() == recording_rules()
    assert (PROMETHEUS / "prometheus.yml").read_text() == render_prometheus_config(
        compose_targets(topo), 1.0, "rules.yml"), "run `geoserve prometheus-config`"


def test_compose_scrape_config_names_every_service_on_port_9100() -> None:
    topo = load_topology("base")
    doc = yaml.safe_load(render_prometheus_config(compose_targets(topo), 2.5, None))
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in doc["scrape_configs"]}
    want = {f"dc-{d.name}" for d in topo.dcs} | {f"scheduler-{r.name}" for r in topo.regions} \
        | {"provisioner", "loadgen"}
    assert set(jobs) == want
    assert all(t == [f"{job}:9100"] for job, t in jobs.items())
    assert doc["global"]["scrape_interval"] == "2500ms"
    assert "rule_files" not in doc


@pytest.mark.parametrize("key", list(DASHBOARDS))
def test_every_panel_uses_the_provisioned_datasource_uid(key: str) -> None:
    text = (GRAFANA / "dashboards" / f"{key}.json").read_text()
    assert "${DS" not in text and "DS_PROMETHEUS" not in text
    model = json.loads(text)
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for p in model["panels"]:
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": UID}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": UID}, p["title"]
            assert set(re.findall(r"\$\w+", t["expr"])) <= {"$__rate_interval"}, t["expr"]


def test_datasource_provisioning_has_the_fixed_uid() -> None:
    doc = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (ds,) = doc["datasources"]
    assert ds["uid"] == UID and ds["type"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/geoserve.yml").read_text())
    assert prov["providers"][0]["type"] == "file"


@pytest.fixture(scope="module")
def exported_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    _, objs = exercise(3.0, tmp_path_factory.mktemp("d") / "m.csv")
    return {s.name for f in families(objs) for s in f.samples}


def _rules() -> dict[str, str]:
    doc = yaml.safe_load(recording_rules())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def _series(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads (labels and strings removed)."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|on|group_left)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"e\d*", n)}


def test_rules_read_only_exported_series(exported_names: set[str]) -> None:
    rules = _rules()
    assert len(rules) >= 15
    for name, expr in rules.items():
        unknown = _series(expr) - exported_names - set(rules)
        assert not unknown, f"{name} reads {unknown}"


def test_dashboards_read_only_exported_series_or_rules(exported_names: set[str]) -> None:
    rules = set(_rules())
    used: set[str] = set()
    for key in DASHBOARDS:
        for title, expr in panel_queries(dashboard(key)):
            names = _series(expr)
            unknown = names - exported_names - rules - BUILTIN
            assert not unknown, f"{key}/{title} reads {unknown}"
            used |= names
    # the panels: carbon, SLOs, TTFT/TPOT quantiles, CI, power, frequency,
    # scheduler decisions and latency, lateness, faithful flag, snapshot age
    for needed in ("geoserve_dc_carbon_grams_total", "region:geoserve_carbon_grams:rate1m",
                   "policy:geoserve_slo_ttft_attainment:ratio_rate1m",
                   "policy:geoserve_slo_tpot_attainment:ratio_rate1m",
                   "geoserve_loadgen_time_to_first_token_seconds_bucket",
                   "geoserve_loadgen_time_per_output_token_seconds_bucket",
                   "geoserve_dc_grid_carbon_intensity_grams_per_kwh", "geoserve_dc_power_watts",
                   "geoserve_dc_gpu_frequency_hertz", "geoserve_scheduler_decisions_total",
                   "geoserve_scheduler_decision_seconds_bucket",
                   "geoserve_scheduler_solves_total", "geoserve_dc_faithful",
                   "geoserve_dc_wakeup_lateness_p99_seconds",
                   "geoserve_provisioner_snapshot_age_seconds"):
        assert needed in used, needed


@pytest.mark.parametrize("key", list(DASHBOARDS))
def test_panels_do_not_overlap(key: str) -> None:
    model: dict[str, Any] = dashboard(key)
    assert model["uid"] and len(model["uid"]) <= 40  # Grafana's uid limit
    cells: dict[tuple[int, int], str] = {}
    for p in model["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
