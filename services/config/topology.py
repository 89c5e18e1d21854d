"""Topology files: regions, schedulers, datacenters, network, load and emulation settings.

Rules
-----
* One YAML file describes a whole run (see ``topologies/*.yaml``). It is validated on
  load; every error is a `ConfigError` naming the file and the dotted key path (list
  items by index, e.g. ``regions[1].dcs[0].nodes``) and what was expected.
* Defaults follow paper 1 Table II: SLO TTFT 3 s / TPOT 100 ms, Δp = 1 s sync polling,
  Δw = 100 ms or 300 requests, PUE 1.1, 4 nodes x 8 GPUs per DC.
* The RTT matrix comes from the CloudPing p50 file through each region's ``aws_region``
  (``services.config.rtt``); ``network.rtt_ms`` entries override single pairs.
* Carbon intensity per DC: ``{constant: g}``, an hourly Electricity Maps trace
  (``{trace: auto|path, zone: NL, start_hour: ...}``), or a provider's file at 5-minute to
  hourly steps (``format: emaps-csv | emaps-json | watttime-csv``,
  ``services.model.signals``); ``ci_start_hour`` at the top level is the default start of
  every trace (an hour index of hourly traces; give sub-hourly ones an ISO time).
* ``carm:`` (optional, paper 2 in the emulator) configures the CA-RM controller: slot length
  and horizon, formulation (``performance``: Problem 2, the default; ``carbon``: Problem 1;
  ``ppc``: Problem 3), renewable emission factor, the hour of the renewable trace day at emulated
  t = 0, and per DC (a value for all DCs, overridden under ``carm.dcs.<name>``) the PV and
  wind peak power and the training cluster (nodes and a job set); ``control: none`` keeps
  the supply and the jobs but no CA-RM (top clock, training as soon as it can, the reference
  of experiments); ``ci_forecast_error`` gives the planner's grid CI forecast a relative
  error (0: the trace). Absent: ``Topology.carm`` is None and nothing changes.
* CLI overrides (policy, rate, duration, dilation) return a new frozen `Topology`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from services.config.calibration import load_calibration
from services.model.errors import ConfigError, InvalidInput

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY_DIR = ROOT / "topologies"


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 3.0
    tpot_s: float = 0.1


@dataclass(frozen=True)
class DcSpec:
    name: str
    region: str
    zone: str
    nodes: int
    gpus_per_node: int
    setup: str
    pue: float
    ci: Any                       # raw CI config, built by services.model.carbon
    routing: str = "round-robin"
    max_queue_per_engine: int = 4096


@dataclass(frozen=True)
class SchedulerSpec:
    policy: str = "round-robin"
    policy_config: Mapping[str, Any] = field(default_factory=dict)
    window_s: float = 0.1
    window_max: int = 300
    osl_mode: str = "oracle"      # oracle | predicted
    staleness_s: float = 5.0      # snapshot age past which the scheduler falls back to RR
    deadline_s: float = 2.0       # deadline for peer/DC calls before local fallback
    project_dispatches: bool = True  # add own dispatches since the snapshot to its state
    project_peers: bool = True    # ... once per regional scheduler (peers route alike)


_SCHEDULER_DEFAULTS = SchedulerSpec()  # the validator's defaults are the spec's


@dataclass(frozen=True)
class RegionSpec:
    name: str
    aws_region: str
    scheduler: SchedulerSpec
    dcs: tuple[DcSpec, ...]


@dataclass(frozen=True)
class LoadSpec:
    rate_rps: float = 10.0
    dataset: str = "cnn-dailymail"
    duration_s: float = 60.0
    warmup_s: float = 5.0
    seed: int = 1
    arrivals: str = "poisson"
    origin: str | Mapping[str, float] = "round-robin"
    model: str = ""


@dataclass(frozen=True)
class ProvisionerSpec:
    period_s: float = 1.0
    mode: str = "sync"            # sync: poll all DCs at once; async: staggered


@dataclass(frozen=True)
class CarmJobSpec:
    """One deferrable training job; times in emulated seconds from the run's start."""

    model: str
    epochs: float
    arrival_s: float
    deadline_s: float


@dataclass(frozen=True)
class CarmTrainingSpec:
    """A DC's training cluster: explicit ``jobs``, or ``count`` jobs drawn from ``workload``
    (a mix of ``data/carm/workloads.yaml``) with epochs x ``epochs_scale``, arrival uniform in
    ``arrival_s`` and deadline = arrival + uniform in ``deadline_s``."""

    nodes: int = 0
    workload: str = "light"
    count: int = 0
    epochs_scale: float = 0.05
    arrival_s: tuple[float, float] = (0.0, 0.0)
    deadline_s: tuple[float, float] = (3600.0, 7200.0)
    jobs: tuple[CarmJobSpec, ...] = ()
    max_workers_per_job: int = 8


@dataclass(frozen=True)
class CarmDcSpec:
    dc: str
    pv_peak_w: float = 0.0        # PV nameplate (W at 1000 W/m2), scaled from the site trace
    wind_peak_w: float = 0.0      # wind farm rating (W), scaled from the ENTSO-E trace
    trace_start_hour: float = 0.0  # hour of the renewable trace day at emulated t = 0
    training: CarmTrainingSpec = field(default_factory=CarmTrainingSpec)


@dataclass(frozen=True)
class CarmSpec:
    slot_s: float = 900.0
    horizon_slots: int = 8
    formulation: str = "performance"
    renewable_g_per_kwh: float = 50.0   # paper 2 Table 1, solar PV 0.05 g/Wh
    forecast: str = "persistence"       # persistence | ewma (load forecast)
    ewma_alpha: float = 0.5
    time_limit_s: float = 5.0           # HiGHS limit per DC per slot
    dcs: tuple[CarmDcSpec, ...] = ()
    control: str = "carm"               # carm | none (supply and jobs only: top clock, EDF)
    ci_forecast_error: float = 0.0      # relative error of the grid CI forecast (0: oracle)

    def dc(self, name: str) -> CarmDcSpec:
        for d in self.dcs:
            if d.dc == name:
                return d
        raise InvalidInput("carm.dcs", f"no CA-RM settings for DC {name!r}")


@dataclass(frozen=True)
class Topology:
    name: str
    path: str
    description: str
    regions: tuple[RegionSpec, ...]
    slo: Slo
    provisioner: ProvisionerSpec
    load: LoadSpec
    dilation: float
    rtt_s: Mapping[tuple[str, str], float]
    ci_start_hour: Any = 0
    faithful_lateness_s: float = 0.005
    carm: CarmSpec | None = None

    @property
    def dcs(self) -> tuple[DcSpec, ...]:
        return tuple(dc for r in self.regions for dc in r.dcs)

    def dc(self, name: str) -> DcSpec:
        for d in self.dcs:
            if d.name == name:
                return d
        known = ", ".join(d.name for d in self.dcs)
        raise InvalidInput("dc", f"no DC {name!r} in topology {self.name}; known: {known}")

    def region(self, name: str) -> RegionSpec:
        for r in self.regions:
            if r.name == name:
                return r
        known = ", ".join(r.name for r in self.regions)
        raise InvalidInput("region", f"no region {name!r} in topology {self.name}; known: {known}")

    @property
    def model(self) -> str:
        return self.load.model

    def with_overrides(
        self,
        policy: str | None = None,
        policy_config: Mapping[str, Any] | None = None,
        rate_rps: float | None = None,
        duration_s: float | None = None,
        dilation: float | None = None,
        seed: int | None = None,
        warmup_s: float | None = None,
        project_peers: bool | None = None,
    ) -> Topology:
        regions = self.regions
        if project_peers is not None:
            regions = tuple(
                dataclasses.replace(
                    r, scheduler=dataclasses.replace(r.scheduler, project_peers=project_peers)
                )
                for r in regions
            )
        if policy is not None or policy_config is not None:
            for r in regions:
                try:
                    check_policy(policy or r.scheduler.policy,
                                 dict(policy_config or {}) if policy is not None
                                 else r.scheduler.policy_config)
                except InvalidInput as exc:
                    flag = ("--policy" if exc.field == "policy"
                            else exc.field.replace("policy_config", "--policy-config", 1))
                    raise InvalidInput(flag, exc.message) from exc
            regions = tuple(
                dataclasses.replace(
                    r,
                    scheduler=dataclasses.replace(
                        r.scheduler,
                        policy=policy or r.scheduler.policy,
                        policy_config=dict(policy_config or {})
                        if policy is not None
                        else r.scheduler.policy_config,
                    ),
                )
                for r in regions
            )
        load = self.load
        if rate_rps is not None:
            if not (math.isfinite(rate_rps) and rate_rps > 0):
                raise InvalidInput("--rate", f"expected a finite number > 0, got {rate_rps}")
            load = dataclasses.replace(load, rate_rps=rate_rps)
        if duration_s is not None:
            if not (math.isfinite(duration_s) and duration_s > 0):
                raise InvalidInput("--duration",
                                   f"expected a finite number > 0, got {duration_s}")
            load = dataclasses.replace(load, duration_s=duration_s)
        if seed is not None:
            load = dataclasses.replace(load, seed=seed)
        if warmup_s is not None:
            if not (math.isfinite(warmup_s) and warmup_s >= 0):
                raise InvalidInput("--warmup", f"expected a finite number >= 0, got {warmup_s}")
            load = dataclasses.replace(load, warmup_s=warmup_s)
        n = load.rate_rps * load.duration_s
        if n > MAX_PLANNED_REQUESTS:
            raise InvalidInput("--rate / --duration",
                               f"rate x duration = {n:,.0f} requests (about "
                               f"{n * BYTES_PER_REQUEST / 2**30:,.0f} GiB to plan and record); "
                               f"at most {MAX_PLANNED_REQUESTS:,}")
        dil = self.dilation
        if dilation is not None:
            if not (math.isfinite(dilation) and 1.0 <= dilation <= 1000.0):
                raise InvalidInput("--dilation", f"expected a number in [1, 1000], got {dilation}")
            dil = dilation
        return dataclasses.replace(self, regions=regions, load=load, dilation=dil)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly description (for summaries)."""
        return {
            "name": self.name,
            "path": self.path,
            "regions": [
                {
                    "name": r.name,
                    "aws_region": r.aws_region,
                    "policy": r.scheduler.policy,
                    "policy_config": dict(r.scheduler.policy_config),
                    "project_peers": r.scheduler.project_peers,
                    "dcs": [
                        {
                            "name": d.name,
                            "zone": d.zone,
                            "nodes": d.nodes,
                            "gpus_per_node": d.gpus_per_node,
                            "setup": d.setup,
                            "pue": d.pue,
                        }
                        for d in r.dcs
                    ],
                }
                for r in self.regions
            ],
            "slo": dataclasses.asdict(self.slo),
            "provisioner": dataclasses.asdict(self.provisioner),
            "load": {
                **{k: v for k, v in dataclasses.asdict(self.load).items() if k != "origin"},
                "origin": self.load.origin
                if isinstance(self.load.origin, str)
                else dict(self.load.origin),
            },
            "dilation": self.dilation,
            "window_s": self.regions[0].scheduler.window_s if self.regions else None,
        }


NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Bounds that keep a topology within what one machine (or a sweep worker) can plan.
MAX_NODES_PER_DC = 4096
MAX_GPUS_PER_NODE = 64
MAX_ENGINES = 65_536
MAX_PLANNED_REQUESTS = 20_000_000
BYTES_PER_REQUEST = 1024     # plan + record + journey, measured order of magnitude


class _V:
    """Validation helpers bound to one file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def err(self, key: str, msg: str) -> ConfigError:
        return ConfigError(self.path, key, msg)

    def mapping(self, v: Any, key: str) -> Mapping[str, Any]:
        if not isinstance(v, Mapping):
            raise self.err(key, f"expected a mapping, got {type(v).__name__}")
        return v

    def known(self, m: Mapping[str, Any], key: str, allowed: set[str]) -> None:
        extra = sorted(set(m) - allowed)
        if extra:
            where = f"{key}." if key else ""
            raise self.err(f"{where}{extra[0]}", f"unknown key; expected one of {sorted(allowed)}")

    def num(self, m: Mapping[str, Any], key: str, full: str, default: Any = None,
            lo: float | None = None, hi: float | None = None, strict_lo: bool = False) -> float:
        v = m.get(key, default)
        if v is None:
            raise self.err(full, "missing required number")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.err(full, f"expected a number, got {v!r}")
        if not math.isfinite(v):
            raise self.err(full, f"expected a finite number, got {v}")
        if lo is not None and (v <= lo if strict_lo else v < lo):
            raise self.err(full, f"expected a number {'>' if strict_lo else '>='} {lo}, got {v}")
        if hi is not None and v > hi:
            raise self.err(full, f"expected a number <= {hi}, got {v}")
        return float(v)

    def integer(self, m: Mapping[str, Any], key: str, full: str, default: Any = None,
                lo: int = 0, hi: int | None = None) -> int:
        v = m.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(full, f"expected an integer, got {v!r}")
        if v < lo:
            raise self.err(full, f"expected an integer >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise self.err(full, f"expected an integer <= {hi}, got {v}")
        return v

    def ident(self, m: Mapping[str, Any], key: str, full: str) -> str:
        """A name used in addresses, flags, container and metric labels."""
        v = self.text(m, key, full)
        if not NAME_RE.fullmatch(v):
            raise self.err(full, f"expected letters, digits, '.', '_' or '-' (at most 63, "
                                 f"starting with a letter or digit), got {v!r}")
        return v

    def text(self, m: Mapping[str, Any], key: str, full: str, default: Any = None,
             choices: tuple[str, ...] | None = None) -> str:
        v = m.get(key, default)
        if not isinstance(v, str) or not v:
            raise self.err(full, f"expected a non-empty string, got {v!r}")
        if choices is not None and v not in choices:
            raise self.err(full, f"expected one of {list(choices)}, got {v!r}")
        return v


def _scheduler(v: _V, raw: Any, key: str, defaults: Mapping[str, Any]) -> SchedulerSpec:
    m = dict(defaults)
    if raw is not None:
        m.update(v.mapping(raw, key))
    v.known(m, key, {"policy", "policy_config", "window_s", "window_max", "osl_mode",
                     "staleness_s", "deadline_s", "project_dispatches", "project_peers"})
    flags = {}
    for flag in ("project_dispatches", "project_peers"):
        flags[flag] = m.get(flag, getattr(_SCHEDULER_DEFAULTS, flag))
        if not isinstance(flags[flag], bool):
            raise v.err(f"{key}.{flag}", f"expected true or false, got {flags[flag]!r}")
    pc = m.get("policy_config", {}) or {}
    v.mapping(pc, f"{key}.policy_config")
    d = _SCHEDULER_DEFAULTS
    policy = v.text(m, "policy", f"{key}.policy", d.policy)
    try:
        check_policy(policy, pc)
    except InvalidInput as exc:
        where = f"{key}.policy" if exc.field == "policy" else f"{key}.{exc.field}"
        raise v.err(where, exc.message) from exc
    return SchedulerSpec(
        policy=policy,
        policy_config=dict(pc),
        window_s=v.num(m, "window_s", f"{key}.window_s", d.window_s, lo=0.0),
        window_max=v.integer(m, "window_max", f"{key}.window_max", d.window_max, lo=1),
        osl_mode=v.text(m, "osl_mode", f"{key}.osl_mode", d.osl_mode, ("oracle", "predicted")),
        staleness_s=v.num(m, "staleness_s", f"{key}.staleness_s", d.staleness_s, lo=0.0,
                          strict_lo=True),
        deadline_s=v.num(m, "deadline_s", f"{key}.deadline_s", d.deadline_s, lo=0.0,
                         strict_lo=True),
        project_dispatches=flags["project_dispatches"],
        project_peers=flags["project_peers"],
    )


def _ci_start_hour(v: _V, raw: Any) -> Any:
    """An hour index >= 0 or an ISO UTC hour ('2022-06-01T12:00Z')."""
    if isinstance(raw, str):
        try:
            datetime.fromisoformat(raw)
        except ValueError:
            raise v.err("ci_start_hour", f"expected an ISO UTC hour such as "
                                         f"'2022-06-01T12:00Z' or an hour index, got {raw!r}"
                        ) from None
    elif isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise v.err("ci_start_hour", f"expected an hour index >= 0 or an ISO UTC hour, "
                                     f"got {raw!r}")
    return raw


def check_size(v: _V, regions: list[RegionSpec], load: LoadSpec) -> None:
    """Refuse a topology too large to plan, with an estimate of what it would need."""
    engines = sum(d.nodes * d.gpus_per_node // load_calibration(d.setup).tp
                  for r in regions for d in r.dcs)
    if engines > MAX_ENGINES:
        raise v.err("regions", f"{engines:,} engines in all; at most {MAX_ENGINES:,} "
                               "(nodes x gpus_per_node / tp over every DC)")
    n = load.rate_rps * load.duration_s
    if n > MAX_PLANNED_REQUESTS:
        gib = n * BYTES_PER_REQUEST / 2**30
        raise v.err("load.rate_rps", f"rate x duration = {n:,.0f} requests (about {gib:,.0f} "
                                     f"GiB to plan and record); at most "
                                     f"{MAX_PLANNED_REQUESTS:,}")


def check_policy(policy: str, config: Mapping[str, Any]) -> None:
    """The policy exists and its settings are valid (raises InvalidInput naming
    ``policy`` or ``policy_config[.setting]``) — checked before any process starts."""
    from services.scheduler.policies.registry import REGISTRY

    REGISTRY.make_config(policy, **dict(config))


def _dc(v: _V, raw: Any, key: str, region: str, defaults: Mapping[str, Any]) -> DcSpec:
    m = dict(defaults)
    m.update(v.mapping(raw, key))
    v.known(m, key, {"name", "zone", "nodes", "gpus_per_node", "setup", "pue", "ci", "routing",
                     "max_queue_per_engine"})
    from services.datacenter.dc import DC_DEFAULTS as d

    setup = v.text(m, "setup", f"{key}.setup", d.setup)
    try:
        cal = load_calibration(setup)
    except ConfigError as exc:
        raise v.err(f"{key}.setup", str(exc)) from exc
    gpn = v.integer(m, "gpus_per_node", f"{key}.gpus_per_node", d.gpus_per_node, lo=1,
                    hi=MAX_GPUS_PER_NODE)
    if gpn % cal.tp:
        raise v.err(f"{key}.gpus_per_node", f"expected a multiple of tp={cal.tp} ({setup})")
    if "ci" not in m:
        raise v.err(f"{key}.ci", "missing; expected {constant: g} or {trace: auto, zone: Z}")
    return DcSpec(
        name=v.ident(m, "name", f"{key}.name"),
        region=region,
        zone=str(m.get("zone", "")),
        nodes=v.integer(m, "nodes", f"{key}.nodes", d.nodes, lo=1, hi=MAX_NODES_PER_DC),
        gpus_per_node=gpn,
        setup=setup,
        pue=v.num(m, "pue", f"{key}.pue", d.pue, lo=1.0),
        ci=m["ci"],
        routing=v.text(m, "routing", f"{key}.routing", d.routing,
                       ("round-robin", "least-loaded")),
        max_queue_per_engine=v.integer(m, "max_queue_per_engine", f"{key}.max_queue_per_engine",
                                       d.max_queue_per_engine, lo=1),
    )


# the formulations the live controller solves (services.carm.controller.FORMULATIONS)
CARM_FORMULATIONS = ("performance", "carbon", "ppc")


def _range(v: _V, m: Mapping[str, Any], key: str, full: str,
           default: tuple[float, float]) -> tuple[float, float]:
    r = m.get(key, list(default))
    if isinstance(r, bool) or isinstance(r, int | float):
        r = [r, r]
    if (not isinstance(r, list) or len(r) != 2
            or any(isinstance(x, bool) or not isinstance(x, int | float) for x in r)
            or not 0 <= r[0] <= r[1]):
        raise v.err(full, f"expected a number or [lo, hi] with 0 <= lo <= hi, got {r!r}")
    return float(r[0]), float(r[1])


def _carm_training(v: _V, m: Mapping[str, Any], key: str) -> CarmTrainingSpec:
    v.known(m, key, {"nodes", "workload", "jobs", "epochs_scale", "arrival_s", "deadline_s",
                     "max_workers_per_job"})
    from services.carm.profiles import load_profiles
    from services.carm.workload import load_workloads

    workloads = load_workloads()["workloads"]
    workload = v.text(m, "workload", f"{key}.workload", "light")
    if workload not in workloads:
        raise v.err(f"{key}.workload", f"unknown workload; known: {sorted(workloads)}")
    raw_jobs = m.get("jobs", 0)
    jobs: list[CarmJobSpec] = []
    count = 0
    if isinstance(raw_jobs, list):
        models = load_profiles().models
        for i, jr in enumerate(raw_jobs):
            jk = f"{key}.jobs[{i}]"
            jm = v.mapping(jr, jk)
            v.known(jm, jk, {"model", "epochs", "arrival_s", "deadline_s"})
            model = v.text(jm, "model", f"{jk}.model")
            if model not in models or models[model].training is None:
                trainable = sorted(n for n, p in models.items() if p.training is not None)
                raise v.err(f"{jk}.model", f"no training profile; known: {trainable}")
            arrival = v.num(jm, "arrival_s", f"{jk}.arrival_s", 0.0, lo=0.0)
            deadline = v.num(jm, "deadline_s", f"{jk}.deadline_s")
            if deadline <= arrival:
                raise v.err(f"{jk}.deadline_s", f"expected > arrival_s ({arrival}), got {deadline}")
            jobs.append(CarmJobSpec(model, v.num(jm, "epochs", f"{jk}.epochs", lo=0.0,
                                                 strict_lo=True), arrival, deadline))
    else:
        count = v.integer(m, "jobs", f"{key}.jobs", 0, lo=0)
    dl = _range(v, m, "deadline_s", f"{key}.deadline_s", (3600.0, 7200.0))
    if dl[0] <= 0:
        raise v.err(f"{key}.deadline_s", f"expected deadlines > 0 s after arrival, got {dl[0]}")
    nodes = v.integer(m, "nodes", f"{key}.nodes", 0, lo=0)
    if (count or jobs) and nodes == 0:
        raise v.err(f"{key}.nodes", "expected an integer >= 1 when the DC has training jobs")
    return CarmTrainingSpec(
        nodes=nodes,
        workload=workload,
        count=count,
        epochs_scale=v.num(m, "epochs_scale", f"{key}.epochs_scale", 0.05, lo=0.0,
                           strict_lo=True),
        arrival_s=_range(v, m, "arrival_s", f"{key}.arrival_s", (0.0, 0.0)),
        deadline_s=dl,
        jobs=tuple(jobs),
        max_workers_per_job=v.integer(m, "max_workers_per_job", f"{key}.max_workers_per_job",
                                      8, lo=1),
    )


def _carm(v: _V, raw: Any, dc_names: list[str]) -> CarmSpec:
    """The optional ``carm:`` section; every DC gets the shared values unless overridden."""
    m = v.mapping(raw, "carm")
    v.known(m, "carm", {"slot_s", "horizon_slots", "formulation", "renewable_g_per_kwh",
                        "trace_start_hour", "forecast", "ewma_alpha", "time_limit_s",
                        "renewables", "training", "dcs", "control", "ci_forecast_error"})
    form = m.get("formulation", "performance")
    if form not in CARM_FORMULATIONS:
        raise v.err("carm.formulation", f"expected one of {list(CARM_FORMULATIONS)} "
                    f"(Problem 2, 1 or 3), got {form!r}")
    ren = v.mapping(m.get("renewables", {}) or {}, "carm.renewables")
    v.known(ren, "carm.renewables", {"pv_peak_w", "wind_peak_w"})
    train = v.mapping(m.get("training", {}) or {}, "carm.training")
    start = v.num(m, "trace_start_hour", "carm.trace_start_hour", 0.0, lo=0.0)
    if start >= 24:
        raise v.err("carm.trace_start_hour", f"expected an hour in [0, 24), got {start}")
    per = v.mapping(m.get("dcs", {}) or {}, "carm.dcs")
    for name in per:
        if name not in dc_names:
            raise v.err(f"carm.dcs.{name}", f"unknown DC; known: {dc_names}")
    dcs: list[CarmDcSpec] = []
    for name in dc_names:
        key = f"carm.dcs.{name}"
        o = v.mapping(per.get(name, {}) or {}, key)
        v.known(o, key, {"renewables", "training", "trace_start_hour"})
        r = {**ren, **v.mapping(o.get("renewables", {}) or {}, f"{key}.renewables")}
        rk = f"{key}.renewables" if "renewables" in o else "carm.renewables"
        v.known(r, rk, {"pv_peak_w", "wind_peak_w"})
        t = {**train, **v.mapping(o.get("training", {}) or {}, f"{key}.training")}
        tk = f"{key}.training" if "training" in o else "carm.training"
        dstart = v.num(o, "trace_start_hour", f"{key}.trace_start_hour", start, lo=0.0)
        if dstart >= 24:
            raise v.err(f"{key}.trace_start_hour", f"expected an hour in [0, 24), got {dstart}")
        dcs.append(CarmDcSpec(
            dc=name,
            pv_peak_w=v.num(r, "pv_peak_w", f"{rk}.pv_peak_w", 0.0, lo=0.0),
            wind_peak_w=v.num(r, "wind_peak_w", f"{rk}.wind_peak_w", 0.0, lo=0.0),
            trace_start_hour=dstart,
            training=_carm_training(v, t, tk),
        ))
    return CarmSpec(
        slot_s=v.num(m, "slot_s", "carm.slot_s", 900.0, lo=0.0, strict_lo=True),
        horizon_slots=v.integer(m, "horizon_slots", "carm.horizon_slots", 8, lo=1),
        formulation=str(form),
        renewable_g_per_kwh=v.num(m, "renewable_g_per_kwh", "carm.renewable_g_per_kwh", 50.0,
                                  lo=0.0),
        forecast=v.text(m, "forecast", "carm.forecast", "persistence", ("persistence", "ewma")),
        ewma_alpha=v.num(m, "ewma_alpha", "carm.ewma_alpha", 0.5, lo=0.0, hi=1.0,
                         strict_lo=True),
        time_limit_s=v.num(m, "time_limit_s", "carm.time_limit_s", 5.0, lo=0.0, strict_lo=True),
        dcs=tuple(dcs),
        control=v.text(m, "control", "carm.control", "carm", ("carm", "none")),
        ci_forecast_error=v.num(m, "ci_forecast_error", "carm.ci_forecast_error", 0.0, lo=0.0,
                                hi=10.0),
    )


def parse_topology(data: Any, path: str, check_ci: bool = True) -> Topology:
    """Validate a parsed topology mapping; errors name `path` and the key path. With
    `check_ci` every DC's carbon-intensity source is built (bad traces fail here)."""
    from services.config.rtt import load_rtt_matrix, region_rtt

    v = _V(path)
    top = v.mapping(data, "")
    v.known(top, "", {"name", "description", "regions", "slo", "provisioner", "load",
                      "emulation", "network", "defaults", "ci_start_hour", "carm"})
    defaults = v.mapping(top.get("defaults", {}) or {}, "defaults")
    v.known(defaults, "defaults", {"dc", "scheduler"})
    dc_defaults = v.mapping(defaults.get("dc", {}) or {}, "defaults.dc")
    sched_defaults = v.mapping(defaults.get("scheduler", {}) or {}, "defaults.scheduler")
    # validate the defaults where they are written, before they are merged anywhere
    if dc_defaults:
        _dc(v, {"name": "defaults", "ci": {"constant": 0}, **dc_defaults}, "defaults.dc", "",
            {})
    if sched_defaults:
        _scheduler(v, sched_defaults, "defaults.scheduler", {})
    regions_raw = top.get("regions")
    if not isinstance(regions_raw, list) or not regions_raw:
        raise v.err("regions", "expected a non-empty list of regions")
    regions: list[RegionSpec] = []
    seen_dc: set[str] = set()
    seen_region: set[str] = set()
    for i, rr in enumerate(regions_raw):
        key = f"regions[{i}]"
        rm = v.mapping(rr, key)
        v.known(rm, key, {"name", "aws_region", "scheduler", "dcs"})
        name = v.ident(rm, "name", f"{key}.name")
        if name in seen_region:
            raise v.err(f"{key}.name", f"duplicate region name {name!r}")
        seen_region.add(name)
        dcs_raw = rm.get("dcs")
        if not isinstance(dcs_raw, list) or not dcs_raw:
            raise v.err(f"{key}.dcs", "expected a non-empty list of datacenters")
        dcs = []
        for j, dr in enumerate(dcs_raw):
            d = _dc(v, dr, f"{key}.dcs[{j}]", name, dc_defaults)
            if d.name in seen_dc:
                raise v.err(f"{key}.dcs[{j}].name", f"duplicate DC name {d.name!r}")
            seen_dc.add(d.name)
            dcs.append(d)
        regions.append(
            RegionSpec(
                name=name,
                aws_region=v.text(rm, "aws_region", f"{key}.aws_region"),
                scheduler=_scheduler(v, rm.get("scheduler"), f"{key}.scheduler", sched_defaults),
                dcs=tuple(dcs),
            )
        )
    slo_m = v.mapping(top.get("slo", {}) or {}, "slo")
    v.known(slo_m, "slo", {"ttft_s", "tpot_s"})
    slo = Slo(
        ttft_s=v.num(slo_m, "ttft_s", "slo.ttft_s", 3.0, lo=0.0, strict_lo=True),
        tpot_s=v.num(slo_m, "tpot_s", "slo.tpot_s", 0.1, lo=0.0, strict_lo=True),
    )
    pm = v.mapping(top.get("provisioner", {}) or {}, "provisioner")
    v.known(pm, "provisioner", {"period_s", "mode"})
    prov = ProvisionerSpec(
        period_s=v.num(pm, "period_s", "provisioner.period_s", 1.0, lo=0.0, strict_lo=True),
        mode=v.text(pm, "mode", "provisioner.mode", "sync", ("sync", "async")),
    )
    lm = v.mapping(top.get("load", {}) or {}, "load")
    v.known(lm, "load", {"rate_rps", "dataset", "duration_s", "warmup_s", "seed", "arrivals",
                         "origin", "model"})
    origin = lm.get("origin", "round-robin")
    if isinstance(origin, Mapping):
        for rname, w in origin.items():
            if rname not in seen_region:
                raise v.err(f"load.origin.{rname}", f"unknown region; known: {sorted(seen_region)}")
            if isinstance(w, bool) or not isinstance(w, int | float) or w < 0:
                raise v.err(f"load.origin.{rname}", f"expected a weight >= 0, got {w!r}")
        origin = {str(k): float(w) for k, w in origin.items()}
    elif origin != "round-robin":
        raise v.err("load.origin", "expected 'round-robin' or a mapping region -> weight")
    models = {load_calibration(d.setup).model for r in regions for d in r.dcs}
    model = str(lm.get("model", "") or (sorted(models)[0] if len(models) == 1 else ""))
    if not model:
        raise v.err("load.model", f"several models in the topology {sorted(models)}; name one")
    if model not in models:
        raise v.err("load.model", f"no DC serves {model!r}; served: {sorted(models)}")
    load = LoadSpec(
        rate_rps=v.num(lm, "rate_rps", "load.rate_rps", 10.0, lo=0.0, strict_lo=True),
        dataset=v.text(lm, "dataset", "load.dataset", "cnn-dailymail"),
        duration_s=v.num(lm, "duration_s", "load.duration_s", 60.0, lo=0.0, strict_lo=True),
        warmup_s=v.num(lm, "warmup_s", "load.warmup_s", 5.0, lo=0.0),
        seed=v.integer(lm, "seed", "load.seed", 1),
        arrivals=v.text(lm, "arrivals", "load.arrivals", "poisson"),
        origin=origin,
        model=model,
    )
    check_size(v, regions, load)
    from services.loadgen.arrivals import available as arrivals_available
    from services.loadgen.datasets import available as datasets_available

    if load.dataset not in datasets_available():
        raise v.err("load.dataset", f"unknown dataset; known: {list(datasets_available())}")
    if load.arrivals not in arrivals_available():
        known_arrivals = list(arrivals_available())
        raise v.err("load.arrivals", f"unknown arrival process; known: {known_arrivals}")
    em = v.mapping(top.get("emulation", {}) or {}, "emulation")
    v.known(em, "emulation", {"dilation", "faithful_lateness_s"})
    dilation = v.num(em, "dilation", "emulation.dilation", 1.0, lo=1.0, hi=1000.0)
    faithful = v.num(em, "faithful_lateness_s", "emulation.faithful_lateness_s", 0.005, lo=0.0)
    nm = v.mapping(top.get("network", {}) or {}, "network")
    v.known(nm, "network", {"rtt_ms", "rtt_file"})
    try:
        rtt_file = nm.get("rtt_file")
        matrix = load_rtt_matrix(ROOT / rtt_file) if rtt_file else load_rtt_matrix()
        rtt = dict(region_rtt({r.name: r.aws_region for r in regions}, matrix))
    except InvalidInput as exc:
        key = exc.field
        for i, r in enumerate(regions):  # regions.<name> -> the key as written in the file
            if exc.field == f"regions.{r.name}":
                key = f"regions[{i}].aws_region"
        raise v.err(key, exc.message) from exc
    overrides = nm.get("rtt_ms", {}) or {}
    v.mapping(overrides, "network.rtt_ms")
    for pair, ms in overrides.items():
        parts = str(pair).split("--")
        if len(parts) != 2 or not all(p in seen_region for p in parts):
            raise v.err(f"network.rtt_ms.{pair}", "expected 'regionA--regionB' of known regions")
        if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
            raise v.err(f"network.rtt_ms.{pair}", f"expected milliseconds >= 0, got {ms!r}")
        rtt[(parts[0], parts[1])] = rtt[(parts[1], parts[0])] = ms / 1000.0
    topo = Topology(
        name=str(top.get("name", Path(path).stem)),
        path=path,
        description=str(top.get("description", "")),
        regions=tuple(regions),
        slo=slo,
        provisioner=prov,
        load=load,
        dilation=dilation,
        rtt_s=rtt,
        ci_start_hour=_ci_start_hour(v, top.get("ci_start_hour", 0)),
        faithful_lateness_s=faithful,
        carm=_carm(v, top["carm"], [d.name for r in regions for d in r.dcs])
        if top.get("carm") is not None else None,
    )
    if check_ci:
        from services.config.factory import build_ci

        for d in topo.dcs:  # build every CI source once so bad traces fail at load time
            build_ci(topo, d)
    return topo


def load_topology(path: str | Path, check_ci: bool = True) -> Topology:
    """Load a topology by path, or by name from ``topologies/`` (``small`` -> small.yaml).

    ``check_ci=False`` skips building every DC's CI source: for a service of one
    component (a DC builds its own; schedulers, the provisioner and the load generator use
    none), so 22 processes of base.yaml do not each parse every trace at start-up."""
    p = Path(path)
    if not p.exists() and not p.suffix:
        p = TOPOLOGY_DIR / f"{path}.yaml"
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read topology file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), "", f"not valid YAML: {exc}") from exc
    return parse_topology(data, str(p), check_ci)
