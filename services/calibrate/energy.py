"""Power and energy-per-token figures of a calibration, beside public measurements.

Rules / theory of operation
---------------------------
* `power_table` evaluates the calibrated step models at chosen shapes and reports mean
  power per GPU (step energy / step time / TP) for prefill (single prompts of N tokens)
  and decode (batch B at mean context l), to check them against the paper's description
  (prefill at TDP once compute saturates, decode sublinear towards ~95 % of TDP).
* `joules_per_token` is the steady-state GPU energy per output token of a full batch B
  serving requests of mean ISL/OSL: one decode step (B tokens) plus the prefills of the
  B/OSL requests admitted per step, divided by B. Idle and host power are excluded, as
  in ML.ENERGY's GPU-only (Zeus) measurement.
* `mlenergy_comparison` puts ours beside ML.ENERGY v2 (A100-SXM4-40GB, vLLM, chat task)
  at ML.ENERGY's own batch sizes, ISL = ShareGPT mean 246, OSL = their mean output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from services.calibrate.csvio import read_table
from services.config.calibration import CALIBRATION_DIR, Calibration
from services.datacenter.perfmodel import PerfModel

MLENERGY_CSV = CALIBRATION_DIR / "measurements" / "mlenergy_v2_vllm_llm_energy_by_batch.csv"
MLENERGY_MODELS = {
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B-Instruct",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
}
SHAREGPT_MEAN_ISL = 246.0


def power_table(cal: Calibration, ctx: float = 1000.0) -> dict[str, list[dict[str, float]]]:
    pm = PerfModel(cal)
    tp = cal.tp
    pre = []
    for n in (32, 128, 256, 512, 1024, 2048, 4096, 8192):
        t = pm.prefill_time(n, 1, float(n * n))
        e = pm.prefill_energy(n, float(n * n))
        pre.append({"n_tokens": n, "time_s": t, "w_per_gpu": e / t / tp})
    dec = []
    for b in sorted({1, 2, 4, 8, 16, 32, cal.engine.max_num_seqs // 2, cal.engine.max_num_seqs}):
        t = pm.decode_time(b, b * ctx)
        e = pm.decode_energy(b, b * ctx)
        dec.append({"batch": b, "time_s": t, "w_per_gpu": e / t / tp})
    return {"prefill": pre, "decode": dec}


def joules_per_token(cal: Calibration, batch: float, isl: float, osl: float) -> dict[str, float]:
    pm = PerfModel(cal)
    ctx = isl + osl / 2.0
    t_dec = pm.decode_time(batch, batch * ctx)
    e_dec = pm.decode_energy(batch, batch * ctx)
    admits = batch / osl
    e_pre = admits * pm.prefill_energy(isl, isl * isl)
    t_pre = admits * pm.prefill_time(isl, 1, isl * isl)
    return {
        "j_per_token": (e_dec + e_pre) / batch,
        "tpot_s": t_dec + t_pre,
        "w_per_gpu": (e_dec + e_pre) / (t_dec + t_pre) / cal.tp,
    }


def mlenergy_comparison(cal: Calibration, path: Path = MLENERGY_CSV) -> list[dict[str, Any]]:
    name = MLENERGY_MODELS.get(cal.model)
    if name is None or cal.gpu != "a100-40gb":
        return []
    t = read_table(path, numeric=("tp", "avg_batch_size", "avg_output_tokens",
                                  "energy_per_output_token_j", "avg_tpot_s",
                                  "derived_power_per_gpu_w"),
                   text=("gpu", "model", "task"))
    rows = []
    for i in range(t.n_rows):
        if (t.text["gpu"][i] != "NVIDIA A100-SXM4-40GB" or t.text["model"][i] != name
                or t.text["task"][i] != "chat" or t.num["tp"][i] != cal.tp):
            continue
        b = float(t.num["avg_batch_size"][i])
        osl = float(t.num["avg_output_tokens"][i])
        ours = joules_per_token(cal, b, SHAREGPT_MEAN_ISL, osl)
        rows.append({
            "batch": round(b, 1),
            "beyond_max_num_seqs": b > cal.engine.max_num_seqs,
            "mlenergy_j_per_token": float(t.num["energy_per_output_token_j"][i]),
            "ours_j_per_token": round(ours["j_per_token"], 4),
            "mlenergy_w_per_gpu": float(t.num["derived_power_per_gpu_w"][i]),
            "ours_w_per_gpu": round(ours["w_per_gpu"], 1),
            "mlenergy_tpot_s": float(t.num["avg_tpot_s"][i]),
            "ours_tpot_s": round(ours["tpot_s"], 4),
        })
    return rows


def summary_ratio(rows: list[dict[str, Any]]) -> float | None:
    if not rows:
        return None
    r = [x["ours_j_per_token"] / x["mlenergy_j_per_token"] for x in rows]
    return float(np.mean(r))
