"""Shared latency / carbon estimator of the regional schedulers (paper 1 §IV).

Rules / theory of operation
---------------------------
* Sans-IO and vectorised: inputs are a window of `RequestView`s and a `SnapshotView`; the
  output `Estimates` holds ``[R, D]`` numpy arrays (requests x DCs, DCs in snapshot order).
  No clocks, no I/O; calibrations are read once per setup through an injectable loader and
  cached (one `PerfModel` and one coefficient row per setup).
* Per request r and DC d (all snapshot values are per-engine averages)::

      TTFT[r,d] = RTT(origin_r, region_d) + W_d + t_pre(ISL_r + Q_d)
      TPOT[r,d] = [t_dec(B_d + 1, K_d + ISL_r) + T_pre_d] / (1 - duty_d)

  - ``t_pre(N)`` is the total time of prefilling N tokens: chunks of at most
    ``max_num_batched_tokens`` (each chunk pays b0 and its token term; the request-count
    term b1 counts the request plus the ``waiting_requests`` whose Q_d tokens go first; the
    attention term b2 sums ISL^2 + Q_d^2 / max(waiting, 1), i.e. the queued tokens split
    evenly over the waiting requests). When the engine is decoding (B_d > 0), each chunk
    after the first waits for one decode step, as in the engine's prefill/decode loop.
  - ``W_d`` is the wait for a batch slot. Admission happens at iteration boundaries, so a
    busy engine (B_d > 0) costs half an effective step ``s_d = t_dec(B_d, K_d)/(1-duty_d)``
    on average. If the batch is full -- ``waiting_d + 1 > max_batch - B_d`` -- or the
    request's KV (ISL + OSL tokens) does not fit the free KV memory, the request waits for
    ``excess`` requests to retire first; a full engine retires ``max_batch / (L * s_d)``
    requests per second, where L is the mean OSL of the running requests, estimated by the
    mean OSL of the window (same workload) unless `EstimatorConfig.mean_osl_tokens` is set.
    So ``W_d = [B_d > 0] * s_d / 2 + excess * L * s_d / max_batch``.
  - ``T_pre_d`` is the stall from prefills queued at d that have not started yet:
    ``t_pre(Q_d)`` (same chunking as above) amortised over the request's OSL, i.e.
    ``t_pre(Q_d) / OSL_r``. Prefills already running show up through ``duty_d``, clipped
    to `EstimatorConfig.max_duty_ratio` so the factor stays finite.
  - The request's own prompt joins the KV cache: ``K_d + ISL_r`` in t_dec (paper: KV_d).
* Energy (J) of a request at d, at the calibrated maximum frequency::

      E_pre      = e0_pre * chunks(ISL) + e_p * ISL + e_a * ISL^2
      dE_dec     = e_d + e_k * (ISL + OSL / 2)            marginal decode energy per step
                 + max(0, 1 - B_d) * max(0, e0_dec - P_idle * a0)   wake-up share
      E[r,d]     = E_pre + OSL * dE_dec
      carbon_g   = E * PUE_d * CI_d / 3.6e6

  The wake-up share is the fixed decode step energy not already paid by the running batch
  (an idle engine burns ``P_idle`` anyway); ``energy_fixed_j`` isolates the fixed parts
  (prefill e0 and the wake-up share) for the facility MILP, which charges them per DC.
* Feasibility: ``up`` and the DC serves the request's model (empty model = any) and both
  estimates within the request's SLOs. ``capacity_requests[d]`` (H_d) is the number of free
  batch slots in the DC: ``floor(max(0, max_batch - B_d - waiting_d) * engines)``.
* `DcArrays.project` adds requests "as if already dispatched" (iterative ILP) by
  `project_dispatches`, the rule by which `SchedulerCore.view` also adds its own dispatches
  since the last snapshot.
* The step formulas (t_pre, t_dec) are `services.datacenter.perfmodel`'s, evaluated on
  the calibrations' coefficient records with one numpy column per DC (`Coeffs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from services.config.calibration import (
    Calibration,
    DecodeCoeffs,
    EnergyCoeffs,
    PrefillCoeffs,
    load_calibration,
)
from services.datacenter.perfmodel import (
    PerfModel,
    X,
    chunked_prefill_time,
    columns,
    decode_step_time,
    engine_idle_w,
    select,
)
from services.model.errors import InvalidInput
from services.model.state import DcView, RequestView, SnapshotView

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class EstimatorConfig:
    """Knobs of the shared estimator (defaults follow the paper)."""

    max_duty_ratio: float = 0.95
    """Upper clip of the prefill duty so 1/(1-duty) stays finite."""
    mean_osl_tokens: float | None = None
    """Mean OSL of running requests for the retire rate; None: mean OSL of the window."""
    include_elapsed: bool = False
    """Add the time the request already spent since arrival (window wait) to TTFT."""


@dataclass(frozen=True)
class Coeffs:
    """Calibration coefficients of the DCs as per-DC columns (snapshot order): the
    calibration's own records with a numpy column in each field."""

    prefill: PrefillCoeffs[FloatArray]
    decode: DecodeCoeffs[FloatArray]
    energy: EnergyCoeffs[FloatArray]
    chunk_tokens: FloatArray  # max_num_batched_tokens
    idle_w: FloatArray  # idle power of a whole engine
    kv_capacity_tokens: FloatArray


def project_dispatches(
    batch: X, waiting: X, queue_tokens: X, kv_tokens: X, max_batch: X, engines: X,
    n_requests: X, isl_tokens: X,
) -> tuple[X, X, X, X]:
    """Per-engine (batch, waiting, queue, KV) of a DC after `n_requests` requests with
    `isl_tokens` prompt tokens in total were dispatched to it, spread over its engines:
    they join the batch up to `max_batch` (the rest wait), their prompts join the queue
    and, once admitted, the KV cache. Floats (`SchedulerCore.view`) or per-DC arrays
    (`DcArrays.project`) alike."""
    eng = select(engines >= 1.0, engines, 1.0)
    add = n_requests / eng
    tok = isl_tokens / eng
    joined = batch + add
    new_batch = select(joined <= max_batch, joined, max_batch)
    return new_batch, waiting + (joined - new_batch), queue_tokens + tok, kv_tokens + tok


@dataclass(frozen=True)
class DcArrays:
    """The DCs of a snapshot as column arrays (per-engine averages)."""

    names: tuple[str, ...]
    regions: tuple[str, ...]
    models: tuple[str, ...]
    setups: tuple[str, ...]
    engines: FloatArray
    max_batch: FloatArray
    batch: FloatArray
    queue_tokens: FloatArray
    kv_tokens: FloatArray
    duty_ratio: FloatArray
    waiting: FloatArray
    ci_g_per_kwh: FloatArray
    pue: FloatArray
    up: BoolArray

    @classmethod
    def from_snapshot(cls, snapshot: SnapshotView) -> DcArrays:
        dcs = list(snapshot.dcs)

        def col(attr: str) -> FloatArray:
            return np.array([float(getattr(d, attr)) for d in dcs], dtype=np.float64)

        return cls(
            names=tuple(d.dc for d in dcs),
            regions=tuple(d.region for d in dcs),
            models=tuple(d.model.lower() for d in dcs),
            setups=tuple(d.setup for d in dcs),
            engines=np.maximum(col("engines"), 0.0),
            max_batch=np.maximum(col("max_batch"), 1.0),
            batch=np.maximum(col("active_batch"), 0.0),
            queue_tokens=np.maximum(col("queue_tokens"), 0.0),
            kv_tokens=np.maximum(col("kv_tokens"), 0.0),
            duty_ratio=np.clip(col("prefill_duty_ratio"), 0.0, 1.0),
            waiting=np.maximum(col("waiting_requests"), 0.0),
            ci_g_per_kwh=np.maximum(col("ci_g_per_kwh"), 0.0),
            pue=np.maximum(col("pue"), 1.0),
            up=np.array([bool(d.up) and d.engines > 0 for d in dcs], dtype=np.bool_),
        )

    @property
    def size(self) -> int:
        return len(self.names)

    def capacity_requests(self) -> FloatArray:
        """H_d: free batch slots over all engines of each DC (0 for a down DC)."""
        free = np.maximum(self.max_batch - self.batch - self.waiting, 0.0) * self.engines
        return np.where(self.up, np.floor(free + 1e-9), 0.0)

    def project(self, n_requests: FloatArray, isl_tokens: FloatArray) -> DcArrays:
        """These DCs after `n_requests[d]` requests with `isl_tokens[d]` prompt tokens in
        total were dispatched to each: they join the batch up to max_batch (the rest wait),
        their prompts join the queue and, once admitted, the KV cache."""
        batch, waiting, queue, kv = project_dispatches(
            self.batch, self.waiting, self.queue_tokens, self.kv_tokens, self.max_batch,
            self.engines, np.asarray(n_requests, dtype=np.float64),
            np.asarray(isl_tokens, dtype=np.float64),
        )
        return replace(self, batch=batch, waiting=waiting, queue_tokens=queue, kv_tokens=kv)

    def idle(self) -> DcArrays:
        """The same DCs with empty engines (batch-agnostic estimates, e.g. Green-LLM)."""
        z = np.zeros_like(self.batch)
        return replace(self, batch=z, waiting=z, queue_tokens=z, kv_tokens=z, duty_ratio=z)


class Projection:
    """A scheduler's own dispatches since its latest snapshot, kept on that snapshot's DC
    columns (`DcArrays`) in place: each dispatch re-projects its one DC from the
    snapshot's values with `project_dispatches` (each dispatch counting `scale` times),
    so a policy's view costs O(1) per dispatch instead of a snapshot rebuilt per
    decision. `view()` is what the policy sees; the arrays change with the next `add`,
    so a view is valid for the decision it was taken for."""

    def __init__(self, base: SnapshotView, scale: float = 1.0) -> None:
        self.base = base
        self.scale = scale
        self.index = {d.dc: i for i, d in enumerate(base.dcs)}
        self.arrays = DcArrays.from_snapshot(base)   # owned: updated in place
        self.n = [0.0] * len(self.index)
        self.tokens = [0.0] * len(self.index)
        self.dispatched = False

    def add(self, dc: str, isl_tokens: float) -> None:
        """One more dispatch of a request with `isl_tokens` prompt tokens to `dc`."""
        i = self.index.get(dc)
        if i is None:
            return
        self.n[i] += 1.0
        self.tokens[i] += isl_tokens
        batch, waiting, queue, kv = self._projected(i)
        a = self.arrays  # the clamps of `DcArrays.from_snapshot`
        a.batch[i] = max(float(batch), 0.0)
        a.waiting[i] = max(float(waiting), 0.0)
        a.queue_tokens[i] = max(float(queue), 0.0)
        a.kv_tokens[i] = max(float(kv), 0.0)
        self.dispatched = True

    def view(self) -> SnapshotView:
        return ProjectedSnapshot(self) if self.dispatched else self.base

    def _projected(self, i: int) -> tuple[float, float, float, float]:
        """(batch, waiting, queue, KV) of DC `i` after its dispatches so far."""
        d = self.base.dcs[i]
        return project_dispatches(
            d.active_batch, d.waiting_requests, d.queue_tokens, d.kv_tokens,
            float(d.max_batch), float(d.engines), self.n[i] * self.scale,
            self.tokens[i] * self.scale,
        )

    def dc_views(self) -> tuple[DcView, ...]:
        """The projected DCs as `DcView`s (DCs without dispatches: the snapshot's own)."""
        out = []
        for i, d in enumerate(self.base.dcs):
            if self.n[i]:
                batch, waiting, queue, kv = self._projected(i)
                d = replace(d, active_batch=batch, waiting_requests=waiting,
                            queue_tokens=queue, kv_tokens=kv)
            out.append(d)
        return tuple(out)


class ProjectedSnapshot(SnapshotView):
    """A snapshot as a `Projection` sees it: seq, time and RTTs of the snapshot, DC
    columns from the projection (`Estimator.dc_arrays`), `dcs` built on demand."""

    projection: Projection

    def __init__(self, projection: Projection) -> None:  # noqa: D107
        base = projection.base
        object.__setattr__(self, "projection", projection)
        object.__setattr__(self, "seq", base.seq)
        object.__setattr__(self, "time_s", base.time_s)
        object.__setattr__(self, "rtt_s", base.rtt_s)

    @property  # type: ignore[override]
    def dcs(self) -> tuple[DcView, ...]:
        return self.projection.dc_views()


@dataclass(frozen=True)
class RequestArrays:
    """A window of requests as column arrays."""

    ids: tuple[str, ...]
    models: tuple[str, ...]
    origins: tuple[str, ...]
    isl_tokens: FloatArray
    osl_tokens: FloatArray
    ttft_slo_s: FloatArray
    tpot_slo_s: FloatArray
    arrival_s: FloatArray

    @classmethod
    def from_requests(cls, requests: Sequence[RequestView], region: str = "") -> RequestArrays:
        for r in requests:
            if r.isl_tokens < 0 or r.osl_tokens < 0:
                raise InvalidInput("request.isl_tokens", f"negative length in request {r.id!r}")
        return cls(
            ids=tuple(r.id for r in requests),
            models=tuple(r.model.lower() for r in requests),
            origins=tuple(r.origin_region or region for r in requests),
            isl_tokens=np.array([max(r.isl_tokens, 1) for r in requests], dtype=np.float64),
            osl_tokens=np.array([max(r.osl_tokens, 1) for r in requests], dtype=np.float64),
            ttft_slo_s=np.array([r.ttft_slo_s for r in requests], dtype=np.float64),
            tpot_slo_s=np.array([r.tpot_slo_s for r in requests], dtype=np.float64),
            arrival_s=np.array([r.arrival_s for r in requests], dtype=np.float64),
        )

    @property
    def size(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Estimates:
    """Per request x DC estimates; rows follow the window, columns the snapshot's DCs."""

    dc_names: tuple[str, ...]
    ttft_s: FloatArray
    tpot_s: FloatArray
    latency_s: FloatArray  # TTFT + OSL * TPOT: estimated end-to-end latency
    energy_j: FloatArray
    energy_fixed_j: FloatArray  # fixed parts of energy_j (prefill e0, wake-up share)
    carbon_g: FloatArray
    carbon_per_j: FloatArray  # [D] grams CO2 per joule at the DC (PUE * CI / 3.6e6)
    feasible: BoolArray  # SLO-feasible, up and serving the model
    eligible: BoolArray  # up and serving the model (SLO ignored)
    capacity_requests: FloatArray  # [D] H_d

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.ttft_s.shape[0]), int(self.ttft_s.shape[1]))


class Estimator:
    """Vectorised TTFT / TPOT / carbon estimates for a window of requests."""

    def __init__(
        self,
        config: EstimatorConfig | None = None,
        loader: Callable[[str], Calibration] = load_calibration,
    ) -> None:
        self.config = config or EstimatorConfig()
        self._loader = loader
        self._models: dict[str, PerfModel] = {}
        self._coeffs: dict[tuple[str, ...], Coeffs] = {}
        self._last_snapshot: SnapshotView | None = None
        self._last_dcs: DcArrays | None = None
        self._rtt_rows: dict[str, FloatArray] = {}
        self._eligible: dict[str, list[int]] = {}

    # --- caches ------------------------------------------------------------------------
    def perf_model(self, setup: str) -> PerfModel:
        """The cached `PerfModel` of a calibration setup."""
        pm = self._models.get(setup)
        if pm is None:
            pm = PerfModel(self._loader(setup))
            self._models[setup] = pm
        return pm

    def coeffs(self, setups: tuple[str, ...]) -> Coeffs:
        """Per-DC coefficient arrays for DCs running `setups` (cached per tuple)."""
        hit = self._coeffs.get(setups)
        if hit is not None:
            return hit
        cals = [self.perf_model(s).cal for s in setups]
        energy: EnergyCoeffs[FloatArray] = columns(EnergyCoeffs, [c.energy for c in cals])
        co = Coeffs(
            prefill=columns(PrefillCoeffs, [c.prefill for c in cals]),
            decode=columns(DecodeCoeffs, [c.decode for c in cals]),
            energy=energy,
            chunk_tokens=np.array([c.engine.max_num_batched_tokens for c in cals], np.float64),
            idle_w=engine_idle_w(energy, np.array([c.tp for c in cals], np.float64)),
            kv_capacity_tokens=np.array(
                [c.engine.kv_capacity_tokens(c.tp) for c in cals], np.float64
            ),
        )
        self._coeffs[setups] = co
        return co

    def dc_arrays(self, snapshot: SnapshotView) -> DcArrays:
        """Column view of a snapshot's DCs (cached for the last snapshot object; a
        `ProjectedSnapshot`'s are its projection's)."""
        if isinstance(snapshot, ProjectedSnapshot):
            self.dc_arrays(snapshot.projection.base)
            return snapshot.projection.arrays
        if snapshot is not self._last_snapshot or self._last_dcs is None:
            self._last_snapshot = snapshot
            self._last_dcs = DcArrays.from_snapshot(snapshot)
            self._rtt_rows = {}
            self._eligible = {}
        return self._last_dcs

    def eligible_indices(self, snapshot: SnapshotView, model: str) -> list[int]:
        """Indices (snapshot order) of the DCs that are up and serve `model` (empty: any),
        cached per snapshot: the per-request path of round-robin and least-loaded."""
        dcs = self.dc_arrays(snapshot)
        key = model.lower()
        hit = self._eligible.get(key)
        if hit is None:
            hit = [i for i, (up, m) in enumerate(zip(dcs.up.tolist(), dcs.models, strict=True))
                   if up and (not key or not m or m == key)]
            self._eligible[key] = hit
        return hit

    def _rtt_row(self, snapshot: SnapshotView, dcs: DcArrays, origin: str) -> FloatArray:
        self.dc_arrays(snapshot)  # resets the row cache on a new snapshot
        row = self._rtt_rows.get(origin)
        if row is None:
            row = np.array([snapshot.rtt(origin, reg) for reg in dcs.regions], dtype=np.float64)
            self._rtt_rows[origin] = row
        return row

    # --- estimates ---------------------------------------------------------------------
    def estimate(
        self,
        requests: Sequence[RequestView] | RequestArrays,
        snapshot: SnapshotView,
        *,
        dcs: DcArrays | None = None,
        now_s: float | None = None,
        region: str = "",
        batch_agnostic: bool = False,
    ) -> Estimates:
        """Estimates for every (request, DC) pair.

        `dcs` overrides the snapshot's DC state (e.g. a projection); `batch_agnostic`
        computes latencies as if every engine were empty (energy keeps the real state).
        """
        cfg = self.config
        reqs = (
            requests
            if isinstance(requests, RequestArrays)
            else RequestArrays.from_requests(requests, region)
        )
        state = dcs if dcs is not None else self.dc_arrays(snapshot)
        n_r, n_d = reqs.size, state.size
        co = self.coeffs(state.setups)
        lat = state.idle() if batch_agnostic else state

        isl = reqs.isl_tokens[:, None]
        osl = reqs.osl_tokens[:, None]
        mean_osl = cfg.mean_osl_tokens or (float(reqs.osl_tokens.mean()) if n_r else 1.0)

        # RTT from each request's origin region to each DC's region.
        rtt = np.empty((n_r, n_d), dtype=np.float64)
        by_origin: dict[str, list[int]] = {}
        for i, o in enumerate(reqs.origins):
            by_origin.setdefault(o, []).append(i)
        for o, rows in by_origin.items():
            rtt[rows, :] = self._rtt_row(snapshot, state, o)

        duty = np.minimum(lat.duty_ratio, cfg.max_duty_ratio)
        stretch = 1.0 / (1.0 - duty)
        # effective step now
        step_s = decode_step_time(co.decode, lat.batch, lat.kv_tokens) * stretch

        # W_d: iteration boundary + waiting for `excess` retirements.
        free_slots = lat.max_batch - lat.batch
        excess_batch = np.maximum(lat.waiting + 1.0 - free_slots, 0.0)
        ctx_per_req = np.where(lat.batch > 0, lat.kv_tokens / np.maximum(lat.batch, 1e-9), 1.0)
        kv_over = np.maximum(
            lat.kv_tokens + lat.queue_tokens + isl + osl - co.kv_capacity_tokens, 0.0
        )
        excess_kv = np.ceil(kv_over / np.maximum(ctx_per_req, 1.0))
        excess = np.maximum(excess_batch, excess_kv)
        wait_s = np.where(lat.batch > 0, 0.5 * step_s, 0.0) + excess * mean_osl * np.where(
            lat.batch > 0, step_s, 0.0
        ) / lat.max_batch

        # Prefill of the queued tokens then the request's prompt.
        q = lat.queue_tokens
        w = lat.waiting
        q_sq = q * q / np.maximum(w, 1.0)
        pre_s, chunks = chunked_prefill_time(
            co.prefill, co.chunk_tokens, isl + q, 1.0 + w, isl * isl + q_sq
        )
        pre_s = pre_s + np.where(lat.batch > 0, np.maximum(chunks - 1.0, 0.0), 0.0) * step_s
        ttft = rtt + wait_s + pre_s
        if cfg.include_elapsed and now_s is not None:
            ttft = ttft + np.maximum(now_s - reqs.arrival_s, 0.0)[:, None]

        queued_pre_s, _ = chunked_prefill_time(co.prefill, co.chunk_tokens, q, w, q_sq)
        t_dec = decode_step_time(co.decode, lat.batch + 1.0, lat.kv_tokens + isl)
        tpot = (t_dec + queued_pre_s / osl) * stretch

        # Energy and carbon (real state even when latencies are batch-agnostic).
        own_chunks = np.ceil(isl / co.chunk_tokens)
        ce = co.energy
        e_pre_var = ce.prefill_ep_j * isl + ce.prefill_ea_j * isl * isl
        e_pre_fix = ce.prefill_e0_j * own_chunks
        dec_var = ce.decode_ed_j + ce.decode_ek_j * (isl + 0.5 * osl)
        idle_frac = np.clip(1.0 - state.batch, 0.0, 1.0)
        wake_j = idle_frac * np.maximum(
            ce.decode_e0_j - co.idle_w * co.decode.alpha_s[0], 0.0
        )
        energy_fixed = e_pre_fix + osl * wake_j
        energy = e_pre_var + osl * dec_var + energy_fixed
        carbon_per_j = state.pue * state.ci_g_per_kwh / J_PER_KWH
        carbon = energy * carbon_per_j

        eligible = np.broadcast_to(state.up, (n_r, n_d)) & self._serves(reqs, state)
        feasible = (
            eligible
            & (ttft <= reqs.ttft_slo_s[:, None])
            & (tpot <= reqs.tpot_slo_s[:, None])
        )
        return Estimates(
            dc_names=state.names,
            ttft_s=ttft,
            tpot_s=tpot,
            latency_s=ttft + osl * tpot,
            energy_j=energy,
            energy_fixed_j=np.broadcast_to(energy_fixed, (n_r, n_d)).copy(),
            carbon_g=carbon,
            carbon_per_j=carbon_per_j,
            feasible=feasible,
            eligible=eligible,
            capacity_requests=state.capacity_requests(),
        )

    def eligibility(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str = ""
    ) -> tuple[RequestArrays, DcArrays, BoolArray]:
        """(requests, DCs, eligible[R, D]) without latency or carbon estimates: the
        cheap path of carbon- and SLO-blind policies (round-robin, least-loaded)."""
        reqs = RequestArrays.from_requests(requests, region)
        state = self.dc_arrays(snapshot)
        elig = np.broadcast_to(state.up, (reqs.size, state.size)) & self._serves(reqs, state)
        return reqs, state, elig

    @staticmethod
    def _serves(reqs: RequestArrays, state: DcArrays) -> BoolArray:
        dc_models = np.array(state.models, dtype=object)
        out = np.ones((reqs.size, state.size), dtype=np.bool_)
        for m in set(reqs.models):
            if not m:
                continue
            rows = [i for i, x in enumerate(reqs.models) if x == m]
            ok = (dc_models == "") | (dc_models == m)
            out[rows, :] = ok.astype(np.bool_)
        return out
