"""Docker Compose deployment of a topology: ``geoserve compose``.

Rules / theory of operation
---------------------------
* One container per service of the topology, all from one image (``deploy/Dockerfile``):
  ``dc-<dc>`` per datacenter, ``carm`` when the topology has a ``carm:`` section,
  ``provisioner``, ``scheduler-<region>`` per region, ``loadgen``; plus ``prometheus``
  (scrapes every service on ``METRICS_PORT``) and, under the ``grafana`` profile,
  ``grafana``. Service names are the DNS names the services use
  to reach each other and the scrape targets of ``deploy/prometheus/prometheus.yml``.
* Every GeoServe service listens for gRPC on ``GRPC_PORT`` and serves metrics on
  ``METRICS_PORT`` inside its own container, so the ports never clash; only Prometheus and
  Grafana are published, on the host's loopback, at ports pinned in ``.env``.
* Start order follows the local runner: DCs, then the provisioner, then the schedulers,
  then the load generator, each ``depends_on`` the previous tier being *healthy* (gRPC
  health probe ``python -m services.runtime.healthprobe``).
* All processes of a run share one epoch: ``GEOSERVE_EPOCH`` when set, else the first
  container to start writes its start time to a tmpfs volume that the others read
  (``deploy/entrypoint.sh``); the volume empties when the last container of the run stops.
* Per-region scheduler image and policy come from ``.env`` (``SCHEDULER_IMAGE_<REGION>``,
  ``POLICY_<REGION>``, ``POLICY_CONFIG_<REGION>``), so a scheduler is swapped without
  editing the generated file. Compose v1 (Debian's 1.29) has no nested defaults, so
  ``.env`` spells every variable out; the defaults in the file are the same values.
* Mutual TLS: ``docker-compose.tls.yml`` (written beside the file) mounts a host folder
  (``GEOSERVE_TLS_DIR``, default ``./tls``: ``ca.pem``, ``cert.pem``, ``key.pem`` from
  ``geoserve tls-certs --topology T``) read-only into every GeoServe service and points
  ``GEOSERVE_TLS_*`` at it; use it with ``-f docker-compose.yml -f docker-compose.tls.yml``.
  Prometheus still scrapes plain HTTP metrics.
* The output is deterministic text (hand-laid YAML with ``x-`` anchors and merge keys);
  `compose_model` is the same content as plain data, for tests and tools.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.config.topology import ROOT, Topology
from services.model.errors import InvalidInput

GRPC_PORT = 50051
METRICS_PORT = 9100
PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000
IMAGE = "geoserve/geoserve:0.1.0"
# Pinned bases; build-image.sh and the Dockerfile's BASE_IMAGE default use the first.
BASE_IMAGE = "python:3.11.14-slim-bookworm"
PROMETHEUS_IMAGE = "prom/prometheus:v2.55.1"
GRAFANA_IMAGE = "grafana/grafana:11.3.0"
UID = 10001
EPOCH_DIR = "/run/geoserve"
RESULTS_IN_CONTAINER = "/results"
# where an external topology file is mounted (one under topologies/ is in the image)
TOPOLOGY_MOUNT = "/etc/geoserve/topology.yaml"
TLS_MOUNT = "/run/geoserve-tls"
TLS_OVERRIDE = "docker-compose.tls.yml"
COMPOSE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def env_key(name: str) -> str:
    """``eu-north`` -> ``EU_NORTH`` (the suffix of per-region .env variables)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()


def dc_service(dc: str) -> str:
    return f"dc-{dc}"


def scheduler_service(region: str) -> str:
    return f"scheduler-{region}"


def scheduler_image_var(region: str) -> str:
    return f"SCHEDULER_IMAGE_{env_key(region)}"


def policy_var(region: str) -> str:
    return f"POLICY_{env_key(region)}"


def policy_config_var(region: str) -> str:
    return f"POLICY_CONFIG_{env_key(region)}"


def check_names(topo: Topology) -> None:
    """Refuse region and DC names that are no compose service / DNS name, and regions
    whose .env suffixes (`env_key`) clash."""
    keys: dict[str, str] = {}
    for kind, names in (("region", [r.name for r in topo.regions]),
                        ("dc", [d.name for d in topo.dcs])):
        for name in names:
            if not COMPOSE_NAME_RE.match(name):
                raise InvalidInput(
                    f"{topo.path}: {kind} {name!r}",
                    "not usable as a compose service / DNS name (lower-case letters, digits, "
                    "'-', '_', '.'; starting with a letter or digit)")
    for r in topo.regions:
        other = keys.setdefault(env_key(r.name), r.name)
        if other != r.name:
            raise InvalidInput(f"{topo.path}: region {r.name!r}",
                               f"its .env suffix {env_key(r.name)} clashes with {other!r}")


def topology_ref(topo: Topology, out_dir: Path) -> tuple[str, str | None]:
    """(path the containers load, host path to bind-mount or None).

    A topology under the repository's ``topologies/`` is in the image (relative path from
    the image's working directory /app); any other file is mounted read-only.
    """
    path = Path(topo.path).resolve()
    try:
        rel = path.relative_to(ROOT / "topologies")
    except ValueError:
        try:
            host = Path(path).relative_to(out_dir.resolve()).as_posix()
            host = f"./{host}"
        except ValueError:
            host = path.as_posix()
        return TOPOLOGY_MOUNT, host
    return f"topologies/{rel.as_posix()}", None


# --------------------------------------------------------------------------- components


@dataclass(frozen=True)
class Knob:
    """An environment value set per deployment, not per topology: compose takes it from
    ``.env`` or the shell (``${var:-default}``); other deployments choose their own way
    (``services/deploy/k8s.py``). `var` is the .env variable."""

    var: str
    default: str = ""

    def compose(self) -> str:
        return f"${{{self.var}:-{self.default}}}"


EnvValue = str | Knob


@dataclass(frozen=True)
class Component:
    """One GeoServe process of a deployment of a topology (a compose service, a Kubernetes
    Deployment or Job): its service name, which is also its DNS name; the entry point's
    arguments (`command`, starting with the service kind); its environment beyond
    `common_env`; the services that must be healthy before it starts (`after`); and
    whether it serves gRPC (and the gRPC health service) on `GRPC_PORT`."""

    name: str
    kind: str
    command: tuple[str, ...]
    env: Mapping[str, EnvValue]
    after: tuple[str, ...] = ()
    region: str | None = None
    serves_grpc: bool = True


def common_env(ref: str) -> dict[str, EnvValue]:
    """The environment of every GeoServe process; `ref` is the topology path they load."""
    return {
        "PORT": str(GRPC_PORT),
        "METRICS_PORT": str(METRICS_PORT),
        # services listen on loopback unless told otherwise; in a container, on every
        # interface of the compose network
        "GEOSERVE_ADDRESS": f"0.0.0.0:{GRPC_PORT}",
        "METRICS_ADDR": "0.0.0.0",
        # mutual TLS when set: paths inside the containers (mount the files with an
        # override file; `geoserve tls-certs --topology T` makes them for these host names)
        "GEOSERVE_TLS_CERT": Knob("GEOSERVE_TLS_CERT"),
        "GEOSERVE_TLS_KEY": Knob("GEOSERVE_TLS_KEY"),
        "GEOSERVE_TLS_CA": Knob("GEOSERVE_TLS_CA"),
        "GEOSERVE_TOPOLOGY": ref,
        "GEOSERVE_EPOCH": Knob("GEOSERVE_EPOCH"),
        "GEOSERVE_EPOCH_FILE": f"{EPOCH_DIR}/epoch",
        "GEOSERVE_DILATION": Knob("GEOSERVE_DILATION"),
        "GRPC_VERBOSITY": "ERROR",
    }


def components(topo: Topology, ref: str) -> list[Component]:
    """The GeoServe processes of `topo` in start order (DCs, CA-RM, provisioner,
    schedulers, load generator), each with the addresses of the services it talks to."""
    check_names(topo)
    topo_args = ("--topology", ref)
    dc_names = tuple(dc_service(d.name) for d in topo.dcs)
    all_dcs = _addr_map([(d.name, dc_service(d.name)) for d in topo.dcs])
    out = [Component(dc_service(d.name), "datacenter", ("datacenter", *topo_args, "--dc", d.name),
                     {}, region=d.region) for d in topo.dcs]
    before_provisioner = dc_names
    if getattr(topo, "carm", None) is not None:
        # the CA-RM controller starts after the DCs and before the provisioner (local runner)
        out.append(Component("carm", "carm", ("carm", *topo_args), {"DC_ADDRS": all_dcs},
                             after=dc_names))
        before_provisioner = (*dc_names, "carm")
    out.append(Component("provisioner", "provisioner", ("provisioner", *topo_args),
                         {"DC_ADDRS": all_dcs}, after=before_provisioner))
    for r in topo.regions:
        peers = [(o.name, scheduler_service(o.name)) for o in topo.regions if o.name != r.name]
        out.append(Component(
            scheduler_service(r.name), "scheduler", ("scheduler", *topo_args),
            {
                "GEOSERVE_REGION": r.name,
                "GEOSERVE_POLICY": Knob(policy_var(r.name)),
                "GEOSERVE_POLICY_CONFIG": Knob(policy_config_var(r.name)),
                "DC_ADDRS": _addr_map([(d.name, dc_service(d.name)) for d in r.dcs]),
                "PEER_ADDRS": _addr_map(peers),
                "PROVISIONER_ADDR": f"provisioner:{GRPC_PORT}",
            },
            after=("provisioner", *(dc_service(d.name) for d in r.dcs)), region=r.name))
    sched_names = tuple(scheduler_service(r.name) for r in topo.regions)
    out.append(Component(
        "loadgen", "loadgen", ("loadgen", *topo_args),
        {
            "SCHEDULER_ADDRS": _addr_map([(r.name, scheduler_service(r.name))
                                          for r in topo.regions]),
            "DC_ADDRS": all_dcs,
            "PROVISIONER_ADDR": f"provisioner:{GRPC_PORT}",
            "GEOSERVE_OUT": RESULTS_IN_CONTAINER,
            "GEOSERVE_EXTRA_ARGS": Knob("LOADGEN_ARGS"),
        },
        after=(*dc_names, *sched_names), serves_grpc=False))
    return out


def _compose_env(env: Mapping[str, EnvValue]) -> dict[str, str]:
    return {k: v.compose() if isinstance(v, Knob) else v for k, v in env.items()}


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Alias:
    """A YAML alias (``*name``) in the emitted text."""

    name: str


@dataclass(frozen=True)
class Anchored:
    """A mapping emitted with an anchor (``&name``)."""

    name: str
    value: Mapping[str, Any]


def _addr_map(items: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{name}={host}:{GRPC_PORT}" for name, host in items)


def _healthy(names: Sequence[str]) -> dict[str, Any]:
    return {n: {"condition": "service_healthy"} for n in names}


def _layout(topo: Topology, out_dir: Path) -> dict[str, Any]:
    """The compose file as data with anchors and aliases (rendered by `_emit`)."""
    ref, mount = topology_ref(topo, out_dir)
    comps = components(topo, ref)
    image = f"${{GEOSERVE_IMAGE:-{IMAGE}}}"
    base_volumes = [f"epoch:{EPOCH_DIR}"]
    if mount:
        base_volumes.append(f"{mount}:{TOPOLOGY_MOUNT}:ro")
    env = Anchored("geoserve-env", _compose_env(common_env(ref)))
    health = Anchored("grpc-health", {
        "test": ["CMD", "python", "-m", "services.runtime.healthprobe"],
        "interval": "5s",
        "timeout": "4s",
        "retries": 3,
        "start_period": "60s",
    })
    logging = Anchored("logging", {
        "driver": "json-file",
        "options": {"max-size": "10m", "max-file": "3"},
    })
    common = Anchored("geoserve", {
        "image": image,
        "environment": Alias("geoserve-env"),
        "volumes": base_volumes,
        "healthcheck": Alias("grpc-health"),
        "stop_grace_period": "15s",
        "logging": Alias("logging"),
    })

    def svc(c: Component) -> dict[str, Any]:
        body: dict[str, Any] = {"<<": Alias("geoserve"), "command": list(c.command)}
        environment = {"<<": Alias("geoserve-env"), **_compose_env(c.env)} if c.env else None
        if c.kind == "scheduler":
            assert c.region is not None
            body["image"] = f"${{{scheduler_image_var(c.region)}:-{IMAGE}}}"
        if c.kind == "loadgen":
            body["user"] = f"${{GEOSERVE_UID:-{UID}}}:${{GEOSERVE_GID:-{UID}}}"
        if environment is not None:
            body["environment"] = environment
        if c.kind == "loadgen":
            body["volumes"] = [*base_volumes,
                               f"${{RESULTS_DIR:-./results}}:{RESULTS_IN_CONTAINER}"]
        if not c.serves_grpc:
            body["healthcheck"] = {"disable": True}
        if c.after:
            body["depends_on"] = _healthy(c.after)
        return body

    services: dict[str, Any] = {c.name: svc(c) for c in comps}
    services["prometheus"] = {
        "image": f"${{PROMETHEUS_IMAGE:-{PROMETHEUS_IMAGE}}}",
        "command": [
            "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.path=/prometheus",
            "--storage.tsdb.retention.time=7d",
            f"--web.listen-address=:{PROMETHEUS_PORT}",
        ],
        "volumes": ["./deploy/prometheus:/etc/prometheus:ro"],
        "ports": [f"127.0.0.1:${{PROMETHEUS_PORT:-{PROMETHEUS_PORT}}}:{PROMETHEUS_PORT}"],
        "healthcheck": {
            "test": ["CMD", "wget", "-q", "-O", "/dev/null",
                     f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready"],
            "interval": "5s", "timeout": "4s", "retries": 3, "start_period": "30s",
        },
        "logging": Alias("logging"),
    }
    services["grafana"] = {
        "image": f"${{GRAFANA_IMAGE:-{GRAFANA_IMAGE}}}",
        "profiles": ["grafana"],
        "environment": {
            "GF_AUTH_ANONYMOUS_ENABLED": "true",
            "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
            "GF_SECURITY_ADMIN_PASSWORD": "${GRAFANA_ADMIN_PASSWORD:-admin}",
            "GF_ANALYTICS_REPORTING_ENABLED": "false",
            "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
        },
        "volumes": [
            "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro",
            "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro",
        ],
        "ports": [f"127.0.0.1:${{GRAFANA_PORT:-{GRAFANA_PORT}}}:{GRAFANA_PORT}"],
        "depends_on": _healthy(["prometheus"]),
        "healthcheck": {
            "test": ["CMD", "wget", "-q", "-O", "/dev/null",
                     f"http://127.0.0.1:{GRAFANA_PORT}/api/health"],
            "interval": "10s", "timeout": "5s", "retries": 3, "start_period": "60s",
        },
        "logging": Alias("logging"),
    }
    return {
        "x-geoserve-env": env,
        "x-grpc-health": health,
        "x-logging": logging,
        "x-geoserve": common,
        "services": services,
        "volumes": {
            # run-scoped: tmpfs, mounted while any container of the run uses it
            "epoch": {"driver": "local",
                      "driver_opts": {"type": "tmpfs", "device": "tmpfs",
                                      "o": "size=64k,mode=1777"}},
        },
    }


# --------------------------------------------------------------------------- emitter


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, allow_unicode=True)
    text = text.rstrip("\n")
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return text


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _emit(value: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, Anchored):
        value = value.value
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Alias):
                out.append(f"{pad}{key}: *{item.name}")
            elif isinstance(item, Anchored):
                out.append(f"{pad}{key}: &{item.name}")
                _emit(item.value, indent + 2, out)
            elif _is_scalar(item):
                out.append(f"{pad}{key}: {_scalar(item)}")
            elif isinstance(item, list) and all(_is_scalar(i) for i in item):
                flow = _scalar(item)
                if len(pad) + len(str(key)) + len(flow) + 2 <= 100:
                    out.append(f"{pad}{key}: {flow}")
                else:
                    out.append(f"{pad}{key}:")
                    out.extend(f"{pad}  - {_scalar(i)}" for i in item)
            else:
                out.append(f"{pad}{key}:")
                _emit(item, indent + 2, out)
    elif isinstance(value, list):
        for item in value:
            out.append(f"{pad}- {_scalar(item)}")
    else:  # pragma: no cover - layouts only hold mappings, lists and scalars
        raise TypeError(f"cannot emit {type(value).__name__}")


def render_compose(topo: Topology, out_dir: Path | None = None) -> str:
    """The docker-compose.yml text for `topo` (written to `out_dir`)."""
    out_dir = out_dir or ROOT
    layout = _layout(topo, out_dir)
    ref, mount = topology_ref(topo, out_dir)
    head = [
        f"# GeoServe on Docker Compose: topology {topo.name!r}.",
        f"# Generated by `geoserve compose --topology {mount or ref}`; do not edit:",
        "# regenerate it (a test checks that the committed file is current).",
        "# Images, published ports and per-region scheduler",
        "# images/policies come from .env; see deploy/README.md.",
        "#   deploy/build-image.sh && mkdir -p -m 777 results && docker compose up -d",
        "#   docker compose logs -f loadgen        # results/ gets records.csv, summary.json",
        "#   COMPOSE_PROFILES=grafana docker compose up -d    # with Grafana",
        "# Works with Compose v2 (docker compose) and v1.29 (docker-compose).",
        "",
    ]
    body: list[str] = []
    blocks = list(layout.items())
    for i, (key, value) in enumerate(blocks):
        one: list[str] = []
        _emit({key: value}, 0, one)
        if key == "services":
            # a blank line between services
            lines = [one[0]]
            for line in one[1:]:
                if line.startswith("  ") and not line.startswith("   ") and len(lines) > 1:
                    lines.append("")
                lines.append(line)
            one = lines
        body.extend(one)
        if i < len(blocks) - 1:
            body.append("")
    return "\n".join(head + body) + "\n"


def compose_model(topo: Topology, out_dir: Path | None = None) -> dict[str, Any]:
    """The rendered file parsed back (anchors and merge keys resolved)."""
    data = yaml.safe_load(render_compose(topo, out_dir))
    assert isinstance(data, dict)
    return data


def render_env(topo: Topology) -> str:
    """The .env next to docker-compose.yml: pinned images, host ports, per-region knobs."""
    lines = [
        f"# Settings of docker-compose.yml (topology {topo.name!r}), generated by",
        "# `geoserve compose` with the file; edit the values freely (variables exported in",
        "# the shell win over this file). See deploy/README.md.",
        "",
        "# One image for every GeoServe service (deploy/Dockerfile, deploy/build-image.sh)",
        f"GEOSERVE_IMAGE={IMAGE}",
        "# Base of that image; pin a digest here where a registry is reachable",
        f"GEOSERVE_BASE_IMAGE={BASE_IMAGE}",
        f"PROMETHEUS_IMAGE={PROMETHEUS_IMAGE}",
        f"GRAFANA_IMAGE={GRAFANA_IMAGE}",
        "",
        "# Host ports (published on 127.0.0.1 only)",
        f"PROMETHEUS_PORT={PROMETHEUS_PORT}",
        f"GRAFANA_PORT={GRAFANA_PORT}",
        "",
        "# Run settings: shared epoch (unix s; empty = the first container's start time),",
        "# dilation (empty = the topology's), load generator arguments (e.g. --duration 20),",
        "# results folder and the uid:gid the load generator writes it as",
        "GEOSERVE_EPOCH=",
        "GEOSERVE_DILATION=",
        "LOADGEN_ARGS=",
        "RESULTS_DIR=./results",
        f"GEOSERVE_UID={UID}",
        f"GEOSERVE_GID={UID}",
        "",
        "# Mutual TLS between the services (empty = plaintext): paths inside the containers",
        "GEOSERVE_TLS_CERT=",
        "GEOSERVE_TLS_KEY=",
        "GEOSERVE_TLS_CA=",
        "",
        "# Schedulers: image, policy (empty = the topology's) and policy settings (k=v,k=v)",
        "# per region; `geoserve swap-scheduler` replaces one in a running deployment",
    ]
    for r in topo.regions:
        lines += [
            f"{scheduler_image_var(r.name)}={IMAGE}",
            f"{policy_var(r.name)}=",
            f"{policy_config_var(r.name)}=",
        ]
    return "\n".join(lines) + "\n"


def geoserve_services(topo: Topology) -> list[str]:
    """The compose services that run GeoServe (every one speaks gRPC, with TLS when set)."""
    model = compose_model(topo)
    return [name for name, svc in model["services"].items()
            if "GEOSERVE_TOPOLOGY" in (svc.get("environment") or {})]


def render_tls_override(topo: Topology) -> str:
    """``docker-compose.tls.yml``: mutual TLS between every GeoServe service of `topo`."""
    tls = Anchored("geoserve-tls", {
        "environment": {
            "GEOSERVE_TLS_CERT": f"{TLS_MOUNT}/cert.pem",
            "GEOSERVE_TLS_KEY": f"{TLS_MOUNT}/key.pem",
            "GEOSERVE_TLS_CA": f"{TLS_MOUNT}/ca.pem",
        },
        "volumes": [f"${{GEOSERVE_TLS_DIR:-./tls}}:{TLS_MOUNT}:ro"],
    })
    head = [
        f"# Mutual TLS for docker-compose.yml (topology {topo.name!r}); generated with it by",
        "# `geoserve compose`; do not edit. Every GeoServe service gets the host folder",
        "# $GEOSERVE_TLS_DIR (default ./tls) read-only and uses its ca.pem, cert.pem and",
        "# key.pem; the services run as uid 10001, which must be able to read key.pem:",
        f"#   geoserve tls-certs --topology {topo.name} --out tls && sudo chown 10001 "
        "tls/key.pem",
        f"#   docker compose -f docker-compose.yml -f {TLS_OVERRIDE} up -d",
        "",
    ]
    body: list[str] = []
    _emit({"x-geoserve-tls": tls}, 0, body)
    body.append("")
    body.append("services:")
    body.extend(f"  {name}: *geoserve-tls" for name in geoserve_services(topo))
    return "\n".join(head + body) + "\n"


def write_compose(topo: Topology, out: Path, env_out: Path | None) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_compose(topo, out.parent))
    tls = out.parent / TLS_OVERRIDE
    tls.write_text(render_tls_override(topo))
    written = [out, tls]
    if env_out is not None:
        env_out.write_text(render_env(topo))
        written.append(env_out)
    return written
