"""The load plan: which requests are emitted when, with what lengths, from which region.

Rules
-----
* Deterministic from the topology's load section and seed (numpy Generator): arrival
  times from `services.loadgen.arrivals`, (ISL, OSL) pairs from `services.loadgen.datasets`
  fitted to the model's context, origin regions round-robin over the regions (paper 1:
  the load generator dispatches round-robin to the schedulers) or drawn by weight.
* Every planned request carries the topology's SLO; request ids are ``r<index>``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.config.calibration import load_calibration
from services.config.topology import Topology
from services.loadgen.arrivals import make_arrivals
from services.loadgen.datasets import get_dataset


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    id: str
    t_s: float               # emission time, emulated seconds from the start of the load
    isl_tokens: int
    osl_tokens: int
    origin_region: str
    model: str
    dataset: str
    ttft_slo_s: float
    tpot_slo_s: float


def plan_requests(topo: Topology) -> list[PlannedRequest]:
    load = topo.load
    rng = np.random.default_rng(load.seed)
    arrivals = make_arrivals(load.arrivals, load.rate_rps, load.duration_s, rng)
    times = np.asarray(arrivals.times_s, dtype=float)
    n = len(times)
    max_len = min(
        load_calibration(d.setup).engine.max_model_len
        for d in topo.dcs
        if load_calibration(d.setup).model == load.model
    )
    isl, osl = get_dataset(load.dataset).sample(n, rng, max_model_len=max_len)
    regions = [r.name for r in topo.regions]
    if isinstance(load.origin, str):
        origins = [regions[i % len(regions)] for i in range(n)]
    else:
        w = np.array([load.origin.get(r, 0.0) for r in regions], dtype=float)
        if w.sum() <= 0:
            w = np.ones(len(regions))
        picks = rng.choice(len(regions), size=n, p=w / w.sum())
        origins = [regions[int(k)] for k in picks]
    return [
        PlannedRequest(
            id=f"r{i}",
            t_s=float(times[i]),
            isl_tokens=int(isl[i]),
            osl_tokens=int(osl[i]),
            origin_region=origins[i],
            model=load.model,
            dataset=load.dataset,
            ttft_slo_s=topo.slo.ttft_s,
            tpot_slo_s=topo.slo.tpot_s,
        )
        for i in range(n)
    ]
