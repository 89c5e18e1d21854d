"""``geoserve`` deployment commands: Prometheus config, Grafana dashboards (and compose).

* ``geoserve prometheus-config --topology T [--out deploy/prometheus]`` writes
  ``prometheus.yml`` (one scrape job per compose service, metrics port 9100) and
  ``rules.yml`` (recording rules).
* ``geoserve dashboards [--out deploy/grafana]`` writes the Grafana dashboards and
  provisioning files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from services.common.topology import ROOT, load_topology


def cmd_prometheus_config(args: argparse.Namespace) -> int:
    from services.deploy.prometheus import (
        compose_targets,
        recording_rules,
        render_prometheus_config,
    )

    topo = load_topology(args.topology)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "prometheus.yml"
    cfg.write_text(render_prometheus_config(compose_targets(topo, args.port),
                                            args.scrape_interval, "rules.yml"))
    rules = out / "rules.yml"
    rules.write_text(recording_rules())
    print(f"wrote {cfg} ({topo.name}: {len(compose_targets(topo))} scrape jobs) and {rules}")
    return 0


def cmd_dashboards(args: argparse.Namespace) -> int:
    from services.deploy.dashboards import write_all

    for path in write_all(Path(args.out)):
        print(f"wrote {path}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("prometheus-config",
                       help="write the Prometheus scrape config and recording rules",
                       description=cmd_prometheus_config.__doc__ or __doc__)
    p.add_argument("--topology", default="topologies/small.yaml",
                   help="topology YAML, or a name in topologies/ (default: small)")
    p.add_argument("--out", default=str(ROOT / "deploy" / "prometheus"),
                   help="output folder (default deploy/prometheus)")
    p.add_argument("--port", type=int, default=9100, help="metrics port of every service")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds (default 1)")
    p.set_defaults(func=cmd_prometheus_config)

    d = sub.add_parser("dashboards", help="write the Grafana dashboards and provisioning files")
    d.add_argument("--out", default=str(ROOT / "deploy" / "grafana"),
                   help="Grafana folder (default deploy/grafana)")
    d.set_defaults(func=cmd_dashboards)

    # ---- compose deployment: `geoserve compose` and `geoserve swap-scheduler` go here ----
    from services.deploy.compose import register_commands as register_compose

    register_compose(sub)
