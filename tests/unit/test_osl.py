"""OSL predictor: committed weights, inference paths, training on known-answer data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.scheduler import osl


@pytest.fixture(scope="module")
def pred() -> osl.OslPredictor:
    return osl.OslPredictor.load()


def test_buckets_are_half_open_intervals() -> None:
    got = osl.bucket_of([1, 15, 16, 63, 64, 127, 128, 255, 256, 511, 512, 100000]).tolist()
    assert got == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_names_are_normalised() -> None:
    llama = osl.normalise("meta-llama/Llama-3.1-8B-Instruct", osl.MODELS)
    assert osl.MODELS[llama] == "llama-3.1-8b"
    assert osl.DATASETS[osl.normalise("Azure_Code", osl.DATASETS)] == "azure-code"
    assert osl.DATASETS[osl.normalise("something-new", osl.DATASETS)] == osl.OTHER


def test_committed_weights_predict_monotone_quantiles(pred: osl.OslPredictor) -> None:
    isl = [10, 200, 1000, 4000, 20000]
    buckets, q = pred.predict(isl, ["llama-3.1-8b"] * 5, ["sharegpt"] * 5)
    assert buckets.shape == (5,) and q.shape == (5, 3)
    assert np.all((buckets >= 0) & (buckets < osl.N_BUCKETS))
    assert np.all(np.diff(q, axis=1) >= 0) and np.all(q > 0)
    assert pred.meta["bucket_edges_tokens"] == list(osl.BUCKET_EDGES_TOKENS)


def test_single_request_path_matches_batch_path(pred: osl.OslPredictor) -> None:
    cases = [(50, "llama-3.1-8b", "azure-code"), (3000, "mixtral-8x7b", "arxiv-summarization"),
             (700, "unknown-model", "unknown-dataset")]  # fmt: skip
    b, q = pred.predict([c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases])
    for k, (isl, m, d) in enumerate(cases):
        one = pred.predict_one(isl, m, d)
        assert one.bucket == b[k]
        np.testing.assert_allclose(one.quantiles_tokens, q[k])
        assert one.median_tokens == max(round(float(q[k, 1])), 1) == pred.median_tokens(isl, m, d)


def test_committed_weights_separate_workloads(pred: osl.OslPredictor) -> None:
    """Azure code outputs are short (median 13 tokens), arXiv summaries long (mean 290)."""
    code = pred.median_tokens(1500, "other", "azure-code")
    arxiv = pred.median_tokens(2500, "other", "arxiv-summarization")
    assert code < 64 < arxiv


def test_committed_weights_beat_chance_on_the_traces(pred: osl.OslPredictor) -> None:
    data = osl.load_training_data(np.random.default_rng(5), synthetic_rows=0,
                                  histogram_rows_per_model=200)  # fmt: skip
    rep = osl.evaluate(pred, data)
    assert rep.bucket_exact > 2.0 / osl.N_BUCKETS
    assert rep.bucket_adjacent >= rep.bucket_exact
    assert rep.quantile_coverage[0] < rep.quantile_coverage[1] < rep.quantile_coverage[2]


def _known_answer_data(rng: np.random.Generator, n: int) -> osl.TrainingData:
    """azure-code: always 10 tokens; arxiv: always 300; sharegpt: OSL = ISL / 2."""
    ds = rng.choice([osl.DATASETS.index(x) for x in ("azure-code", "arxiv-summarization",
                                                     "sharegpt")], size=n)  # fmt: skip
    isl = np.exp(rng.uniform(np.log(8), np.log(4000), n))
    out = np.where(ds == osl.DATASETS.index("azure-code"), 10.0,
                   np.where(ds == osl.DATASETS.index("arxiv-summarization"), 300.0,
                            np.maximum(np.floor(isl / 2), 1)))  # fmt: skip
    return osl.TrainingData(np.log(isl), np.full(n, osl.MODELS.index(osl.OTHER)), ds, out)


def test_training_learns_a_known_mapping(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = _known_answer_data(rng, 6000)
    pred, rep = osl.train(data, rng, osl.TrainConfig(epochs=12, label_dropout=0.0))
    assert rep.bucket_exact > 0.9 and rep.bucket_adjacent > 0.98
    assert pred.predict_one(100, "x", "azure-code").bucket == 0
    assert pred.predict_one(100, "x", "arxiv-summarization").bucket == 4
    assert 5 <= pred.median_tokens(100, "x", "azure-code") <= 20
    # Save / load round trip keeps the predictions.
    path = tmp_path / "w.npz"
    pred.save(path)
    again = osl.OslPredictor.load(path)
    b1, q1 = pred.predict([30, 3000], ["x", "x"], ["sharegpt", "sharegpt"])
    b2, q2 = again.predict([30, 3000], ["x", "x"], ["sharegpt", "sharegpt"])
    assert b1.tolist() == b2.tolist()
    np.testing.assert_allclose(q1, q2)


def test_backprop_matches_finite_differences() -> None:
    rng = np.random.default_rng(1)
    n_in, hid, n_out = 4, 5, osl.N_BUCKETS + 3
    p = {"w1": rng.normal(size=(n_in, hid)), "b1": rng.normal(size=hid),
         "w2": rng.normal(size=(hid, hid)), "b2": rng.normal(size=hid),
         "w3": rng.normal(size=(hid, n_out)), "b3": rng.normal(size=n_out)}  # fmt: skip
    x = rng.normal(size=(7, n_in))
    y_b = rng.integers(0, osl.N_BUCKETS, 7)
    y_q = rng.normal(size=7)
    taus = np.asarray(osl.QUANTILES)

    def loss(params: dict[str, np.ndarray]) -> float:
        h1 = np.maximum(x @ params["w1"] + params["b1"], 0)
        h2 = np.maximum(h1 @ params["w2"] + params["b2"], 0)
        out = h2 @ params["w3"] + params["b3"]
        lg = out[:, : osl.N_BUCKETS]
        lse = np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) + lg.max(1)
        ce = np.mean(lse - lg[np.arange(7), y_b])
        q = osl._monotone(out[:, osl.N_BUCKETS :])
        e = y_q[:, None] - q
        pin = np.mean(np.sum(np.maximum(taus * e, (taus - 1) * e), axis=1))
        return float(ce + pin)

    grads = osl._backprop(p, x, y_b, y_q, taus, 1.0)
    eps = 1e-6
    for k in p:
        flat = p[k].reshape(-1)
        for i in range(0, flat.size, max(flat.size // 6, 1)):
            old = flat[i]
            flat[i] = old + eps
            up = loss(p)
            flat[i] = old - eps
            dn = loss(p)
            flat[i] = old
            assert grads[k].reshape(-1)[i] == pytest.approx((up - dn) / (2 * eps), abs=1e-5)
