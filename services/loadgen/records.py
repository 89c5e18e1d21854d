"""Flat per-request records (one row per emitted request) and their CSV form.

Both runtimes produce `RecordRow`s through `RecordRow.for_plan`: the wall runtime from
`RequestRecord` protos, the virtual runtime from the origin scheduler's `Journey` and the
engine's `FinishedRequest`. Times are emulated seconds; NaN where a phase was not reached.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPLETED = "completed"
REJECTED = "rejected"
FAILED = "failed"
STATES = (COMPLETED, REJECTED, FAILED)
NAN = math.nan


@dataclass
class RecordRow:
    id: str
    origin_region: str
    dataset: str
    isl_tokens: int
    osl_tokens: int
    state: str
    reason: str = ""
    status_code: str = ""
    dc: str = ""
    dc_region: str = ""
    engine: str = ""
    forwarded: bool = False
    fallback: bool = False
    policy: str = ""
    emitted_s: float = NAN
    scheduler_arrival_s: float = NAN
    decided_s: float = NAN
    dc_arrival_s: float = NAN
    admitted_s: float = NAN
    first_token_s: float = NAN
    completed_s: float = NAN
    first_token_origin_s: float = NAN
    completed_origin_s: float = NAN
    ttft_s: float = NAN
    tpot_s: float = NAN
    e2e_s: float = NAN
    queue_s: float = NAN
    output_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    energy_j: float = 0.0
    decision_s: float = NAN
    ttft_slo_s: float = NAN
    tpot_slo_s: float = NAN

    @classmethod
    def for_plan(cls, plan: Any, state: str = "", **fields: Any) -> RecordRow:
        """The row of a planned request (`services.loadgen.plan.PlannedRequest`): its
        identity, lengths and SLO from the plan, the rest from `fields`. Every runtime
        builds its rows here."""
        return cls(id=plan.id, origin_region=plan.origin_region, dataset=plan.dataset,
                   isl_tokens=plan.isl_tokens, osl_tokens=plan.osl_tokens, state=state,
                   ttft_slo_s=plan.ttft_slo_s, tpot_slo_s=plan.tpot_slo_s, **fields)

    @property
    def slo_met(self) -> bool:
        if self.state != COMPLETED:
            return False
        tpot_ok = self.output_tokens <= 1 or self.tpot_s <= self.tpot_slo_s
        return self.ttft_s <= self.ttft_slo_s and tpot_ok


FIELDS = [f.name for f in dataclasses.fields(RecordRow)]


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6f}"
    return v


def write_csv(path: Path, rows: Iterable[RecordRow]) -> int:
    n = 0
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*FIELDS, "slo_met"])
        for r in rows:
            w.writerow([*(_fmt(getattr(r, k)) for k in FIELDS), int(r.slo_met)])
            n += 1
    return n


def read_csv(path: Path) -> list[RecordRow]:
    types = {f.name: f.type for f in dataclasses.fields(RecordRow)}
    out = []
    with path.open() as f:
        for row in csv.DictReader(f):
            kw: dict[str, Any] = {}
            for k in FIELDS:
                v = row.get(k, "")
                t = str(types[k])
                if t == "float":
                    kw[k] = float(v) if v != "" else NAN
                elif t == "int":
                    kw[k] = int(v or 0)
                elif t == "bool":
                    kw[k] = v in ("True", "true", "1")
                else:
                    kw[k] = v
            out.append(RecordRow(**kw))
    return out
