"""Factories: the cores a topology describes (kept out of the schema in `topology`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.config.calibration import load_calibration
from services.config.topology import ROOT, DcSpec, Topology


def build_ci(topo: Topology, dc: DcSpec) -> Any:
    """The DC's carbon-intensity source (``services.model.carbon``)."""
    from services.model.carbon import ci_source_from_config

    raw = dc.ci
    if isinstance(raw, Mapping) and "trace" in raw:
        raw = dict(raw)
        raw.setdefault("zone", dc.zone)
        raw.setdefault("start_hour", topo.ci_start_hour)
    key = f"{dc.name}.ci"
    for i, r in enumerate(topo.regions):
        for j, d in enumerate(r.dcs):
            if d.name == dc.name:
                key = f"regions[{i}].dcs[{j}].ci"
    return ci_source_from_config(raw, key, source=topo.path, base_dir=ROOT)


def build_datacenter(topo: Topology, name: str, start_s: float = 0.0) -> Any:
    """A `services.datacenter.dc.Datacenter` core for DC `name` of the topology."""
    from services.datacenter.dc import Datacenter, DcConfig

    d = topo.dc(name)
    cal = load_calibration(d.setup)
    cfg = DcConfig(
        name=d.name,
        region=d.region,
        zone=d.zone,
        nodes=d.nodes,
        gpus_per_node=d.gpus_per_node,
        setup=d.setup,
        pue=d.pue,
        routing=d.routing,
        max_queue_per_engine=d.max_queue_per_engine,
        faithful_lateness_s=topo.faithful_lateness_s,
        renewable_ci_g_per_kwh=topo.carm.renewable_g_per_kwh if topo.carm else 0.0,
    )
    return Datacenter(cfg, cal, build_ci(topo, d), start_s=start_s)
