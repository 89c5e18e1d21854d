"""Common interface, result type and fallback chain of the scheduling policies.

Rules / theory of operation
---------------------------
* A policy is a plain object: ``decide(requests, snapshot, region, now_s) -> Decision``.
  It never sleeps, reads a clock or does I/O; solver wall time is measured only through
  the injected ``clock`` (a ``Callable[[], float]``; the default returns 0.0 so cores stay
  deterministic) and randomness only through the injected ``numpy.random.Generator``.
* ``batch`` tells the caller whether the policy wants a window of requests (Δw = 100 ms or
  300 requests); every policy also accepts a one-request window.
* ``decide`` is a template: an empty window gets the empty decision, any other goes to
  the policy's ``decide_window``. A policy overrides one of the two.
* `SolverPolicy` is the template of the window solvers (ILP, iterative ILP, facility
  MILP): estimate the window, ``prepare`` the model inputs, ``solve``, then `finish` with
  the fallback reason of each request the solver did not place (`reasons_for`).
* Per-scheduler state (round-robin cursor, counters, budgets) lives in the policy object,
  never in module globals, so two schedulers in one process do not interact.
* DCs with ``up=False`` (or not serving the request's model) are never chosen. When no DC
  can take a request at all, its target is None and the caller rejects it (UNAVAILABLE).
* Fallback chain (paper 1 §V-A): solver failure or no capacity -> the lowest-carbon
  SLO-feasible DC with headroom left in this window -> round-robin over the eligible DCs.
  Every fallback is flagged per request, with a reason, and counted in `PolicyStats`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from services.model.state import RequestView, SnapshotView
from services.scheduler.estimator import Estimates, Estimator, RequestArrays
from services.scheduler.policies.solver import (
    BoolArray,
    FloatArray,
    HighsSolver,
    IntArray,
    SolveResult,
)

Clock = Callable[[], float]
P = TypeVar("P")  # a solver policy's model inputs (`SolverPolicy.prepare`)

# Fallback reasons (also the keys of PolicyStats.fallback_reasons).
NO_FEASIBLE = "no_feasible_dc"  # no SLO-feasible DC for the request
NO_CAPACITY = "no_capacity"  # the solver could not place it within capacity
SOLVER_FAILED = "solver_failed"  # no usable solution (error, infeasible, time limit)
BUDGET = "budget_exhausted"  # Green-LLM: no feasible DC with token budget left


def check(ok: bool, name: str, rule: str, value: object) -> None:
    """Validation of a policy config field: ValueError "<name> must be <rule>, got <value>"
    unless `ok` (a NaN fails every comparison, so it is rejected too)."""
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def zero_clock() -> float:
    """Default clock: solver time is not measured (deterministic cores and tests)."""
    return 0.0


@dataclass(frozen=True)
class Decision:
    """Where each request of a window goes and how the decision was reached."""

    targets: tuple[str | None, ...]  # DC name per request; None: no DC can take it
    fallback: tuple[bool, ...]  # True where the fallback chain placed the request
    fallback_reason: tuple[str, ...]  # "" where no fallback
    status: str  # "heuristic", "optimal", "time_limit", "solver_failed", ...
    solve_s: float = 0.0  # solver wall time (injected clock), all iterations
    build_s: float = 0.0  # model build time (injected clock)
    iterations: int = 0  # solver calls (iterative ILP: rounds)
    objective_g: float | None = None  # solver objective, grams CO2 (unplaced excluded)
    mip_gap: float | None = None  # relative gap when a MIP stopped early
    limit_hit: bool = False  # the solver stopped at its time limit

    @property
    def n_fallback(self) -> int:
        return sum(self.fallback)


@dataclass
class DecisionStats:
    """Counters of decided windows: the record that a policy object's `PolicyStats` and a
    regional scheduler's `SchedulerStats` (services/scheduler/core.py) both extend."""

    windows: int = 0
    requests: int = 0
    fallbacks: int = 0
    unplaceable: int = 0
    fallback_reasons: Counter[str] = field(default_factory=Counter)

    def tally(
        self, targets: Sequence[str | None], fallback: Iterable[bool], reasons: Sequence[str]
    ) -> None:
        """Count one decided window: its requests, those no DC takes (target None or ""),
        the `fallback` flags set and the non-empty fallback `reasons`."""
        self.windows += 1
        self.requests += len(targets)
        self.fallbacks += sum(fallback)
        self.unplaceable += len(targets) - sum(map(bool, targets))
        if any(reasons):
            for reason in reasons:
                if reason:
                    self.fallback_reasons[reason] += 1


@dataclass
class PolicyStats(DecisionStats):
    """Counters of one policy object (mutable run state, owned by the policy)."""

    solver_calls: int = 0
    limit_hits: int = 0
    solver_failures: int = 0
    solve_s_total: float = 0.0

    def record(self, d: Decision) -> None:
        self.tally(d.targets, d.fallback, d.fallback_reason)
        self.solver_calls += d.iterations
        self.limit_hits += int(d.limit_hit)
        self.solver_failures += int(d.status == "solver_failed")
        self.solve_s_total += d.solve_s


@dataclass(frozen=True)
class PolicyDeps:
    """What the runtime injects into every policy."""

    clock: Clock = zero_clock
    rng: np.random.Generator | None = None
    estimator: Estimator | None = None


class RoundRobin:
    """A round-robin cursor over DC positions that skips ineligible DCs."""

    def __init__(self) -> None:
        self._pos = 0

    def pick(self, mask: BoolArray) -> int:
        """Next eligible index from the cursor on, or -1 if none is eligible."""
        return self.pick_index(np.flatnonzero(mask).tolist(), int(mask.shape[0]))

    def pick_index(self, eligible: Sequence[int], n: int) -> int:
        """Next of the sorted `eligible` indices (out of `n`) from the cursor on,
        wrapping around, or -1 if there is none."""
        if not eligible or n == 0:
            return -1
        k = bisect_left(eligible, self._pos % n)
        idx = eligible[k] if k < len(eligible) else eligible[0]
        self._pos = idx + 1
        return idx


class Policy:
    """Base class: estimator, deps, counters, fallback chain and Decision building.

    A subclass overrides `decide_window` (or, owning the empty window too, `decide`)."""

    name: str = ""
    batch: bool = False
    config_cls: type[Any] | None = None  # set by `register`: what `config=None` builds

    def __init__(self, config: Any = None, deps: PolicyDeps | None = None) -> None:
        cls = type(self)
        if cls.decide is Policy.decide and cls.decide_window is Policy.decide_window:
            raise TypeError(f"{cls.__name__} must override decide_window (or decide)")
        if config is None and cls.config_cls is not None:
            config = cls.config_cls()
        self.config = config
        self.deps = deps or PolicyDeps()
        self.estimator = self.deps.estimator or Estimator()
        self.clock = self.deps.clock
        self.stats = PolicyStats()
        self._fallback_rr = RoundRobin()

    def decide(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        """Assign every request of the window to a DC (or None)."""
        if not requests:
            return empty_decision(self)
        return self.decide_window(requests, snapshot, region, now_s)

    def decide_window(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        """`decide` for a window of at least one request."""
        raise NotImplementedError

    # --- helpers for subclasses ---------------------------------------------------------
    def fallback_one(
        self, est: Estimates, r: int, used: FloatArray, capacity: FloatArray | None = None
    ) -> int:
        """Lowest-carbon feasible DC with headroom left (``used < H_d``), else
        round-robin over the eligible DCs; -1 if none is eligible. Updates `used`."""
        cap = est.capacity_requests if capacity is None else capacity
        ok = est.feasible[r] & (used < cap)
        if bool(ok.any()):
            d = int(np.argmin(np.where(ok, est.carbon_g[r], np.inf)))
        else:
            d = self._fallback_rr.pick(est.eligible[r])
        if d >= 0:
            used[d] += 1.0
        return d

    def finish(
        self,
        est: Estimates,
        assign: IntArray,
        reasons: Sequence[str],
        status: str,
        *,
        solve_s: float = 0.0,
        build_s: float = 0.0,
        iterations: int = 0,
        objective_g: float | None = None,
        mip_gap: float | None = None,
        limit_hit: bool = False,
        capacity: FloatArray | None = None,
    ) -> Decision:
        """Run the fallback chain for requests with a reason and build the Decision.

        `assign[r]` is the chosen DC index or -1; requests with a non-empty reason go
        through the fallback chain (their `assign` entry is ignored). `capacity` overrides
        the estimates' H_d for the headroom test (iterative ILP: the pre-window H_d).
        """
        n_d = len(est.dc_names)
        placed = assign[assign >= 0]
        used = np.bincount(placed, minlength=n_d).astype(np.float64) if n_d else np.zeros(0)
        out = assign.copy()
        for r, why in enumerate(reasons):
            if why:
                out[r] = self.fallback_one(est, r, used, capacity) if n_d else -1
        return self.build(
            est.dc_names,
            out,
            reasons,
            status,
            solve_s=solve_s,
            build_s=build_s,
            iterations=iterations,
            objective_g=objective_g,
            mip_gap=mip_gap,
            limit_hit=limit_hit,
        )

    def build(
        self,
        names: Sequence[str],
        assign: IntArray | Sequence[int],
        reasons: Sequence[str],
        status: str,
        **extra: Any,
    ) -> Decision:
        """The Decision for final DC indices `assign` (-1: None); records the stats."""
        idx = assign.tolist() if isinstance(assign, np.ndarray) else assign
        d = Decision(
            targets=tuple([names[i] if i >= 0 else None for i in idx]),
            fallback=tuple([bool(w) for w in reasons]),
            fallback_reason=tuple(reasons),
            status=status,
            **extra,
        )
        self.stats.record(d)
        return d


def empty_decision(policy: Policy, status: str = "empty") -> Decision:
    """The decision for an empty window."""
    d = Decision(targets=(), fallback=(), fallback_reason=(), status=status)
    policy.stats.record(d)
    return d


def reasons_for(est: Estimates, res: SolveResult) -> list[str]:
    """Fallback reason per request after a solve ("" where the solver placed it)."""
    has_feasible: list[bool] = np.asarray(est.feasible.any(axis=1)).tolist()
    out: list[str] = []
    for r, a in enumerate(res.assign.tolist()):
        if not has_feasible[r]:
            out.append(NO_FEASIBLE)
        elif not res.has_solution:
            out.append(SOLVER_FAILED)
        elif a < 0:
            out.append(NO_CAPACITY)
        else:
            out.append("")
    return out


def status_of(res: SolveResult) -> str:
    return res.status if res.has_solution else "solver_failed"


@dataclass(frozen=True)
class SolverConfig:
    """The setting every window solver has (its config classes extend this one)."""

    time_limit_s: float = field(
        default=0.25, metadata={"help": "HiGHS time limit per solver call, seconds"}
    )

    def __post_init__(self) -> None:
        check(self.time_limit_s >= 0.0, "time_limit_s", ">= 0", self.time_limit_s)


@dataclass(frozen=True)
class Window:
    """The window a solver policy's `solve` works on: its requests, the snapshot and the
    decision time (the iterative ILP re-estimates the window on projected DC states)."""

    requests: RequestArrays
    snapshot: SnapshotView
    now_s: float


@dataclass(frozen=True)
class Solved:
    """What `SolverPolicy.solve` returns: the estimates its result refers to (iterative
    ILP: the last solved round's), the result (times and limit hits over all rounds) and
    the number of solver calls."""

    est: Estimates
    result: SolveResult
    iterations: int = 1


class SolverPolicy(Policy, ABC, Generic[P]):
    """Template of the window solvers: estimate the window on the snapshot, `prepare`
    the model inputs (timed with the estimate as model build), `solve`, then `finish`:
    requests the result leaves unplaced (or all of them, when there is no solution) go
    through the fallback chain with their reason (`reasons_for`); the headroom test uses
    the first estimate's H_d."""

    batch = True

    def __init__(self, config: Any = None, deps: PolicyDeps | None = None) -> None:
        super().__init__(config, deps)
        self.solver = HighsSolver(self.clock)

    @abstractmethod
    def prepare(self, est: Estimates) -> P:
        """The solver's inputs derived from the estimates (costs, a warm start)."""

    @abstractmethod
    def solve(self, est: Estimates, problem: P, window: Window) -> Solved:
        """Solve the window's model (one or more solver calls)."""

    def decide_window(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        t0 = self.clock()
        reqs = RequestArrays.from_requests(requests, region)
        est = self.estimator.estimate(reqs, snapshot, now_s=now_s)
        problem = self.prepare(est)
        prep_s = self.clock() - t0
        out = self.solve(est, problem, Window(reqs, snapshot, now_s))
        res = out.result
        assign: IntArray = res.assign if res.has_solution else np.full(len(requests), -1)
        return self.finish(
            out.est,
            assign,
            reasons_for(out.est, res),
            status_of(res),
            solve_s=res.solve_s,
            build_s=res.build_s + prep_s,
            iterations=out.iterations,
            objective_g=res.objective_g,
            mip_gap=res.mip_gap,
            limit_hit=res.limit_hit,
            capacity=est.capacity_requests,
        )
