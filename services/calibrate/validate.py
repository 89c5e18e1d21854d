"""Emulation of the paper's end-to-end engine validation (paper 1 §V-B).

Rules / theory of operation
---------------------------
* Three data-parallel engines of one setup, requests dispatched round-robin, Poisson
  arrivals at each rate of `PAPER_RATES_RPS` (19 rates, 2 to 50 req/s as in the paper),
  CNN-DailyMail-like lengths from `services.calibrate.workload` with a fixed seed.
* Each rate point runs arrivals over ``max(min_duration_s, min_requests / rate)`` seconds
  (default 60 s and 600 requests, so low rates still average over enough requests) and
  lets every request finish. ``ttft_mean_s`` and ``tpot_mean_s`` are plain means over the
  point's requests (TPOT over requests with more than one output token).
* **Capacity** is the maximum sustained completion rate under overload: a separate run at
  `CAPACITY_RATE_RPS` (far above capacity, so every engine keeps a queue) for
  `CAPACITY_DURATION_S`; completions between the end of warm-up (`CAPACITY_WARMUP_S`) and
  the last arrival (the queue is never empty in between) divided by that window.
* Paper anchors: TTFT 71 ms and TPOT 15.5 ms at the lowest rate; TPOT 54 ms and TTFT
  "over 20 s" at the highest rate (20 s is a lower bound, written as 20.0); capacity
  27.58 req/s for the three engines. Other points carry null paper fields.
* The engine is the datacenter's sans-IO engine, run by `services.datacenter.vdriver.replay`
  with every decision fixed — the same path `calibrate replay` uses for real logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.calibrate.workload import CNN_DAILYMAIL, Stream, Workload, poisson_stream
from services.config.calibration import Calibration
from services.datacenter.vdriver import ReplayItem, ReplayResult, replay

PAPER_RATES_RPS: tuple[float, ...] = (
    2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 35, 40, 45, 50,
)
PAPER_CAPACITY_RPS = 27.58
PAPER_ANCHORS: dict[float, tuple[float | None, float | None]] = {
    # rate -> (TTFT s, TPOT s) reported in paper 1 §V-B
    2.0: (0.071, 0.0155),
    50.0: (20.0, 0.054),
}
N_ENGINES = 3
CAPACITY_RATE_RPS = 100.0
CAPACITY_DURATION_S = 40.0
CAPACITY_WARMUP_S = 10.0
DEFAULT_SEED = 20241


@dataclass(frozen=True)
class RatePoint:
    rate_rps: float
    ttft_mean_s: float
    tpot_mean_s: float
    n_requests: int
    paper_ttft_s: float | None
    paper_tpot_s: float | None


def items_from_stream(s: Stream) -> list[ReplayItem]:
    return [
        ReplayItem(float(a), int(i), int(o), int(e))
        for a, i, o, e in zip(s.arrival_s, s.isl, s.osl, s.engine, strict=True)
    ]


def run_point(
    cal: Calibration, rate_rps: float, rng: np.random.Generator, duration_s: float,
    n_engines: int = N_ENGINES, workload: Workload = CNN_DAILYMAIL,
) -> tuple[Stream, ReplayResult]:
    stream = poisson_stream(rng, rate_rps, duration_s, n_engines, workload)
    return stream, replay(cal, items_from_stream(stream), n_engines)


def summarise(rate: float, res: ReplayResult) -> RatePoint:
    ttft = np.array([f.ttft_s for f in res.finished])
    tpot = np.array([f.tpot_s for f in res.finished if f.output_tokens > 1])
    paper = PAPER_ANCHORS.get(float(rate), (None, None))
    return RatePoint(
        rate_rps=float(rate),
        ttft_mean_s=float(ttft.mean()) if len(ttft) else float("nan"),
        tpot_mean_s=float(tpot.mean()) if len(tpot) else float("nan"),
        n_requests=len(res.finished),
        paper_ttft_s=paper[0],
        paper_tpot_s=paper[1],
    )


def measure_capacity(
    cal: Calibration, rng: np.random.Generator, n_engines: int = N_ENGINES,
    rate_rps: float = CAPACITY_RATE_RPS, duration_s: float = CAPACITY_DURATION_S,
    warmup_s: float = CAPACITY_WARMUP_S, workload: Workload = CNN_DAILYMAIL,
) -> float:
    """Completions per second in [warmup_s, last arrival] of an overload run (see rules)."""
    stream, res = run_point(cal, rate_rps, rng, duration_s, n_engines, workload)
    t_end = float(stream.arrival_s[-1])
    done = np.array([f.completed_s for f in res.finished])
    n = int(np.count_nonzero((done >= warmup_s) & (done <= t_end)))
    return n / (t_end - warmup_s)


def validate(
    cal: Calibration,
    rates: Sequence[float] = PAPER_RATES_RPS,
    seed: int = DEFAULT_SEED,
    min_duration_s: float = 60.0,
    min_requests: int = 600,
    n_engines: int = N_ENGINES,
) -> dict[str, Any]:
    """The validation report, shaped as `calibrate validate --json` prints it."""
    points = []
    for k, rate in enumerate(rates):
        rng = np.random.default_rng([seed, k])
        duration = max(min_duration_s, min_requests / rate)
        _, res = run_point(cal, rate, rng, duration, n_engines)
        p = summarise(rate, res)
        points.append({
            "rate_rps": p.rate_rps,
            "ttft_mean_s": round(p.ttft_mean_s, 6),
            "tpot_mean_s": round(p.tpot_mean_s, 6),
            "paper_ttft_s": p.paper_ttft_s,
            "paper_tpot_s": p.paper_tpot_s,
        })
    cap = measure_capacity(cal, np.random.default_rng([seed, 1000]), n_engines)
    return {
        "setup": cal.setup,
        "points": points,
        "capacity_rps": round(cap, 4),
        "paper_capacity_rps": PAPER_CAPACITY_RPS,
    }


def anchor_errors(report: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """(anchor, paper, ours, relative error %) for every paper figure in `report`."""
    out = []
    for p in report["points"]:
        for key, paper_key in (("ttft_mean_s", "paper_ttft_s"), ("tpot_mean_s", "paper_tpot_s")):
            if p[paper_key] is not None:
                ours = p[key]
                out.append((f"{key} @ {p['rate_rps']:g} rps", p[paper_key], ours,
                            (ours - p[paper_key]) / p[paper_key] * 100.0))
    cap = report["capacity_rps"]
    pc = report["paper_capacity_rps"]
    out.append(("capacity_rps", pc, cap, (cap - pc) / pc * 100.0))
    return out
