"""The load generator's journal: rows as they arrive, rebuilt into one row per emitted
request after a crash."""

from __future__ import annotations

from pathlib import Path

from services.loadgen.plan import PlannedRequest
from services.loadgen.records import COMPLETED, FAILED, RecordJournal, RecordRow


def plan(i: int) -> PlannedRequest:
    return PlannedRequest(id=f"r{i}", t_s=0.1 * i, isl_tokens=100 + i, osl_tokens=10,
                          origin_region="eu", model="m", dataset="d", ttft_slo_s=3.0,
                          tpot_slo_s=0.1)


def test_rebuild_gives_every_emitted_request_one_row(tmp_path: Path) -> None:
    plans = {p.id: p for p in map(plan, range(4))}
    j = RecordJournal(tmp_path)
    for i in range(3):  # r3 was planned but never emitted
        j.emitted(f"r{i}", 0.1 * i)
    j.record(RecordRow.for_plan(plans["r1"], state=COMPLETED, ttft_s=0.2, tpot_s=0.02,
                                output_tokens=10, emitted_s=0.1))
    j.record(RecordRow.for_plan(plans["r0"], state=COMPLETED, ttft_s=0.3, tpot_s=0.02,
                                output_tokens=10, emitted_s=0.0))
    # no close(): a killed process leaves the line-buffered files as they are
    rows, ids = RecordJournal.rebuild(tmp_path, "died", plans)
    j.close()
    assert ids == ["r0", "r1", "r2"]
    by_id = {r.id: r for r in rows}
    assert by_id["r0"].state == by_id["r1"].state == COMPLETED
    assert by_id["r1"].ttft_s == 0.2
    lost = by_id["r2"]
    assert (lost.state, lost.reason, lost.isl_tokens, lost.emitted_s) == (FAILED, "died", 102,
                                                                          0.2)
