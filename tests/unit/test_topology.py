"""Topology validation: every error names the file, the key path at fault and what was
expected; shipped topologies load; CLI overrides validate; the CLI exits 2 on a bad file.

Each bad topology is a small valid one with one fault, written as YAML into ``tmp_path``
and loaded through `load_topology`, exactly as the services and the CLI load them.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.config.topology import ROOT, TOPOLOGY_DIR, Topology, load_topology
from services.model.errors import ConfigError, GeoServeError, InvalidInput

_GEOSERVE = Path(sys.executable).parent / "geoserve"
# the installed console script; `python -m services.cli` where it is not installed
GEOSERVE = [str(_GEOSERVE)] if _GEOSERVE.exists() else [sys.executable, "-m", "services.cli"]

# A valid two-region topology with constant CI (no trace files needed).
BASE: dict[str, Any] = {
    "name": "unit-tiny",
    "defaults": {
        "dc": {"nodes": 1, "gpus_per_node": 2, "setup": "a100-40gb/llama-3.1-8b-tp1",
               "pue": 1.1},
        "scheduler": {"policy": "round-robin", "window_s": 0.1, "window_max": 300},
    },
    "regions": [
        {
            "name": "eu-north",
            "aws_region": "eu-north-1",
            "dcs": [
                {"name": "eu-a", "zone": "NL", "ci": {"constant": 300}},
                {"name": "eu-b", "zone": "LT", "ci": {"constant": 200}},
            ],
        },
        {
            "name": "us-east",
            "aws_region": "us-east-1",
            "dcs": [{"name": "us-a", "zone": "US-MIDA-PJM", "ci": {"constant": 400}}],
        },
    ],
    "provisioner": {"period_s": 0.5, "mode": "sync"},
    "load": {"rate_rps": 6, "dataset": "cnn-dailymail", "duration_s": 20, "warmup_s": 0,
             "seed": 1, "arrivals": "poisson"},
    "emulation": {"dilation": 1.0},
}


def write(tmp_path: Path, data: Any, name: str = "topo.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def mutated(fn: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    fn(d)
    return d


def load_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load_topology(path)
    return ei.value


# ------------------------------------------------------------------------------ valid
def test_base_topology_is_valid(tmp_path: Path) -> None:
    topo = load_topology(write(tmp_path, BASE))
    assert [r.name for r in topo.regions] == ["eu-north", "us-east"]
    assert [d.name for d in topo.dcs] == ["eu-a", "eu-b", "us-a"]
    assert topo.dc("eu-b").region == "eu-north"
    assert topo.dc("eu-a").gpus_per_node == 2  # from defaults.dc
    assert topo.provisioner.period_s == 0.5
    assert topo.load.rate_rps == 6.0
    assert topo.rtt_s[("eu-north", "eu-north")] == 0.0
    # the two AWS regions are an ocean apart: tens to hundreds of milliseconds, symmetric
    rtt = topo.rtt_s[("eu-north", "us-east")]
    assert 0.03 < rtt < 0.3
    assert topo.rtt_s[("us-east", "eu-north")] == rtt


def test_rtt_override_applies_to_both_directions(tmp_path: Path) -> None:
    d = mutated(lambda d: d.update(network={"rtt_ms": {"eu-north--us-east": 250}}))
    topo = load_topology(write(tmp_path, d))
    assert topo.rtt_s[("eu-north", "us-east")] == pytest.approx(0.25)
    assert topo.rtt_s[("us-east", "eu-north")] == pytest.approx(0.25)


def test_peer_projection_default_and_override(tmp_path: Path) -> None:
    topo = load_topology(write(tmp_path, BASE))
    assert all(r.scheduler.project_peers for r in topo.regions)
    d = mutated(lambda d: d["regions"][1].update(scheduler={"project_peers": False}))
    topo = load_topology(write(tmp_path, d, "off.yaml"))
    assert [r.scheduler.project_peers for r in topo.regions] == [True, False]
    assert [r.scheduler.project_peers
            for r in topo.with_overrides(project_peers=False).regions] == [False, False]


SHIPPED = sorted(TOPOLOGY_DIR.glob("*.yaml"))


def test_some_topologies_are_shipped() -> None:
    assert SHIPPED, f"no topology in {TOPOLOGY_DIR}"
    assert (TOPOLOGY_DIR / "small.yaml") in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_topology_loads(path: Path) -> None:
    topo = load_topology(path)
    assert topo.regions and topo.dcs
    names = [d.name for d in topo.dcs]
    assert len(names) == len(set(names))
    for a in topo.regions:
        for b in topo.regions:
            assert (a.name, b.name) in topo.rtt_s
    assert topo.load.rate_rps > 0 and topo.dilation >= 1


def test_topology_by_name() -> None:
    assert load_topology("small").path == str(TOPOLOGY_DIR / "small.yaml")


# ------------------------------------------------------------------------------ errors
# (case id, mutation, key path the error must name, words saying what was expected)
CASES: list[tuple[str, Callable[[dict[str, Any]], object], str, tuple[str, ...]]] = [
    ("missing-regions", lambda d: d.pop("regions"), "regions", ("list",)),
    ("empty-regions", lambda d: d.update(regions=[]), "regions", ("non-empty",)),
    ("region-without-dcs", lambda d: d["regions"][1].pop("dcs"), "regions[1].dcs", ("list",)),
    ("region-empty-dcs", lambda d: d["regions"][1].update(dcs=[]), "regions[1].dcs",
     ("non-empty",)),
    ("nodes-not-int", lambda d: d["regions"][0]["dcs"][1].update(nodes="two"),
     "regions[0].dcs[1].nodes", ("integer", "two")),
    ("nodes-float", lambda d: d["regions"][0]["dcs"][1].update(nodes=1.5),
     "regions[0].dcs[1].nodes", ("integer",)),
    ("nodes-zero", lambda d: d["regions"][0]["dcs"][1].update(nodes=0),
     "regions[0].dcs[1].nodes", (">= 1",)),
    ("unknown-key-dc", lambda d: d["regions"][0]["dcs"][1].update(gpus=2),
     "regions[0].dcs[1].gpus", ("unknown key", "gpus_per_node")),
    ("unknown-key-top", lambda d: d.update(regoins=[]), "regoins", ("unknown key", "regions")),
    ("unknown-key-scheduler", lambda d: d["regions"][1].update(scheduler={"polcy": "x"}),
     "regions[1].scheduler.polcy", ("unknown key", "policy")),
    ("project-peers-not-bool",
     lambda d: d["regions"][1].update(scheduler={"project_peers": "yes"}),
     "regions[1].scheduler.project_peers", ("true or false", "yes")),
    ("unknown-setup", lambda d: d["regions"][0]["dcs"][1].update(setup="h100/nope-tp1"),
     "regions[0].dcs[1].setup", ("h100/nope-tp1", "a100-40gb/llama-3.1-8b-tp1")),
    ("gpus-not-multiple-of-tp",
     lambda d: d["regions"][0]["dcs"][1].update(setup="a100-40gb/llama-3.1-8b-tp2",
                                                gpus_per_node=3),
     "regions[0].dcs[1].gpus_per_node", ("multiple", "2")),
    ("unknown-dataset", lambda d: d["load"].update(dataset="no-such-set"), "load.dataset",
     ("unknown dataset", "cnn-dailymail")),
    ("unknown-arrivals", lambda d: d["load"].update(arrivals="fractal"), "load.arrivals",
     ("poisson",)),
    ("origin-unknown-region", lambda d: d["load"].update(origin={"eu-north": 1, "atlantis": 1}),
     "load.origin.atlantis", ("unknown region", "us-east")),
    ("origin-negative-weight", lambda d: d["load"].update(origin={"eu-north": -1}),
     "load.origin.eu-north", (">= 0",)),
    ("negative-rate", lambda d: d["load"].update(rate_rps=-5), "load.rate_rps", ("> 0",)),
    ("zero-rate", lambda d: d["load"].update(rate_rps=0), "load.rate_rps", ("> 0",)),
    ("rate-not-number", lambda d: d["load"].update(rate_rps="fast"), "load.rate_rps",
     ("number",)),
    ("negative-duration", lambda d: d["load"].update(duration_s=-1), "load.duration_s",
     ("> 0",)),
    ("dilation-below-1", lambda d: d.update(emulation={"dilation": 0.5}), "emulation.dilation",
     (">= 1",)),
    ("zero-period", lambda d: d["provisioner"].update(period_s=0), "provisioner.period_s",
     ("> 0",)),
    ("bad-poll-mode", lambda d: d["provisioner"].update(mode="sometimes"), "provisioner.mode",
     ("sync", "async")),
    ("duplicate-dc", lambda d: d["regions"][1]["dcs"][0].update(name="eu-a"),
     "regions[1].dcs[0].name", ("duplicate",)),
    ("dc-without-ci", lambda d: d["regions"][1]["dcs"][0].pop("ci"), "regions[1].dcs[0].ci",
     ("constant", "trace")),
    ("rtt-override-unknown-region",
     lambda d: d.update(network={"rtt_ms": {"eu-north--mars": 10}}),
     "network.rtt_ms.eu-north--mars", ("known regions",)),
]


@pytest.mark.parametrize(("mutate", "key", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_error_names_file_key_and_expectation(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], key: str, words: tuple[str, ...]
) -> None:
    path = write(tmp_path, mutated(mutate))
    err = load_error(path)
    text = str(err)
    assert err.path == str(path)
    assert text.startswith(str(path))
    assert key in text, f"key path {key!r} not in {text!r}"
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"


def test_error_is_invalid_input(tmp_path: Path) -> None:
    # runtimes map InvalidInput to INVALID_ARGUMENT / exit 2
    err = load_error(write(tmp_path, mutated(lambda d: d["load"].update(rate_rps=-1))))
    assert isinstance(err, InvalidInput) and isinstance(err, GeoServeError)


def test_not_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    text = str(load_error(p))
    assert str(p) in text and "mapping" in text


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.yaml"
    p.write_text("")
    text = str(load_error(p))
    assert str(p) in text and "mapping" in text


def test_invalid_yaml(tmp_path: Path) -> None:
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nregions:\n  - name: [a\n    b: c\n")
    text = str(load_error(p))
    assert str(p) in text
    assert "YAML" in text
    assert "line 3" in text  # where the parser found the fault


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.yaml"
    err = load_error(p)
    assert str(p) in str(err)
    assert "No such file" in str(err) or "cannot read" in str(err)


def test_missing_name_in_topologies_dir() -> None:
    err = load_error(Path("no-such-topology-name"))
    assert "no-such-topology-name" in str(err)


@pytest.mark.parametrize(("mutate", "key"), [
    (lambda d: d["defaults"]["dc"].update(gpu="a100"), "defaults.dc.gpu"),
    (lambda d: d["defaults"]["dc"].update(nodes="x"), "defaults.dc.nodes"),
    (lambda d: d["defaults"]["scheduler"].update(polcy="x"), "defaults.scheduler.polcy"),
], ids=["dc-unknown-key", "dc-bad-value", "scheduler-unknown-key"])
def test_fault_in_defaults_named_there(tmp_path: Path, mutate: Callable[[dict[str, Any]], object],
                                       key: str) -> None:
    path = write(tmp_path, mutated(mutate))
    text = str(load_error(path))
    assert text.startswith(str(path))
    assert key in text


def test_fault_in_defaults_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, mutated(lambda d: d["defaults"]["dc"].update(gpu="a100")))
    text = str(load_error(path))
    assert text.startswith(str(path)) and "gpu" in text and "unknown key" in text


# Errors raised by helpers the topology delegates to (RTT matrix, CI sources) must still
# name the topology file and the key path in it.
def test_unknown_aws_region(tmp_path: Path) -> None:
    path = write(tmp_path, mutated(lambda d: d["regions"][1].update(aws_region="mars-1")))
    text = str(load_error(path))
    assert text.startswith(str(path))
    assert "mars-1" in text and "us-east-1" in text  # the bad value and the known ones
    assert "regions[1].aws_region" in text


def test_unknown_aws_region_names_file_and_value(tmp_path: Path) -> None:
    path = write(tmp_path, mutated(lambda d: d["regions"][1].update(aws_region="mars-1")))
    text = str(load_error(path))
    assert text.startswith(str(path))
    assert "mars-1" in text and "eu-north-1" in text


def test_ci_trace_unknown_zone(tmp_path: Path) -> None:
    path = write(tmp_path, mutated(
        lambda d: d["regions"][1]["dcs"][0].update(ci={"trace": "auto", "zone": "XX-NOPE"})))
    text = str(load_error(path))
    assert text.startswith(str(path))
    assert "regions[1].dcs[0].ci" in text
    assert "XX-NOPE" in text and "NL" in text  # the bad zone and the known ones


@pytest.mark.parametrize("ci", [{"constant": -3}, {"solar": 3}], ids=["negative", "unknown-kind"])
def test_bad_ci_config_key_path(tmp_path: Path, ci: dict[str, Any]) -> None:
    path = write(tmp_path, mutated(lambda d: d["regions"][1]["dcs"][0].update(ci=ci)))
    text = str(load_error(path))
    assert text.startswith(str(path))
    assert "regions[1].dcs[0].ci" in text


@pytest.mark.parametrize(("ci", "words"), [
    ({"constant": -3}, ("constant", ">= 0")),
    ({"solar": 3}, ("constant", "trace")),
    ({"constant": 3, "zone": "NL"}, ("zone",)),
], ids=["negative", "unknown-kind", "extra-key"])
def test_bad_ci_config_names_file_and_dc(tmp_path: Path, ci: dict[str, Any],
                                         words: tuple[str, ...]) -> None:
    path = write(tmp_path, mutated(lambda d: d["regions"][1]["dcs"][0].update(ci=ci)))
    text = str(load_error(path))
    assert text.startswith(str(path))
    assert "us-a" in text or "regions[1].dcs[0]" in text
    for w in words:
        assert w in text


# ------------------------------------------------------------------------------ overrides
@pytest.fixture
def base_topo(tmp_path: Path) -> Topology:
    return load_topology(write(tmp_path, BASE))


def test_overrides_apply_and_leave_original(base_topo: Topology) -> None:
    t = base_topo.with_overrides(policy="least-loaded", rate_rps=3.5, duration_s=7,
                                 dilation=2.0, seed=9, warmup_s=0.5)
    assert {r.scheduler.policy for r in t.regions} == {"least-loaded"}
    assert (t.load.rate_rps, t.load.duration_s, t.dilation, t.load.seed, t.load.warmup_s) == (
        3.5, 7, 2.0, 9, 0.5)
    assert {r.scheduler.policy for r in base_topo.regions} == {"round-robin"}
    assert base_topo.load.rate_rps == 6.0 and base_topo.dilation == 1.0
    assert base_topo.with_overrides() == base_topo


@pytest.mark.parametrize("kw", [
    {"rate_rps": 0.0}, {"rate_rps": -1.0}, {"rate_rps": float("nan")},
    {"duration_s": 0.0}, {"duration_s": -3.0},
    {"dilation": 0.99}, {"dilation": 0.0}, {"dilation": float("nan")},
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_bad_overrides_rejected(base_topo: Topology, kw: dict[str, float]) -> None:
    with pytest.raises(InvalidInput) as ei:
        base_topo.with_overrides(**kw)  # type: ignore[arg-type]
    name = next(iter(kw)).split("_")[0]
    assert name in str(ei.value)


def test_dilation_one_is_allowed(base_topo: Topology) -> None:
    assert base_topo.with_overrides(dilation=1.0).dilation == 1.0


# ------------------------------------------------------------------------------ CLI
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GEOSERVE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.parametrize("cmd", ["sim", "run"])
def test_cli_exits_2_naming_the_fault(tmp_path: Path, cmd: str) -> None:
    path = write(tmp_path, mutated(lambda d: d["regions"][0]["dcs"][1].update(nodes="two")))
    r = _cli(cmd, "--topology", str(path), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert str(path) in r.stderr
    assert "regions[0].dcs[1].nodes" in r.stderr
    assert "integer" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "logs").exists()  # no service was started


def test_cli_bad_rate_override_exits_2(tmp_path: Path) -> None:
    r = _cli("sim", "--topology", str(write(tmp_path, BASE)), "--rate", "-2",
             "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert "rate" in r.stderr and "Traceback" not in r.stderr


def test_cli_missing_topology_exits_2(tmp_path: Path) -> None:
    p = tmp_path / "missing.yaml"
    r = _cli("sim", "--topology", str(p), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert str(p) in r.stderr and "Traceback" not in r.stderr


# Policy settings are validated with the topology, before any process starts, and the
# error names the file and the key path (not a later TypeError in a scheduler's log).
@pytest.mark.parametrize(("scheduler", "key", "words"), [
    ({"policy": "no-such-policy"}, "defaults.scheduler.policy", ("unknown policy",)),
    ({"policy": "greedy", "policy_config": {"alpha": "x"}},
     "defaults.scheduler.policy_config.alpha", ("expected a number", "'x'")),
    ({"policy": "greedy", "policy_config": {"alpha": float("nan")}},
     "defaults.scheduler.policy_config.alpha", ("finite",)),
    ({"policy": "greedy", "policy_config": {"alpha": 2.0}},
     "defaults.scheduler.policy_config", ("alpha must be in [0, 1]", "2.0")),
    ({"policy": "greedy", "policy_config": {"beta": 1}},
     "defaults.scheduler.policy_config", ("unknown setting", "beta", "alpha")),
    ({"policy": "facility-milp", "policy_config": {"time_limit_s": True}},
     "defaults.scheduler.policy_config.time_limit_s", ("expected a number",)),
], ids=["unknown-policy", "wrong-type", "nan", "out-of-range", "unknown-key", "bool"])
def test_policy_settings_checked_with_the_topology(tmp_path: Path, scheduler: dict[str, Any],
                                                   key: str, words: tuple[str, ...]) -> None:
    path = write(tmp_path, mutated(lambda d: d["defaults"]["scheduler"].update(scheduler)))
    text = str(load_error(path))
    assert text.startswith(f"{path}: {key}:"), text
    for w in words:
        assert w in text, text


def test_policy_override_checked_and_named_by_its_flag() -> None:
    topo = load_topology("small")
    with pytest.raises(InvalidInput, match=r"^--policy-config\.alpha: expected a number"):
        topo.with_overrides(policy="greedy", policy_config={"alpha": "high"})
    with pytest.raises(InvalidInput, match=r"^--policy: unknown policy 'nope'"):
        topo.with_overrides(policy="nope")


def test_run_refuses_bad_policy_settings_before_starting_anything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([*GEOSERVE, "run", "--topology", "small", "--policy", "greedy",
                           "--policy-config", "alpha=2", "--duration", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--policy-config: policy 'greedy': alpha must be in [0, 1], got 2" in proc.stderr
    assert not (out / "logs").exists()  # no service was started


# Finite numbers only, upper bounds on counts, names safe for flags and addresses, and a
# plan too large for memory refused with an estimate — each naming the file and key path.
@pytest.mark.parametrize(("mutate", "key", "words"), [
    (lambda d: d["defaults"]["dc"].update(pue=float("nan")), "defaults.dc.pue", ("finite",)),
    (lambda d: d.update(load={"rate_rps": float("inf")}), "load.rate_rps", ("finite",)),
    (lambda d: d.update(emulation={"dilation": float("inf")}), "emulation.dilation",
     ("finite",)),
    (lambda d: d["regions"][0]["dcs"][0].update(nodes=10**9), "regions[0].dcs[0].nodes",
     ("<= 4096",)),
    (lambda d: d["defaults"]["dc"].update(gpus_per_node=10**9), "defaults.dc.gpus_per_node",
     ("<= 64",)),
    (lambda d: d["regions"][0]["dcs"][0].update(name="eu,a=b"), "regions[0].dcs[0].name",
     ("'eu,a=b'",)),
    (lambda d: d["regions"][1].update(name="us east"), "regions[1].name", ("'us east'",)),
    (lambda d: d.update(load={"rate_rps": 1e9, "duration_s": 60}), "load.rate_rps",
     ("60,000,000,000 requests", "GiB", "at most 20,000,000")),
    (lambda d: [r["dcs"][0].update(nodes=4096, gpus_per_node=64) for r in d["regions"]],
     "regions", ("engines in all", "at most 65,536")),
], ids=["nan-pue", "inf-rate", "inf-dilation", "nodes-1e9", "gpus-1e9", "dc-name-comma",
        "region-name-space", "plan-too-large", "too-many-engines"])
def test_bounds_named_with_file_and_key(tmp_path: Path, mutate, key: str,
                                        words: tuple[str, ...]) -> None:
    path = write(tmp_path, mutated(mutate))
    text = str(load_error(path))
    assert text.startswith(f"{path}: {key}:"), text
    for w in words:
        assert w in text, text


@pytest.mark.parametrize(("kw", "flag"), [
    ({"rate_rps": float("nan")}, "--rate"), ({"duration_s": float("inf")}, "--duration"),
    ({"dilation": float("inf")}, "--dilation"), ({"warmup_s": -1.0}, "--warmup"),
    ({"rate_rps": 1e9}, "--rate / --duration"),
])
def test_cli_overrides_bounded_and_named_by_flag(kw: dict[str, float], flag: str) -> None:
    with pytest.raises(InvalidInput) as ei:
        load_topology("small").with_overrides(**kw)
    assert ei.value.field == flag


def test_bad_ci_start_hours_name_the_topology(tmp_path: Path) -> None:
    top = (ROOT / "topologies" / "small.yaml").read_text()
    p1 = tmp_path / "top.yaml"
    p1.write_text(top.replace('ci_start_hour: "2022-06-01T12:00Z"', "ci_start_hour: yesterday"))
    assert str(load_error(p1)).startswith(f"{p1}: ci_start_hour: expected an ISO UTC hour")
    p2 = tmp_path / "dc.yaml"
    p2.write_text(top.replace("{name: eu-nl, zone: NL, ci: {trace: auto}}",
                              "{name: eu-nl, zone: NL, ci: {trace: auto, start_hour: yesterday}}"))
    text = str(load_error(p2))
    assert text.startswith(f"{p2}: regions[0].dcs[0].ci.start_hour: not an ISO timestamp")
