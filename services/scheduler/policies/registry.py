"""String-keyed registry of scheduling policies.

Rules / theory of operation
---------------------------
* Each entry is a `PolicySpec`: a name, a small frozen config dataclass whose fields carry
  help text (``field(metadata={"help": ...})``), a factory ``(config, deps) -> Policy``
  and one line of help. Registering a name twice raises `UsageError`.
* Built-in policies register themselves when their module is imported; the registry
  imports them lazily on first use. Third-party policies are discovered through the
  Python entry point group ``geoserve.policies``: each entry point loads either a
  `PolicySpec` or a zero-argument callable returning one.
* ``get_policy(name, clock=..., rng=..., estimator=..., **config)`` builds the config
  dataclass from keyword arguments (unknown keys or bad values raise `InvalidInput`) and
  returns a fresh policy object: the registry holds specs, never run state.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import numpy as np

from services.model.errors import InvalidInput, UsageError
from services.scheduler.estimator import Estimator
from services.scheduler.policies.base import Clock, Policy, PolicyDeps, zero_clock

ENTRY_POINT_GROUP = "geoserve.policies"

BUILTIN_MODULES = (
    "services.scheduler.policies.round_robin",
    "services.scheduler.policies.least_loaded",
    "services.scheduler.policies.greedy",
    "services.scheduler.policies.moer",
    "services.scheduler.policies.ilp",
    "services.scheduler.policies.iterative_ilp",
    "services.scheduler.policies.facility_milp",
    "services.scheduler.policies.green_llm",
)


@dataclass(frozen=True)
class NoConfig:
    """A policy without settings."""


@dataclass(frozen=True)
class PolicySpec:
    """One registry entry."""

    name: str
    config_cls: type[Any]
    factory: Callable[[Any, PolicyDeps], Policy]
    help: str
    batch: bool = False

    def config_help(self) -> dict[str, str]:
        """Field name -> 'help (default: value)' for every config field."""
        out = {}
        for f in dataclasses.fields(self.config_cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            out[f.name] = f"{f.metadata.get('help', '')} (default: {default!r})"
        return out


class PolicyRegistry:
    """Name -> PolicySpec, with lazy built-ins and entry-point discovery."""

    def __init__(self, builtin_modules: tuple[str, ...] = BUILTIN_MODULES) -> None:
        self._specs: dict[str, PolicySpec] = {}
        self._builtin_modules = builtin_modules
        self._loaded = False

    def register(self, spec: PolicySpec) -> PolicySpec:
        if not spec.name:
            raise UsageError("a policy needs a non-empty name")
        if spec.name in self._specs:
            raise UsageError(f"policy {spec.name!r} is already registered")
        if not dataclasses.is_dataclass(spec.config_cls):
            raise UsageError(f"policy {spec.name!r}: config_cls must be a dataclass")
        self._specs[spec.name] = spec
        return spec

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for mod in self._builtin_modules:
            importlib.import_module(mod)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            obj = ep.load()
            spec = obj if isinstance(obj, PolicySpec) else obj()
            if not isinstance(spec, PolicySpec):
                raise UsageError(f"entry point {ep.name!r} did not give a PolicySpec")
            if spec.name not in self._specs or self._specs[spec.name] is not spec:
                self.register(spec)

    def spec(self, name: str) -> PolicySpec:
        self._ensure_loaded()
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs))
            raise InvalidInput("policy", f"unknown policy {name!r}; known: {known}") from None

    def available(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self._specs)

    def make_config(self, name: str, **config: Any) -> Any:
        """The policy's config from settings; errors name ``policy_config[.setting]``."""
        spec = self.spec(name)
        fields = {f.name: f for f in dataclasses.fields(spec.config_cls)}
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise InvalidInput(
                "policy_config",
                f"unknown setting(s) {unknown} for policy {name!r}; known: {sorted(fields)}")
        for key, value in config.items():
            _check_type(key, str(fields[key].type), value)
        try:
            return spec.config_cls(**config)
        except (TypeError, ValueError) as exc:
            raise InvalidInput("policy_config", f"policy {name!r}: {exc}") from exc

    def get(
        self,
        name: str,
        *,
        clock: Clock = zero_clock,
        rng: np.random.Generator | None = None,
        estimator: Estimator | None = None,
        **config: Any,
    ) -> Policy:
        spec = self.spec(name)
        cfg = self.make_config(name, **config)
        return spec.factory(cfg, PolicyDeps(clock=clock, rng=rng, estimator=estimator))


REGISTRY = PolicyRegistry()


def _check_type(key: str, annotation: str, value: Any) -> None:
    """A setting's value against its config field's type (float, int, bool, str)."""
    kind = annotation.replace(" ", "")
    field = f"policy_config.{key}"
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidInput(field, f"expected true or false, got {value!r}")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(field, f"expected an integer, got {value!r}")
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(field, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise InvalidInput(field, f"expected a finite number, got {value!r}")
    elif kind == "str" and not isinstance(value, str):
        raise InvalidInput(field, f"expected a string, got {value!r}")


def register(
    name: str, config_cls: type[Any] = NoConfig, help: str = "", batch: bool = False
) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator registering a built-in policy ``cls(config, deps)``; `config_cls()`
    becomes the policy's config when it is built with ``config=None``."""

    def deco(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        cls.batch = batch
        cls.config_cls = config_cls
        REGISTRY.register(PolicySpec(name, config_cls, cls, help or (cls.__doc__ or ""), batch))
        return cls

    return deco


def get_policy(
    name: str,
    *,
    clock: Clock = zero_clock,
    rng: np.random.Generator | None = None,
    estimator: Estimator | None = None,
    **config: Any,
) -> Policy:
    """A new policy object by registry name, e.g. ``get_policy("greedy", alpha=0.5)``."""
    return REGISTRY.get(name, clock=clock, rng=rng, estimator=estimator, **config)


def available() -> list[str]:
    """Registered policy names (built-ins plus entry points)."""
    return REGISTRY.available()


def policy_spec(name: str) -> PolicySpec:
    """The registry entry of `name` (config class, help text)."""
    return REGISTRY.spec(name)
