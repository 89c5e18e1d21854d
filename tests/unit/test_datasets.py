"""Length datasets: paper means for synthetic sets, trace means, context fit, registry errors."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from services.loadgen.datasets import (
    DEFAULT_TRACE_DIR,
    TraceDataset,
    available,
    clipped_lognormal_mean,
    get_dataset,
)
from services.model.errors import ConfigError, InvalidInput

# Paper 1 §V-A/§V-C: the expectation, not the code's numbers.
PAPER_MEANS = {
    "cnn-dailymail": (841.0, 71.0),    # ISL, OSL on Llama-3.1-8B
    "openorca": (195.0, 211.0),        # ISL, OSL on Mixtral-8x7B
    "govreport": (10_700.0, None),     # ISL only
    "mixed": (2_900.0, None),          # ISL only
}
N = 200_000


def csv_means(path: Path, isl_col: str, osl_col: str) -> tuple[float, float]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return (float(np.mean([float(r[isl_col]) for r in rows])),
            float(np.mean([float(r[osl_col]) for r in rows])))


@pytest.mark.parametrize("name", sorted(PAPER_MEANS))
def test_synthetic_means_match_paper(name: str) -> None:
    ds = get_dataset(name)
    assert ds.synthetic
    assert "synthetic" in ds.label
    isl, osl = ds.sample(N, np.random.default_rng(1))
    assert isl.dtype.kind == "i" and osl.dtype.kind == "i"
    assert isl.min() >= 1 and osl.min() >= 1
    isl_mean, osl_mean = PAPER_MEANS[name]
    assert isl.mean() == pytest.approx(isl_mean, rel=0.03)
    if osl_mean is not None:
        assert osl.mean() == pytest.approx(osl_mean, rel=0.03)


@pytest.mark.parametrize(
    ("name", "file", "isl_col", "osl_col"),
    [("azure-code", "azure_llm_2023_code_tokens.csv", "context_tokens", "generated_tokens"),
     ("azure-conv", "azure_llm_2023_conv_tokens.csv", "context_tokens", "generated_tokens"),
     ("sharegpt", "sharegpt_val10k_llama2tok.csv", "input_tokens", "output_tokens"),
     ("arxiv-summarization", "arxiv_summarization_llama2tok_sample20k.csv", "input_tokens",
      "output_tokens")],
)
def test_trace_bootstrap_means_match_file(name: str, file: str, isl_col: str,
                                          osl_col: str) -> None:
    ds = get_dataset(name)
    assert not ds.synthetic
    want_isl, want_osl = csv_means(DEFAULT_TRACE_DIR / file, isl_col, osl_col)
    isl, osl = ds.sample(N, np.random.default_rng(2))
    assert isl.mean() == pytest.approx(want_isl, rel=0.03)
    assert osl.mean() == pytest.approx(want_osl, rel=0.03)


@pytest.mark.parametrize("name", ["govreport", "mixed", "arxiv-summarization", "azure-code"])
@pytest.mark.parametrize("fit", ["clip", "drop"])
def test_samples_respect_max_model_len(name: str, fit: str) -> None:
    ds = get_dataset(name)
    for max_len in (2, 512, 4096):
        if fit == "drop" and (max_len == 2 or (name == "govreport" and max_len == 512)):
            continue  # (almost) nothing fits: see test_drop_with_nothing_fitting_raises
        isl, osl = ds.sample(5000, np.random.default_rng(3), max_model_len=max_len,
                             fit=fit)  # type: ignore[arg-type]
        assert isl.shape == osl.shape == (5000,)
        assert np.all(isl + osl <= max_len)
        assert isl.min() >= 1 and osl.min() >= 1


def test_drop_keeps_pairs_intact_and_clip_truncates() -> None:
    ds = get_dataset("govreport")
    isl_d, _ = ds.sample(3000, np.random.default_rng(4), max_model_len=8192, fit="drop")
    isl_c, _ = ds.sample(3000, np.random.default_rng(4), max_model_len=8192, fit="clip")
    # clipping piles prompts up at the limit; dropping never truncates a prompt
    assert np.sum(isl_c == 8191) > 100
    assert np.sum(isl_d == 8191) < 10


def test_drop_with_nothing_fitting_raises() -> None:
    with pytest.raises(InvalidInput, match="max_model_len"):
        get_dataset("govreport").sample(10, np.random.default_rng(0), max_model_len=512,
                                        fit="drop")


def test_same_seed_same_samples() -> None:
    ds = get_dataset("openorca")
    a = ds.sample(100, np.random.default_rng(9))
    b = ds.sample(100, np.random.default_rng(9))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_take_is_in_trace_order() -> None:
    ds = get_dataset("azure-conv")
    assert isinstance(ds, TraceDataset)
    with (DEFAULT_TRACE_DIR / "azure_llm_2023_conv_tokens.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    isl, osl = ds.take(3, start=len(rows) - 1)  # wraps
    assert isl.tolist() == [int(rows[-1]["context_tokens"]), int(rows[0]["context_tokens"]),
                            int(rows[1]["context_tokens"])]
    assert osl[1] == int(rows[0]["generated_tokens"])


def test_clipped_lognormal_mean_closed_form_vs_monte_carlo() -> None:
    x = np.random.default_rng(5).lognormal(6.0, 1.1, size=400_000)
    mc = float(np.clip(x, 1.0, 2000.0).mean())
    assert clipped_lognormal_mean(6.0, 1.1, 1.0, 2000.0) == pytest.approx(mc, rel=0.01)


def test_registry_and_errors(tmp_path: Path) -> None:
    names = available()
    assert {"azure-code", "azure-conv", "sharegpt", "arxiv-summarization", "cnn-dailymail",
            "openorca", "govreport", "mixed"} <= set(names)
    with pytest.raises(InvalidInput) as ei:
        get_dataset("lmsys")
    assert ei.value.field == "dataset"
    assert "known:" in str(ei.value) and "sharegpt" in str(ei.value)
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidInput, match="max_model_len"):
        get_dataset("openorca").sample(3, rng, max_model_len=1)
    with pytest.raises(InvalidInput, match="^n:"):
        get_dataset("openorca").sample(-1, rng)
    with pytest.raises(ConfigError, match="azure_llm_2023_code_tokens.csv"):
        get_dataset("azure-code", data_dir=tmp_path).sample(3, rng)
