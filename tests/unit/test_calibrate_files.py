"""Shipped calibration files and roofline output load through the schema and behave."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from services.calibrate import roofline as rl
from services.config.calibration import list_setups, load_calibration, parse_calibration
from services.datacenter.perfmodel import (
    PerfModel,
    decode_energy_arr,
    decode_time_arr,
    prefill_energy_arr,
    prefill_time_arr,
)
from services.model.errors import ConfigError, InvalidInput

PAPER_SETUPS = {
    "a100-40gb/llama-3.1-8b-tp1": 40,
    "a100-40gb/llama-3.1-8b-tp2": 80,
    "a100-40gb/qwen2.5-7b-tp1": 40,
    "a100-40gb/mixtral-8x7b-tp4": 400,
}


def test_every_paper_setup_is_shipped_with_its_batch_limit():
    assert set(PAPER_SETUPS) <= set(list_setups())
    for setup, limit in PAPER_SETUPS.items():
        cal = load_calibration(setup)
        assert cal.engine.max_num_seqs == limit
        assert cal.energy.idle_w_per_gpu == 72.0 and cal.energy.host_w_per_node == 300.0
        assert cal.energy.tdp_w_per_gpu == 400.0
        assert cal.provenance, f"{setup}: no provenance"


def _check_monotone(cal):
    n = np.arange(1.0, cal.engine.max_num_batched_tokens + 1, 7.0)
    t = prefill_time_arr(cal, n, np.ones_like(n), n * n)
    assert (np.diff(t) > 0).all(), "prefill time not increasing in tokens"
    e = prefill_energy_arr(cal, n, n * n)
    assert (np.diff(e) > 0).all()
    b = np.arange(1.0, cal.engine.max_num_seqs + 1)
    for ell in (16.0, 512.0, 2048.0, cal.engine.max_model_len / 2):
        td = decode_time_arr(cal, b, b * ell)
        assert (np.diff(td) > 0).all(), f"decode time not increasing in batch at l={ell}"
        assert (np.diff(decode_energy_arr(cal, b, b * ell)) > 0).all()
    ells = np.linspace(1.0, cal.engine.max_model_len, 50)
    for bb in (1.0, cal.engine.max_num_seqs / 2, float(cal.engine.max_num_seqs)):
        assert (np.diff(decode_time_arr(cal, np.full_like(ells, bb), bb * ells)) >= 0).all()


@pytest.mark.parametrize("setup", sorted(list_setups()))
def test_shipped_file_loads_and_is_monotone(setup):
    cal = load_calibration(setup)
    _check_monotone(cal)
    pm = PerfModel(cal)
    # physical sanity: per-GPU power between idle and 1.15 x TDP at every shape
    tdp = cal.energy.tdp_w_per_gpu
    for n in (16, 256, 1024, 4096, 8192):
        w = pm.prefill_energy(n, n * n) / pm.prefill_time(n, 1, n * n) / cal.tp
        assert cal.energy.idle_w_per_gpu < w < 1.15 * tdp
    for b in (1, cal.engine.max_num_seqs):
        w = pm.decode_energy(b, b * 1000) / pm.decode_time(b, b * 1000) / cal.tp
        assert cal.energy.idle_w_per_gpu < w < 1.15 * tdp


def test_llama_power_follows_the_paper_description():
    cal = load_calibration("a100-40gb/llama-3.1-8b-tp1")
    pm = PerfModel(cal)
    tdp = cal.energy.tdp_w_per_gpu
    w_long = pm.prefill_energy(4096, 4096.0**2) / pm.prefill_time(4096, 1, 4096.0**2)
    assert w_long == pytest.approx(tdp, rel=0.05)  # prefill at TDP once compute saturates
    w = [pm.decode_energy(b, b * 1000.0) / pm.decode_time(b, b * 1000.0) for b in (1, 10, 20, 40)]
    assert w[0] < w[1] < w[2] < w[3]
    assert (w[1] - w[0]) / 9 > (w[3] - w[2]) / 20  # sublinear growth
    assert w[3] == pytest.approx(0.95 * tdp, rel=0.06)


@pytest.mark.parametrize(("gpu", "model", "tp"), [
    (g, m, tp) for g, m, tp in itertools.product(sorted(rl.GPUS), sorted(rl.MODELS), (1, 2, 4))
    if rl.Roofline(rl.GPUS[g], rl.MODELS[m], tp).kv_capacity_tokens() >= 8192
])
def test_roofline_output_loads_through_the_schema(gpu, model, tp):
    fitted = rl.roofline_calibration(rl.GPUS[gpu], rl.MODELS[model], tp)
    assert fitted.mapping["derived"] == "roofline"
    cal = parse_calibration(fitted.mapping, f"roofline:{gpu}/{model}", "")
    assert cal.tp == tp and cal.gpu == gpu
    _check_monotone(cal)


def test_roofline_from_hf_config_matches_builtin(tmp_path):
    cfg = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    arch = rl.get_model(str(p))
    # Llama-3.1-8B: 8.03 B parameters, 128 KiB KV per token (paper 1 §III-C)
    assert arch.total_params == pytest.approx(8.03e9, rel=0.01)
    assert arch.kv_bytes_per_token == 128 * 1024
    p.write_text(json.dumps({**cfg, "hidden_size": "big"}))
    with pytest.raises(ConfigError, match="hidden_size"):
        rl.get_model(str(p))


def test_roofline_rejects_models_that_do_not_fit():
    with pytest.raises(InvalidInput, match="do not fit"):
        rl.roofline_calibration(rl.GPUS["rtx-4090"], rl.MODELS["mixtral-8x7b"], 1)
    with pytest.raises(InvalidInput, match="unknown GPU"):
        rl.get_gpu("tpu-v5")
