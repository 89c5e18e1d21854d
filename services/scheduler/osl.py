"""Output-length (OSL) predictor: a two-layer numpy MLP (paper 1 §V-C).

Rules / theory of operation
---------------------------
* Inputs: standardised log ISL, a one-hot of the serving model and a one-hot of the dataset
  (application type). Names are normalised (lower case, ``_`` -> ``-``; a vocabulary entry
  contained in the name also matches, e.g. ``meta-llama/Llama-3.1-8B-Instruct`` ->
  ``llama-3.1-8b``); anything unknown maps to the ``other`` slot, which training fills by
  label dropout (10 % of rows) so it predicts the marginal over known values.
* Network: 128 ReLU -> 128 ReLU -> two heads: 6 logits over the length buckets
  `BUCKET_EDGES_TOKENS` ([1,16), [16,64), [64,128), [128,256), [256,512), [512,inf)) and
  3 quantiles (10/50/90 %) of log OSL, made monotone by softplus increments. Loss:
  cross-entropy + pinball loss; Adam; a seeded ``numpy.random.Generator``.
* The scheduler uses the median quantile as the request's OSL (`OslPredictor.median_tokens`).
  Inference is numpy only; one request costs a few vector ops (the first layer is a sum of
  precomputed rows, no one-hot is built) -- well under 0.1 ms.
* Training data are the length traces in ``data/request_traces/`` (`load_training_data`),
  plus, when `services.loadgen.datasets` is importable, samples of its labelled synthetic
  stand-ins for the paper's workloads (cnn-dailymail, openorca, govreport, mixed). Weights are
  committed in ``services/scheduler/osl_weights.npz``; ``geoserve osl train`` rebuilds them.
* Pure: no clocks, no I/O except explicit load/save paths.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from services.model.errors import ConfigError, InvalidInput

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

BUCKET_EDGES_TOKENS = (16, 64, 128, 256, 512)
N_BUCKETS = len(BUCKET_EDGES_TOKENS) + 1
QUANTILES = (0.1, 0.5, 0.9)
HIDDEN = 128
OTHER = "other"
MODELS = ("llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b", OTHER)
DATASETS = (
    "azure-code", "azure-conv", "sharegpt", "arxiv-summarization", "lm-arena-chat",
    "cnn-dailymail", "openorca", "govreport", "mixed", OTHER,
)  # fmt: skip
SYNTHETIC_DATASETS = ("cnn-dailymail", "openorca", "govreport", "mixed")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE_DIR = REPO_ROOT / "data" / "request_traces"
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "osl_weights.npz"


def bucket_of(osl_tokens: npt.ArrayLike) -> IntArray:
    """Length bucket index (0..5) of each OSL."""
    return np.searchsorted(np.asarray(BUCKET_EDGES_TOKENS), np.asarray(osl_tokens), side="right")


def normalise(name: str, vocab: Sequence[str]) -> int:
    """Index of `name` in `vocab` (exact or contained match), else the ``other`` slot."""
    n = name.strip().lower().replace("_", "-")
    if n in vocab:
        return vocab.index(n)
    for i, v in enumerate(vocab):
        if v != OTHER and v in n:
            return i
    return vocab.index(OTHER)


@dataclass(frozen=True)
class OslPrediction:
    """One request's prediction."""

    bucket: int
    quantiles_tokens: tuple[float, ...]  # at QUANTILES
    median_tokens: int


@dataclass(frozen=True)
class TrainingData:
    """Rows for training: log ISL, model index, dataset index, OSL tokens."""

    log_isl: FloatArray
    model_idx: IntArray
    dataset_idx: IntArray
    osl_tokens: FloatArray

    @property
    def size(self) -> int:
        return int(self.log_isl.shape[0])

    def subset(self, idx: IntArray) -> TrainingData:
        return TrainingData(
            self.log_isl[idx], self.model_idx[idx], self.dataset_idx[idx], self.osl_tokens[idx]
        )


def _read_pairs(path: Path, isl_col: str, osl_col: str) -> tuple[FloatArray, FloatArray]:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read trace: {exc.strerror}") from exc
    try:
        isl = np.array([float(r[isl_col]) for r in rows], dtype=np.float64)
        osl = np.array([float(r[osl_col]) for r in rows], dtype=np.float64)
    except (KeyError, ValueError) as exc:
        raise ConfigError(str(path), f"{isl_col}/{osl_col}", f"bad column: {exc}") from exc
    keep = (isl > 0) & (osl > 0)
    return isl[keep], osl[keep]


TRACES = (
    ("azure-code", "azure_llm_2023_code_tokens.csv", "context_tokens", "generated_tokens"),
    ("azure-conv", "azure_llm_2023_conv_tokens.csv", "context_tokens", "generated_tokens"),
    ("sharegpt", "sharegpt_val10k_llama2tok.csv", "input_tokens", "output_tokens"),
    ("arxiv-summarization", "arxiv_summarization_llama2tok_sample20k.csv", "input_tokens",
     "output_tokens"),
)  # fmt: skip
HISTOGRAMS = "mlenergy_v3_output_length_histograms.csv"


def load_training_data(
    rng: np.random.Generator,
    trace_dir: Path = DEFAULT_TRACE_DIR,
    synthetic_rows: int = 5000,
    histogram_rows_per_model: int = 4000,
) -> TrainingData:
    """Rows from the traces (model ``other``: the traces carry no serving model), from the
    ML.ENERGY lm-arena-chat output histograms (Llama-3.1-8B-Instruct as ``llama-3.1-8b``, the
    other models pooled as ``other``; OSL uniform within a bin, ISL drawn from ShareGPT
    prompts since the histograms carry none) and from the loadgen's synthetic datasets."""
    parts: list[tuple[FloatArray, int, int, FloatArray]] = []
    other_m = MODELS.index(OTHER)
    share_isl: FloatArray | None = None
    for name, file, ic, oc in TRACES:
        isl, osl = _read_pairs(trace_dir / file, ic, oc)
        parts.append((isl, other_m, DATASETS.index(name), osl))
        if name == "sharegpt":
            share_isl = isl
    hist = trace_dir / HISTOGRAMS
    if hist.exists() and share_isl is not None:
        for m_i, osl in _histogram_samples(hist, rng, histogram_rows_per_model).items():
            isl = rng.choice(share_isl, size=osl.size)
            parts.append((isl, m_i, DATASETS.index("lm-arena-chat"), osl))
    if synthetic_rows > 0:
        try:
            from services.loadgen.datasets import get_dataset
        except ImportError:  # the loadgen package is optional for training
            get_dataset = None  # type: ignore[assignment]
        if get_dataset is not None:
            for name in SYNTHETIC_DATASETS:
                isl_i, osl_i = get_dataset(name).sample(synthetic_rows, rng)
                parts.append((isl_i.astype(np.float64), other_m, DATASETS.index(name),
                              osl_i.astype(np.float64)))  # fmt: skip
    log_isl = np.concatenate([np.log(np.maximum(p[0], 1.0)) for p in parts])
    model_idx = np.concatenate([np.full(p[0].size, p[1], dtype=np.int64) for p in parts])
    ds_idx = np.concatenate([np.full(p[0].size, p[2], dtype=np.int64) for p in parts])
    osl_all = np.concatenate([np.maximum(p[3], 1.0) for p in parts])
    return TrainingData(log_isl, model_idx, ds_idx, osl_all)


def _histogram_samples(
    path: Path, rng: np.random.Generator, rows_per_model: int
) -> dict[int, FloatArray]:
    lo: dict[int, list[float]] = {}
    hi: dict[int, list[float]] = {}
    cnt: dict[int, list[float]] = {}
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            if r["task"] != "lm-arena-chat":
                continue
            m = normalise(r["model_id"].split("/")[-1], MODELS)
            lo.setdefault(m, []).append(float(r["bin_lo_tokens"]))
            hi.setdefault(m, []).append(float(r["bin_hi_tokens"]))
            cnt.setdefault(m, []).append(float(r["count"]))
    out = {}
    for m in lo:
        p = np.asarray(cnt[m]) / np.sum(cnt[m])
        k = rng.choice(len(p), size=rows_per_model, p=p)
        a, b = np.asarray(lo[m])[k], np.asarray(hi[m])[k]
        out[m] = np.maximum(np.floor(rng.uniform(a, b)), 1.0)
    return out


class OslPredictor:
    """The trained network; ``predict`` for arrays, ``predict_one`` / ``median_tokens`` for
    one request."""

    def __init__(self, params: dict[str, FloatArray], meta: dict[str, object] | None = None):
        self.p = params
        self.meta = meta or {}
        self.models = tuple(str(x) for x in params.get("models", np.array(MODELS)))
        self.datasets = tuple(str(x) for x in params.get("datasets", np.array(DATASETS)))
        w1 = params["w1"]
        self._w1_isl = w1[0]
        self._w1_model = w1[1 : 1 + len(self.models)]
        self._w1_ds = w1[1 + len(self.models) :]
        self._mu = float(params["isl_mean"][0])
        self._sd = float(params["isl_std"][0])

    # --- persistence ---------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path = DEFAULT_WEIGHTS) -> OslPredictor:
        p = Path(path)
        try:
            with np.load(p, allow_pickle=False) as z:
                params = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise ConfigError(str(p), "", f"cannot read OSL weights: {exc}") from exc
        for k in ("w1", "b1", "w2", "b2", "w3", "b3", "isl_mean", "isl_std"):
            if k not in params:
                raise ConfigError(str(p), k, "missing array in OSL weights")
        meta = json.loads(str(params.pop("meta"))) if "meta" in params else {}
        return cls(params, meta)

    def save(self, path: str | Path) -> None:
        arrays = dict(self.p)
        arrays["models"] = np.array(self.models)
        arrays["datasets"] = np.array(self.datasets)
        arrays["meta"] = np.array(json.dumps(self.meta, sort_keys=True))
        np.savez_compressed(Path(path), **arrays)  # type: ignore[arg-type]

    # --- inference -------------------------------------------------------------------------
    def _features(
        self, isl_tokens: npt.ArrayLike, models: Sequence[str], datasets: Sequence[str]
    ) -> tuple[FloatArray, IntArray, IntArray]:
        isl = np.maximum(np.asarray(isl_tokens, dtype=np.float64), 1.0)
        x = (np.log(isl) - self._mu) / self._sd
        m = np.array([normalise(s, self.models) for s in models], dtype=np.int64)
        d = np.array([normalise(s, self.datasets) for s in datasets], dtype=np.int64)
        if not (x.shape[0] == m.shape[0] == d.shape[0]):
            raise InvalidInput("osl.predict", "isl, models and datasets differ in length")
        return x, m, d

    def forward(
        self, x: FloatArray, m: IntArray, d: IntArray
    ) -> tuple[FloatArray, FloatArray]:
        """(bucket logits [N, 6], log-OSL quantiles [N, 3]) for feature arrays."""
        p = self.p
        h1 = np.maximum(
            x[:, None] * self._w1_isl + self._w1_model[m] + self._w1_ds[d] + p["b1"], 0.0
        )
        h2 = np.maximum(h1 @ p["w2"] + p["b2"], 0.0)
        out = h2 @ p["w3"] + p["b3"]
        return out[:, :N_BUCKETS], _monotone(out[:, N_BUCKETS:])

    def predict(
        self, isl_tokens: npt.ArrayLike, models: Sequence[str], datasets: Sequence[str]
    ) -> tuple[IntArray, FloatArray]:
        """(bucket [N], quantiles in tokens [N, 3]) for many requests."""
        x, m, d = self._features(isl_tokens, models, datasets)
        logits, q = self.forward(x, m, d)
        return np.argmax(logits, axis=1).astype(np.int64), np.exp(q)

    def predict_one(self, isl_tokens: int, model: str, dataset: str) -> OslPrediction:
        """Prediction for one request (the scheduler's hot path)."""
        p = self.p
        x = (np.log(max(float(isl_tokens), 1.0)) - self._mu) / self._sd
        mi = normalise(model, self.models)
        di = normalise(dataset, self.datasets)
        h1 = np.maximum(x * self._w1_isl + self._w1_model[mi] + self._w1_ds[di] + p["b1"], 0.0)
        h2 = np.maximum(h1 @ p["w2"] + p["b2"], 0.0)
        out = h2 @ p["w3"] + p["b3"]
        q = np.exp(_monotone(out[None, N_BUCKETS:])[0])
        return OslPrediction(
            bucket=int(np.argmax(out[:N_BUCKETS])),
            quantiles_tokens=tuple(float(v) for v in q),
            median_tokens=max(int(round(float(q[1]))), 1),
        )

    def median_tokens(self, isl_tokens: int, model: str, dataset: str) -> int:
        """The OSL the scheduler uses: the median quantile, in tokens (>= 1)."""
        return self.predict_one(isl_tokens, model, dataset).median_tokens


def _softplus(z: FloatArray) -> FloatArray:
    return np.logaddexp(0.0, z)


def _monotone(raw: FloatArray) -> FloatArray:
    """Quantiles q10 = raw0, q50 = q10 + softplus(raw1), q90 = q50 + softplus(raw2)."""
    inc = _softplus(raw[:, 1:])
    return np.concatenate([raw[:, :1], raw[:, :1] + np.cumsum(inc, axis=1)], axis=1)


# --- training ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters."""

    epochs: int = 25
    batch_rows: int = 512
    learning_rate: float = 2e-3
    quantile_weight: float = 1.0
    label_dropout: float = 0.1
    holdout_fraction: float = 0.2


@dataclass(frozen=True)
class TrainReport:
    """Held-out accuracy of a trained predictor."""

    rows_train: int
    rows_holdout: int
    bucket_exact: float  # classifier head: correct bucket
    bucket_adjacent: float  # correct or adjacent bucket
    median_bucket_exact: float  # bucket of the median quantile
    median_bucket_adjacent: float
    quantile_coverage: tuple[float, ...]  # fraction of OSL <= each quantile
    per_dataset_exact: dict[str, float]


def train(
    data: TrainingData, rng: np.random.Generator, cfg: TrainConfig | None = None
) -> tuple[OslPredictor, TrainReport]:
    """Train on a random (1 - holdout) split; report accuracy on the rest."""
    c = cfg or TrainConfig()
    n = data.size
    perm = rng.permutation(n)
    n_hold = int(n * c.holdout_fraction)
    hold, tr = data.subset(perm[:n_hold]), data.subset(perm[n_hold:])
    mu, sd = float(tr.log_isl.mean()), float(tr.log_isl.std() or 1.0)
    n_in = 1 + len(MODELS) + len(DATASETS)
    n_out = N_BUCKETS + len(QUANTILES)
    params: dict[str, FloatArray] = {
        "w1": rng.normal(0, np.sqrt(2.0 / n_in), (n_in, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(0, np.sqrt(2.0 / HIDDEN), (HIDDEN, HIDDEN)),
        "b2": np.zeros(HIDDEN),
        "w3": rng.normal(0, np.sqrt(1.0 / HIDDEN), (HIDDEN, n_out)),
        "b3": np.zeros(n_out),
        "isl_mean": np.array([mu]),
        "isl_std": np.array([sd]),
    }
    params["b3"][N_BUCKETS] = float(np.log(np.quantile(tr.osl_tokens, QUANTILES[0])))
    adam_m = {k: np.zeros_like(v) for k, v in params.items()}
    adam_v = {k: np.zeros_like(v) for k, v in params.items()}
    taus = np.asarray(QUANTILES)
    step = 0
    for _ in range(c.epochs):
        order = rng.permutation(tr.size)
        for s in range(0, tr.size, c.batch_rows):
            idx = order[s : s + c.batch_rows]
            x = np.zeros((idx.size, n_in))
            x[:, 0] = (tr.log_isl[idx] - mu) / sd
            m = tr.model_idx[idx].copy()
            d = tr.dataset_idx[idx].copy()
            drop = rng.uniform(size=idx.size) < c.label_dropout
            m[drop] = MODELS.index(OTHER)
            drop = rng.uniform(size=idx.size) < c.label_dropout
            d[drop] = DATASETS.index(OTHER)
            x[np.arange(idx.size), 1 + m] = 1.0
            x[np.arange(idx.size), 1 + len(MODELS) + d] = 1.0
            y_b = bucket_of(tr.osl_tokens[idx])
            y_q = np.log(tr.osl_tokens[idx])
            grads = _backprop(params, x, y_b, y_q, taus, c.quantile_weight)
            step += 1
            for k, g in grads.items():
                adam_m[k] = 0.9 * adam_m[k] + 0.1 * g
                adam_v[k] = 0.999 * adam_v[k] + 0.001 * g * g
                mh = adam_m[k] / (1 - 0.9**step)
                vh = adam_v[k] / (1 - 0.999**step)
                params[k] = params[k] - c.learning_rate * mh / (np.sqrt(vh) + 1e-8)
    pred = OslPredictor(params)
    report = evaluate(pred, hold)
    report = TrainReport(
        rows_train=tr.size, rows_holdout=hold.size, **{
            k: getattr(report, k) for k in (
                "bucket_exact", "bucket_adjacent", "median_bucket_exact",
                "median_bucket_adjacent", "quantile_coverage", "per_dataset_exact")
        },
    )  # fmt: skip
    pred.meta.update(
        {
            "bucket_edges_tokens": list(BUCKET_EDGES_TOKENS),
            "quantiles": list(QUANTILES),
            "rows_train": tr.size,
            "holdout_bucket_exact": report.bucket_exact,
            "holdout_bucket_adjacent": report.bucket_adjacent,
        }
    )
    return pred, report


def evaluate(pred: OslPredictor, data: TrainingData) -> TrainReport:
    """Bucket accuracy (exact / adjacent) and quantile coverage on `data`."""
    x = (data.log_isl - pred.p["isl_mean"][0]) / pred.p["isl_std"][0]
    logits, q = pred.forward(x, data.model_idx, data.dataset_idx)
    truth = bucket_of(data.osl_tokens)
    b = np.argmax(logits, axis=1)
    bm = bucket_of(np.exp(q[:, 1]))
    per_ds = {}
    for i, name in enumerate(DATASETS):
        sel = data.dataset_idx == i
        if sel.any():
            per_ds[name] = float(np.mean(b[sel] == truth[sel]))
    cover = tuple(float(np.mean(np.log(data.osl_tokens) <= q[:, j])) for j in range(q.shape[1]))
    return TrainReport(
        rows_train=0,
        rows_holdout=data.size,
        bucket_exact=float(np.mean(b == truth)),
        bucket_adjacent=float(np.mean(np.abs(b - truth) <= 1)),
        median_bucket_exact=float(np.mean(bm == truth)),
        median_bucket_adjacent=float(np.mean(np.abs(bm - truth) <= 1)),
        quantile_coverage=cover,
        per_dataset_exact=per_ds,
    )


def _backprop(
    p: dict[str, FloatArray],
    x: FloatArray,
    y_b: IntArray,
    y_q: FloatArray,
    taus: FloatArray,
    qw: float,
) -> dict[str, FloatArray]:
    n = x.shape[0]
    z1 = x @ p["w1"] + p["b1"]
    h1 = np.maximum(z1, 0.0)
    z2 = h1 @ p["w2"] + p["b2"]
    h2 = np.maximum(z2, 0.0)
    out = h2 @ p["w3"] + p["b3"]
    logits, raw = out[:, :N_BUCKETS], out[:, N_BUCKETS:]
    # Cross-entropy.
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob = e / e.sum(axis=1, keepdims=True)
    g_logits = prob
    g_logits[np.arange(n), y_b] -= 1.0
    g_logits /= n
    # Pinball loss on monotone quantiles q = [r0, r0 + sp(r1), r0 + sp(r1) + sp(r2)].
    q = _monotone(raw)
    err = y_q[:, None] - q
    g_q = np.where(err < 0, 1.0 - taus, -taus) * qw / n  # dL/dq
    sig = 1.0 / (1.0 + np.exp(-raw[:, 1:]))
    g_raw = np.empty_like(raw)
    g_raw[:, 0] = g_q.sum(axis=1)
    # q_j depends on r_k (k >= 1) for j >= k.
    tail = np.cumsum(g_q[:, ::-1], axis=1)[:, ::-1]  # sum_{j >= k} g_q[j]
    g_raw[:, 1:] = tail[:, 1:] * sig
    g_out = np.concatenate([g_logits, g_raw], axis=1)
    grads = {"w3": h2.T @ g_out, "b3": g_out.sum(axis=0)}
    g_h2 = (g_out @ p["w3"].T) * (z2 > 0)
    grads["w2"] = h1.T @ g_h2
    grads["b2"] = g_h2.sum(axis=0)
    g_h1 = (g_h2 @ p["w2"].T) * (z1 > 0)
    grads["w1"] = x.T @ g_h1
    grads["b1"] = g_h1.sum(axis=0)
    return grads
