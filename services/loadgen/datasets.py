"""Request-length datasets: (ISL, OSL) samples from real traces or labelled synthetic laws.

Rules / theory of operation
---------------------------
* A dataset yields pairs of input sequence length (ISL) and output sequence length (OSL) in
  tokens. ``sample(n, rng, max_model_len)`` draws ``n`` i.i.d. pairs with the caller's
  ``numpy.random.Generator``; the same seed gives the same pairs. No clocks, no global state;
  trace files are read once per ``Dataset`` object, lazily.
* **Trace datasets** (``synthetic = False``) bootstrap rows of a public length trace, keeping
  each row's (ISL, OSL) pair together: Azure LLM inference 2023 code and conversation
  (CC-BY-4.0), ShareGPT and arXiv summarisation (Llama-2 tokenizer; via vidur, MIT). Files live
  in ``data/request_traces/`` (provenance in ``data/README.md``). ``take`` returns rows in
  trace order, for replaying a trace's own arrival times (``arrivals.replay_arrivals``).
* **Synthetic datasets** (``synthetic = True``, labelled "(synthetic)") stand in for the
  paper's workloads whose prompts we do not ship. ISL and OSL are independent; each is
  ``rint(clip(LogNormal(mu, sigma), 1, max_tokens))``, with ``mu`` solved so that the mean
  **after** that clipping equals the paper's stated mean (paper 1 §V-A/§V-C):

  - ``cnn-dailymail``: ISL mean 841 (σ 0.45, cap 4096), OSL mean 71 (σ 0.45, cap 128) —
    both means from the paper (Llama-3.1-8B tokens, MLPerf CNN-DailyMail).
  - ``openorca``: ISL mean 195 (σ 0.90, cap 1024), OSL mean 211 (σ 0.90, cap 1024) — both
    means from the paper (Mixtral-8x7B tokens, MLPerf's OpenOrca-based workload).
  - ``govreport``: ISL mean 10,700 (σ 0.50, cap 30,720) from the paper; OSL mean 512
    (σ 0.60, cap 2048) is our assumption.
  - ``mixed``: ISL mean 2,900 (σ 1.20, cap 30,720) from the paper; OSL mean 211 (σ 1.00,
    cap 2048) is our assumption.

  The σ values and caps are our choices; the paper gives only means. The OSL caps follow
  MLPerf's reference generation limits as we know them (128 new tokens for CNN-DailyMail,
  1024 for OpenOrca; not re-checked against the MLPerf sources). For GovReport and mixed the paper
  states no OSL: we assume 512 (GovReport reference summaries run to several hundred words)
  and 211 (the paper's Mixtral OSL mean), respectively.
* **Context fit** (``max_model_len`` from the caller, ISL + OSL ≤ max_model_len):
  ``fit="clip"`` (default) truncates the prompt to ``max_model_len − 1`` tokens (keeping at
  least one output token) and then caps OSL at ``max_model_len − ISL`` — what a server does
  with prompt truncation and ``max_tokens``; ``fit="drop"`` redraws pairs that do not fit
  (rejection sampling), which keeps each kept pair intact. Either way means fall when the
  context binds; the stated means hold for ``max_model_len=None`` (no context limit).
* Errors: unknown dataset → ``InvalidInput("dataset", ...)`` listing the known names; bad
  ``n``/``max_model_len``/``fit`` → ``InvalidInput`` naming the argument; a malformed trace
  file → ``ConfigError(path, column, ...)``.
"""

from __future__ import annotations

import csv
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from services.model.errors import ConfigError, InvalidInput, UsageError

DEFAULT_TRACE_DIR = Path(__file__).resolve().parents[2] / "data" / "request_traces"

Fit = Literal["clip", "drop"]
IntArray = np.ndarray  # int64 token counts


# ------------------------------------------------------------------------------------------
# Context fitting


def _check_args(n: int, max_model_len: int | None, fit: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise InvalidInput("n", f"sample size must be an integer >= 0, got {n!r}")
    if max_model_len is not None and (
        isinstance(max_model_len, bool)
        or not isinstance(max_model_len, int | np.integer)
        or max_model_len < 2
    ):
        raise InvalidInput(
            "max_model_len", f"must be an integer >= 2 (one input + one output token), "
            f"got {max_model_len!r}"
        )
    if fit not in ("clip", "drop"):
        raise InvalidInput("fit", f"must be 'clip' or 'drop', got {fit!r}")


def clip_to_context(
    isl: IntArray, osl: IntArray, max_model_len: int
) -> tuple[IntArray, IntArray]:
    """Truncate prompts to ``max_model_len - 1`` then cap OSL so ISL + OSL ≤ max_model_len."""
    isl_c = np.minimum(isl, max_model_len - 1)
    osl_c = np.minimum(osl, max_model_len - isl_c)
    return isl_c, osl_c


# ------------------------------------------------------------------------------------------
# Dataset base


class Dataset(ABC):
    """A source of (ISL, OSL) pairs."""

    name: str
    synthetic: bool
    description: str

    @property
    def label(self) -> str:
        """Name for reports; synthetic datasets say so."""
        return f"{self.name} (synthetic)" if self.synthetic else self.name

    @abstractmethod
    def _draw(self, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        """``n`` i.i.d. pairs before any context fit (both int64, ≥ 1)."""

    def sample(
        self,
        n: int,
        rng: np.random.Generator,
        max_model_len: int | None = None,
        fit: Fit = "clip",
    ) -> tuple[IntArray, IntArray]:
        """Draw ``n`` (ISL, OSL) pairs; with ``max_model_len``, ISL + OSL ≤ max_model_len."""
        _check_args(n, max_model_len, fit)
        n = int(n)
        if max_model_len is None:
            return self._draw(n, rng)
        if fit == "clip":
            return clip_to_context(*self._draw(n, rng), int(max_model_len))
        isl_parts: list[IntArray] = []
        osl_parts: list[IntArray] = []
        have = 0
        drawn = 0
        while have < n:
            want = max(64, 2 * (n - have))
            isl, osl = self._draw(want, rng)
            drawn += want
            keep = isl + osl <= max_model_len
            isl_parts.append(isl[keep])
            osl_parts.append(osl[keep])
            have += int(keep.sum())
            if have == 0 and drawn >= 100_000:
                raise InvalidInput(
                    "max_model_len",
                    f"{max_model_len} tokens fits no pair of dataset {self.name!r} "
                    f"(0 of {drawn} draws); use fit='clip' or a longer context",
                )
        return np.concatenate(isl_parts)[:n], np.concatenate(osl_parts)[:n]


# ------------------------------------------------------------------------------------------
# Trace datasets


@dataclass
class TraceDataset(Dataset):
    """Bootstrap rows of a CSV length trace (one row = one request)."""

    name: str
    path: Path
    isl_column: str
    osl_column: str
    description: str
    synthetic: bool = field(default=False, init=False)
    _isl: IntArray | None = field(default=None, init=False, repr=False)
    _osl: IntArray | None = field(default=None, init=False, repr=False)

    def _load(self) -> tuple[IntArray, IntArray]:
        if self._isl is not None and self._osl is not None:
            return self._isl, self._osl
        p = Path(self.path)
        try:
            with p.open(newline="", encoding="utf-8") as fh:
                reader = csv.reader(fh)
                header = next(reader, [])
                cols = []
                for c in (self.isl_column, self.osl_column):
                    if c not in header:
                        raise ConfigError(str(p), c, f"column missing; header: {header}")
                    cols.append(header.index(c))
                isl_l: list[int] = []
                osl_l: list[int] = []
                for i, rec in enumerate(reader, start=2):
                    if not rec:
                        continue
                    for c, col, dst in ((self.isl_column, cols[0], isl_l),
                                        (self.osl_column, cols[1], osl_l)):
                        try:
                            dst.append(int(float(rec[col])))
                        except (ValueError, IndexError):
                            raise ConfigError(
                                str(p), f"{c} (row {i})", "not a token count"
                            ) from None
        except OSError as exc:
            raise ConfigError(str(p), "", f"cannot read length trace: {exc.strerror or exc}") \
                from exc
        if not isl_l:
            raise ConfigError(str(p), self.isl_column, "length trace has no rows")
        isl = np.maximum(np.asarray(isl_l, dtype=np.int64), 1)
        osl = np.maximum(np.asarray(osl_l, dtype=np.int64), 1)
        isl.setflags(write=False)
        osl.setflags(write=False)
        self._isl, self._osl = isl, osl
        return isl, osl

    def __len__(self) -> int:
        return int(self._load()[0].size)

    @property
    def mean_isl(self) -> float:
        return float(self._load()[0].mean())

    @property
    def mean_osl(self) -> float:
        return float(self._load()[1].mean())

    def _draw(self, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        isl, osl = self._load()
        idx = rng.integers(0, isl.size, size=n)
        return isl[idx], osl[idx]

    def take(
        self, n: int, max_model_len: int | None = None, start: int = 0
    ) -> tuple[IntArray, IntArray]:
        """Rows ``start, start+1, …`` in trace order (wrapping), context-clipped."""
        _check_args(n, max_model_len, "clip")
        isl, osl = self._load()
        idx = (int(start) + np.arange(int(n))) % isl.size
        out = isl[idx], osl[idx]
        return clip_to_context(*out, int(max_model_len)) if max_model_len else out


# ------------------------------------------------------------------------------------------
# Synthetic datasets


def _norm_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X ~ LogNormal(mu, sigma) (closed form)."""
    la, lb = math.log(lo), math.log(hi)
    below = _norm_cdf((la - mu) / sigma)
    above = 1.0 - _norm_cdf((lb - mu) / sigma)
    body = math.exp(mu + 0.5 * sigma * sigma) * (
        _norm_cdf((lb - mu - sigma * sigma) / sigma) - _norm_cdf((la - mu - sigma * sigma) / sigma)
    )
    return lo * below + body + hi * above


def solve_mu(mean: float, sigma: float, lo: float, hi: float) -> float:
    """The ``mu`` whose clipped lognormal has the given mean (bisection; monotone in mu)."""
    if not lo < mean < hi:
        raise UsageError(f"target mean {mean} must lie strictly inside ({lo}, {hi})")
    a, b = math.log(lo) - 10 * sigma, math.log(hi) + 10 * sigma
    for _ in range(200):
        m = 0.5 * (a + b)
        if clipped_lognormal_mean(m, sigma, lo, hi) < mean:
            a = m
        else:
            b = m
    return 0.5 * (a + b)


@dataclass(frozen=True)
class LengthLaw:
    """``rint(clip(LogNormal(mu, sigma), 1, max_tokens))`` with mu solved for ``mean_tokens``."""

    mean_tokens: float
    sigma: float
    max_tokens: int
    mu: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mu", solve_mu(self.mean_tokens, self.sigma, 1.0,
                                                float(self.max_tokens)))

    def draw(self, n: int, rng: np.random.Generator) -> IntArray:
        x = rng.lognormal(self.mu, self.sigma, size=n)
        return np.rint(np.clip(x, 1.0, float(self.max_tokens))).astype(np.int64)


@dataclass(frozen=True)
class SyntheticDataset(Dataset):
    """Independent clipped-lognormal ISL and OSL matching a paper's stated means."""

    name: str
    isl: LengthLaw
    osl: LengthLaw
    description: str
    synthetic: bool = field(default=True, init=False)

    def _draw(self, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        return self.isl.draw(n, rng), self.osl.draw(n, rng)


# ------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class DatasetSpec:
    """One registry entry: a name, help text and a factory taking the trace folder."""

    name: str
    synthetic: bool
    help: str
    factory: Callable[[Path], Dataset]


class DatasetRegistry:
    """String-keyed registry of datasets; duplicate names raise."""

    def __init__(self) -> None:
        self._specs: dict[str, DatasetSpec] = {}

    def register(self, spec: DatasetSpec) -> None:
        if spec.name in self._specs:
            raise UsageError(f"dataset {spec.name!r} registered twice")
        self._specs[spec.name] = spec

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._specs))

    def spec(self, name: str) -> DatasetSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise InvalidInput(
                "dataset", f"unknown dataset {name!r}; known: {', '.join(self.names())}"
            ) from None

    def get(self, name: str, data_dir: str | Path | None = None) -> Dataset:
        d = Path(data_dir) if data_dir is not None else DEFAULT_TRACE_DIR
        if (d / "request_traces").is_dir():
            d = d / "request_traces"
        return self.spec(name).factory(d)


DATASETS = DatasetRegistry()


def _trace(name: str, file: str, isl_col: str, osl_col: str, help_text: str) -> None:
    def factory(d: Path) -> Dataset:
        return TraceDataset(name, d / file, isl_col, osl_col, help_text)

    DATASETS.register(DatasetSpec(name, False, help_text, factory))


def _synthetic(name: str, isl: tuple[float, float, int], osl: tuple[float, float, int],
               help_text: str) -> None:
    def factory(d: Path) -> Dataset:
        return SyntheticDataset(name, LengthLaw(*isl), LengthLaw(*osl), help_text)

    DATASETS.register(DatasetSpec(name, True, help_text, factory))


_trace("azure-code", "azure_llm_2023_code_tokens.csv", "context_tokens", "generated_tokens",
       "Azure LLM inference trace 2023, code (Patel et al., Splitwise; CC-BY-4.0): "
       "ISL mean 2048, OSL mean 28")
_trace("azure-conv", "azure_llm_2023_conv_tokens.csv", "context_tokens", "generated_tokens",
       "Azure LLM inference trace 2023, conversation (CC-BY-4.0): ISL mean 1155, OSL mean 211")
_trace("sharegpt", "sharegpt_val10k_llama2tok.csv", "input_tokens", "output_tokens",
       "ShareGPT, 10k validation conversations, Llama-2 tokens: ISL mean 246, OSL mean 326")
_trace("arxiv-summarization", "arxiv_summarization_llama2tok_sample20k.csv", "input_tokens",
       "output_tokens",
       "arXiv summarisation (vidur), 20k-row sample, Llama-2 tokens: ISL mean 2590, OSL mean 290")
_synthetic("cnn-dailymail", (841.0, 0.45, 4096), (71.0, 0.45, 128),
           "SYNTHETIC stand-in for MLPerf CNN-DailyMail on Llama-3.1-8B: lognormal, "
           "ISL mean 841, OSL mean 71 (paper 1)")
_synthetic("openorca", (195.0, 0.90, 1024), (211.0, 0.90, 1024),
           "SYNTHETIC stand-in for MLPerf's OpenOrca-based Mixtral-8x7B workload: lognormal, "
           "ISL mean 195, OSL mean 211 (paper 1)")
_synthetic("govreport", (10_700.0, 0.50, 30_720), (512.0, 0.60, 2048),
           "SYNTHETIC long prompts (GovReport): lognormal, ISL mean 10.7K (paper 1); "
           "OSL mean 512 is our assumption")
_synthetic("mixed", (2_900.0, 1.20, 30_720), (211.0, 1.00, 2048),
           "SYNTHETIC mixed prompts from six datasets: lognormal, ISL mean 2.9K (paper 1); "
           "OSL mean 211 (the paper's Mixtral OSL) is our assumption")


def available() -> tuple[str, ...]:
    """Registered dataset names, sorted."""
    return DATASETS.names()


def describe() -> dict[str, str]:
    """Name → help text (synthetic ones say SYNTHETIC)."""
    return {n: DATASETS.spec(n).help for n in DATASETS.names()}


def get_dataset(name: str, data_dir: str | Path | None = None) -> Dataset:
    """The dataset registered under ``name``; trace files are read from ``data_dir``
    (default ``data/request_traces``) on first use."""
    return DATASETS.get(name, data_dir)
