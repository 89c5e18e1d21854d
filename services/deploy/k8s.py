"""Kubernetes deployment of a topology: ``geoserve k8s`` (a kustomize base and overlays).

Rules / theory of operation
---------------------------
* The same processes as the compose deployment, from `compose.components`: names, entry
  point arguments, environment and addresses are compose's. Each GeoServe server
  (``dc-<dc>``, ``carm``, ``provisioner``, ``scheduler-<region>``) is a Deployment of one
  replica (strategy Recreate: never two processes of one component in a run) with a
  ClusterIP Service of the same name (ports ``grpc`` 50051 and ``metrics`` 9100), so the
  compose service names are the cluster DNS names; the load generator is a Job
  (``loadgen``, restartPolicy Never, backoffLimit 0) with a metrics-only Service.
* Start order: compose's ``depends_on: service_healthy`` becomes an init container
  ``wait-for`` that probes each prerequisite's gRPC health service through its Service
  (``python -m services.runtime.healthprobe``) until it is SERVING.
* Probes: native gRPC startup, readiness and liveness probes on 50051 (every server
  serves ``grpc.health.v1``). The kubelet's gRPC probe speaks plaintext only, so the
  ``mtls`` overlay replaces them by ``exec`` probes running the same health probe over TLS.
* One run epoch: pods cannot share compose's tmpfs, so every GeoServe container reads
  ``GEOSERVE_EPOCH`` from the ConfigMap ``geoserve-epoch`` (not optional), which the user
  creates right before applying; pods wait in CreateContainerConfigError until it exists.
  Its optional keys ``GEOSERVE_DILATION`` and ``LOADGEN_ARGS`` are compose's ``.env``
  variables of the same names. The generated files stay deterministic.
* The topology file is a generated ConfigMap (``geoserve-topology``, from a verbatim copy
  ``base/topology.yaml``) mounted at ``compose.TOPOLOGY_MOUNT``; ``--topology`` points there.
* Results: the load generator writes to the PVC ``loadgen-results`` (an emptyDir would go
  with the pod, and ``kubectl cp`` needs a running container, which a finished Job has not);
  ``results-reader.yaml`` beside the base is a pod that mounts it for ``kubectl cp``.
* Resources: `resources_for` (one rule, from docs/performance.md and a soak run).
* Disruption: a PodDisruptionBudget (minAvailable 1) for every DC, the provisioner and
  every scheduler, which a run cannot lose.
* Overlays: ``mtls`` (Secret ``geoserve-tls`` at ``/run/geoserve-tls``),
  ``prometheus-operator`` (ServiceMonitor + PrometheusRule), ``grafana`` (Prometheus and
  Grafana with the provisioning of deploy/grafana/) and ``swap-scheduler-example`` (one
  region's scheduler image and policy; the form of ``geoserve swap-scheduler`` here).
* Output: text files (relative path -> text, `render_k8s`), deterministic: same topology,
  same bytes. Layout ``<out>/base/``, ``<out>/overlays/<name>/``, ``<out>/results-reader.yaml``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from services.config.topology import ROOT, Topology
from services.deploy import compose, dashboards, prometheus
from services.deploy.compose import GRPC_PORT, IMAGE, METRICS_PORT, UID, Component, Knob
from services.model.errors import InvalidInput

NAMESPACE = "geoserve"
CONTAINER = "geoserve"                 # the main container of every GeoServe pod
EPOCH_CONFIGMAP = "geoserve-epoch"     # made by the user right before applying
TOPOLOGY_CONFIGMAP = "geoserve-topology"
TLS_SECRET = "geoserve-tls"
RESULTS_PVC = "loadgen-results"
RESULTS_SIZE = "1Gi"
RESULTS_READER = "results-reader"
# run settings: keys of the epoch ConfigMap (compose's .env variables of the same names)
REQUIRED_RUN_SETTINGS = ("GEOSERVE_EPOCH",)
OPTIONAL_RUN_SETTINGS = ("GEOSERVE_DILATION", "LOADGEN_ARGS")
# compose's way of sharing the epoch (a tmpfs volume); pods read the ConfigMap instead
COMPOSE_ONLY_ENV = ("GEOSERVE_EPOCH_FILE",)
OVERLAYS = ("mtls", "prometheus-operator", "grafana", "swap-scheduler-example")
MUST_STAY_UP = ("datacenter", "provisioner", "scheduler")  # kinds with a PodDisruptionBudget
SCRAPE_INTERVAL_S = 1.0                # as deploy/prometheus/prometheus.yml
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_REGION = "geoserve.io/region"
# a Service name is a DNS-1035 label
K8S_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
PROBE_SCRIPT = ("for a in \"$@\"; do until python -m services.runtime.healthprobe \"$a\"; do "
                "echo \"wait-for: $a is not serving yet\" >&2; sleep 2; done; done")
HEALTHPROBE = ["python", "-m", "services.runtime.healthprobe"]

# ------------------------------------------------------------------------- sizing figures
# docs/performance.md, "Wall runtime at k = 1", the "CPU µs/request by service" column of
# base.yaml at 600 req/s (the highest rate measured; 16 datacenter and 4 scheduler
# processes, round-robin): CPU of all processes of a kind per request of the run.
PERF_SOURCE = "docs/performance.md, wall runtime table, base at 600 req/s"
WALL_CPU_US_PER_REQUEST = {"datacenter": 2720.0, "loadgen": 467.0, "provisioner": 90.0,
                           "scheduler": 1919.0}
CPU_FLOOR_M = 100
CPU_LIMIT_MIN_M = 1000
# Soak run of small.yaml at 60 req/s for 600 s (36006 requests): every service 66-89 MiB
# RSS with at most 3.4 % growth (a base.yaml DC with 32 engines: 82 MiB at start); the load
# generator 78 -> 116 MiB, about 1.1 KiB per request it keeps a record of.
SOAK_SOURCE = "soak of small at 60 req/s for 600 s"
SERVICE_MEMORY_MI = (128, 512)         # request, limit
LOADGEN_BASE_MI = 128
LOADGEN_BYTES_PER_REQUEST = 1126       # 1.1 KiB
INIT_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"},
                  "limits": {"cpu": "500m", "memory": "256Mi"}}


@dataclass(frozen=True)
class Resources:
    """CPU (millicores) and memory (MiB) requests and limits of one container, and the
    arithmetic behind them (`note`, written into the generated file)."""

    cpu_request_m: int
    cpu_limit_m: int
    memory_request_mi: int
    memory_limit_mi: int
    note: tuple[str, ...]

    def spec(self) -> dict[str, Any]:
        return {
            "requests": {"cpu": f"{self.cpu_request_m}m",
                         "memory": f"{self.memory_request_mi}Mi"},
            "limits": {"cpu": f"{self.cpu_limit_m}m", "memory": f"{self.memory_limit_mi}Mi"},
        }


def _round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step - 1e-9) * step)


def resources_for(topo: Topology, comp: Component) -> Resources:
    """Requests and limits of `comp`'s container at the topology's load rate.

    CPU request = rate / (processes of the kind) x CPU µs per request of the kind
    (`WALL_CPU_US_PER_REQUEST`, from docs/performance.md: all processes of a kind per
    request of a wall-clock run of base.yaml at 600 req/s), rounded up to 10m, at least
    `CPU_FLOOR_M` (100m; the CA-RM controller, which has no measured figure, gets the
    floor). The figure includes the fixed cost of polls and idle engines amortised at that
    rate, so lower rates cost more per request, which the floor covers for small
    topologies. CPU limit = 2 x the request, at least one core: a faithful run needs its
    wake-ups on time, and CFS throttling at the limit shows up as wake-up lateness.
    Memory: every service 128Mi request, 512Mi limit (soak: 66-89 MiB RSS, at most 3.4 %
    growth); the load generator 128Mi + 1.1 KiB per request of the run (rate x duration,
    soak: 78 -> 116 MiB over 36006 requests), limit twice that.
    """
    rate = float(topo.load.rate_rps)
    processes = {"datacenter": len(topo.dcs), "scheduler": len(topo.regions)}.get(comp.kind, 1)
    us = WALL_CPU_US_PER_REQUEST.get(comp.kind)
    note: list[str] = []
    if us is None:
        cpu = CPU_FLOOR_M
        note.append(f"cpu: no measured figure for {comp.kind}: the floor, {CPU_FLOOR_M}m")
    else:
        need = rate / processes * us / 1000.0
        cpu = max(CPU_FLOOR_M, _round_up(need, 10))
        share = f"{rate:g} req/s / {processes} {comp.kind}s" if processes > 1 else \
            f"{rate:g} req/s"
        note.append(f"cpu: {share} x {us:g} µs/request = {need:.0f}m -> {cpu}m "
                    f"(floor {CPU_FLOOR_M}m);")
        note.append(f"  the {comp.kind} figure is from {PERF_SOURCE}")
    cpu_limit = max(2 * cpu, CPU_LIMIT_MIN_M)
    note.append(f"cpu limit: 2 x request, at least {CPU_LIMIT_MIN_M}m")
    if comp.kind == "loadgen":
        requests = rate * float(topo.load.duration_s)
        mem = LOADGEN_BASE_MI + _round_up(requests * LOADGEN_BYTES_PER_REQUEST / 2**20, 1)
        mem_limit = 2 * mem
        note.append(f"memory: {LOADGEN_BASE_MI}Mi + {requests:.0f} requests x 1.1 KiB = "
                    f"{mem}Mi, limit 2x")
        note.append(f"  ({SOAK_SOURCE}: 78 -> 116 MiB over 36006 requests)")
    else:
        mem, mem_limit = SERVICE_MEMORY_MI
        note.append(f"memory: {mem}Mi, limit {mem_limit}Mi ({SOAK_SOURCE}: 66-89 MiB RSS")
        note.append("  per service)")
    return Resources(cpu, cpu_limit, mem, mem_limit, tuple(note))


# ------------------------------------------------------------------------------ objects


def check_k8s_names(topo: Topology) -> list[Component]:
    """The topology's components, refusing names that are no Kubernetes Service name."""
    comps = compose.components(topo, compose.TOPOLOGY_MOUNT)
    for c in comps:
        if not K8S_NAME_RE.match(c.name):
            raise InvalidInput(
                f"{topo.path}: service {c.name!r}",
                "not usable as a Kubernetes Service name (DNS-1035 label: at most 63 "
                "lower-case letters, digits and '-', starting with a letter, not ending "
                "with '-')")
    return comps


def _labels(topo: Topology, comp: Component) -> dict[str, str]:
    labels = {LABEL_NAME: comp.name, LABEL_COMPONENT: comp.kind, LABEL_PART_OF: NAMESPACE}
    if comp.region is not None:
        labels[LABEL_REGION] = comp.region
    return labels


def _selector(comp: Component) -> dict[str, str]:
    return {LABEL_PART_OF: NAMESPACE, LABEL_NAME: comp.name}


def env_list(env: Mapping[str, compose.EnvValue]) -> list[dict[str, Any]]:
    """Kubernetes ``env`` entries for a compose environment: run settings from the epoch
    ConfigMap, other per-deployment knobs at their defaults, compose-only ones left out."""
    out: list[dict[str, Any]] = []
    for name, value in env.items():
        if name in COMPOSE_ONLY_ENV:
            continue
        if isinstance(value, Knob) and value.var in (*REQUIRED_RUN_SETTINGS,
                                                      *OPTIONAL_RUN_SETTINGS):
            out.append({"name": name, "valueFrom": {"configMapKeyRef": {
                "name": EPOCH_CONFIGMAP, "key": value.var,
                "optional": value.var in OPTIONAL_RUN_SETTINGS}}})
        elif isinstance(value, Knob):
            out.append({"name": name, "value": value.default})
        else:
            out.append({"name": name, "value": value})
    return out


def _addresses(names: Iterable[str]) -> list[str]:
    return [f"{n}:{GRPC_PORT}" for n in names]


def _grpc_probes() -> dict[str, Any]:
    grpc = {"port": GRPC_PORT}
    return {
        # compose's start_period: 60 s to come up
        "startupProbe": {"grpc": grpc, "periodSeconds": 2, "timeoutSeconds": 4,
                         "failureThreshold": 30},
        "readinessProbe": {"grpc": grpc, "periodSeconds": 5, "timeoutSeconds": 4,
                           "failureThreshold": 3},
        "livenessProbe": {"grpc": grpc, "periodSeconds": 10, "timeoutSeconds": 4,
                          "failureThreshold": 3},
    }


def _exec_probes() -> dict[str, Any]:
    """The mtls overlay's probes: the health probe over TLS (about 0.2 CPU s each, hence
    longer periods than the native ones)."""
    run = {"exec": {"command": HEALTHPROBE}}
    return {
        "startupProbe": {"grpc": None, **run, "periodSeconds": 5, "timeoutSeconds": 8,
                         "failureThreshold": 12},
        "readinessProbe": {"grpc": None, **run, "periodSeconds": 10, "timeoutSeconds": 8,
                           "failureThreshold": 3},
        "livenessProbe": {"grpc": None, **run, "periodSeconds": 20, "timeoutSeconds": 8,
                          "failureThreshold": 3},
    }


def _security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod_security(uid: int) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _topology_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    mount = PurePosixPath(compose.TOPOLOGY_MOUNT)
    volume = {"name": "topology", "configMap": {
        "name": TOPOLOGY_CONFIGMAP, "items": [{"key": "topology.yaml", "path": mount.name}]}}
    return volume, {"name": "topology", "mountPath": str(mount.parent), "readOnly": True}


def _pod_spec(comp: Component, res: Resources, env: list[dict[str, Any]]) -> dict[str, Any]:
    volume, mount = _topology_volume()
    ports = [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}] \
        if comp.serves_grpc else []
    ports.append({"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": list(comp.command),
        "ports": ports,
        "env": env,
        "resources": res.spec(),
    }
    if comp.serves_grpc:
        container.update(_grpc_probes())
    mounts = [mount]
    volumes = [volume]
    if comp.kind == "loadgen":
        mounts.append({"name": "results", "mountPath": compose.RESULTS_IN_CONTAINER})
        volumes.append({"name": "results",
                        "persistentVolumeClaim": {"claimName": RESULTS_PVC}})
    container["volumeMounts"] = mounts
    container["securityContext"] = _security()
    spec: dict[str, Any] = {
        "enableServiceLinks": False,        # no *_SERVICE_HOST/_PORT variables
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 15,  # compose's stop_grace_period
        "securityContext": _pod_security(UID),
    }
    if comp.kind == "loadgen":
        spec["restartPolicy"] = "Never"
    if comp.after:
        spec["initContainers"] = [{
            "name": "wait-for",
            "image": IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "args": ["sh", "-c", PROBE_SCRIPT, "wait-for", *_addresses(comp.after)],
            "env": [e for e in env if e["name"].startswith("GEOSERVE_TLS_")]
            + [{"name": "GRPC_VERBOSITY", "value": "NONE"}],
            "resources": INIT_RESOURCES,
            "securityContext": _security(),
        }]
    spec["containers"] = [container]
    spec["volumes"] = volumes
    return spec


def _annotations() -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics"}


def _service(topo: Topology, comp: Component) -> dict[str, Any]:
    ports = [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}] \
        if comp.serves_grpc else []
    ports.append({"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
                  "protocol": "TCP"})
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": comp.name, "labels": _labels(topo, comp)},
        "spec": {"type": "ClusterIP", "selector": _selector(comp), "ports": ports},
    }


def _workload(topo: Topology, comp: Component, res: Resources) -> dict[str, Any]:
    env = env_list({**compose.common_env(compose.TOPOLOGY_MOUNT), **comp.env})
    template = {
        "metadata": {"labels": _labels(topo, comp), "annotations": _annotations()},
        "spec": _pod_spec(comp, res, env),
    }
    meta = {"name": comp.name, "labels": _labels(topo, comp)}
    if comp.kind == "loadgen":
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                "spec": {"backoffLimit": 0, "template": template}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                 "selector": {"matchLabels": _selector(comp)}, "template": template},
    }


def _pdb(topo: Topology, comp: Component) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": comp.name, "labels": _labels(topo, comp)},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": _selector(comp)}},
    }


def _pvc() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": RESULTS_PVC, "labels": {LABEL_PART_OF: NAMESPACE}},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": RESULTS_SIZE}}},
    }


def _results_reader() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": RESULTS_READER, "namespace": NAMESPACE,
                     "labels": {LABEL_NAME: RESULTS_READER, LABEL_PART_OF: NAMESPACE}},
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "securityContext": _pod_security(UID),
            "containers": [{
                "name": "reader", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "args": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                              "limits": {"cpu": "200m", "memory": "64Mi"}},
                "volumeMounts": [{"name": "results",
                                  "mountPath": compose.RESULTS_IN_CONTAINER,
                                  "readOnly": True}],
                "securityContext": _security(),
            }],
            "volumes": [{"name": "results", "persistentVolumeClaim": {
                "claimName": RESULTS_PVC, "readOnly": True}}],
        },
    }


# ------------------------------------------------------------------------------ emitter


class _Dumper(yaml.SafeDumper):
    """Plain YAML: shared values are written out again, never as anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _doc(obj: Mapping[str, Any]) -> str:
    return yaml.dump(dict(obj), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     width=1 << 16, allow_unicode=True)


def _file(head: Sequence[str], docs: Sequence[tuple[Sequence[str], Mapping[str, Any]]]) -> str:
    parts = []
    for i, (comment, obj) in enumerate(docs):
        lines = [*(head if i == 0 else ()), *comment]
        text = "".join(f"# {line}\n" if line else "#\n" for line in lines) + _doc(obj)
        parts.append(text)
    return "---\n".join(parts)


def _source(topo: Topology) -> str:
    path = Path(topo.path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def _generated(topo: Topology, what: str) -> list[str]:
    return [f"{what}",
            f"Topology {topo.name!r}; generated by `geoserve k8s --topology {_source(topo)}`",
            "(services/deploy/k8s.py): do not edit, regenerate (a test checks the committed "
            "files)."]


def _kustomization(body: Mapping[str, Any]) -> dict[str, Any]:
    # every kustomization sets the namespace: the base's does not reach an overlay's objects
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "namespace": NAMESPACE, **body}


def _component_file(topo: Topology, comp: Component) -> str:
    res = resources_for(topo, comp)
    if comp.kind == "loadgen":
        what = "the load generator: its results volume, a Job and a Service (metrics)"
    elif comp.kind in MUST_STAY_UP:
        what = f"GeoServe {comp.kind}: a Deployment, its Service and a PodDisruptionBudget"
    else:
        what = f"GeoServe {comp.kind}: a Deployment and its Service"
    head = _generated(topo, f"{comp.name}, {what}.")
    sizing = ["Resources (services/deploy/k8s.py resources_for):", *res.note]
    docs: list[tuple[Sequence[str], Mapping[str, Any]]] = []
    if comp.kind == "loadgen":
        docs.append((["The load generator's results (records.csv, summary.json); read them "
                      "with ../results-reader.yaml"], _pvc()))
    docs.append((sizing, _workload(topo, comp, res)))
    docs.append(([], _service(topo, comp)))
    if comp.kind in MUST_STAY_UP:
        docs.append((["A run cannot lose this process: voluntary evictions (node drains) "
                      "wait until the run is torn down"], _pdb(topo, comp)))
    return _file(head, docs)


def _base(topo: Topology, comps: Sequence[Component]) -> dict[str, str]:
    files = {"namespace.yaml": _file(_generated(topo, "The namespace of every GeoServe object."), [
        ([], {"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": NAMESPACE, "labels": {LABEL_PART_OF: NAMESPACE}}})])}
    for c in comps:
        files[f"{c.name}.yaml"] = _component_file(topo, c)
    files["topology.yaml"] = Path(topo.path).read_text()
    head = [
        *_generated(topo, "GeoServe on Kubernetes: the kustomize base."),
        "",
        "Run epoch: every GeoServe container reads GEOSERVE_EPOCH (unix seconds) from the",
        f"ConfigMap {EPOCH_CONFIGMAP}, which is not generated (the files stay deterministic):",
        "create it right before applying, once per run, so all processes share one clock",
        "(emulated time = (wall - epoch) / dilation). Pods wait in CreateContainerConfigError",
        "until it exists. Optional keys: GEOSERVE_DILATION, LOADGEN_ARGS (as in compose's .env).",
        f"  kubectl create namespace {NAMESPACE}",
        f"  kubectl -n {NAMESPACE} create configmap {EPOCH_CONFIGMAP} "
        "--from-literal=GEOSERVE_EPOCH=$(date +%s)",
        "  kubectl apply -k .",
        "The topology is base/topology.yaml (a copy of the source file) in the ConfigMap",
        f"{TOPOLOGY_CONFIGMAP}; the containers load it at {compose.TOPOLOGY_MOUNT}.",
        "See deploy/k8s/README.md.",
    ]
    body = _kustomization({
        "resources": list(files)[:-1],
        "configMapGenerator": [{"name": TOPOLOGY_CONFIGMAP, "files": ["topology.yaml"]}],
    })
    files["kustomization.yaml"] = _file(head, [([], body)])
    return files


def _in(kinds: Iterable[str]) -> str:
    return f"{LABEL_COMPONENT} in ({','.join(dict.fromkeys(kinds))})"


def _mtls(topo: Topology, comps: Sequence[Component]) -> dict[str, str]:
    mount = compose.TLS_MOUNT
    env = [{"name": "GEOSERVE_TLS_CERT", "value": f"{mount}/cert.pem"},
           {"name": "GEOSERVE_TLS_KEY", "value": f"{mount}/key.pem"},
           {"name": "GEOSERVE_TLS_CA", "value": f"{mount}/ca.pem"}]
    vmount = {"name": "geoserve-tls", "mountPath": mount, "readOnly": True}
    # 0440 with the pods' fsGroup 10001: the services' uid reads key.pem
    volume = {"name": "geoserve-tls", "secret": {"secretName": TLS_SECRET, "defaultMode": 0o440}}

    def patch(kind: str, name: str, pod: dict[str, Any]) -> dict[str, Any]:
        api = "batch/v1" if kind == "Job" else "apps/v1"
        return {"apiVersion": api, "kind": kind, "metadata": {"name": name},
                "spec": {"template": {"spec": pod}}}

    servers = [c for c in comps if c.kind != "loadgen"]
    waiting = [c for c in servers if c.after]
    main = {"name": CONTAINER, "env": env, "volumeMounts": [vmount]}
    init = {"name": "wait-for", "env": env, "volumeMounts": [vmount]}
    head = _generated(topo, "Mutual TLS overlay: a strategic-merge patch.")
    files = {
        "tls-servers.yaml": _file(
            [*head, "Every GeoServe server: the Secret's files, GEOSERVE_TLS_*, and exec",
             "probes (the kubelet's gRPC probe speaks plaintext only; `grpc: null` removes",
             "it). defaultMode 288 is 0440: with the pods' fsGroup 10001 the services read",
             "key.pem."],
            [([], patch("Deployment", "geoserve-servers", {
                "containers": [{**main, **_exec_probes()}], "volumes": [volume]}))]),
        "tls-wait.yaml": _file(
            [*head, "The wait-for init containers probe their prerequisites over TLS."],
            [([], patch("Deployment", "geoserve-waiting", {"initContainers": [init]}))]),
        "tls-loadgen.yaml": _file(
            [*head, "The load generator and its wait-for init container (defaultMode 288 is",
             "0440)."],
            [([], patch("Job", "loadgen", {"initContainers": [init], "containers": [main],
                                           "volumes": [volume]}))]),
    }
    patches = [
        {"path": "tls-servers.yaml",
         "target": {"kind": "Deployment", "labelSelector": _in(c.kind for c in servers)}},
        {"path": "tls-wait.yaml",
         "target": {"kind": "Deployment", "labelSelector": _in(c.kind for c in waiting)}},
        {"path": "tls-loadgen.yaml", "target": {"kind": "Job", "name": "loadgen"}},
    ]
    khead = [
        *_generated(topo, "GeoServe on Kubernetes with mutual TLS between the services."),
        "",
        f"Needs the Secret {TLS_SECRET} (ca.pem, cert.pem, key.pem) in namespace {NAMESPACE}; the",
        "certificate's names are the Service names (`geoserve tls-certs --topology T`):",
        f"  geoserve tls-certs --topology {_source(topo)} --out tls",
        f"  kubectl -n {NAMESPACE} create secret generic {TLS_SECRET} --from-file=tls/ca.pem \\",
        "      --from-file=tls/cert.pem --from-file=tls/key.pem",
        "or uncomment the secretGenerator below (it reads ./tls/ beside this file; keep keys",
        "out of version control). Metrics stay plain HTTP.",
    ]
    body = _kustomization({"resources": ["../../base"], "patches": patches})
    text = _file(khead, [([], body)])
    text += ("# secretGenerator:\n"
             f"# - name: {TLS_SECRET}\n"
             "#   options: {disableNameSuffixHash: true}\n"
             "#   files: [tls/ca.pem, tls/cert.pem, tls/key.pem]\n")
    files["kustomization.yaml"] = text
    return files


def _prometheus_operator(topo: Topology) -> dict[str, str]:
    head = _generated(topo, "Prometheus Operator overlay.")
    interval = f"{SCRAPE_INTERVAL_S:g}s"
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": NAMESPACE, "labels": {LABEL_PART_OF: NAMESPACE}},
        "spec": {
            "selector": {"matchLabels": {LABEL_PART_OF: NAMESPACE}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": interval}],
        },
    }
    rules = yaml.safe_load(prometheus.recording_rules())
    rule = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": NAMESPACE, "labels": {LABEL_PART_OF: NAMESPACE}},
        "spec": {"groups": rules["groups"]},
    }
    khead = [
        *_generated(topo, "GeoServe on Kubernetes scraped by the Prometheus Operator."),
        "",
        "A ServiceMonitor for the metrics port of every GeoServe Service (the job label is the",
        "Service name, as the compose scrape jobs) and the recording rules of",
        "deploy/prometheus/rules.yml as a PrometheusRule. Needs the operator's CRDs. A",
        "Prometheus selects ServiceMonitors by label: kube-prometheus-stack wants",
        "`release: <its release name>` (add it under labels: below) or",
        "serviceMonitorSelectorNilUsesHelmValues=false.",
    ]
    return {
        "servicemonitor.yaml": _file(head, [([], monitor)]),
        "prometheusrule.yaml": _file(head, [([], rule)]),
        "kustomization.yaml": _file(khead, [([], _kustomization({
            "resources": ["../../base", "servicemonitor.yaml", "prometheusrule.yaml"]}))]),
    }


def _plain_deployment(name: str, image: str, uid: int, container: Mapping[str, Any],
                      volumes: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    labels = {LABEL_NAME: name, LABEL_COMPONENT: name, LABEL_PART_OF: NAMESPACE}
    selector = {LABEL_PART_OF: NAMESPACE, LABEL_NAME: name}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                 "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "enableServiceLinks": False,
                     "automountServiceAccountToken": False,
                     "securityContext": _pod_security(uid),
                     "containers": [{"name": name, "image": image,
                                     "imagePullPolicy": "IfNotPresent", **container,
                                     "securityContext": _security()}],
                     "volumes": volumes}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
        "spec": {"type": "ClusterIP", "selector": selector, "ports": [
            {"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]},
    }
    return [deployment, service]


def _grafana(topo: Topology) -> dict[str, str]:
    head = _generated(topo, "Grafana overlay.")
    p_port, g_port = compose.PROMETHEUS_PORT, compose.GRAFANA_PORT
    prom = _plain_deployment("prometheus", compose.PROMETHEUS_IMAGE, 65534, {
        "args": ["--config.file=/etc/prometheus/prometheus.yml",
                 "--storage.tsdb.path=/prometheus",
                 "--storage.tsdb.retention.time=7d",
                 f"--web.listen-address=:{p_port}"],
        "ports": [{"name": "http", "containerPort": p_port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "http"},
                           "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/-/healthy", "port": "http"},
                          "periodSeconds": 10},
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"},
                      "limits": {"cpu": "1000m", "memory": "1Gi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus", "readOnly": True},
                         {"name": "data", "mountPath": "/prometheus"}],
    }, [{"name": "config", "configMap": {"name": "prometheus-config"}},
        {"name": "data", "emptyDir": {}}], p_port)
    graf = _plain_deployment("grafana", compose.GRAFANA_IMAGE, 472, {
        "env": [
            {"name": "GF_AUTH_ANONYMOUS_ENABLED", "value": "true"},
            {"name": "GF_AUTH_ANONYMOUS_ORG_ROLE", "value": "Viewer"},
            # Grafana's own default (admin) unless the Secret grafana-admin has a password
            {"name": "GF_SECURITY_ADMIN_PASSWORD", "valueFrom": {"secretKeyRef": {
                "name": "grafana-admin", "key": "password", "optional": True}}},
            {"name": "GF_ANALYTICS_REPORTING_ENABLED", "value": "false"},
            {"name": "GF_ANALYTICS_CHECK_FOR_UPDATES", "value": "false"},
        ],
        "ports": [{"name": "http", "containerPort": g_port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/api/health", "port": "http"},
                           "periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "500m", "memory": "512Mi"}},
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/grafana"},
            {"name": "datasources", "mountPath": "/etc/grafana/provisioning/datasources",
             "readOnly": True},
            {"name": "dashboard-providers",
             "mountPath": "/etc/grafana/provisioning/dashboards", "readOnly": True},
            {"name": "dashboards", "mountPath": dashboards.DASHBOARDS_PATH, "readOnly": True},
        ],
    }, [{"name": "data", "emptyDir": {}},
        {"name": "datasources", "configMap": {"name": "grafana-datasources"}},
        {"name": "dashboard-providers", "configMap": {"name": "grafana-dashboard-providers"}},
        {"name": "dashboards", "configMap": {"name": "grafana-dashboards"}}], g_port)
    files = {
        "prometheus.yaml": _file([*head, "Prometheus, scraping every GeoServe Service as the "
                                  "compose deployment's does"], [([], d) for d in prom]),
        "grafana.yaml": _file([*head, "Grafana with the datasource and dashboards of "
                               "deploy/grafana/ (`geoserve dashboards`)"],
                              [([], d) for d in graf]),
        "prometheus/prometheus.yml": prometheus.render_prometheus_config(
            prometheus.compose_targets(topo), SCRAPE_INTERVAL_S, "rules.yml"),
        "prometheus/rules.yml": prometheus.recording_rules(),
    }
    grafana_files = dashboards.generated_files()
    for rel, text in grafana_files.items():
        files[f"grafana/{rel}"] = text

    def keyed(prefix: str) -> list[str]:
        return [f"{PurePosixPath(rel).name}=grafana/{rel}" for rel in grafana_files
                if rel.startswith(prefix)]

    khead = [
        *_generated(topo, "GeoServe on Kubernetes with Prometheus and Grafana."),
        "",
        "Like compose's grafana profile: Prometheus scrapes every Service (prometheus/",
        "prometheus.yml, as `geoserve prometheus-config` writes it) and Grafana shows the",
        "dashboards of deploy/grafana/. Anonymous viewer; admin password from the Secret",
        "grafana-admin (key password) when it exists, else Grafana's default.",
        f"  kubectl -n {NAMESPACE} port-forward svc/grafana {g_port}    "
        f"# http://127.0.0.1:{g_port}",
        f"  kubectl -n {NAMESPACE} port-forward svc/prometheus {p_port}",
    ]
    body = _kustomization({
        "resources": ["../../base", "prometheus.yaml", "grafana.yaml"],
        "configMapGenerator": [
            {"name": "prometheus-config", "files": ["prometheus/prometheus.yml",
                                                    "prometheus/rules.yml"]},
            {"name": "grafana-datasources", "files": keyed("provisioning/datasources/")},
            {"name": "grafana-dashboard-providers",
             "files": keyed("provisioning/dashboards/")},
            {"name": "grafana-dashboards", "files": keyed("dashboards/")},
        ],
    })
    files["kustomization.yaml"] = _file(khead, [([], body)])
    return files


def _swap(topo: Topology) -> dict[str, str]:
    region = topo.regions[0].name
    name = compose.scheduler_service(region)
    patch = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"template": {"spec": {"containers": [{
            "name": CONTAINER,
            "image": "my-scheduler",
            "env": [{"name": "GEOSERVE_POLICY", "value": "greedy"},
                    {"name": "GEOSERVE_POLICY_CONFIG", "value": "alpha=0.5"}],
        }]}}},
    }
    head = _generated(topo, f"Scheduler swap example: the scheduler of region {region!r}.")
    khead = [
        *_generated(topo, f"GeoServe on Kubernetes, the scheduler of region {region!r} "
                    "swapped."),
        "",
        "The Kubernetes form of `geoserve swap-scheduler`: the patch gives the Deployment",
        f"{name} the image `my-scheduler` and a policy (GEOSERVE_POLICY and",
        "GEOSERVE_POLICY_CONFIG; empty = the topology's); images: says which build",
        "`my-scheduler` is (here",
        "GeoServe's own, so the example runs as is: put your image and tag there). A",
        "replacement implements the geoserve.v1 scheduler service from protos/ and the",
        "standard gRPC health service on 50051 (the probes are native gRPC probes).",
        "Copy this folder to swap another region (change the patch's name and the file).",
        "Between runs: `kubectl apply -k .` recreates that scheduler only.",
    ]
    image_name, _, tag = IMAGE.rpartition(":")
    body = _kustomization({
        "resources": ["../../base"],
        "images": [{"name": "my-scheduler", "newName": image_name, "newTag": tag}],
        "patches": [{"path": f"{name}.yaml"}],
    })
    return {
        f"{name}.yaml": _file(head, [([], patch)]),
        "kustomization.yaml": _file(khead, [([], body)]),
    }


def render_k8s(topo: Topology) -> dict[str, str]:
    """Every generated file: path relative to the output folder -> text."""
    comps = check_k8s_names(topo)
    files = {f"base/{k}": v for k, v in _base(topo, comps).items()}
    overlays = {"mtls": _mtls(topo, comps), "prometheus-operator": _prometheus_operator(topo),
                "grafana": _grafana(topo), "swap-scheduler-example": _swap(topo)}
    assert tuple(overlays) == OVERLAYS
    for overlay, content in overlays.items():
        files.update({f"overlays/{overlay}/{k}": v for k, v in content.items()})
    files[f"{RESULTS_READER}.yaml"] = _file(
        [*_generated(topo, "Results reader: a pod that mounts the load generator's PVC."),
         "Not part of the kustomization: apply it after the loadgen Job has completed,",
         f"  kubectl apply -f {RESULTS_READER}.yaml",
         f"  kubectl -n {NAMESPACE} wait --for=condition=Ready pod/{RESULTS_READER}",
         f"  kubectl -n {NAMESPACE} cp {RESULTS_READER}:{compose.RESULTS_IN_CONTAINER} "
         "./results",
         f"  kubectl delete -f {RESULTS_READER}.yaml"],
        [([], _results_reader())])
    return files


def write_k8s(topo: Topology, out: Path) -> list[Path]:
    """Write `render_k8s` under `out`; returns the paths written."""
    written = []
    for rel, text in render_k8s(topo).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def stale_files(topo: Topology, out: Path) -> list[Path]:
    """Files under `out`'s base/ and overlays/ that `render_k8s` does not write (left from
    an earlier topology); `geoserve k8s` names them and leaves them alone."""
    expected = set(render_k8s(topo))
    found = []
    for sub in ("base", "overlays"):
        root = out / sub
        if root.is_dir():
            found += [p for p in sorted(root.rglob("*"))
                      if p.is_file() and p.relative_to(out).as_posix() not in expected]
    return found
