"""Registry of CA-RM methods (formulations and baselines), selected by name.

Rules / theory of operation
---------------------------
* One entry per method: a name, help text and ``run(inst, cfg) -> Plan``. Duplicate names raise.
* ``MethodConfig`` carries the knobs a method may need (carbon budget, power cap, PPC weight,
  solver options); ``None`` budgets are derived from ``data/carm/site.yaml`` fractions of
  baseline-MAX on the same instance (carbon) or of the peak cluster power (PowerCap).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from services.carm import baselines, milp
from services.carm.evaluate import evaluate
from services.carm.problem import Instance, Plan
from services.model.errors import InvalidInput


@dataclass(frozen=True)
class MethodConfig:
    carbon_budget_g: float | None = None
    carbon_budget_fraction: float = 0.05
    power_cap_w: float | None = None
    power_cap_fraction: float = 0.6
    w_inf: float = 0.5
    milp: milp.MilpOptions = field(default_factory=milp.MilpOptions)


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    run: Callable[[Instance, MethodConfig], Plan]
    proposed: bool


REGISTRY: dict[str, Method] = {}


def register(m: Method) -> None:
    if m.name in REGISTRY:
        raise ValueError(f"duplicate CA-RM method {m.name!r}")
    REGISTRY[m.name] = m


def _budget_and_least_carbon_plan(inst: Instance, cfg: MethodConfig
                                  ) -> tuple[float, Plan | None]:
    if cfg.carbon_budget_g is not None:
        return cfg.carbon_budget_g, None
    ref = evaluate(inst, baselines.fixed_clock(inst, -1, "baseline-max")).summary.carbon_g
    low_plan = milp.min_carbon_plan(inst, cfg.milp)
    low = low_plan.info.objective
    if not math.isfinite(low):
        raise InvalidInput("jobs", f"no plan completes every job within the horizon "
                                   f"({low_plan.info.status})")
    return low + cfg.carbon_budget_fraction * max(ref - low, 0.0), low_plan


def carbon_budget(inst: Instance, cfg: MethodConfig) -> float:
    return _budget_and_least_carbon_plan(inst, cfg)[0]


def _carbon(inst: Instance, cfg: MethodConfig) -> Plan:
    # the least-carbon plan that sets the budget is also a feasible warm start
    budget, low_plan = _budget_and_least_carbon_plan(inst, cfg)
    return milp.solve_carbon(inst, budget, cfg.milp, start=low_plan)


def _powercap(inst: Instance, cfg: MethodConfig) -> Plan:
    cap = cfg.power_cap_w
    if cap is None:
        cap = cfg.power_cap_fraction * baselines.peak_power_w(inst)
    return baselines.power_cap(inst, cap)


register(Method("baseline-min", "all clocks at the lowest level, on-arrival placement",
                lambda i, c: baselines.fixed_clock(i, 0, "baseline-min"), False))
register(Method("baseline-max", "all clocks at the highest level, on-arrival placement",
                lambda i, c: baselines.fixed_clock(i, -1, "baseline-max"), False))
register(Method("energycost", "grid-price-driven slot allocation + idle inference nodes off",
                lambda i, c: milp.solve_energycost(i, c.milp), False))
register(Method("powercap", "clock control under a cluster power budget", _powercap, False))
register(Method("carbon", "Problem 1: min SLA penalties s.t. carbon budget (MILP)", _carbon, True))
register(Method("performance", "Problem 2: min carbon s.t. latency bounds and deadlines (MILP)",
                lambda i, c: milp.solve_performance(i, c.milp), True))
register(Method("performance-drs",
                "Problem 2 + dynamic right sizing of inference nodes (not in the paper)",
                lambda i, c: milp.solve_performance(i, c.milp, drs=True), True))
register(Method("ppc", "Problem 3: max performance per carbon (Dinkelbach + MILP)",
                lambda i, c: milp.solve_ppc(i, c.w_inf, c.milp), True))


def get(name: str) -> Method:
    if name not in REGISTRY:
        raise InvalidInput("method", f"unknown method {name!r}; expected one of {list(REGISTRY)}")
    return REGISTRY[name]


def run(name: str, inst: Instance, cfg: MethodConfig | None = None) -> Plan:
    return get(name).run(inst, cfg or MethodConfig())
