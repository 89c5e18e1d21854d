"""Random but plausible snapshots and request windows for benchmarks and tests.

Rules / theory of operation
---------------------------
* Pure functions of an injected ``numpy.random.Generator``: the same seed gives the same
  instance. Shapes follow paper 1 §V-A: regions x DCs per region, 32 engines per DC
  (4 nodes x 8 A100), batch limit 40, RTT 85-280 ms between regions, CI 20-600 g/kWh,
  PUE 1.1, SLO TTFT 3 s / TPOT 100 ms. `load` in [0, 1] scales batch, queue and duty.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.model.state import DcView, RequestView, SnapshotView

DEFAULT_SETUP = "a100-40gb/llama-3.1-8b-tp1"


@dataclass(frozen=True)
class SyntheticShape:
    """Size and load of a synthetic topology."""

    regions: int = 4
    dcs_per_region: int = 4
    engines: int = 32
    max_batch: int = 40
    load: float = 0.5
    setup: str = DEFAULT_SETUP
    model: str = "llama-3.1-8b"


def make_snapshot(
    rng: np.random.Generator, shape: SyntheticShape | None = None, seq: int = 1
) -> SnapshotView:
    """A snapshot with random per-DC load and CI and a symmetric random RTT matrix."""
    sh = shape or SyntheticShape()
    regions = [f"region-{i}" for i in range(sh.regions)]
    dcs = []
    for ri, reg in enumerate(regions):
        for j in range(sh.dcs_per_region):
            b = float(np.clip(rng.normal(sh.load, 0.2), 0.0, 1.0)) * sh.max_batch
            w = float(max(b - 0.9 * sh.max_batch, 0.0) * rng.uniform(0, 2))
            dcs.append(
                DcView(
                    dc=f"dc-{ri}-{j}",
                    region=reg,
                    setup=sh.setup,
                    engines=sh.engines,
                    max_batch=sh.max_batch,
                    active_batch=b,
                    queue_tokens=float(rng.uniform(0, 3000) * sh.load),
                    kv_tokens=b * float(rng.uniform(300, 1500)),
                    kv_occupancy_ratio=float(np.clip(b / sh.max_batch * 0.5, 0, 1)),
                    prefill_duty_ratio=float(rng.uniform(0.0, 0.4) * sh.load),
                    waiting_requests=w,
                    ci_g_per_kwh=float(rng.uniform(20, 600)),
                    pue=1.1,
                    model=sh.model,
                )
            )
    rtt: dict[tuple[str, str], float] = {}
    for i in range(sh.regions):
        for k in range(i + 1, sh.regions):
            rtt[(regions[i], regions[k])] = float(rng.uniform(0.085, 0.280))
    return SnapshotView(seq=seq, time_s=0.0, dcs=dcs, rtt_s=rtt)


def make_requests(
    rng: np.random.Generator,
    n: int,
    regions: int = 4,
    model: str = "llama-3.1-8b",
    ttft_slo_s: float = 3.0,
    tpot_slo_s: float = 0.1,
) -> list[RequestView]:
    """`n` requests with log-normal ISL/OSL from random origin regions."""
    isl = np.clip(rng.lognormal(6.5, 0.9, n), 8, 8000).astype(int)
    osl = np.clip(rng.lognormal(4.3, 0.9, n), 1, 2000).astype(int)
    origin = rng.integers(0, regions, n)
    return [
        RequestView(
            id=f"r{i}",
            model=model,
            isl_tokens=int(isl[i]),
            osl_tokens=int(osl[i]),
            origin_region=f"region-{origin[i]}",
            ttft_slo_s=ttft_slo_s,
            tpot_slo_s=tpot_slo_s,
            arrival_s=0.0,
        )
        for i in range(n)
    ]
