"""What a request message must satisfy wherever it enters (scheduler Submit and Forward,
a DC's Submit and SubmitStream): one rule, field names in every error.

Limits: ids and names at most `MAX_NAME_BYTES` bytes (UTF-8), token counts in
[1, `MAX_TOKENS`], SLO budgets finite and >= 0 (0 means the topology's).
"""

from __future__ import annotations

import math
from typing import Any

from services.model.errors import InvalidInput

MAX_NAME_BYTES = 256
MAX_TOKENS = 10_000_000
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
