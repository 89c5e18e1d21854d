"""Loading CA-RM coefficient files (``data/carm/*.yaml``) into frozen profile objects.

Rules / theory of operation
---------------------------
* Every coefficient of the CA-RM models lives in ``data/carm/profiles.yaml`` (GPU clock levels,
  per-model training and inference coefficients, with their provenance in the file's header);
  the code never hard-codes one.
* Loaders read a file once and return immutable objects; a missing or malformed key raises
  ``ConfigError`` naming the file and key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.carm.models import InferenceProfile, TrainingProfile
from services.model.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
CARM_DIR = DATA_DIR / "carm"


@dataclass(frozen=True)
class GpuProfile:
    """A GPU type's discrete core-clock levels (ascending)."""

    name: str
    frequency_levels_mhz: tuple[float, ...]

    @property
    def min_mhz(self) -> float:
        return self.frequency_levels_mhz[0]

    @property
    def max_mhz(self) -> float:
        return self.frequency_levels_mhz[-1]


@dataclass(frozen=True)
class ModelProfile:
    """One DNN model on one GPU type: training (may be absent) and inference coefficients."""

    name: str
    gpu: str
    status: str
    training: TrainingProfile | None
    inference: InferenceProfile


@dataclass(frozen=True)
class ProfileSet:
    gpus: dict[str, GpuProfile]
    models: dict[str, ModelProfile]

    def gpu(self, name: str) -> GpuProfile:
        if name not in self.gpus:
            raise ConfigError("profiles.yaml", f"gpus.{name}", "unknown GPU")
        return self.gpus[name]

    def model(self, name: str) -> ModelProfile:
        if name not in self.models:
            raise ConfigError("profiles.yaml", f"models.{name}", "unknown model")
        return self.models[name]


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "", f"not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "", "expected a mapping at the top level")
    return doc


def _floats(path: Path, key: str, d: Any, names: tuple[str, ...]) -> dict[str, float]:
    if not isinstance(d, dict):
        raise ConfigError(str(path), key, "expected a mapping")
    out: dict[str, float] = {}
    for n in names:
        if n not in d:
            raise ConfigError(str(path), f"{key}.{n}", "missing")
        try:
            out[n] = float(d[n])
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(path), f"{key}.{n}", f"not a number: {d[n]!r}") from exc
    return out


_TRAIN = ("alpha0_s_mhz", "alpha1_s", "beta0_w_per_mhz", "beta1_w")
_INF = (
    "a0_s_mhz",
    "a1_s",
    "alpha0_w_per_mhz",
    "alpha1_w_per_mhz",
    "alpha2_w",
    "alpha3_w",
    "latency_bound_s",
    "network_delay_s",
)


def load_profiles(path: Path | None = None) -> ProfileSet:
    """Read ``data/carm/profiles.yaml`` (or ``path``)."""
    p = path or CARM_DIR / "profiles.yaml"
    doc = read_yaml(p)
    gpus: dict[str, GpuProfile] = {}
    for name, g in (doc.get("gpus") or {}).items():
        levels = g.get("frequency_levels_mhz") if isinstance(g, dict) else None
        if not isinstance(levels, list) or len(levels) < 1:
            raise ConfigError(str(p), f"gpus.{name}.frequency_levels_mhz", "expected a list")
        lv = tuple(float(x) for x in levels)
        if list(lv) != sorted(lv) or lv[0] <= 0:
            raise ConfigError(
                str(p), f"gpus.{name}.frequency_levels_mhz", "expected ascending positive"
            )
        gpus[name] = GpuProfile(name, lv)
    models: dict[str, ModelProfile] = {}
    for name, m in (doc.get("models") or {}).items():
        key = f"models.{name}"
        if not isinstance(m, dict):
            raise ConfigError(str(p), key, "expected a mapping")
        gpu = str(m.get("gpu", ""))
        if gpu not in gpus:
            raise ConfigError(str(p), f"{key}.gpu", f"unknown GPU {gpu!r}")
        tr = None
        if "training" in m:
            tr = TrainingProfile(model=name, **_floats(p, f"{key}.training", m["training"], _TRAIN))
        inf = InferenceProfile(model=name, **_floats(p, f"{key}.inference", m["inference"], _INF))
        models[name] = ModelProfile(name, gpu, str(m.get("status", "")), tr, inf)
    return ProfileSet(gpus, models)
