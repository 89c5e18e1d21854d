"""Flat per-request records (one row per emitted request) and their CSV form.

Both runtimes produce `RecordRow`s through `RecordRow.for_plan`: the wall runtime from
`RequestRecord` protos, the virtual runtime from the origin scheduler's `Journey` and the
engine's `FinishedRequest`. Times are emulated seconds; NaN where a phase was not reached.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPLETED = "completed"
REJECTED = "rejected"
FAILED = "failed"
STATES = (COMPLETED, REJECTED, FAILED)
NAN = math.nan


@dataclass(slots=True)
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
_VALUES = operator.attrgetter(*FIELDS)


def csv_values(r: RecordRow) -> list[Any]:
    """A row's CSV cells: its fields in order (floats with 6 decimals, NaN empty), then
    ``slo_met`` as 0/1 -- the one CSV form of a record (files and journal)."""
    out = [("" if v != v else f"{v:.6f}") if isinstance(v, float) else v
           for v in _VALUES(r)]
    out.append(int(r.slo_met))
    return out


def write_csv(path: Path, rows: Iterable[RecordRow]) -> int:
    n = 0
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*FIELDS, "slo_met"])
        for r in rows:
            w.writerow(csv_values(r))
            n += 1
    return n


class RecordJournal:
    """Rows written as they arrive, so a run killed at any moment leaves what it had.

    ``records.journal.csv`` holds every terminal row in arrival order (the CSV form of
    `write_csv`); ``emitted.journal`` one line ``id,emitted_s`` per emitted request
    (seconds from the start of the load). Both
    are line-buffered. `rebuild` turns them back into one row per emitted request: a
    request emitted without a row ends FAILED with the given reason."""

    ROWS = "records.journal.csv"
    EMITTED = "emitted.journal"

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.dir = out_dir
        self._rows = (out_dir / self.ROWS).open("w", newline="", buffering=1)
        self._csv = csv.writer(self._rows)
        self._csv.writerow([*FIELDS, "slo_met"])
        self._emitted = (out_dir / self.EMITTED).open("w", buffering=1)

    def emitted(self, rid: str, emitted_s: float) -> None:
        self._emitted.write(f"{rid},{emitted_s:.6f}\n")

    def record(self, r: RecordRow) -> None:
        self._csv.writerow(csv_values(r))

    def close(self, remove: bool = False) -> None:
        self._rows.close()
        self._emitted.close()
        if remove:
            (self.dir / self.ROWS).unlink(missing_ok=True)
            (self.dir / self.EMITTED).unlink(missing_ok=True)

    @classmethod
    def exists(cls, out_dir: Path) -> bool:
        return (out_dir / cls.ROWS).exists()

    @classmethod
    def rebuild(cls, out_dir: Path, reason: str, plans: Mapping[str, Any] | None = None
                ) -> tuple[list[RecordRow], list[str]]:
        """(rows, emitted ids): one row per emitted request, in emission order; `plans`
        (id -> `PlannedRequest`, the run's plan) fills the identity of a request that has
        no row."""
        rows = {r.id: r for r in read_csv(out_dir / cls.ROWS)}
        emitted: dict[str, float] = {}
        path = out_dir / cls.EMITTED
        if path.exists():
            for line in path.read_text().splitlines():
                rid, _, t = line.rpartition(",")
                if rid:
                    emitted.setdefault(rid, float(t))
        order = list(emitted) + [rid for rid in rows if rid not in emitted]
        out = []
        for rid in order:
            row = rows.get(rid)
            if row is None:
                plan = (plans or {}).get(rid)
                if plan is not None:
                    row = RecordRow.for_plan(plan, state=FAILED, reason=reason,
                                             status_code="UNAVAILABLE", emitted_s=emitted[rid])
                else:
                    row = RecordRow(id=rid, origin_region="", dataset="", isl_tokens=0,
                                    osl_tokens=0, state=FAILED, reason=reason,
                                    status_code="UNAVAILABLE", emitted_s=emitted[rid])
            out.append(row)
        return out, order


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
