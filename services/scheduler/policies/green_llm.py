"""Green-LLM port (paper 1 §V-A, [39]): hourly per-DC token budgets, batch-agnostic
latency estimates.

Rules / theory of operation
---------------------------
* Budget: each DC gets an hourly budget of output tokens equal to what its engines produce
  in one hour at the batch limit, i.e. the batch limit mapped to tokens; each request's
  prefill (ISL, OSL: the window's means) stalls decode and is paid for::

      budget_d = engines_d * 3600 s * OSL / (t_pre(ISL) + OSL * t_dec(B, B * ctx) / B)
      B = max_batch_d

  with ctx = `budget_ctx_tokens` cached tokens per request. The budget resets when
  ``floor(now_s / 3600)`` changes; the tokens spent (the requests' OSL) are state of the
  policy object.
* Latency is batch-agnostic: TTFT/TPOT are estimated as if every engine were empty (RTT,
  the request's own prefill, a one-request decode step), so a loaded DC is never rejected.
* Pacing (our mapping of the hourly budget to the batch limit, the paper being silent on
  how an hourly budget acts within a 200 s run): the budget is released as a token bucket
  at budget/3600 per second, split evenly over the schedulers (one per region), holding at
  most ``pacing_s`` seconds of it; ``pacing_s = 0`` spends the hourly budget as it comes.
* Per window (requests in arrival order): the lowest-carbon feasible DC whose remaining
  budget covers the request's OSL. Green-LLM's hourly LP reduces to this choice at a
  100 ms window, since the only coupling is the hourly budget. No such DC -> fallback
  (reason "budget_exhausted"; lowest-carbon feasible DC with slot headroom, then RR).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from services.model.state import RequestView, SnapshotView
from services.scheduler.estimator import DcArrays, FloatArray
from services.scheduler.policies.base import (
    BUDGET,
    NO_FEASIBLE,
    Decision,
    Policy,
    PolicyDeps,
)
from services.scheduler.policies.registry import register

HOUR_S = 3600.0


@dataclass(frozen=True)
class GreenLlmConfig:
    """Settings of the Green-LLM port."""

    budget_ctx_tokens: float = field(
        default=1024.0,
        metadata={"help": "cached tokens per request when mapping the batch limit to tokens"},
    )
    pacing_s: float = field(
        default=1.0,
        metadata={"help": "release the hourly budget as a token bucket holding this many "
                          "seconds of it, shared by the regions' schedulers (0: whole hour)"},
    )


@register(
    "green-llm",
    GreenLlmConfig,
    help="Lowest-carbon DC within an hourly token budget; batch-agnostic latency.",
    batch=True,
)
class GreenLlmPolicy(Policy):
    """Hourly token budgets per DC, lowest carbon first."""

    config: GreenLlmConfig

    def __init__(
        self, config: GreenLlmConfig | None = None, deps: PolicyDeps | None = None
    ) -> None:
        super().__init__(config, deps)
        self._hour: int | None = None
        self._spent: dict[str, float] = {}
        self._bucket: dict[str, float] = {}
        self._bucket_t: float | None = None

    def budget_tokens(
        self, dcs: DcArrays, isl_tokens: float = 0.0, osl_tokens: float = 0.0
    ) -> FloatArray:
        """Hourly output-token budget of each DC: what its engines produce in an hour at
        the batch limit. With the window's mean ISL and OSL given, each request also pays
        its prefill (which stalls decode), so the rate is OSL / (t_pre(ISL) + OSL *
        t_dec(B_max) / B_max) tokens per second per engine; without, decode steps only."""
        out = np.zeros(dcs.size, dtype=np.float64)
        for i, setup in enumerate(dcs.setups):
            pm = self.estimator.perf_model(setup)
            m = float(dcs.max_batch[i])
            step = max(pm.decode_time(m, m * self.config.budget_ctx_tokens), 1e-9)
            if isl_tokens > 0 and osl_tokens > 0:
                pre = pm.prefill_time(isl_tokens, 1, isl_tokens * isl_tokens)
                per_s = osl_tokens / (pre + osl_tokens * step / m)
            else:
                per_s = m / step
            out[i] = dcs.engines[i] * per_s * HOUR_S
        return out

    def decide_window(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str, now_s: float
    ) -> Decision:
        hour = int(now_s // HOUR_S)
        if hour != self._hour:
            self._hour = hour
            self._spent = {}
        est = self.estimator.estimate(
            requests, snapshot, region=region, now_s=now_s, batch_agnostic=True
        )
        dcs = self.estimator.dc_arrays(snapshot)
        hourly = self.budget_tokens(
            dcs,
            float(np.mean([r.isl_tokens for r in requests])),
            float(np.mean([max(r.osl_tokens, 1) for r in requests])),
        )
        left = hourly - np.array([self._spent.get(n, 0.0) for n in dcs.names], dtype=np.float64)
        paced = self.config.pacing_s > 0
        if paced:
            left = np.minimum(left, self._refill(dcs, hourly, snapshot, now_s))
        osl = np.array([max(r.osl_tokens, 1) for r in requests], dtype=np.float64)
        assign = np.full(len(requests), -1, dtype=np.int64)
        reasons = [""] * len(requests)
        for r in range(len(requests)):
            if not est.feasible[r].any():
                reasons[r] = NO_FEASIBLE
                continue
            ok = est.feasible[r] & (left >= osl[r])
            if not ok.any():
                reasons[r] = BUDGET
                continue
            d = int(np.argmin(np.where(ok, est.carbon_g[r], np.inf)))
            assign[r] = d
            left[d] -= osl[r]
        dec = self.finish(est, assign, reasons, "heuristic")
        for name, r_osl in zip(dec.targets, osl.tolist(), strict=True):
            if name is not None:
                self._spent[name] = self._spent.get(name, 0.0) + r_osl
                if paced:
                    self._bucket[name] = self._bucket.get(name, 0.0) - r_osl
        return dec

    def _refill(
        self, dcs: DcArrays, hourly: FloatArray, snapshot: SnapshotView, now_s: float
    ) -> FloatArray:
        """Token bucket per DC: the hourly budget released evenly over the hour, split
        over the schedulers (one per region in the snapshot), at most `pacing_s` deep."""
        n_sched = max(len({d.region for d in snapshot.dcs}), 1)
        rate = hourly / HOUR_S / n_sched
        depth = rate * self.config.pacing_s
        dt = 0.0 if self._bucket_t is None else max(now_s - self._bucket_t, 0.0)
        self._bucket_t = now_s
        out = np.zeros(dcs.size, dtype=np.float64)
        for i, name in enumerate(dcs.names):
            level = self._bucket.get(name, float(depth[i])) + float(rate[i]) * dt
            self._bucket[name] = min(level, float(depth[i]))
            out[i] = self._bucket[name]
        return out
