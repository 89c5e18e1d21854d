"""``geoserve`` deployment commands: Prometheus config, Grafana dashboards (and compose).

* ``geoserve prometheus-config --topology T [--out deploy/prometheus]`` writes
  ``prometheus.yml`` (one scrape job per compose service, metrics port 9100) and
  ``rules.yml`` (recording rules).
* ``geoserve dashboards [--out deploy/grafana]`` writes the Grafana dashboards and
  provisioning files.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from services.config.topology import ROOT, load_topology


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


def cmd_tls_certs(args: argparse.Namespace) -> int:
    """Write a private CA and a certificate/key for every service (mutual TLS)."""
    from services.deploy.compose import geoserve_services
    from services.deploy.tls import make_certs

    hosts = list(args.host or [])
    if args.topology:
        hosts += geoserve_services(load_topology(args.topology))
    for path in make_certs(Path(args.out), hosts, args.days):
        print(f"wrote {path}")
    return 0


def register(sub: Any) -> None:
    t = sub.add_parser("tls-certs", help="make a private CA and a certificate for mutual TLS",
                       description=cmd_tls_certs.__doc__)
    t.add_argument("--out", required=True, help="folder for ca.pem, cert.pem, key.pem")
    t.add_argument("--topology", default=None,
                   help="also valid for the compose service names of this topology")
    t.add_argument("--host", action="append", help="another host name (repeatable)")
    t.add_argument("--days", type=int, default=30)
    t.set_defaults(func=cmd_tls_certs)
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

    register_commands(sub)


# ---- compose deployment: `geoserve compose` and `geoserve swap-scheduler` ----


def cmd_compose(args: Any) -> int:
    from services.config.topology import load_topology
    from services.deploy.compose import write_compose

    topo = load_topology(args.topology)
    out = Path(args.out)
    env_out = None if args.no_env else Path(args.env_out or out.parent / ".env")
    for path in write_compose(topo, out, env_out):
        print(f"wrote {path}")
    return 0


def cmd_swap_scheduler(args: Any) -> int:
    from services.deploy.swap import swap_scheduler, validate

    req = validate(compose_file=Path(args.file), region=args.region, image=args.image,
                   project=args.project, policy=args.policy,
                   policy_config=args.policy_config, any_policy=args.any_policy,
                   health_cmd=args.health_cmd, timeout_s=args.timeout)
    swap_scheduler(req)
    return 0


def register_commands(sub: Any) -> None:
    """Add ``compose`` and ``swap-scheduler`` to the ``geoserve`` subcommands."""
    c = sub.add_parser(
        "compose", help="write docker-compose.yml (and .env) for a topology",
        description="Write a Docker Compose file running every service of a topology in its "
                    "own container (plus Prometheus, and Grafana under the 'grafana' "
                    "profile), the .env that pins its images and ports, and "
                    "docker-compose.tls.yml (mutual TLS between the services, with -f).")
    c.add_argument("--topology", default="topologies/small.yaml",
                   help="topology YAML, or a name in topologies/ (default: small)")
    c.add_argument("--out", default=str(ROOT / "docker-compose.yml"),
                   help="compose file to write (default: docker-compose.yml at the top)")
    c.add_argument("--env-out", default=None,
                   help="the .env to write (default: .env next to --out)")
    c.add_argument("--no-env", action="store_true", help="do not write the .env")
    c.set_defaults(func=cmd_compose)

    s = sub.add_parser(
        "swap-scheduler", help="replace a region's scheduler container (Docker, between runs)",
        description="Replace the running scheduler container of one region of a compose "
                    "deployment by one from another image (and/or policy), keeping its "
                    "network, aliases, environment and command; waits for it to be healthy "
                    "and rolls back if it is not.")
    s.add_argument("--region", required=True, help="region whose scheduler to replace")
    s.add_argument("--image", required=True, help="image of the new scheduler")
    s.add_argument("--policy", default=None, help="policy of the new scheduler "
                   "(default: keep the current setting)")
    s.add_argument("--policy-config", default=None, help="policy settings k=v,k=v")
    s.add_argument("--any-policy", action="store_true",
                   help="pass --policy on without checking it against GeoServe's registry")
    s.add_argument("--project", default=os.environ.get("COMPOSE_PROJECT_NAME") or None,
                   help="compose project (default: $COMPOSE_PROJECT_NAME or the compose "
                        "file's folder name)")
    s.add_argument("--file", "-f", default="docker-compose.yml",
                   help="compose file of the deployment (default: docker-compose.yml)")
    s.add_argument("--health-cmd", default=None,
                   help="health check command of the new container (default: the old one's, "
                        "python -m services.runtime.healthprobe)")
    s.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the new scheduler to be healthy")
    s.set_defaults(func=cmd_swap_scheduler)

    register_k8s(sub)


# ---- Kubernetes deployment: `geoserve k8s` ----


def cmd_k8s(args: Any) -> int:
    import sys

    from services.deploy.k8s import stale_files, write_k8s

    topo = load_topology(args.topology)
    out = Path(args.out) if args.out else ROOT / "deploy" / "k8s" / topo.name
    for path in write_k8s(topo, out):
        print(f"wrote {path}")
    for path in stale_files(topo, out):
        print(f"note: {path} is not part of the manifests of topology {topo.name!r} "
              "(left from an earlier one?); remove it", file=sys.stderr)
    return 0


def register_k8s(sub: Any) -> None:
    """Add ``k8s`` to the ``geoserve`` subcommands."""
    k = sub.add_parser(
        "k8s", help="write Kubernetes manifests (kustomize base and overlays) for a topology",
        description="Write a kustomize base running every service of a topology on "
                    "Kubernetes (a Deployment and Service per DC, CA-RM, provisioner and "
                    "scheduler, the load generator as a Job, in namespace geoserve) and "
                    "overlays: mtls, prometheus-operator, grafana, swap-scheduler-example. "
                    "See deploy/k8s/README.md.")
    k.add_argument("--topology", default="topologies/small.yaml",
                   help="topology YAML, or a name in topologies/ (default: small)")
    k.add_argument("--out", default=None,
                   help="output folder (default: deploy/k8s/<topology name>); gets base/, "
                        "overlays/<name>/ and results-reader.yaml")
    k.set_defaults(func=cmd_k8s)
