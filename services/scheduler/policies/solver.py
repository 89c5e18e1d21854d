"""HiGHS models of the window assignment problems, built from numpy arrays in CSC form.

Rules / theory of operation
---------------------------
* Variables exist only for SLO-feasible pairs (r, d) (``feasible[r, d]``); columns are
  ordered x (pairs, row-major), then u (one "unplaced" slack per request), then y (one per
  DC, facility model only). Every request row reads ``sum_d x[r,d] + u[r] = 1`` with u
  priced at `unplaced_penalty` (more than any placement can cost), so the model is always
  feasible and the solver places as many requests as capacity allows; requests left with
  u = 1 go through the policy's fallback chain (reason "no_capacity").
* Assignment ILP (paper 1 eq. 2): ``min sum c x`` s.t. request rows and capacity rows
  ``sum_r x[r,d] <= H_d``. The constraint matrix is that of a transportation problem
  (totally unimodular) and H_d is integral, so the LP relaxation has integral vertices:
  it is solved as an LP with simplex and the basic solution is the ILP optimum.
* Facility MILP (paper 1 §IV-C): adds ``sum_d f_d y_d``, capacity rows
  ``sum_r x[r,d] - H_d y_d <= 0`` and the tight linking rows ``x[r,d] - y_d <= 0``. Only
  y is integer: with y fixed the rest is again a transportation problem with integral
  vertices. If the MIP's incumbent has fractional x (a heuristic's point), x is re-solved
  as an LP with y fixed. A greedy warm start is passed with ``setSolution`` so a time-out
  still returns a feasible assignment; status, limit hits and the MIP gap are reported.
* Wall time only through the injected ``clock``; the module imports no clock itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import highspy
import numpy as np
import numpy.typing as npt

from services.model.highs import new_highs

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

_COLWISE = 1  # highspy MatrixFormat.kColwise
_MINIMIZE = 1  # highspy ObjSense.kMinimize
_SOLUTION_FEASIBLE = 2  # HighsSolutionStatus kSolutionStatusFeasible
_INF = highspy.kHighsInf


@dataclass(frozen=True)
class SolveResult:
    """The outcome of one solver call."""

    assign: IntArray  # [R] DC index per request, -1 where unplaced (u = 1) or no solution
    status: str  # optimal | time_limit | solver_failed
    has_solution: bool
    objective_g: float | None  # placement cost (unplaced penalty excluded)
    mip_gap: float | None
    limit_hit: bool
    build_s: float
    solve_s: float
    open_dcs: BoolArray | None = None  # facility model: y


def unplaced_penalty(cost: FloatArray, fixed: FloatArray | None, feasible: BoolArray) -> float:
    """A price for u[r] that exceeds any change of placement cost in the window."""
    c = float(np.max(np.abs(cost[feasible]), initial=0.0))
    f = float(np.sum(np.abs(fixed))) if fixed is not None else 0.0
    return (cost.shape[0] + 1) * c + f + 1.0


class HighsSolver:
    """HiGHS wrapper of one policy object. Each solve gets a fresh ``highspy.Highs``
    (about 0.1 ms): HiGHS measures ``time_limit`` against the instance's cumulative run
    time, so a reused instance would start hitting the limit once its solves add up."""

    def __init__(self, clock: Callable[[], float], threads: int = 0) -> None:
        self.clock = clock
        self.threads = threads
        self.h = self._new()

    def _new(self) -> highspy.Highs:
        h = new_highs()
        # HiGHS's thread pool is global to the process and fixed by the first solve that
        # starts it: a different `threads` value in a later Highs object makes that run
        # fail. So the option is only set when asked for (CA-RM may share the process).
        if self.threads:
            h.setOptionValue("threads", self.threads)
        # The warm start replaces HiGHS's feasibility-jump heuristic, which costs ~0.1 s
        # at 300 x 16 before the root LP even starts.
        h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
        return h

    def _pass(
        self,
        cost: FloatArray,
        lower: FloatArray,
        upper: FloatArray,
        row_lo: FloatArray,
        row_hi: FloatArray,
        start: npt.NDArray[np.int32],
        index: npt.NDArray[np.int32],
        value: FloatArray,
        integrality: npt.NDArray[np.int32] | None,
        presolve: bool = True,
    ) -> bool:
        h = self.h = self._new()
        h.setOptionValue("presolve", "on" if presolve else "off")
        n_col, n_row, nnz = len(cost), len(row_lo), len(value)
        integ = integrality if integrality is not None else np.zeros(n_col, dtype=np.int32)
        status = h.passModel(
            n_col, n_row, nnz, _COLWISE, _MINIMIZE, 0.0,
            cost, lower, upper, row_lo, row_hi, start, index, value, integ,
        )  # fmt: skip
        return bool(status != highspy.HighsStatus.kError)

    def _run(self, time_limit_s: float, mip_rel_gap: float) -> tuple[str, bool, bool]:
        h = self.h
        h.setOptionValue("time_limit", max(float(time_limit_s), 0.0))
        h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
        h.run()
        ms = h.getModelStatus()
        info = h.getInfo()
        has = int(info.primal_solution_status) == _SOLUTION_FEASIBLE
        limit = ms == highspy.HighsModelStatus.kTimeLimit
        if ms == highspy.HighsModelStatus.kOptimal and has:
            return "optimal", has, limit
        if limit:
            return "time_limit", has, limit
        return "solver_failed", False, limit

    # --- assignment ILP -----------------------------------------------------------------
    def solve_assignment(
        self,
        cost: FloatArray,
        feasible: BoolArray,
        capacity: FloatArray,
        *,
        time_limit_s: float,
    ) -> SolveResult:
        """Min-cost assignment with per-DC capacities (solved as its integral LP)."""
        t0 = self.clock()
        n_r, n_d = feasible.shape
        rr, dd = np.nonzero(feasible)
        p = len(rr)
        penalty = unplaced_penalty(cost, None, feasible)
        col_cost = np.concatenate([cost[rr, dd], np.full(n_r, penalty)])
        n_col = p + n_r
        # x column: rows (r, R + d); u column: row r.
        index = np.empty(2 * p + n_r, dtype=np.int32)
        index[0 : 2 * p : 2] = rr
        index[1 : 2 * p : 2] = n_r + dd
        index[2 * p :] = np.arange(n_r)
        start = np.concatenate([np.arange(0, 2 * p + 1, 2), 2 * p + np.arange(1, n_r + 1)])
        start = start.astype(np.int32)
        value = np.ones(len(index), dtype=np.float64)
        row_lo = np.concatenate([np.ones(n_r), np.full(n_d, -_INF)])
        row_hi = np.concatenate([np.ones(n_r), np.maximum(capacity, 0.0)])
        # No presolve: on these transportation LPs it costs more than the simplex itself.
        ok = self._pass(
            col_cost, np.zeros(n_col), np.ones(n_col), row_lo, row_hi,
            start, index, value, None, presolve=False,
        )  # fmt: skip
        t1 = self.clock()
        status, has, limit = self._run(time_limit_s, 0.0) if ok else ("solver_failed", False, False)
        t2 = self.clock()
        assign = np.full(n_r, -1, dtype=np.int64)
        obj = None
        if has:
            x = np.asarray(self.h.getSolution().col_value, dtype=np.float64)
            take = x[:p] > 0.5
            assign[rr[take]] = dd[take]
            obj = float(np.sum(cost[rr[take], dd[take]]))
        return SolveResult(assign, status, has, obj, None, limit, t1 - t0, t2 - t1)

    # --- facility MILP ------------------------------------------------------------------
    def solve_facility(
        self,
        cost: FloatArray,
        fixed: FloatArray,
        feasible: BoolArray,
        capacity: FloatArray,
        *,
        time_limit_s: float,
        mip_rel_gap: float,
        warm_start: IntArray | None = None,
        linking: bool = True,
        presolve: bool = True,
    ) -> SolveResult:
        """Capacitated facility location: wake-up cost `fixed[d]` once per used DC.

        `linking` adds the disaggregated rows x[r,d] <= y_d (a much tighter relaxation);
        without them only the aggregated capacity row links x and y.
        """
        t0 = self.clock()
        n_r, n_d = feasible.shape
        rr, dd = np.nonzero(feasible)
        p = len(rr)
        cap = np.maximum(capacity, 0.0)
        penalty = unplaced_penalty(cost, fixed, feasible)
        n_col = p + n_r + n_d
        col_cost = np.concatenate([cost[rr, dd], np.full(n_r, penalty), fixed])
        per_d = np.bincount(dd, minlength=n_d)
        # Capacity coefficient tightened to the requests that can use d at all.
        cap_y = np.minimum(cap, per_d.astype(np.float64))
        # Rows: R request rows, D capacity rows, then (linking) P rows x[r,d] - y_d <= 0.
        # x column k: (r_k, R + d_k[, R + D + k]) -> +1 each.   u column r: (r) -> +1.
        # y column d: (R + d) -> -min(H_d, n_d)[, linking rows of d -> -1].
        per_x = 3 if linking else 2
        x_idx = np.empty(per_x * p, dtype=np.int64)
        x_idx[0::per_x] = rr
        x_idx[1::per_x] = n_r + dd
        if linking:
            x_idx[2::per_x] = n_r + n_d + np.arange(p)
        y_len = 1 + (per_d if linking else 0 * per_d)
        y_start = np.concatenate([[0], np.cumsum(y_len)[:-1]])
        y_idx = np.empty(int(y_len.sum()), dtype=np.int64)
        y_val = np.empty(int(y_len.sum()), dtype=np.float64)
        y_idx[y_start] = n_r + np.arange(n_d)
        y_val[y_start] = -cap_y
        if linking:
            link_pos = np.ones(len(y_idx), dtype=np.bool_)
            link_pos[y_start] = False
            by_d = np.argsort(dd, kind="stable")  # pairs sorted by d, ascending k within d
            y_idx[link_pos] = n_r + n_d + by_d
            y_val[link_pos] = -1.0
        index = np.concatenate([x_idx, np.arange(n_r), y_idx]).astype(np.int32)
        value = np.concatenate([np.ones(per_x * p + n_r), y_val])
        start = np.concatenate(
            [np.arange(0, per_x * p, per_x), per_x * p + np.arange(n_r),
             per_x * p + n_r + y_start, [len(index)]]
        ).astype(np.int32)  # fmt: skip
        n_link = p if linking else 0
        row_lo = np.concatenate([np.ones(n_r), np.full(n_d + n_link, -_INF)])
        row_hi = np.concatenate([np.ones(n_r), np.zeros(n_d + n_link)])
        upper = np.ones(n_col)
        upper[p + n_r :] = np.where(per_d > 0, 1.0, 0.0)  # no y for DCs nobody can use
        integ = np.zeros(n_col, dtype=np.int32)
        integ[p + n_r :] = 1
        ok = self._pass(
            col_cost, np.zeros(n_col), upper, row_lo, row_hi, start, index, value, integ,
            presolve=presolve,
        )
        if ok and warm_start is not None:
            sol = self._facility_point(warm_start, rr, dd, n_r, n_d)
            self.h.setSolution(n_col, np.arange(n_col, dtype=np.int32), sol)
        t1 = self.clock()
        status, has, limit = (
            self._run(time_limit_s, mip_rel_gap) if ok else ("solver_failed", False, False)
        )
        assign = np.full(n_r, -1, dtype=np.int64)
        obj: float | None = None
        gap: float | None = None
        open_dcs: BoolArray | None = None
        if has:
            sol_x = np.asarray(self.h.getSolution().col_value, dtype=np.float64)
            y = sol_x[p + n_r :] > 0.5
            open_dcs = y
            x = sol_x[:p]
            if limit:
                gap = float(self.h.getInfo().mip_gap)
            if np.max(np.abs(x - np.round(x)), initial=0.0) > 1e-6:
                # A fractional incumbent: re-solve the transportation LP with y fixed.
                sub = self.solve_assignment(
                    cost, feasible & y[None, :], np.where(y, cap, 0.0),
                    time_limit_s=max(time_limit_s, 1e-3),
                )  # fmt: skip
                assign = sub.assign
            else:
                take = x > 0.5
                assign[rr[take]] = dd[take]
            placed = assign >= 0
            used = np.zeros(n_d, dtype=np.bool_)
            used[assign[placed]] = True
            obj = float(np.sum(cost[np.nonzero(placed)[0], assign[placed]])) + float(
                np.sum(fixed[used])
            )
        t2 = self.clock()
        return SolveResult(assign, status, has, obj, gap, limit, t1 - t0, t2 - t1, open_dcs)

    @staticmethod
    def _facility_point(
        assign: IntArray, rr: IntArray, dd: IntArray, n_r: int, n_d: int
    ) -> FloatArray:
        """The full column vector (x, u, y) of a warm-start assignment (it must respect
        capacity; pairs that are not feasible are dropped to u = 1)."""
        x = (assign[rr] == dd).astype(np.float64)
        placed = np.zeros(n_r, dtype=np.float64)
        np.add.at(placed, rr, x)
        u = 1.0 - np.minimum(placed, 1.0)
        y = np.zeros(n_d, dtype=np.float64)
        y[dd[x > 0]] = 1.0
        return np.concatenate([x, u, y])


def greedy_capacitated(
    cost: FloatArray, fixed: FloatArray | None, feasible: BoolArray, capacity: FloatArray
) -> IntArray:
    """Heuristic assignment: requests with the fewest feasible DCs first (ties: cheapest),
    each to its cheapest feasible DC with capacity left, paying `fixed[d]` when it opens
    a DC; -1 where no feasible DC has capacity left. Used as the MILP warm start."""
    n_r, n_d = feasible.shape
    left = np.floor(np.maximum(capacity, 0.0)).astype(np.float64)
    opened = np.zeros(n_d, dtype=np.bool_)
    fx = fixed if fixed is not None else np.zeros(n_d)
    masked = np.where(feasible, cost, np.inf)
    order = np.lexsort((masked.min(axis=1), feasible.sum(axis=1)))
    assign = np.full(n_r, -1, dtype=np.int64)
    for r in order.tolist():
        row = masked[r] + np.where(opened, 0.0, fx)
        row = np.where(left > 0, row, np.inf)
        d = int(np.argmin(row))
        if np.isfinite(row[d]):
            assign[r] = d
            left[d] -= 1.0
            opened[d] = True
    return assign
