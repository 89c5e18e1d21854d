"""A sans-IO vLLM-style continuous-batching engine (paper 1 §III-C, DESIGN §4).

Theory of operation
-------------------
The engine is a state machine driven by its runtime, which owns the clock:

    plan = engine.next_step(now)        # None: nothing to do (idle)
    ... runtime waits plan.duration_s (sleeps, or advances a virtual clock) ...
    events = engine.complete_step(plan.end_s)

Requests enter with `enqueue(req, now)`; they are validated (ISL >= 1, OSL >= 1,
ISL + OSL <= max_model_len) and refused when the waiting queue is full.

Rules of one iteration (vLLM 0.6 semantics, prefill-first scheduling):

1. *Retire*: a request leaves the running batch the moment its last token is produced
   (its KV blocks are freed then), which is equivalent to retiring at the next iteration.
2. *Admit* (at the start of an iteration only): FIFO from the waiting queue while the
   batch is below ``max_num_seqs`` and the request's prompt KV (whole blocks) fits in the
   free KV memory. Head-of-line blocking: a request that does not fit stops admission.
3. *Prefill*: while any running request has prompt tokens left, run prefill steps; each
   takes up to ``max_num_batched_tokens`` tokens FIFO across those requests (a longer
   prompt is split over consecutive steps: chunked prefill) and stalls decode. A request's
   first token is produced at the end of the step that finishes its prompt.
4. *Decode*: one step for the whole batch, one token per running request. Before it, each
   request whose cached context (prompt + generated tokens, the last one's KV being
   written by this step) crosses a block boundary needs one more KV block; if none is free the most
   recently admitted request is *preempted* (vLLM's recompute mode): its blocks are freed,
   it goes back to the front of the waiting queue, and when re-admitted it re-prefills its
   prompt plus the tokens it had generated (producing its next token, not a new first one).
5. Step time and energy come from `PerfModel`; each step's energy is shared among the
   requests in the step (by tokens for prefill, equally for decode).

Decode runs (``EngineConfig.max_run_steps`` > 1; the datacenter plans 32): between
events a decode batch does not change, so one plan may cover several decode steps -- up
to the step that produces some request's last token, while the KV blocks of every step
fit the free blocks (no preemption can happen in the run) and before the first step
boundary at which a waiting request could be admitted. The steps are the same steps, each
timed from the previous one's end, so a run ends where the steps would have, bit for bit.
The runtime waits for the run's end only; `cut(t)` ends a run at its first boundary at or
after `t` (a request arrived, or the GPU clock changed), and reads during a run
(`counters`, `active_energy_j`) first `sync` the steps that have ended. With
``max_run_steps = 1`` (the default of `EngineConfig`) every plan is one step.

Energy: step energy (GPU active), plus idle power of the engine's GPUs while no request is
in the pipeline (nothing running or waiting). Host power is the datacenter's.

Counters for the provisioner: running batch, queue tokens (waiting prompts plus unfinished
prefill of running requests), KV tokens and block occupancy, prefill duty (fraction of the
last ``duty_window_s`` spent in prefill steps).

Errors: `InvalidInput` for a bad request, `CapacityExceeded` for a full queue, `UsageError`
for runtime misuse (completing a step never planned, time going backwards).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from services.config.calibration import Calibration
from services.datacenter.perfmodel import PerfModel
from services.model.errors import CapacityExceeded, InvalidInput, UsageError

PREFILL = "prefill"
DECODE = "decode"



@dataclass(slots=True, eq=False)  # identity: the engine's lists look requests up by it
class EngineRequest:
    """Mutable per-request state inside one engine."""

    id: str
    isl_tokens: int
    osl_tokens: int
    arrival_s: float
    payload: Any = None            # opaque to the engine (e.g. the runtime's proto message)
    prefill_target: int = 0        # tokens to prefill: prompt (+ generated when recomputing)
    prefill_done: int = 0
    generated: int = 0
    blocks: int = 0
    admitted_s: float = math.nan
    first_token_s: float = math.nan
    preemptions: int = 0
    prefilled_tokens: int = 0      # all prefill work, recomputation included
    energy_j: float = 0.0          # prefill shares, plus decode shares booked on leaving
    share_mark_j: float = 0.0      # engine's decode-share accumulator when it joined
    last_token_s: float = math.nan  # when its latest token was produced (token gaps only)

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV is cached: prompt plus generated tokens."""
        return self.isl_tokens + self.generated


class TokenGaps:
    """A histogram of the gaps between consecutive tokens of every request (vLLM's
    inter-token latency): upper bucket bounds `edges` (a value v falls in the first bucket
    whose bound is >= v, Prometheus' rule; the last count is +Inf), their sum and count.
    A request's first token has no gap; its later gaps add up to its decode time."""

    __slots__ = ("edges", "counts", "sum", "count")

    def __init__(self, edges: Iterable[float]) -> None:
        self.edges = np.asarray(list(edges), dtype=np.float64)
        self.counts = np.zeros(len(self.edges) + 1, dtype=np.int64)
        self.sum = 0.0
        self.count = 0

    def add(self, gap: float) -> None:
        self.counts[int(np.searchsorted(self.edges, gap, side="left"))] += 1
        self.sum += gap
        self.count += 1

    def add_run(self, ends: list[float], batch: list[EngineRequest]) -> None:
        """Every request of `batch` got one token at each step end of `ends`."""
        n = len(batch)
        first = np.fromiter((ends[0] - r.last_token_s for r in batch), np.float64, n)
        first = first[~np.isnan(first)]  # tokens from before the histogram was attached
        idx = np.searchsorted(self.edges, first, side="left")
        self.counts += np.bincount(idx, minlength=len(self.counts))
        self.sum += float(first.sum())
        self.count += len(first)
        if len(ends) > 1:
            inner = np.diff(np.asarray(ends, dtype=np.float64))
            idx = np.searchsorted(self.edges, inner, side="left")
            self.counts += n * np.bincount(idx, minlength=len(self.counts))
            self.sum += n * float(inner.sum())
            self.count += n * len(inner)
        last = ends[-1]
        for r in batch:
            r.last_token_s = last


@dataclass(frozen=True)
class FinishedRequest:
    """Terminal facts about a completed request (engine-local times, emulated seconds)."""

    id: str
    arrival_s: float
    admitted_s: float
    first_token_s: float
    completed_s: float
    isl_tokens: int
    output_tokens: int
    prefilled_tokens: int
    preemptions: int
    energy_j: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        if self.output_tokens <= 1:
            return 0.0
        return (self.completed_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def queue_s(self) -> float:
        return self.admitted_s - self.arrival_s


@dataclass(frozen=True)
class FirstToken:
    """A request produced its first output token at `time_s`."""

    request_id: str
    time_s: float
    payload: Any = None


@dataclass(frozen=True)
class Finished:
    """A request produced its last token at `time_s` and left the engine."""

    request_id: str
    time_s: float
    payload: Any
    finished: FinishedRequest


EngineEvent = FirstToken | Finished


@dataclass(frozen=True)
class StepPlan:
    kind: str                      # PREFILL or DECODE
    start_s: float
    duration_s: float
    energy_j: float
    n_requests: int
    n_tokens: int                  # prefill tokens, or tokens generated by the decode step
    kv_tokens: int                 # cached tokens read (decode; the first step of a run)
    steps: int = 1                 # decode steps planned as one run (see `EngineConfig`)
    run_end_s: float = math.nan    # a run's end: its last step's, step ends summed in order

    @property
    def end_s(self) -> float:
        e = self.run_end_s
        return self.start_s + self.duration_s if e != e else e  # NaN: a single step


@dataclass
class EngineCounters:
    running: int
    waiting: int
    queue_tokens: int
    kv_tokens: int
    kv_occupancy_ratio: float
    prefill_duty_ratio: float
    steps: int


@dataclass
class EngineConfig:
    max_queue: int = 4096          # waiting requests before RESOURCE_EXHAUSTED
    duty_window_s: float = 1.0     # window of the prefill-duty counter
    watermark_ratio: float = 0.01  # free KV blocks kept back at admission (vLLM default)
    max_run_steps: int = 1         # decode steps one plan may cover (1: step by step)


@dataclass
class _Energy:
    active_j: float = 0.0
    idle_j: float = 0.0


@dataclass
class _StepWork:
    plan: StepPlan
    chunks: list[tuple[EngineRequest, int]] = field(default_factory=list)
    batch: list[EngineRequest] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)      # decode: each step's end
    energies: list[float] = field(default_factory=list)  # decode: each step's energy
    applied: int = 0                                     # decode: steps already applied


class Engine:
    """One inference engine (TP GPUs) emulating vLLM continuous batching."""

    def __init__(
        self,
        cal: Calibration,
        name: str = "engine",
        config: EngineConfig | None = None,
        start_s: float = 0.0,
        perf: PerfModel | None = None,
    ) -> None:
        self.cal = cal
        self.name = name
        self.config = config or EngineConfig()
        self.perf = perf or PerfModel(cal)
        spec = cal.engine
        self.max_num_seqs = spec.max_num_seqs
        self.token_budget = spec.max_num_batched_tokens
        self.block_tokens = spec.kv_block_tokens
        self.max_model_len = spec.max_model_len
        self.total_blocks = spec.kv_capacity_tokens(cal.tp) // self.block_tokens
        self.watermark_blocks = int(self.total_blocks * self.config.watermark_ratio)
        self.free_blocks = self.total_blocks
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._phase_start = True           # next call to next_step starts an iteration
        self._work: _StepWork | None = None
        self._now = start_s
        self._idle_since: float | None = start_s
        self.energy = _Energy()
        self.steps = 0
        self.prefill_steps = 0
        self.decode_steps = 0
        self.preemptions = 0
        self.prompt_tokens = 0             # prefill tokens computed (recomputation included)
        self.generation_tokens = 0         # tokens produced (first tokens included)
        self.token_gaps: TokenGaps | None = None  # every token's gap to the one before
        self._waiting_tokens = 0           # prompt tokens of waiting requests
        self._kv_tokens = 0                # cached tokens of running requests
        self._prefill_intervals: deque[tuple[float, float]] = deque()
        self._pending_prefill = 0          # running requests with prompt tokens left
        self._decode_share_j = 0.0         # sum over decode steps of energy / batch size

    # ------------------------------------------------------------------ admission
    def validate(self, isl: int, osl: int) -> None:
        """Raise `InvalidInput` naming the field when a request cannot be served here."""
        if isl < 1:
            raise InvalidInput("isl_tokens", f"must be >= 1, got {isl}")
        if osl < 1:
            raise InvalidInput("osl_tokens", f"must be >= 1, got {osl}")
        if isl + osl > self.max_model_len:
            raise InvalidInput(
                "isl_tokens",
                f"isl_tokens + osl_tokens = {isl + osl} exceeds the model context "
                f"max_model_len={self.max_model_len} of {self.cal.model}",
            )

    def enqueue(self, req: EngineRequest, now: float) -> None:
        """Add a request to the waiting queue (validated; refused when the queue is full).

        `now` is the request's arrival; it may be later than the start of a step in
        flight (a wall-clock runtime wakes up late), so it does not advance the step clock.
        """
        self.validate(req.isl_tokens, req.osl_tokens)
        if len(self.waiting) >= self.config.max_queue:
            raise CapacityExceeded(
                f"engine {self.name}: waiting queue full ({self.config.max_queue} requests)"
            )
        req.prefill_target = req.isl_tokens
        self._leave_idle(now)
        self.waiting.append(req)
        self._waiting_tokens += req.prefill_target

    # ------------------------------------------------------------------ stepping
    @property
    def now_s(self) -> float:
        """The engine's own time: the end of its last step (or its start)."""
        return self._now

    def oldest_waiting_arrival_s(self) -> float | None:
        return self.waiting[0].arrival_s if self.waiting else None

    @property
    def busy(self) -> bool:
        """True while a planned step has not been completed."""
        return self._work is not None

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def next_step(self, now: float) -> StepPlan | None:
        """Plan the next step starting at `now`, or None when there is nothing to run.

        None with requests still waiting means they all arrived after `now`; plan again
        at a later time.
        """
        if self._work is not None:
            raise UsageError(f"engine {self.name}: step planned at {self._work.plan.start_s} "
                             "not completed")
        self._advance(now)
        if self._phase_start:
            self._admit(now)
        pending = (
            [r for r in self.running if r.prefill_done < r.prefill_target]
            if self._pending_prefill
            else []
        )
        work: _StepWork | None
        if pending:
            work = self._plan_prefill(pending, now)
        else:
            if not self.running:
                if self.waiting and not self._phase_start:
                    # the prefill step just retired every running request: a new
                    # iteration starts now and may admit the waiting ones
                    self._phase_start = True
                    return self.next_step(now)
                self._phase_start = True
                return None
            self._phase_start = True
            work = self._plan_decode(now)
            if work is None:
                return self.next_step(now) if self.running or self.waiting else None
        self._work = work
        return work.plan

    def complete_step(self, now: float) -> list[EngineEvent]:
        """Apply the planned step (or decode run), which ended at `now`; returns the
        resulting events."""
        work = self._work
        if work is None:
            raise UsageError(f"engine {self.name}: complete_step without a planned step")
        plan = work.plan
        if now + 1e-9 < plan.start_s:
            raise UsageError(f"engine {self.name}: step ends at {now} before it started")
        events: list[EngineEvent] = []
        if plan.kind == PREFILL:
            self._work = None
            self._advance(now)
            self.steps += 1
            self.energy.active_j += plan.energy_j
            self.prefill_steps += 1
            self._prefill_intervals.append((plan.start_s, now))
            q = self._prefill_intervals
            while q and q[0][1] <= now - self.config.duty_window_s:
                self._prefill_intervals.popleft()
            total = max(plan.n_tokens, 1)
            gaps = self.token_gaps
            for req, chunk in work.chunks:
                req.prefill_done += chunk
                req.prefilled_tokens += chunk
                self.prompt_tokens += chunk
                req.energy_j += plan.energy_j * chunk / total
                if req.prefill_done >= req.prefill_target:
                    self._pending_prefill -= 1
                    if gaps is not None and req.generated and req.last_token_s == req.last_token_s:
                        # recomputed after a preemption: the gap since its last token
                        gaps.add(now - req.last_token_s)
                    self._produce_token(req, now, events)
            # the iteration continues with more prefill or its decode step
            self._phase_start = False
        else:
            last = len(work.ends) - 1
            m = self._run_totals(work, last)  # a run's steps before its last one
            self._work = None
            self._advance(now)
            energy = work.energies[last]
            self.steps += 1
            self.energy.active_j += energy
            self.decode_steps += 1
            # every request in the batch gets an equal share, booked lazily (see _book_share)
            self._decode_share_j += energy / max(len(work.batch), 1)
            if self.token_gaps is not None:
                self.token_gaps.add_run(work.ends, work.batch)
            fast = 0
            bt = self.block_tokens
            for req in work.batch:
                g = req.generated + m
                if m:  # the run's earlier steps, then the KV blocks of its last one
                    need = -(-(req.isl_tokens + g) // bt)
                    if need > req.blocks:
                        self.free_blocks -= need - req.blocks
                        req.blocks = need
                if 0 < g < req.osl_tokens - 1:
                    req.generated = g + 1  # common case: neither the first nor the last token
                    fast += 1
                else:
                    req.generated = g
                    self._produce_token(req, now, events)
            self._kv_tokens += fast
            self.generation_tokens += fast  # the others counted by _produce_token
            self._phase_start = True
        if not self.running and not self.waiting:
            self._idle_since = now
        return events

    # ------------------------------------------------------------------ decode runs
    def _admissible_from(self) -> float:
        """When the head of the waiting queue could join the batch at a step boundary:
        its arrival, or never (inf) while the batch or the KV memory holds it back -- they
        only fill up during a decode run."""
        if not self.waiting:
            return math.inf
        req = self.waiting[0]
        if len(self.running) >= self.max_num_seqs:
            return math.inf
        if self._blocks_for(req.prefill_target) > self.free_blocks - self.watermark_blocks:
            return math.inf
        return req.arrival_s

    def _run_totals(self, work: _StepWork, j: int) -> int:
        """Book steps ``applied .. j-1`` of a decode run on the engine (energy, step and KV
        counters; none of them produces a first or last token); returns their number."""
        m = j - work.applied
        if m <= 0:
            return 0
        n = len(work.batch)
        en = self.energy
        for e in work.energies[work.applied:j]:
            en.active_j += e
            self._decode_share_j += e / n
        self.steps += m
        self.decode_steps += m
        self._kv_tokens += n * m
        self.generation_tokens += n * m
        work.applied = j
        return m

    def _apply_run(self, work: _StepWork, j: int) -> None:
        """Apply steps ``applied .. j-1`` of a decode run, then allocate the KV blocks of
        step j, as its planning would."""
        m = self._run_totals(work, j)
        bt = self.block_tokens
        for req in work.batch:
            req.generated += m
            need = -(-(req.isl_tokens + req.generated) // bt)
            if need > req.blocks:
                self.free_blocks -= need - req.blocks
                req.blocks = need

    def sync(self, now: float) -> None:
        """Apply the steps of a decode run in flight that ended by `now`, so that
        counters and energy read during a run are those of a step-by-step engine."""
        work = self._work
        if work is None or len(work.ends) <= 1:
            return
        j = min(bisect_right(work.ends, now), len(work.ends) - 1)
        if j > work.applied:
            self._apply_run(work, j)

    def cut(self, t: float) -> float | None:
        """End a decode run in flight at its first step boundary at or after `t` (a
        request arrived, or the GPU clock changed: the next iteration must see it).
        Returns the run's new end, or None if it is unchanged."""
        work = self._work
        if work is None or len(work.ends) <= 1:
            return None
        m = max(bisect_left(work.ends, t), work.applied)
        if m >= len(work.ends) - 1:
            return None
        del work.ends[m + 1:]
        del work.energies[m + 1:]
        p = work.plan
        end = work.ends[-1]
        work.plan = StepPlan(DECODE, p.start_s, end - p.start_s, sum(work.energies),
                             p.n_requests, p.n_tokens, p.kv_tokens, len(work.ends), end)
        return end

    def _current(self, work: _StepWork) -> tuple[float, float, float]:
        """(start, duration, energy) of the step in flight."""
        if len(work.ends) <= 1:
            p = work.plan
            return p.start_s, p.duration_s, p.energy_j
        i = work.applied
        start = work.ends[i - 1] if i else work.plan.start_s
        return start, work.ends[i] - start, work.energies[i]

    def step_power_w(self) -> float | None:
        """Mean power of the step in flight (None: no step, or an empty one)."""
        work = self._work
        if work is None:
            return None
        _, dur, energy = self._current(work)
        return energy / dur if dur > 0 else None

    def _produce_token(self, req: EngineRequest, now: float, events: list[EngineEvent]) -> None:
        req.generated += 1
        req.last_token_s = now
        self.generation_tokens += 1
        self._kv_tokens += 1
        if math.isnan(req.first_token_s):
            req.first_token_s = now
            events.append(FirstToken(req.id, now, req.payload))
        if req.generated >= req.osl_tokens:
            self._retire(req)
            self._book_share(req)
            fin = FinishedRequest(
                id=req.id,
                arrival_s=req.arrival_s,
                admitted_s=req.admitted_s,
                first_token_s=req.first_token_s,
                completed_s=now,
                isl_tokens=req.isl_tokens,
                output_tokens=req.generated,
                prefilled_tokens=req.prefilled_tokens,
                preemptions=req.preemptions,
                energy_j=req.energy_j,
            )
            events.append(Finished(req.id, now, req.payload, fin))

    def _retire(self, req: EngineRequest) -> None:
        self.running.remove(req)
        self.free_blocks += req.blocks
        self._kv_tokens -= req.context_tokens
        req.blocks = 0

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def _admit(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.arrival_s > now + 1e-12:
                break  # arrived after this iteration started (late wake-up of a runtime)
            need = self._blocks_for(req.prefill_target)
            if need > self.free_blocks - self.watermark_blocks and self.running:
                break
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            self._waiting_tokens -= req.prefill_target
            self.free_blocks -= need
            req.blocks = need
            self._kv_tokens += req.context_tokens
            if math.isnan(req.admitted_s):
                req.admitted_s = now
            req.share_mark_j = self._decode_share_j
            if req.prefill_done < req.prefill_target:
                self._pending_prefill += 1
            self.running.append(req)

    def _plan_prefill(self, pending: list[EngineRequest], now: float) -> _StepWork:
        budget = self.token_budget
        chunks: list[tuple[EngineRequest, int]] = []
        n_tokens = 0
        sum_sq = 0.0
        for req in pending:
            if budget <= 0:
                break
            chunk = min(req.prefill_target - req.prefill_done, budget)
            chunks.append((req, chunk))
            budget -= chunk
            n_tokens += chunk
            sum_sq += float(chunk) * chunk
        dur = self.perf.prefill_time(n_tokens, len(chunks), sum_sq)
        energy = self.perf.prefill_energy(n_tokens, sum_sq)
        plan = StepPlan(PREFILL, now, dur, energy, len(chunks), n_tokens, 0)
        return _StepWork(plan, chunks=chunks)

    def _plan_decode(self, now: float) -> _StepWork | None:
        # Grow KV by one token per request; preempt the newest request when blocks run out.
        # The same pass measures a run (`max_run_steps` > 1): the steps until a request's
        # last token, and the KV blocks that `max_run_steps` steps would add at most.
        i = 0
        bt = self.block_tokens
        running = self.running
        max_run = self.config.max_run_steps
        run_ok = max_run > 1
        left_min = max_run
        extra = 0
        while i < len(running):
            req = running[i]
            g = req.generated
            # the step writes the KV of the last generated token: context_tokens in all
            ctx = req.isl_tokens + g
            blocks = req.blocks
            if ctx > blocks * bt:
                need = -(-ctx // bt) - blocks
                if self.free_blocks < need:
                    victim = running[-1]
                    self._preempt(victim)
                    run_ok = False
                    continue  # retry req (or, if it was the victim, the next one)
                self.free_blocks -= need
                blocks += need
                req.blocks = blocks
            if run_ok:
                left = req.osl_tokens - g
                if g < 1:
                    run_ok = False
                elif left < left_min:
                    left_min = left
                x = -(-(ctx + max_run - 1) // bt) - blocks
                if x > 0:
                    extra += x
            i += 1
        if not self.running:
            return None
        batch = list(self.running)
        n = len(batch)
        kv = self._kv_tokens
        perf = self.perf
        dur = perf.decode_time(n, kv)
        energy = perf.decode_energy(n, kv)
        k = left_min if run_ok and extra <= self.free_blocks else 1
        if k <= 1:
            plan = StepPlan(DECODE, now, dur, energy, n, n, kv)
            return _StepWork(plan, batch=batch, ends=[plan.end_s], energies=[energy])
        # a run: the same steps, each from the previous one's end, with the KV grown by
        # one token per request per step; it stops early at the first boundary where
        # a waiting request could be admitted
        limit = self._admissible_from()
        if now + dur >= limit:
            k = 1
        times, energies = perf.decode_run(n, kv, k)
        ends = list(accumulate(times, initial=now))
        del ends[0]  # each step from the previous one's end, summed in order
        if limit < ends[-1]:  # stop at the first boundary at or after the admissible arrival
            m = bisect_left(ends, limit) + 1
            del ends[m:]
            del energies[m:]
        t = ends[-1]
        if len(ends) == 1:
            plan = StepPlan(DECODE, now, dur, energy, n, n, kv)
        else:
            plan = StepPlan(DECODE, now, t - now, sum(energies), n, n, kv, len(ends), t)
        return _StepWork(plan, batch=batch, ends=ends, energies=energies)

    def _book_share(self, req: EngineRequest) -> None:
        """Add the decode-energy shares accrued since the request joined the batch."""
        req.energy_j += self._decode_share_j - req.share_mark_j
        req.share_mark_j = self._decode_share_j

    def _preempt(self, req: EngineRequest) -> None:
        self._book_share(req)
        self.running.remove(req)
        self.free_blocks += req.blocks
        self._kv_tokens -= req.context_tokens
        req.blocks = 0
        req.preemptions += 1
        self.preemptions += 1
        req.prefill_target = req.isl_tokens + req.generated
        req.prefill_done = 0
        self.waiting.appendleft(req)
        self._waiting_tokens += req.prefill_target

    # ------------------------------------------------------------------ failure
    def fail_all(self, now: float) -> list[EngineRequest]:
        """Drop every request in the pipeline (crash/drain); returns them for recording."""
        if self._work is not None:
            self.energy.active_j = self.active_energy_j(now)  # the elapsed part of the step
            self._work = None
        self._advance(now)
        dropped = list(self.running) + list(self.waiting)
        for req in self.running:
            self.free_blocks += req.blocks
            req.blocks = 0
        for req in self.running:
            self._book_share(req)
        self.running.clear()
        self.waiting.clear()
        self._pending_prefill = 0
        self._waiting_tokens = 0
        self._kv_tokens = 0
        self._phase_start = True
        if self._idle_since is None:
            self._idle_since = now
        return dropped

    # ------------------------------------------------------------------ accounting
    def _advance(self, now: float) -> None:
        if now + 1e-9 < self._now:
            raise UsageError(f"engine {self.name}: time went backwards ({now} < {self._now})")
        self._now = max(self._now, now)

    def _leave_idle(self, now: float) -> None:
        if self._idle_since is not None:
            self.energy.idle_j += max(0.0, now - self._idle_since) * self.perf.idle_w
            self._idle_since = None

    def active_energy_j(self, now: float) -> float:
        """Step energy so far, the elapsed fraction of a step in flight included."""
        work = self._work
        if work is None or now <= work.plan.start_s:
            return self.energy.active_j
        self.sync(now)
        start, dur, energy = self._current(work)
        if now <= start:
            return self.energy.active_j
        frac = min((now - start) / dur, 1.0) if dur > 0 else 1.0
        return self.energy.active_j + energy * frac

    def idle_energy_j(self, now: float) -> float:
        """Idle energy so far, the current idle period up to `now` included."""
        extra = 0.0
        if self._idle_since is not None and now > self._idle_since:
            extra = (now - self._idle_since) * self.perf.idle_w
        return self.energy.idle_j + extra

    def prefill_duty(self, now: float) -> float:
        """Fraction of the last ``duty_window_s`` spent in prefill steps."""
        w = self.config.duty_window_s
        lo = now - w
        q = self._prefill_intervals
        while q and q[0][1] <= lo:
            q.popleft()
        busy = 0.0
        for s, e in q:
            busy += max(0.0, min(e, now) - max(s, lo))
        work = self._work
        if work is not None and work.plan.kind == PREFILL and now > work.plan.start_s:
            busy += now - max(work.plan.start_s, lo)
        return min(busy / w, 1.0) if w > 0 else 0.0

    def counters(self, now: float) -> EngineCounters:
        self.sync(now)
        unfinished = sum(r.prefill_target - r.prefill_done for r in self.running)
        used = self.total_blocks - self.free_blocks
        return EngineCounters(
            running=len(self.running),
            waiting=len(self.waiting),
            queue_tokens=self._waiting_tokens + unfinished,
            kv_tokens=self._kv_tokens,
            kv_occupancy_ratio=used / self.total_blocks if self.total_blocks else 0.0,
            prefill_duty_ratio=self.prefill_duty(now),
            steps=self.steps,
        )

    def pipeline(self) -> Iterable[EngineRequest]:
        yield from self.running
        yield from self.waiting
