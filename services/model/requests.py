"""What a message must satisfy wherever it enters: one rule, field names in every error.

* Requests (scheduler Submit and Forward, a DC's Submit and SubmitStream, `check_request`):
  ids and names at most `MAX_NAME_BYTES` bytes (UTF-8), token counts in [1, `MAX_TOKENS`],
  SLO budgets finite and >= 0 (0 means the topology's).
* Control messages (a DC's SetFrequency, ApplyCarmPlan and Drain, the provisioner's Watch
  and GetStats): `check_number` (finite, within a range) and `check_name` (at most
  `MAX_NAME_BYTES`); powers at most `MAX_SITE_POWER_W`, emulated times and durations at
  most `MAX_EMULATED_S`.
"""

from __future__ import annotations

import math
from typing import Any

from services.model.errors import InvalidInput

MAX_NAME_BYTES = 256
MAX_TOKENS = 10_000_000
# One site draws at most 1 GW (the largest campuses planned today are about that size).
MAX_SITE_POWER_W = 1e9
# Emulated times and durations of control messages: at most a year.
MAX_EMULATED_S = 365 * 86400.0
NAME_FIELDS = ("id", "model", "dataset", "origin_region", "target_dc", "target_region",
               "policy")


def check_request(r: Any) -> None:
    """Raise `InvalidInput` naming the first field of request `r` that is out of bounds."""
    if not r.id:
        raise InvalidInput("request.id", "expected a non-empty string")
    for name in NAME_FIELDS:
        n = len(getattr(r, name).encode())
        if n > MAX_NAME_BYTES:
            raise InvalidInput(f"request.{name}",
                               f"expected at most {MAX_NAME_BYTES} bytes, got {n}")
    for name in ("isl_tokens", "osl_tokens"):
        v = getattr(r, name)
        if not 1 <= v <= MAX_TOKENS:
            raise InvalidInput(f"request.{name}", f"expected 1..{MAX_TOKENS}, got {v}")
    for name in ("ttft_s", "tpot_s"):
        v = getattr(r.slo, name)
        if not (math.isfinite(v) and v >= 0):
            raise InvalidInput(f"request.slo.{name}",
                               f"expected a finite number >= 0 (0: the topology's), got {v}")


def clipped(r: Any) -> Any:
    """A copy of request message `r` whose name fields are cut to `MAX_NAME_BYTES` bytes,
    so that a refusal never echoes an oversized field back (the record names the field)."""
    out = type(r)()
    out.CopyFrom(r)
    for name in NAME_FIELDS:
        v = getattr(out, name)
        if len(v.encode()) > MAX_NAME_BYTES:
            setattr(out, name, v.encode()[:MAX_NAME_BYTES].decode(errors="ignore"))
    return out


def check_number(field: str, v: float, lo: float = 0.0, hi: float = math.inf,
                 unit: str = "") -> float:
    """`v` if it is a finite number in [lo, hi]; else `InvalidInput` naming `field`."""
    if not (math.isfinite(v) and lo <= v <= hi):
        rng = f">= {lo:g}" if hi == math.inf else f"in [{lo:g}, {hi:g}]"
        raise InvalidInput(field, f"expected a finite number {rng}{unit}, got {v}")
    return v


def check_name(field: str, v: str) -> str:
    """`v` if it is at most `MAX_NAME_BYTES` bytes; else `InvalidInput` (not echoing it)."""
    n = len(v.encode())
    if n > MAX_NAME_BYTES:
        raise InvalidInput(field, f"expected at most {MAX_NAME_BYTES} bytes, got {n}")
    return v
