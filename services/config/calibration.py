"""Calibration files: every coefficient of the latency, power and frequency models.

Rules
-----
* One YAML file per setup ``calibration/<gpu>/<model>-tp<N>.yaml``; the setup name is the
  path below ``calibration/`` without the suffix, e.g. ``a100-40gb/llama-3.1-8b-tp1``.
* Every key is required unless marked optional below; every number is finite and within
  its documented range. A violation raises `ConfigError` naming the file and the dotted key.
* The code never hard-codes a coefficient: engines, estimators and tools read them here.

Models (paper 1 §III-B, DESIGN §4)::

    t_pre  = t_tok(N) + b0 + b1*B + b2*sum(n_i^2)
    t_tok  = s_lo*N                       (N <= knee)
           = s_lo*knee + s_hi*(N - knee)  (N >  knee)
    t_dec  = a0 + a1*B + a2*B^2,  a_j = alpha_j + beta_j * (K / B)
    E_pre  = e0 + e_p*N + e_a*sum(n_i^2)
    E_dec  = e0 + e_d*B + e_k*K

The formulas themselves live once, in `services.datacenter.perfmodel`. The coefficient
records below are generic in their number type: ``float`` in a `Calibration` (and in the
fit tool's results, which extend them), numpy columns with one entry per DC in the
scheduler's estimator (`perfmodel.columns`).

Frequency (per phase; f_max = max level)::

    time(f)  = time(f_max)  * (c * f_max / f + (1 - c))          c: compute-bound fraction
    power(f) = power(f_max) * (s + (1 - s) * (f / f_max) ** g)   s: static power fraction
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml

from services.model.errors import ConfigError

CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"

N = TypeVar("N")  # number type of a coefficient record: float, or a numpy column per DC


@dataclass(frozen=True)
class EngineSpec:
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    weight_bytes: int
    kv_bytes_per_token: int
    kv_block_tokens: int
    max_model_len: int

    def kv_capacity_tokens(self, tp: int) -> int:
        """KV tokens that fit in the memory left after the weights, whole blocks only."""
        free = self.gpu_memory_bytes * tp * self.gpu_memory_utilization - self.weight_bytes
        blocks = int(free // (self.kv_bytes_per_token * self.kv_block_tokens))
        return max(blocks, 0) * self.kv_block_tokens


@dataclass(frozen=True)
class PrefillCoeffs(Generic[N]):
    b0_s: N
    b1_s: N
    b2_s: N
    tok_slope_s: N
    tok_slope_above_s: N
    knee_tokens: N


@dataclass(frozen=True)
class DecodeCoeffs(Generic[N]):
    alpha_s: tuple[N, N, N]
    beta_s: tuple[N, N, N]


@dataclass(frozen=True)
class EnergyCoeffs(Generic[N]):
    prefill_e0_j: N
    prefill_ep_j: N
    prefill_ea_j: N
    decode_e0_j: N
    decode_ed_j: N
    decode_ek_j: N
    idle_w_per_gpu: N
    host_w_per_node: N
    tdp_w_per_gpu: N


@dataclass(frozen=True)
class PhaseFrequency:
    compute_fraction: float
    power_exponent: float


@dataclass(frozen=True)
class FrequencyModel:
    levels_mhz: tuple[float, ...]
    static_power_fraction: float
    prefill: PhaseFrequency
    decode: PhaseFrequency

    @property
    def max_mhz(self) -> float:
        return self.levels_mhz[-1]

    def snap(self, mhz: float) -> float:
        """The supported level nearest to `mhz` (values beyond the range snap to its ends)."""
        mhz = min(max(mhz, self.levels_mhz[0]), self.levels_mhz[-1])
        return min(self.levels_mhz, key=lambda lv: (abs(lv - mhz), lv))

    def factors(self, mhz: float, phase: str) -> tuple[float, float]:
        """(time factor, energy factor) of `phase` at `mhz` relative to the max level."""
        p = self.prefill if phase == "prefill" else self.decode
        ratio = self.max_mhz / mhz
        t = p.compute_fraction * ratio + (1.0 - p.compute_fraction)
        s = self.static_power_fraction
        pw = s + (1.0 - s) * (mhz / self.max_mhz) ** p.power_exponent
        return t, t * pw


@dataclass(frozen=True)
class Calibration:
    setup: str
    path: str
    gpu: str
    model: str
    tp: int
    derived: str
    engine: EngineSpec
    prefill: PrefillCoeffs[float]
    decode: DecodeCoeffs[float]
    energy: EnergyCoeffs[float]
    frequency: FrequencyModel
    provenance: Mapping[str, Any]


class _Reader:
    """Typed access to a nested mapping with errors naming the file and dotted key."""

    def __init__(self, path: str, data: Any) -> None:
        self.path = path
        if not isinstance(data, Mapping):
            raise ConfigError(path, "", "expected a mapping at the top level")
        self.data = data

    def _get(self, key: str) -> Any:
        cur: Any = self.data
        walked: list[str] = []
        for part in key.split("."):
            walked.append(part)
            if not isinstance(cur, Mapping) or part not in cur:
                raise ConfigError(self.path, ".".join(walked), "missing required key")
            cur = cur[part]
        return cur

    def num(self, key: str, lo: float = -math.inf, hi: float = math.inf) -> float:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ConfigError(self.path, key, f"expected a finite number, got {v!r}")
        if not lo <= v <= hi:
            raise ConfigError(self.path, key, f"expected a value in [{lo}, {hi}], got {v!r}")
        return float(v)

    def integer(self, key: str, lo: int = 0, hi: int = 2**62) -> int:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(self.path, key, f"expected an integer, got {v!r}")
        if not lo <= v <= hi:
            raise ConfigError(self.path, key, f"expected an integer in [{lo}, {hi}], got {v!r}")
        return v

    def text(self, key: str) -> str:
        v = self._get(key)
        if not isinstance(v, str) or not v:
            raise ConfigError(self.path, key, f"expected a non-empty string, got {v!r}")
        return v

    def triple(self, key: str) -> tuple[float, float, float]:
        v = self._get(key)
        ok = isinstance(v, list) and len(v) == 3
        ok = ok and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
        if not ok or not all(math.isfinite(x) for x in v):
            raise ConfigError(self.path, key, f"expected a list of 3 finite numbers, got {v!r}")
        return (float(v[0]), float(v[1]), float(v[2]))

    def optional(self, key: str, default: Any) -> Any:
        try:
            return self._get(key)
        except ConfigError:
            return default


def parse_calibration(data: Any, path: str, setup: str = "") -> Calibration:
    """Validate a parsed calibration mapping; `path` is used in error messages."""
    r = _Reader(path, data)
    tp = r.integer("tp", 1, 64)
    engine = EngineSpec(
        max_num_seqs=r.integer("engine.max_num_seqs", 1, 100_000),
        max_num_batched_tokens=r.integer("engine.max_num_batched_tokens", 16, 10_000_000),
        gpu_memory_bytes=r.integer("engine.gpu_memory_bytes", 1),
        gpu_memory_utilization=r.num("engine.gpu_memory_utilization", 0.05, 1.0),
        weight_bytes=r.integer("engine.weight_bytes", 0),
        kv_bytes_per_token=r.integer("engine.kv_bytes_per_token", 1),
        kv_block_tokens=r.integer("engine.kv_block_tokens", 1, 4096),
        max_model_len=r.integer("engine.max_model_len", 2, 10_000_000),
    )
    if engine.kv_capacity_tokens(tp) < engine.max_model_len:
        raise ConfigError(
            path,
            "engine.weight_bytes",
            f"weights leave room for {engine.kv_capacity_tokens(tp)} KV tokens, fewer than "
            f"engine.max_model_len={engine.max_model_len}",
        )
    prefill = PrefillCoeffs(
        b0_s=r.num("prefill.b0_s", 0.0, 10.0),
        b1_s=r.num("prefill.b1_s", 0.0, 1.0),
        b2_s=r.num("prefill.b2_s", 0.0, 1e-3),
        tok_slope_s=r.num("prefill.tok_slope_s", 0.0, 1.0),
        tok_slope_above_s=r.num("prefill.tok_slope_above_s", 0.0, 1.0),
        knee_tokens=r.num("prefill.knee_tokens", 0.0, 1e7),
    )
    decode = DecodeCoeffs(alpha_s=r.triple("decode.alpha_s"), beta_s=r.triple("decode.beta_s"))
    energy = EnergyCoeffs(
        prefill_e0_j=r.num("energy.prefill.e0_j", 0.0),
        prefill_ep_j=r.num("energy.prefill.e_p_j", 0.0),
        prefill_ea_j=r.num("energy.prefill.e_a_j", 0.0),
        decode_e0_j=r.num("energy.decode.e0_j", 0.0),
        decode_ed_j=r.num("energy.decode.e_d_j", 0.0),
        decode_ek_j=r.num("energy.decode.e_k_j", 0.0),
        idle_w_per_gpu=r.num("energy.idle_w_per_gpu", 0.0, 5000.0),
        host_w_per_node=r.num("energy.host_w_per_node", 0.0, 50_000.0),
        tdp_w_per_gpu=r.num("energy.tdp_w_per_gpu", 1.0, 5000.0),
    )
    levels = r.optional("frequency.levels_mhz", None)
    if levels is None:
        raise ConfigError(path, "frequency.levels_mhz", "missing required key")
    if (
        not isinstance(levels, list)
        or not levels
        or not all(isinstance(x, int | float) and x > 0 for x in levels)
        or sorted(levels) != levels
    ):
        raise ConfigError(path, "frequency.levels_mhz", "expected an ascending list of MHz > 0")
    freq = FrequencyModel(
        levels_mhz=tuple(float(x) for x in levels),
        static_power_fraction=r.num("frequency.static_power_fraction", 0.0, 1.0),
        prefill=PhaseFrequency(
            r.num("frequency.prefill.compute_fraction", 0.0, 1.0),
            r.num("frequency.prefill.power_exponent", 0.0, 4.0),
        ),
        decode=PhaseFrequency(
            r.num("frequency.decode.compute_fraction", 0.0, 1.0),
            r.num("frequency.decode.power_exponent", 0.0, 4.0),
        ),
    )
    prov = r.optional("provenance", {})
    if not isinstance(prov, Mapping):
        raise ConfigError(path, "provenance", "expected a mapping of key -> source text")
    return Calibration(
        setup=setup or str(r.optional("setup", "")),
        path=path,
        gpu=r.text("gpu"),
        model=r.text("model"),
        tp=tp,
        derived=str(r.optional("derived", "measured")),
        engine=engine,
        prefill=prefill,
        decode=decode,
        energy=energy,
        frequency=freq,
        provenance=prov,
    )


# Parsed calibrations by (file, version, root): a topology's DCs, estimators and the load
# plan read the same few files many times. `Calibration` is frozen, so sharing is safe.
_LOADED: dict[tuple[str, int, int, str], Calibration] = {}


def load_calibration_file(path: str | Path, root: Path | None = None) -> Calibration:
    """Load and validate one calibration file (setup name relative to `root`); parsed once
    per file version."""
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size, str(root))
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read calibration file: {exc.strerror}") from exc
    hit = _LOADED.get(key)
    if hit is None:
        hit = _LOADED[key] = _load_calibration_file(p, root)
    return hit


def _load_calibration_file(p: Path, root: Path | None) -> Calibration:
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read calibration file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), "", f"not valid YAML: {exc}") from exc
    setup = ""
    try:
        setup = str(p.resolve().relative_to((root or CALIBRATION_DIR).resolve()).with_suffix(""))
    except ValueError:
        setup = p.stem
    return parse_calibration(data, str(p), setup)


def calibration_path(setup: str, root: Path | None = None) -> Path:
    return (root or CALIBRATION_DIR) / f"{setup}.yaml"


def load_calibration(setup: str, root: Path | None = None) -> Calibration:
    """Load a shipped setup by name, e.g. ``a100-40gb/llama-3.1-8b-tp1``."""
    p = calibration_path(setup, root)
    if not p.exists():
        known = ", ".join(list_setups(root)) or "none"
        raise ConfigError(str(p), "", f"unknown calibration setup {setup!r}; known: {known}")
    return load_calibration_file(p, root)


def list_setups(root: Path | None = None) -> list[str]:
    base = root or CALIBRATION_DIR
    return sorted(str(p.relative_to(base).with_suffix("")) for p in base.glob("*/*.yaml"))
