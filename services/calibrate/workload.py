"""Synthetic request streams for calibration checks (CNN-DailyMail-like lengths, Poisson).

Rules / theory of operation
---------------------------
* Lengths are log-normal, clipped, rounded to whole tokens; the log-normal location is
  set so the *unclipped* mean equals the target mean (clipping moves it by < 1 %):
  ``mu = ln(mean) - sigma^2 / 2``.
* `CNN_DAILYMAIL` is the paper's validation workload (paper 1 §V-B): ISL mean 841 tokens,
  OSL mean 71 tokens. The spreads (sigma 0.45 for ISL, 0.30 for OSL) and the clips
  (ISL 64..3072, OSL 8..128, 128 being MLPerf's output cap for this task) are our
  assumptions — the paper reports means only.
* Arrivals are a Poisson process (exponential gaps) starting at t = 0; engines are chosen
  round-robin in arrival order, as in the paper's validation.
* Randomness comes from an injected `numpy.random.Generator`; equal seeds give equal
  streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.model.errors import InvalidInput

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LengthDist:
    """A clipped log-normal token-length distribution."""

    mean: float
    sigma: float
    lo: int
    hi: int

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        mu = math.log(self.mean) - self.sigma**2 / 2.0
        x = rng.lognormal(mu, self.sigma, n)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


@dataclass(frozen=True)
class Workload:
    name: str
    isl: LengthDist
    osl: LengthDist


CNN_DAILYMAIL = Workload(
    "cnn-dailymail-like",
    isl=LengthDist(mean=841.0, sigma=0.45, lo=64, hi=3072),
    osl=LengthDist(mean=71.0, sigma=0.30, lo=8, hi=128),
)


@dataclass(frozen=True)
class Stream:
    arrival_s: FloatArray
    isl: IntArray
    osl: IntArray
    engine: IntArray


def poisson_stream(
    rng: np.random.Generator, rate_rps: float, duration_s: float, n_engines: int,
    workload: Workload = CNN_DAILYMAIL,
) -> Stream:
    """Poisson arrivals at `rate_rps` over [0, duration_s), round-robin over engines."""
    if not rate_rps > 0:
        raise InvalidInput("rate_rps", f"must be > 0, got {rate_rps}")
    if not duration_s > 0:
        raise InvalidInput("duration_s", f"must be > 0, got {duration_s}")
    if n_engines < 1:
        raise InvalidInput("n_engines", f"must be >= 1, got {n_engines}")
    n_guess = int(rate_rps * duration_s + 10 * math.sqrt(rate_rps * duration_s) + 10)
    t = np.cumsum(rng.exponential(1.0 / rate_rps, n_guess))
    t = t[t < duration_s]
    n = len(t)
    return Stream(
        arrival_s=t,
        isl=workload.isl.sample(rng, n),
        osl=workload.osl.sample(rng, n),
        engine=np.arange(n, dtype=np.int64) % n_engines,
    )
