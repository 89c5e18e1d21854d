"""Roofline step-time and power models from model architecture and GPU datasheets.

Rules / theory of operation
---------------------------
* `GPUS` holds datasheet figures (dense FP16/BF16 tensor TFLOP/s, HBM/GDDR bandwidth,
  memory, TDP, interconnect) plus idle power and clock range with their sources.
  `MODELS` holds architectures of the paper's models; any other model is read from a
  Hugging Face-style ``config.json`` (`arch_from_hf_config`).
* Step times per engine of ``tp`` GPUs (weights, FLOPs and KV split evenly over TP):

      decode(B, K)  = c0_dec + c_req*B + hypot(mem, comp) + AR_dec
          mem  = (touched weights + lm_head + K*kv_bytes) / tp / (BW * eta_bw)
          comp = 2 * active_params * B / tp / (peak * eta_flops)
      prefill(N, B, S) = c0_pre + c_req*B + max(mem_weights, comp(N)) + attn(S) + AR(N)
          attn(S) = 2 * S * heads * head_dim * layers / tp / (peak * eta_attn)   (causal)

  ``hypot`` lets memory and compute time overlap imperfectly in decode; ``max`` gives
  prefill its knee where compute overtakes the weight read (paper Fig. 1-a). For MoE,
  decode reads the fraction ``1 - (1 - k/E)^B`` of expert weights (top-k of E per token);
  prefill reads all of them. AR is a ring all-reduce, two per layer, ``2(tp-1)/tp`` of
  the message over the link plus a fixed latency per call.
* `Efficiency` holds the fitted/assumed factors (eta_*, c0_*, c_req, all-reduce latency);
  the defaults are those fitted on Llama-3.1-8B on A100 (see calibration/README.md).
* Power follows the paper's description (paper 1 §III-B, Fig. 2) per GPU: prefill at
  ``floor`` for the shortest prompts rising linearly to TDP at the knee, TDP above it;
  decode ``P1 + (0.95*TDP - P1) * (1 - exp(-(B-1)/tau))``, sublinear in B.
* `roofline_calibration` samples these curves on a grid of step shapes and fits the
  schema's polynomial/affine coefficients with `services.calibrate.fit`, so a roofline
  file is exactly what `calibrate fit` would produce from measurements of that shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from services.calibrate import fit as fitmod
from services.model.errors import ConfigError, InvalidInput

FloatArray = npt.NDArray[np.float64]
GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_tflops: float          # dense FP16/BF16 tensor (FP32 accumulate)
    mem_bw_gbs: float           # GB/s
    memory_bytes: int
    tdp_w: float
    idle_w: float
    link_gbs: float             # per-direction GPU-GPU bandwidth used by all-reduce
    clock_min_mhz: float
    clock_max_mhz: float
    source: str


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("a100-40gb", 312.0, 1555.0, 40 * GIB, 400.0, 72.0, 300.0, 210.0, 1410.0,
                "NVIDIA A100 datasheet (SXM4-40GB); idle 72 W paper 1 §III-B"),
        GpuSpec("a100-80gb", 312.0, 2039.0, 80 * GIB, 400.0, 60.0, 300.0, 210.0, 1410.0,
                "NVIDIA A100 datasheet (SXM4-80GB); idle ~60 W chuyishang/inference-energy"),
        GpuSpec("h100-80gb", 989.4, 3350.0, 80 * GIB, 700.0, 70.0, 450.0, 210.0, 1980.0,
                "NVIDIA H100 SXM5 datasheet; idle assumed 10 % of TDP"),
        GpuSpec("h200", 989.4, 4800.0, 141 * 10**9, 700.0, 70.0, 450.0, 210.0, 1980.0,
                "NVIDIA H200 SXM datasheet; idle assumed 10 % of TDP"),
        GpuSpec("l40s", 362.05, 864.0, 48 * GIB, 350.0, 35.0, 32.0, 210.0, 2520.0,
                "NVIDIA L40S datasheet (PCIe Gen4 x16 between GPUs); idle assumed 10 % TDP"),
        GpuSpec("rtx-4090", 165.2, 1008.0, 24 * GIB, 450.0, 20.0, 32.0, 210.0, 2760.0,
                "NVIDIA Ada whitepaper (FP16 tensor, FP32 accumulate); idle ~20 W as the "
                "RTX-3090 in chuyishang/inference-energy; clocks 210-2760 MHz paper 2"),
    )
}
GPU_ALIASES = {"a100": "a100-40gb", "h100": "h100-80gb", "4090": "rtx-4090",
               "rtx4090": "rtx-4090", "h200-141gb": "h200"}


@dataclass(frozen=True)
class ModelArch:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 1
    top_k: int = 1
    tied_embeddings: bool = False
    dtype_bytes: int = 2
    max_position: int = 8192

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o + 2 * self.hidden

    @property
    def expert_params_per_layer(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        per_layer = self.attn_params_per_layer + self.experts * self.expert_params_per_layer
        if self.experts > 1:
            per_layer += self.hidden * self.experts  # router
        heads = self.embed_params + (0 if self.tied_embeddings else self.lm_head_params)
        return self.layers * per_layer + heads + self.hidden

    @property
    def active_params_per_token(self) -> int:
        """Parameters multiplied per token (attention + top-k experts + lm_head)."""
        per_layer = self.attn_params_per_layer + self.top_k * self.expert_params_per_layer
        return self.layers * per_layer + self.lm_head_params

    @property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


MODELS: dict[str, ModelArch] = {
    m.name: m
    for m in (
        # Hugging Face config.json of each model (meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B,
        # mistralai/Mixtral-8x7B-v0.1); paper 1 Table II for layers / KV heads / top-2.
        ModelArch("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, max_position=131072),
        ModelArch("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, max_position=131072),
        ModelArch("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, experts=8, top_k=2,
                  max_position=32768),
    )
}


def arch_from_hf_config(path: str | Path, name: str | None = None) -> ModelArch:
    """Architecture from a Hugging Face ``config.json`` (errors name the file and key)."""
    p = str(path)
    try:
        data = json.loads(Path(p).read_text())
    except OSError as exc:
        raise ConfigError(p, "", f"cannot read model config: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(p, "", f"not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(p, "", "expected a JSON object")

    def need(key: str) -> int:
        v = data.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(p, key, f"expected a positive integer, got {v!r}")
        return v

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    kv = data.get("num_key_value_heads", heads)
    head_dim = data.get("head_dim") or hidden // heads
    dtype = str(data.get("torch_dtype", "bfloat16"))
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}.get(dtype, 2)
    return ModelArch(
        name=name or str(data.get("_name_or_path") or Path(p).parent.name or "model"),
        layers=need("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=int(kv),
        head_dim=int(head_dim),
        intermediate=need("intermediate_size"),
        vocab=need("vocab_size"),
        experts=int(data.get("num_local_experts", data.get("num_experts", 1)) or 1),
        top_k=int(data.get("num_experts_per_tok", 1) or 1),
        tied_embeddings=bool(data.get("tie_word_embeddings", False)),
        dtype_bytes=dtype_bytes,
        max_position=int(data.get("max_position_embeddings", 8192)),
    )


def get_gpu(name: str) -> GpuSpec:
    key = GPU_ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise InvalidInput("gpu", f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]


def get_model(name_or_path: str) -> ModelArch:
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        return arch_from_hf_config(name_or_path)
    key = name_or_path.lower()
    if key not in MODELS:
        raise InvalidInput(
            "model", f"unknown model {name_or_path!r}; known: {', '.join(sorted(MODELS))} "
            "(or pass the path of a Hugging Face config.json)")
    return MODELS[key]


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of datasheet peaks and fixed costs (defaults: Llama-8B on A100)."""

    eta_bw: float = 0.92           # weight/KV streaming (Vidur A100 GEMMs at 1 token)
    eta_flops: float = 0.70        # prefill GEMMs above the knee
    eta_flops_dec: float = 0.50    # small-M decode GEMMs
    eta_attn: float = 0.50         # flash-attention prefill
    c0_dec_s: float = 0.0040       # per decode step: scheduler, sampler, launch (Argonne B=1)
    c0_pre_s: float = 0.0030       # per prefill step (§V-B anchor tuning, see README)
    c_req_s: float = 0.00008       # per request in a step (vLLM per-sequence bookkeeping)
    ar_latency_s: float = 12e-6    # per all-reduce call (NVLink); PCIe ~ 25e-6
    p1_frac: float = 0.57          # decode power at B=1 / TDP (Argonne A100 vLLM 229 W)
    pre_floor_frac: float = 0.60   # prefill power of the shortest prompts / TDP
    dec_top_frac: float = 0.95     # decode power at large batch / TDP (paper 1 §III-B)
    tau_batch: float = 12.0        # decode power rise constant in requests


class Roofline:
    """Roofline step times and paper-shaped power for one (GPU, model, TP)."""

    def __init__(self, gpu: GpuSpec, arch: ModelArch, tp: int, eff: Efficiency | None = None):
        if tp < 1:
            raise InvalidInput("tp", f"must be >= 1, got {tp}")
        self.gpu, self.arch, self.tp = gpu, arch, tp
        self.eff = eff or Efficiency()
        self.bw = gpu.mem_bw_gbs * 1e9 * self.eff.eta_bw
        self.flops = gpu.peak_tflops * 1e12

    # ---- pieces
    def _allreduce(self, n_tokens: FloatArray) -> FloatArray:
        if self.tp == 1:
            return np.zeros_like(n_tokens)
        msg = n_tokens * self.arch.hidden * self.arch.dtype_bytes
        per = self.eff.ar_latency_s + 2 * (self.tp - 1) / self.tp * msg / (self.gpu.link_gbs * 1e9)
        return 2 * self.arch.layers * per

    def _weights_read(self, batch: FloatArray | None) -> FloatArray | float:
        a = self.arch
        dense = a.layers * a.attn_params_per_layer + a.lm_head_params
        experts = a.layers * a.experts * a.expert_params_per_layer
        if batch is None or a.experts == 1:
            frac: FloatArray | float = 1.0
        else:
            frac = 1.0 - (1.0 - a.top_k / a.experts) ** batch
        return (dense + experts * frac) * a.dtype_bytes / self.tp

    def decode_time(self, batch: FloatArray, kv: FloatArray) -> FloatArray:
        e, a = self.eff, self.arch
        mem = (self._weights_read(batch) + kv * a.kv_bytes_per_token / self.tp) / self.bw
        comp = 2.0 * a.active_params_per_token * batch / self.tp / (self.flops * e.eta_flops_dec)
        return e.c0_dec_s + e.c_req_s * batch + np.hypot(mem, comp) + self._allreduce(batch)

    def prefill_time(self, n: FloatArray, reqs: FloatArray, sum_sq: FloatArray) -> FloatArray:
        e, a = self.eff, self.arch
        mem = np.full_like(n, float(self._weights_read(None)) / self.bw)
        body = a.active_params_per_token - a.lm_head_params
        comp = 2.0 * (body * n + a.lm_head_params * reqs) / self.tp / (self.flops * e.eta_flops)
        attn = 2.0 * sum_sq * a.heads * a.head_dim * a.layers / self.tp / (self.flops * e.eta_attn)
        return e.c0_pre_s + e.c_req_s * reqs + np.maximum(mem, comp) + attn + self._allreduce(n)

    def knee_tokens(self) -> float:
        a, e = self.arch, self.eff
        body = a.active_params_per_token - a.lm_head_params
        per_tok = 2.0 * body / self.tp / (self.flops * e.eta_flops)
        return float(self._weights_read(None)) / self.bw / per_tok

    # ---- power (per engine, all TP GPUs), paper 1 §III-B description
    def prefill_power(self, n: FloatArray) -> FloatArray:
        tdp, e = self.gpu.tdp_w, self.eff
        knee = self.knee_tokens()
        frac = np.minimum(n / knee, 1.0)
        return self.tp * tdp * (e.pre_floor_frac + (1.0 - e.pre_floor_frac) * frac)

    def decode_power(self, batch: FloatArray) -> FloatArray:
        tdp, e = self.gpu.tdp_w, self.eff
        p1 = e.p1_frac * tdp
        top = e.dec_top_frac * tdp
        return self.tp * (p1 + (top - p1) * (1.0 - np.exp(-(batch - 1.0) / e.tau_batch)))

    # ---- derived quantities
    def kv_capacity_tokens(self, mem_util: float = 0.9, block: int = 16) -> int:
        free = self.gpu.memory_bytes * self.tp * mem_util - self.arch.weight_bytes
        return max(int(free // (self.arch.kv_bytes_per_token * block)), 0) * block

    def compute_fractions(self, max_batch: int) -> tuple[float, float]:
        """Share of step time that scales with the SM clock: (prefill N=2048, decode B/2)."""
        a, e = self.arch, self.eff
        n = np.array([2048.0])
        tp_ = float(self.prefill_time(n, np.array([1.0]), n * n)[0])
        body = a.active_params_per_token - a.lm_head_params
        comp = 2.0 * body * 2048.0 / self.tp / (self.flops * e.eta_flops)
        attn = 2.0 * 2048.0**2 * a.heads * a.head_dim * a.layers / self.tp / (
            self.flops * e.eta_attn)
        b = np.array([max(max_batch / 2.0, 1.0)])
        kv = b * 1024.0
        td = float(self.decode_time(b, kv)[0])
        comp_d = 2.0 * a.active_params_per_token * b[0] / self.tp / (self.flops * e.eta_flops_dec)
        # CPU-side costs (c0, c_req) do not scale with the GPU clock; memory time barely.
        return min((comp + attn) / tp_, 1.0), min(comp_d / td, 1.0)


def step_grid(r: Roofline, max_batch: int, max_len: int) -> dict[str, FloatArray]:
    """Step shapes to sample: single and multi-prompt prefills, decode over (B, l)."""
    n1 = np.unique(np.geomspace(16, min(max_len, 16384), 48).round())
    multi = []
    for n_each in (128.0, 512.0, 1024.0):
        for k in (2.0, 4.0, 8.0):
            if n_each * k <= 16384:
                multi.append((n_each * k, k, k * n_each * n_each))
    n = np.concatenate([n1, [m[0] for m in multi]])
    reqs = np.concatenate([np.ones_like(n1), [m[1] for m in multi]])
    ssq = np.concatenate([n1 * n1, [m[2] for m in multi]])
    bs = np.unique(np.linspace(1, max_batch, 16).round())
    ells = np.array([64.0, 256.0, 512.0, 1024.0, 2048.0, min(4096.0, max_len / 2)])
    bb, ll = np.meshgrid(bs, ells)
    return {"n": n, "reqs": reqs, "sum_sq": ssq, "batch": bb.ravel(), "kv": (bb * ll).ravel()}


@dataclass(frozen=True)
class RooflineFit:
    mapping: dict[str, Any]
    result: fitmod.FitResult


def roofline_calibration(
    gpu: GpuSpec,
    arch: ModelArch,
    tp: int,
    eff: Efficiency | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    setup: str | None = None,
    derived: str = "roofline",
) -> RooflineFit:
    """A complete calibration mapping for (gpu, model, tp) from the roofline (no measurements)."""
    r = Roofline(gpu, arch, tp, eff)
    kv_cap = r.kv_capacity_tokens()
    if kv_cap <= 0:
        raise InvalidInput(
            "tp", f"{arch.name} weights ({arch.weight_bytes / GIB:.1f} GiB) do not fit in "
            f"{tp} x {gpu.name} at 90 % memory utilisation")
    mml = max_model_len or min(arch.max_position, 8192)
    mml = min(mml, kv_cap)
    mns = max_num_seqs or int(max(1, min(256, kv_cap // 1024)))
    g = step_grid(r, mns, mml)
    t_pre = r.prefill_time(g["n"], g["reqs"], g["sum_sq"])
    t_dec = r.decode_time(g["batch"], g["kv"])
    pf = fitmod.fit_prefill(g["n"], g["reqs"], g["sum_sq"], t_pre)
    df = fitmod.fit_decode(g["batch"], g["kv"], t_dec)
    pe = fitmod.fit_energy(g["n"], g["sum_sq"], r.prefill_power(g["n"]) * t_pre)
    de = fitmod.fit_energy(g["batch"], g["kv"], r.decode_power(g["batch"]) * t_dec)
    res = fitmod.FitResult(pf, df, pe, de)
    cf_pre, cf_dec = r.compute_fractions(mns)
    levels = [float(round(x)) for x in np.linspace(gpu.clock_min_mhz, gpu.clock_max_mhz, 5)]
    base: dict[str, Any] = {
        "setup": setup or f"{gpu.name}/{arch.name}-tp{tp}",
        "gpu": gpu.name,
        "model": arch.name,
        "tp": tp,
        "derived": derived,
        "engine": {
            "max_num_seqs": mns,
            "max_num_batched_tokens": max(mml, 2048),
            "gpu_memory_bytes": int(gpu.memory_bytes),
            "gpu_memory_utilization": 0.9,
            "weight_bytes": int(arch.weight_bytes),
            "kv_bytes_per_token": int(arch.kv_bytes_per_token),
            "kv_block_tokens": 16,
            "max_model_len": int(mml),
        },
        "energy": {
            "idle_w_per_gpu": gpu.idle_w,
            "host_w_per_node": 300.0,
            "tdp_w_per_gpu": gpu.tdp_w,
        },
        "frequency": {
            "levels_mhz": levels,
            "static_power_fraction": 0.3,
            "prefill": {"compute_fraction": float(round(cf_pre, 3)), "power_exponent": 2.0},
            "decode": {"compute_fraction": float(round(cf_dec, 3)), "power_exponent": 2.0},
        },
        "provenance": {
            "summary": f"derived: {derived} — {gpu.name} ({gpu.source}) x {arch.name} "
                       f"(TP={tp}); efficiencies {_eff_text(r.eff)}",
            "engine": "architecture (weights, KV bytes/token) and datasheet memory; "
                      "max_num_batched_tokens = max(max_model_len, 2048) as vLLM 0.6.3",
            "frequency": "compute_fraction = clock-scaled share of the roofline step time "
                         "(prefill N=2048, decode B=max/2); static 0.3 and exponent 2 assumed",
            "energy.idle_w_per_gpu": gpu.source,
            "energy.host_w_per_node": "paper 1 §III-B (300 W per node)",
        },
    }
    mapping = fitmod.merge_fit(base, res, f"roofline samples of {gpu.name}/{arch.name}-tp{tp}")
    return RooflineFit(mapping, res)


def _eff_text(e: Efficiency) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in e.__dict__.items())
