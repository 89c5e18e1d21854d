"""A sans-IO datacenter: nodes x GPUs -> engines, routing, energy and carbon accounting.

Theory of operation
-------------------
* ``nodes`` nodes of ``gpus_per_node`` GPUs; each node holds ``gpus_per_node // tp``
  engines. Incoming requests go to a node (inter-node policy), then to an engine of that
  node (intra-node policy): round-robin by default (paper 1 §V-A), least-loaded optional.
* All engines share one `PerfModel`, so a GPU frequency set on the DC (CA-RM) changes the
  step time and energy of every engine from their next step on.
* Energy by component: GPU active (step energy), GPU idle (idle power while an engine has
  no request in its pipeline), host (constant per node), training (deferrable jobs run by
  CA-RM). Facility energy = IT energy x PUE. On-site renewable supply covers facility
  energy first; the rest comes from the grid at the DC's carbon intensity.
* Step energy accrues in proportion to elapsed step time (a step in flight counts its
  elapsed fraction), so accruing more or less often does not change the totals.
* Carbon is integrated by `accrue(now)`: the energy spent since the last accrual is
  charged at the time-average grid CI over that interval (exact for hourly CI traces when
  power is constant between accruals; runtimes accrue at every poll and step).
* Lateness samples (how late a wall-clock runtime woke up for a step) are stored here so
  that state reports carry them; the virtual runtime never records any. A run is
  *faithful* while the p99 lateness stays within ``faithful_lateness_s`` and at most
  0.1 % of wake-ups were late enough to force a resync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from services.config.calibration import Calibration
from services.datacenter.engine import Engine, EngineConfig, EngineRequest
from services.datacenter.perfmodel import PerfModel
from services.model.carbon import CISource
from services.model.errors import InvalidInput, Unavailable
from services.model.requests import MAX_SITE_POWER_W, check_number

J_PER_KWH = 3.6e6
ROUTINGS = ("round-robin", "least-loaded")
# A run stays faithful while at most this fraction of wake-ups had to resynchronise
# (woke up later than the runtime's resync bound, so the schedule restarted late).
MAX_RESYNC_RATIO = 0.001


@dataclass(frozen=True)
class DcConfig:
    name: str
    region: str = "local"
    zone: str = ""
    nodes: int = 1
    gpus_per_node: int = 8
    setup: str = "a100-40gb/llama-3.1-8b-tp1"
    pue: float = 1.1
    routing: str = "round-robin"
    max_queue_per_engine: int = 4096
    duty_window_s: float = 1.0
    renewable_ci_g_per_kwh: float = 0.0
    faithful_lateness_s: float = 0.005   # p99 wake-up lateness (emulated s) for a faithful run
    decode_run_steps: int = 32           # decode steps an engine plans at once (1: one by one)

    def validate(self, tp: int) -> None:
        if self.nodes < 1:
            raise InvalidInput("nodes", f"must be >= 1, got {self.nodes}")
        if self.gpus_per_node < tp or self.gpus_per_node % tp:
            raise InvalidInput(
                "gpus_per_node", f"must be a positive multiple of tp={tp}, got {self.gpus_per_node}"
            )
        if not self.pue >= 1.0:
            raise InvalidInput("pue", f"must be >= 1.0, got {self.pue}")
        if self.decode_run_steps < 1:
            raise InvalidInput("decode_run_steps", f"must be >= 1, got {self.decode_run_steps}")
        if self.routing not in ROUTINGS:
            raise InvalidInput("routing", f"expected one of {ROUTINGS}, got {self.routing!r}")


# The DC's defaults, in one place: topologies, the DC service's flags and the core use them.
DC_DEFAULTS = DcConfig(name="")


@dataclass
class EnergyTotals:
    gpu_active_j: float = 0.0
    gpu_idle_j: float = 0.0
    host_j: float = 0.0
    training_j: float = 0.0
    renewable_j: float = 0.0
    grid_j: float = 0.0

    @property
    def it_total_j(self) -> float:
        return self.gpu_active_j + self.gpu_idle_j + self.host_j + self.training_j


class LatenessStats:
    """Wake-up lateness of a wall-clock runtime, emulated seconds; bounded memory. With
    ``trace`` set (a list), every sample is also appended as ``(at_s, lateness_s)``, for
    diagnosis (`GEOSERVE_TRACE_DIR` in the DC service)."""

    trace: list[tuple[float, float]] | None = None

    def __init__(self, capacity: int = 8192) -> None:
        self._buf = np.zeros(capacity)
        self._n = 0
        self.max_s = 0.0
        self.resyncs = 0
        self._q: dict[float, float] = {}   # quantiles of the samples so far (every poll asks)
        self._q_n = 0

    def add(self, lateness_s: float, at_s: float = math.nan) -> None:
        if self.trace is not None:
            self.trace.append((at_s, lateness_s))
        self._buf[self._n % len(self._buf)] = lateness_s
        self._n += 1
        self.max_s = max(self.max_s, lateness_s)

    @property
    def count(self) -> int:
        return self._n

    def quantile(self, q: float) -> float:
        if self._q_n != self._n:
            self._q, self._q_n = {}, self._n
        hit = self._q.get(q)
        if hit is None:
            n = min(self._n, len(self._buf))
            hit = self._q[q] = float(np.quantile(self._buf[:n], q)) if n else 0.0
        return hit


@dataclass
class DcCounters:
    """Aggregated state of a datacenter at one instant (per-engine averages)."""

    time_s: float
    engines: int
    active_batch: float
    queue_tokens: float
    kv_tokens: float
    kv_occupancy_ratio: float
    prefill_duty_ratio: float
    waiting_requests: float
    grid_ci_g_per_kwh: float
    effective_ci_g_per_kwh: float
    power_w: float
    energy: EnergyTotals
    facility_j: float
    carbon_g: float
    gpu_frequency_mhz: float
    lateness_s_p50: float
    lateness_s_p99: float
    lateness_s_max: float
    faithful: bool
    in_flight: int
    per_engine: list[dict[str, float]] = field(default_factory=list)


class Datacenter:
    """Engines of one DC with routing and energy/carbon accounting (sans-IO)."""

    def __init__(
        self,
        config: DcConfig,
        cal: Calibration,
        ci: CISource,
        start_s: float = 0.0,
    ) -> None:
        config.validate(cal.tp)
        self.config = config
        self.cal = cal
        self.ci = ci
        self.perf = PerfModel(cal)
        self.engines_per_node = config.gpus_per_node // cal.tp
        ecfg = EngineConfig(
            max_queue=config.max_queue_per_engine, duty_window_s=config.duty_window_s,
            max_run_steps=config.decode_run_steps,
        )
        self.engines: list[Engine] = []
        self.engine_node: list[int] = []
        for n in range(config.nodes):
            for e in range(self.engines_per_node):
                name = f"{config.name}/n{n}/e{e}"
                self.engines.append(Engine(cal, name, ecfg, start_s, perf=self.perf))
                self.engine_node.append(n)
        self._node_cursor = 0
        self._engine_cursor = [0] * config.nodes
        self.start_s = start_s
        self._last_accrual_s = start_s
        self._last_it_j = 0.0
        self.energy = EnergyTotals()
        self.facility_j = 0.0
        self.carbon_g = 0.0
        self.training_w = 0.0
        self.renewable_w = 0.0
        self.lateness = LatenessStats()
        self.draining = False
        self.completed = 0
        self.rejected = 0
        self.failed = 0

    # ------------------------------------------------------------------ routing
    def _engine_load(self, i: int) -> int:
        e = self.engines[i]
        return len(e.running) + len(e.waiting)

    def route(self) -> int:
        """Pick the engine for the next request (inter-node, then intra-node policy)."""
        epn = self.engines_per_node
        if self.config.routing == "least-loaded":
            return min(range(len(self.engines)), key=lambda i: (self._engine_load(i), i))
        node = self._node_cursor
        self._node_cursor = (node + 1) % self.config.nodes
        slot = self._engine_cursor[node]
        self._engine_cursor[node] = (slot + 1) % epn
        return node * epn + slot

    def validate(self, model: str, isl: int, osl: int) -> None:
        """Raise `InvalidInput` naming the field when this DC cannot serve the request."""
        if model and model != self.cal.model:
            raise InvalidInput(
                "model", f"DC {self.config.name} serves {self.cal.model!r}, not {model!r}"
            )
        self.engines[0].validate(isl, osl)

    def submit(self, req: EngineRequest, model: str, now: float) -> int:
        """Validate, route and enqueue a request; returns the engine index."""
        if self.draining:
            raise Unavailable(f"DC {self.config.name} is draining")
        self.validate(model, req.isl_tokens, req.osl_tokens)
        idx = self.route()
        self.engines[idx].enqueue(req, now)
        return idx

    # ------------------------------------------------------------------ control
    def set_frequency(self, mhz: float, field: str = "gpu_frequency_mhz") -> float:
        """Snap to the nearest supported level. A value that is not finite, not positive
        or above twice the top level is refused (it is no GPU clock of this setup)."""
        top = 2.0 * self.cal.frequency.max_mhz
        if not (math.isfinite(mhz) and 0 < mhz <= top):
            raise InvalidInput(field, f"expected a finite frequency in (0, {top:g}] MHz, "
                                      f"got {mhz}")
        return self.perf.set_frequency(mhz)

    def apply_carm(self, now: float, training_w: float, renewable_w: float) -> None:
        check_number("training_power_w", training_w, 0.0, MAX_SITE_POWER_W, " W")
        check_number("renewable_supply_w", renewable_w, 0.0, MAX_SITE_POWER_W, " W")
        self.accrue(now)
        self.training_w = training_w
        self.renewable_w = renewable_w

    def fail_all(self, now: float) -> list[tuple[int, EngineRequest]]:
        """Drop every request of every engine (crash or end of drain)."""
        self.accrue(now)
        out: list[tuple[int, EngineRequest]] = []
        for i, eng in enumerate(self.engines):
            out.extend((i, r) for r in eng.fail_all(now))
        return out

    # ------------------------------------------------------------------ accounting
    def accrue(self, now: float) -> None:
        """Integrate energy and carbon up to `now`."""
        t0 = self._last_accrual_s
        if now <= t0:
            return
        dt = now - t0
        e = self.energy
        e.gpu_active_j = sum(eng.active_energy_j(now) for eng in self.engines)
        e.gpu_idle_j = sum(eng.idle_energy_j(now) for eng in self.engines)
        e.host_j = self.config.nodes * self.cal.energy.host_w_per_node * (now - self.start_s)
        e.training_j += self.training_w * dt
        it = e.it_total_j
        facility = (it - self._last_it_j) * self.config.pue
        renewable = min(facility, self.renewable_w * dt)
        grid = facility - renewable
        e.renewable_j += renewable
        e.grid_j += grid
        self.facility_j += facility
        self.carbon_g += (
            grid * self.ci.mean(t0, now) + renewable * self.config.renewable_ci_g_per_kwh
        ) / J_PER_KWH
        self._last_it_j = it
        self._last_accrual_s = now

    def power_w(self) -> float:
        """Facility power now: running steps' mean power, idle engines, hosts, training."""
        p = self.config.nodes * self.cal.energy.host_w_per_node + self.training_w
        for eng in self.engines:
            step_w = eng.step_power_w()
            if step_w is not None:
                p += step_w
            elif not eng.has_work:
                p += eng.perf.idle_w
        return p * self.config.pue

    def effective_ci(self, now: float, power_w: float | None = None) -> float:
        grid_ci = self.ci.at(now)
        p = self.power_w() if power_w is None else power_w
        if p <= 0 or self.renewable_w <= 0:
            return grid_ci
        ren = min(p, self.renewable_w)
        return (grid_ci * (p - ren) + self.config.renewable_ci_g_per_kwh * ren) / p

    def in_flight(self) -> int:
        return sum(len(e.running) + len(e.waiting) for e in self.engines)

    def counters(self, now: float, per_engine: bool = False) -> DcCounters:
        self.accrue(now)
        n = len(self.engines)
        cs = [e.counters(now) for e in self.engines]
        power = self.power_w()
        p99 = self.lateness.quantile(0.99)
        rows: list[dict[str, float]] = []
        if per_engine:
            rows = [
                {
                    "running": c.running,
                    "waiting": c.waiting,
                    "queue_tokens": c.queue_tokens,
                    "kv_tokens": c.kv_tokens,
                    "kv_occupancy_ratio": c.kv_occupancy_ratio,
                    "prefill_duty_ratio": c.prefill_duty_ratio,
                    "steps": c.steps,
                }
                for c in cs
            ]
        return DcCounters(
            time_s=now,
            engines=n,
            active_batch=sum(c.running for c in cs) / n,
            queue_tokens=sum(c.queue_tokens for c in cs) / n,
            kv_tokens=sum(c.kv_tokens for c in cs) / n,
            kv_occupancy_ratio=sum(c.kv_occupancy_ratio for c in cs) / n,
            prefill_duty_ratio=sum(c.prefill_duty_ratio for c in cs) / n,
            waiting_requests=sum(c.waiting for c in cs) / n,
            grid_ci_g_per_kwh=self.ci.at(now),
            effective_ci_g_per_kwh=self.effective_ci(now, power),
            power_w=power,
            energy=EnergyTotals(**vars(self.energy)),
            facility_j=self.facility_j,
            carbon_g=self.carbon_g,
            gpu_frequency_mhz=self.perf.frequency_mhz,
            lateness_s_p50=self.lateness.quantile(0.5),
            lateness_s_p99=p99,
            lateness_s_max=self.lateness.max_s,
            faithful=p99 <= self.config.faithful_lateness_s
            and self.lateness.resyncs <= MAX_RESYNC_RATIO * self.lateness.count,
            in_flight=self.in_flight(),
            per_engine=rows,
        )
