"""Kubernetes manifests (`geoserve k8s`): committed trees, structure, kustomize, schemas.

No cluster needed. Expected names, addresses and commands are derived from the topology
(and compared with the compose deployment's); every kustomization (base and overlays, for
small.yaml and base.yaml) is rendered by the real ``kubectl kustomize`` and every object it
renders is validated against the Kubernetes OpenAPI schemas of ``kubernetes-validate``
(strict: unknown fields fail). kubectl is required: without it these tests fail, naming
what to install.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from services.config.topology import load_topology
from services.deploy import compose, dashboards, k8s, prometheus

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "k8s"
TOPOLOGIES = ("small", "base")
KUSTOMIZATIONS = ("base", *(f"overlays/{o}" for o in k8s.OVERLAYS))
PORTS = {"grpc": 50051, "metrics": 9100}
KNOB = re.compile(r"^\$\{[A-Z0-9_]+:-(.*)\}$")


@pytest.fixture(scope="module")
def topos():
    return {name: load_topology(ROOT / "topologies" / f"{name}.yaml") for name in TOPOLOGIES}


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.fail("kubectl is not installed: these tests render the kustomizations with "
                    "`kubectl kustomize` (kubectl >= 1.27, with kustomize v5). Install kubectl "
                    "(https://kubernetes.io/docs/tasks/tools/, or apt-get install kubectl from "
                    "the Kubernetes apt repository) and put it on PATH.", pytrace=False)
    return exe


@pytest.fixture(scope="module")
def rendered():
    """(topology, kustomization) -> the objects `kubectl kustomize` renders from the
    committed tree."""
    exe = _kubectl()
    out = {}
    for topo in TOPOLOGIES:
        for kust in KUSTOMIZATIONS:
            proc = subprocess.run([exe, "kustomize", str(K8S_DIR / topo / kust)],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, f"kubectl kustomize {topo}/{kust}: {proc.stderr}"
            out[topo, kust] = _docs(proc.stdout)
    return out


def _by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _base_docs(topo_name: str) -> list[dict[str, Any]]:
    base = K8S_DIR / topo_name / "base"
    return [d for p in sorted(base.glob("*.yaml"))
            if p.name not in ("kustomization.yaml", "topology.yaml")
            for d in _docs(p.read_text())]


def _expected(topo) -> dict[str, str]:
    """Service name -> kind, from the topology alone."""
    out = {f"dc-{d.name}": "datacenter" for d in topo.dcs}
    if topo.carm is not None:
        out["carm"] = "carm"
    out["provisioner"] = "provisioner"
    out.update({f"scheduler-{r.name}": "scheduler" for r in topo.regions})
    out["loadgen"] = "loadgen"
    return out


def _env(container) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _pod(obj):
    return obj["spec"]["template"]["spec"]


def _main(obj):
    (container,) = [c for c in _pod(obj)["containers"] if c["name"] == k8s.CONTAINER]
    return container


# ---------------------------------------------------------------- committed trees


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_committed_tree_is_current(topos, name):
    files = k8s.render_k8s(topos[name])
    root = K8S_DIR / name
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert on_disk == set(files), (
        f"deploy/k8s/{name} has other files than `geoserve k8s --topology "
        f"topologies/{name}.yaml` writes: {sorted(on_disk ^ set(files))}")
    stale = [rel for rel, text in files.items() if (root / rel).read_text() != text]
    assert not stale, (f"deploy/k8s/{name} is stale ({stale[:3]}...): run "
                       f"`geoserve k8s --topology topologies/{name}.yaml`")


def test_cli_writes_the_same_tree(tmp_path):
    from services.cli import main

    assert main(["k8s", "--topology", "small", "--out", str(tmp_path)]) == 0
    for path in (K8S_DIR / "small").rglob("*"):
        if path.is_file():
            rel = path.relative_to(K8S_DIR / "small")
            assert (tmp_path / rel).read_text() == path.read_text(), rel


def test_render_is_deterministic(topos):
    assert k8s.render_k8s(topos["small"]) == k8s.render_k8s(load_topology(ROOT / "topologies"
                                                                          / "small.yaml"))


# ---------------------------------------------------------------- structure


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_one_workload_and_service_per_process(topos, name):
    topo = topos[name]
    docs = _base_docs(name)
    expected = _expected(topo)
    deployments = _by_kind(docs, "Deployment")
    assert set(deployments) == {n for n, kind in expected.items() if kind != "loadgen"}
    assert set(_by_kind(docs, "Job")) == {"loadgen"}
    services = _by_kind(docs, "Service")
    assert set(services) == set(expected)
    assert ("carm" in deployments) == (topo.carm is not None)
    for n, d in deployments.items():
        assert d["spec"]["replicas"] == 1
        assert d["spec"]["template"]["metadata"]["labels"][k8s.LABEL_COMPONENT] == expected[n]
    for n, svc in services.items():
        assert svc["spec"]["type"] == "ClusterIP"
        ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
        assert ports == (PORTS if n != "loadgen" else {"metrics": 9100}), n
        pod = (deployments.get(n) or _by_kind(docs, "Job")[n])["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items(), n
        container_ports = {p["name"]: p["containerPort"] for p in _main({"spec": {
            "template": pod}})["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(container_ports), n


def test_carm_only_with_a_carm_section():
    joint = load_topology(ROOT / "topologies" / "joint.yaml")
    assert joint.carm is not None
    files = k8s.render_k8s(joint)
    assert "base/carm.yaml" in files
    docs = _docs(files["base/carm.yaml"])
    assert {d["kind"] for d in docs} == {"Deployment", "Service"}   # no PDB for CA-RM
    carm = _by_kind(docs, "Deployment")["carm"]
    assert _main(carm)["args"] == ["carm", "--topology", compose.TOPOLOGY_MOUNT]
    assert _env(_main(carm))["DC_ADDRS"] == ",".join(
        f"{d.name}=dc-{d.name}:50051" for d in joint.dcs)
    prov = _by_kind(_docs(files["base/provisioner.yaml"]), "Deployment")["provisioner"]
    assert _pod(prov)["initContainers"][0]["args"][4:] == [
        *(f"dc-{d.name}:50051" for d in joint.dcs), "carm:50051"]
    assert not any("carm" in rel for rel in k8s.render_k8s(load_topology(
        ROOT / "topologies" / "small.yaml")))


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_commands_and_addresses_follow_the_topology(topos, name):
    topo = topos[name]
    docs = _base_docs(name)
    workloads = {**_by_kind(docs, "Deployment"), **_by_kind(docs, "Job")}
    mount = compose.TOPOLOGY_MOUNT

    def addrs(pairs):
        return ",".join(f"{k}={v}:50051" for k, v in pairs)

    all_dcs = addrs((d.name, f"dc-{d.name}") for d in topo.dcs)
    for d in topo.dcs:
        c = _main(workloads[f"dc-{d.name}"])
        assert c["args"] == ["datacenter", "--topology", mount, "--dc", d.name]
    prov = _main(workloads["provisioner"])
    assert prov["args"] == ["provisioner", "--topology", mount]
    assert _env(prov)["DC_ADDRS"] == all_dcs
    for r in topo.regions:
        c = _main(workloads[f"scheduler-{r.name}"])
        env = _env(c)
        assert c["args"] == ["scheduler", "--topology", mount]
        assert env["GEOSERVE_REGION"] == r.name
        assert env["DC_ADDRS"] == addrs((d.name, f"dc-{d.name}") for d in r.dcs)
        assert env["PEER_ADDRS"] == addrs((o.name, f"scheduler-{o.name}")
                                          for o in topo.regions if o is not r)
        assert env["PROVISIONER_ADDR"] == "provisioner:50051"
        assert env["GEOSERVE_POLICY"] == ""    # the topology's
    lg = _main(workloads["loadgen"])
    env = _env(lg)
    assert lg["args"] == ["loadgen", "--topology", mount]
    assert env["SCHEDULER_ADDRS"] == addrs((r.name, f"scheduler-{r.name}") for r in topo.regions)
    assert env["DC_ADDRS"] == all_dcs
    assert env["GEOSERVE_OUT"] == "/results"


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_same_names_commands_and_environment_as_compose(topos, name):
    """Every GeoServe compose service is a workload of the same name, with the same
    command (but the topology path) and environment (compose's ${VAR:-default} as the
    default, the topology path, and the epoch from the ConfigMap instead of the tmpfs)."""
    topo = topos[name]
    model = compose.compose_model(topo, ROOT)
    docs = _base_docs(name)
    workloads = {**_by_kind(docs, "Deployment"), **_by_kind(docs, "Job")}
    assert set(workloads) == set(compose.geoserve_services(topo))
    for svc_name, wl in workloads.items():
        svc = model["services"][svc_name]
        c = _main(wl)
        ref = svc["environment"]["GEOSERVE_TOPOLOGY"]
        assert [compose.TOPOLOGY_MOUNT if a == ref else a for a in svc["command"]] == c["args"]
        want = {}
        for key, value in svc["environment"].items():
            m = KNOB.match(value)
            want[key] = m.group(1) if m else value
        want.pop("GEOSERVE_EPOCH_FILE")
        want["GEOSERVE_TOPOLOGY"] = compose.TOPOLOGY_MOUNT
        got = _env(c)
        for key in ("GEOSERVE_EPOCH", "GEOSERVE_DILATION", "GEOSERVE_EXTRA_ARGS"):
            if key in got:
                assert got.pop(key)["configMapKeyRef"]["name"] == "geoserve-epoch"
                want.pop(key)
        assert got == want, svc_name


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_epoch_comes_from_the_configmap_and_nothing_else(topos, name):
    for wl in [*_by_kind(_base_docs(name), "Deployment").values(),
               *_by_kind(_base_docs(name), "Job").values()]:
        env = {e["name"]: e for e in _main(wl)["env"]}
        ref = env["GEOSERVE_EPOCH"]["valueFrom"]["configMapKeyRef"]
        assert ref == {"name": "geoserve-epoch", "key": "GEOSERVE_EPOCH", "optional": False}
        assert "GEOSERVE_EPOCH_FILE" not in env
        assert env["GEOSERVE_DILATION"]["valueFrom"]["configMapKeyRef"]["optional"] is True
    kust = (K8S_DIR / name / "base" / "kustomization.yaml").read_text()
    assert "kubectl -n geoserve create configmap geoserve-epoch" in kust
    assert "GEOSERVE_EPOCH=$(date +%s)" in kust


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_topology_configmap_is_the_source_file_mounted_where_loaded(topos, name):
    topo = topos[name]
    base = K8S_DIR / name / "base"
    assert (base / "topology.yaml").read_text() == Path(topo.path).read_text()
    kust = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert kust["namespace"] == "geoserve"
    assert kust["configMapGenerator"] == [{"name": "geoserve-topology",
                                           "files": ["topology.yaml"]}]
    mount = PurePosixPath(compose.TOPOLOGY_MOUNT)
    for wl in [*_by_kind(_base_docs(name), "Deployment").values(),
               *_by_kind(_base_docs(name), "Job").values()]:
        vol = {v["name"]: v for v in _pod(wl)["volumes"]}["topology"]["configMap"]
        assert vol["name"] == "geoserve-topology"
        assert vol["items"] == [{"key": "topology.yaml", "path": mount.name}]
        mounts = {m["name"]: m["mountPath"] for m in _main(wl)["volumeMounts"]}
        assert mounts["topology"] == str(mount.parent)
        assert _env(_main(wl))["GEOSERVE_TOPOLOGY"] == str(mount)


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_probes_pdbs_and_scrape_annotations(topos, name):
    topo = topos[name]
    docs = _base_docs(name)
    expected = _expected(topo)
    for n, d in _by_kind(docs, "Deployment").items():
        c = _main(d)
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": 50051}, (n, probe)
    job = _by_kind(docs, "Job")["loadgen"]
    assert not any(k.endswith("Probe") for k in _main(job))
    assert job["spec"]["backoffLimit"] == 0
    assert _pod(job)["restartPolicy"] == "Never"
    claim = {v["name"]: v for v in _pod(job)["volumes"]}["results"]
    assert claim["persistentVolumeClaim"]["claimName"] in _by_kind(docs, "PersistentVolumeClaim")
    pdbs = _by_kind(docs, "PodDisruptionBudget")
    assert set(pdbs) == {n for n, kind in expected.items()
                         if kind in ("datacenter", "provisioner", "scheduler")}
    workloads = {**_by_kind(docs, "Deployment"), **_by_kind(docs, "Job")}
    for n, pdb in pdbs.items():
        assert pdb["spec"]["minAvailable"] == 1
        labels = workloads[n]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for n, wl in workloads.items():
        ann = wl["spec"]["template"]["metadata"]["annotations"]
        assert ann == {"prometheus.io/scrape": "true", "prometheus.io/port": "9100",
                       "prometheus.io/path": "/metrics"}, n


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_start_order_is_compose_depends_on(topos, name):
    topo = topos[name]
    model = compose.compose_model(topo, ROOT)
    docs = _base_docs(name)
    for n, wl in {**_by_kind(docs, "Deployment"), **_by_kind(docs, "Job")}.items():
        deps = list(model["services"][n].get("depends_on", {}))
        inits = _pod(wl).get("initContainers", [])
        if not deps:
            assert not inits, n
            continue
        (init,) = inits
        assert init["args"][:2] == ["sh", "-c"] and "healthprobe" in init["args"][2]
        assert init["args"][4:] == [f"{d}:50051" for d in deps], n


def _figures_from_docs() -> dict[str, float]:
    text = (ROOT / "docs" / "performance.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| base | sync | 600 |")]
    cell = row.strip("|").split("|")[-1]
    return {k: float(v) for k, v in (part.split() for part in cell.split(","))}


def test_sizing_figures_are_those_of_docs_performance():
    assert _figures_from_docs() == k8s.WALL_CPU_US_PER_REQUEST


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_resources_follow_the_sizing_rule(topos, name):
    topo = topos[name]
    figures = _figures_from_docs()
    rate = topo.load.rate_rps
    count = {"datacenter": len(topo.dcs), "scheduler": len(topo.regions)}
    docs = _base_docs(name)
    for n, kind in _expected(topo).items():
        wl = {**_by_kind(docs, "Deployment"), **_by_kind(docs, "Job")}[n]
        res = _main(wl)["resources"]
        cores = rate / count.get(kind, 1) * figures[kind] * 1e-6
        want = max(100, math.ceil(cores * 100 - 1e-9) * 10)
        assert res["requests"]["cpu"] == f"{want}m", n
        assert res["limits"]["cpu"] == f"{max(2 * want, 1000)}m", n
        if kind == "loadgen":
            mib = 128 + math.ceil(rate * topo.load.duration_s * 1.1 * 1024 / 2**20 - 1e-9)
            assert res["requests"]["memory"] == f"{mib}Mi"
            assert res["limits"]["memory"] == f"{2 * mib}Mi"
        else:
            assert res["requests"]["memory"] == "128Mi" and res["limits"]["memory"] == "512Mi"
        # the figure is cited in the file
        text = (K8S_DIR / name / "base" / f"{n}.yaml").read_text()
        assert f"{figures[kind]:g} µs/request" in text and "docs/performance.md" in text
    if name == "small":  # 12 req/s: every service at the floor
        assert {_main(w)["resources"]["requests"]["cpu"]
                for w in _by_kind(docs, "Deployment").values()} == {"100m"}


def test_names_that_are_no_service_names_are_refused(tmp_path):
    from services.model.errors import InvalidInput

    text = (ROOT / "topologies" / "small.yaml").read_text().replace("name: eu-nl",
                                                                     "name: eu_nl")
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput, match="Kubernetes Service name"):
        k8s.render_k8s(load_topology(path, check_ci=False))


# ---------------------------------------------------------------- kustomize + schemas


def test_every_object_is_namespaced_in_geoserve(rendered):
    for (topo, kust), docs in rendered.items():
        for d in docs:
            if d["kind"] == "Namespace":
                assert d["metadata"]["name"] == "geoserve"
            else:
                assert d["metadata"].get("namespace") == "geoserve", (topo, kust, d["kind"])


def _schema_versions() -> list[str]:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install 'kubernetes-validate"
                    ">=1.31' (it is in the dev extras: pip install -e '.[dev]')",
                    pytrace=False)
    latest = kubernetes_validate.latest_version()

    def minor(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    # kubectl's minor here and in CI (1.32), and the newest the installed package ships
    return sorted({v for v in ("1.32", latest) if minor(v) <= minor(latest)}, key=minor)


def test_every_rendered_object_passes_the_kubernetes_schemas(rendered):
    import kubernetes_validate as kv

    versions = _schema_versions()
    seen: set[str] = set()
    crds = []
    for (topo, kust), docs in rendered.items():
        for d in docs:
            if d["apiVersion"].startswith("monitoring.coreos.com/"):
                crds.append(d)   # CRD objects: not in the schemas (checked below)
                continue
            key = json.dumps(d, sort_keys=True)
            if key in seen:       # overlays repeat most of the base
                continue
            seen.add(key)
            for v in versions:
                try:
                    kv.validate(d, v, strict=True)
                except kv.ValidationError as exc:
                    pytest.fail(f"{topo}/{kust}: {d['kind']} {d['metadata']['name']} is "
                                f"invalid for Kubernetes {v}: {exc}")
    for path in K8S_DIR.glob("*/results-reader.yaml"):
        for d in _docs(path.read_text()):
            for v in versions:
                kv.validate(d, v, strict=True)
    assert {d["kind"] for d in crds} == {"ServiceMonitor", "PrometheusRule"}


def test_prometheus_operator_objects(rendered, topos):
    """ServiceMonitor and PrometheusRule are CRD objects, absent from kubernetes-validate's
    schemas: checked here by structure against the Services they select."""
    for name in TOPOLOGIES:
        docs = rendered[name, "overlays/prometheus-operator"]
        (sm,) = _by_kind(docs, "ServiceMonitor").values()
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        match = sm["spec"]["selector"]["matchLabels"]
        selected = [s for s in _by_kind(docs, "Service").values()
                    if match.items() <= s["metadata"]["labels"].items()]
        assert {s["metadata"]["name"] for s in selected} == set(_expected(topos[name]))
        (ep,) = sm["spec"]["endpoints"]
        assert ep["port"] == "metrics" and ep["path"] == "/metrics"
        assert all("metrics" in {p["name"] for p in s["spec"]["ports"]} for s in selected)
        (rule,) = _by_kind(docs, "PrometheusRule").values()
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["spec"]["groups"] == yaml.safe_load(prometheus.recording_rules())["groups"]
        assert all(r.get("record") and r.get("expr") for g in rule["spec"]["groups"]
                   for r in g["rules"])


def test_mtls_overlay_gives_every_geoserve_container_the_secret(rendered, topos):
    for name in TOPOLOGIES:
        docs = rendered[name, "overlays/mtls"]
        base = rendered[name, "base"]
        workloads = {**_by_kind(docs, "Deployment"), **_by_kind(docs, "Job")}
        assert set(workloads) == set(_expected(topos[name]))
        for n, wl in workloads.items():
            pod = _pod(wl)
            vols = {v["name"]: v for v in pod["volumes"]}
            assert vols["geoserve-tls"]["secret"]["secretName"] == "geoserve-tls"
            for c in [*pod["containers"], *pod.get("initContainers", [])]:
                env = _env(c)
                assert {env[f"GEOSERVE_TLS_{k}"] for k in ("CERT", "KEY", "CA")} == {
                    "/run/geoserve-tls/cert.pem", "/run/geoserve-tls/key.pem",
                    "/run/geoserve-tls/ca.pem"}, (n, c["name"])
                assert {"name": "geoserve-tls", "mountPath": "/run/geoserve-tls",
                        "readOnly": True} in c["volumeMounts"], (n, c["name"])
            c = _main(wl)
            if n == "loadgen":
                assert not any(k.endswith("Probe") for k in c)
            else:  # the kubelet's gRPC probe has no TLS: the health probe over TLS
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    assert "grpc" not in c[probe]
                    assert c[probe]["exec"]["command"][-1] == "services.runtime.healthprobe"
        # nothing else changes
        strip = {"Deployment", "Job"}
        assert [d for d in docs if d["kind"] not in strip] == [
            d for d in base if d["kind"] not in strip]


def test_swap_overlay_changes_one_scheduler(rendered, topos):
    for name in TOPOLOGIES:
        region = topos[name].regions[0].name
        swapped = _by_kind(rendered[name, "overlays/swap-scheduler-example"], "Deployment")
        base = _by_kind(rendered[name, "base"], "Deployment")
        changed = [n for n in base if base[n] != swapped[n]]
        assert changed == [f"scheduler-{region}"]
        c, b = _main(swapped[changed[0]]), _main(base[changed[0]])
        image, tag = k8s.IMAGE.rsplit(":", 1)
        assert c["image"] == f"{image}:{tag}"       # images: maps my-scheduler to a build
        assert _env(c)["GEOSERVE_POLICY"] == "greedy" and _env(b)["GEOSERVE_POLICY"] == ""
        assert {k: v for k, v in _env(c).items() if "POLICY" not in k} == {
            k: v for k, v in _env(b).items() if "POLICY" not in k}
        overlay = K8S_DIR / name / "overlays" / "swap-scheduler-example"
        kust = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        assert kust["images"][0]["name"] == "my-scheduler"
        patch = yaml.safe_load((overlay / f"scheduler-{region}.yaml").read_text())
        assert patch["spec"]["template"]["spec"]["containers"][0]["image"] == "my-scheduler"


def test_grafana_overlay_ships_the_committed_provisioning(rendered, topos):
    committed = {rel: (ROOT / "deploy" / "grafana" / rel).read_text()
                 for rel in dashboards.generated_files()}
    for name in TOPOLOGIES:
        docs = rendered[name, "overlays/grafana"]
        maps = {re.sub(r"-[a-z0-9]{10}$", "", n): cm
                for n, cm in _by_kind(docs, "ConfigMap").items()}
        data = {**maps["grafana-dashboards"]["data"], **maps["grafana-datasources"]["data"],
                **maps["grafana-dashboard-providers"]["data"]}
        assert {PurePosixPath(rel).name: text for rel, text in committed.items()} == data
        cfg = yaml.safe_load(maps["prometheus-config"]["data"]["prometheus.yml"])
        targets = {t for job in cfg["scrape_configs"] for sc in job["static_configs"]
                   for t in sc["targets"]}
        assert targets == {f"{n}:9100" for n in _expected(topos[name])}
        deployments = _by_kind(docs, "Deployment")
        assert {"prometheus", "grafana"} <= set(deployments)
        ds = yaml.safe_load(data["prometheus.yml"])["datasources"][0]["url"]
        assert ds == f"http://prometheus:{compose.PROMETHEUS_PORT}"
        assert "prometheus" in _by_kind(docs, "Service")
