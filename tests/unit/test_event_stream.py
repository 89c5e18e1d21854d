"""The one stream pump of the scheduler's Submit/Forward and the DC's SubmitStream."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.runtime.grpcutil import serve_event_stream


@dataclass
class Ev:
    request_id: str
    final: bool
    note: str = ""


async def _messages(ids):
    for rid in ids:
        yield rid
        await asyncio.sleep(0)


def _serve(ids, finish_after_s: float):
    """Accept each new id and finish it `finish_after_s` later; refuse an id in flight."""
    loop_events: list[Ev] = []
    in_flight: set[str] = set()

    def intake(rid, sink):
        if rid in in_flight:
            return Ev(rid, True, "refused")
        in_flight.add(rid)

        def done():
            in_flight.discard(rid)
            sink(Ev(rid, True, "completed"))

        sink(Ev(rid, False, "accepted"))
        asyncio.get_running_loop().call_later(finish_after_s, done)
        return None

    async def run():
        async for ev in serve_event_stream(_messages(ids), intake, lambda e: e.final,
                                           lambda m: m):
            loop_events.append(ev)

    asyncio.run(asyncio.wait_for(run(), 5.0))
    return loop_events


def test_stream_ends_after_every_accepted_request_finished():
    evs = _serve(["a", "b"], 0.05)
    assert [(e.request_id, e.note) for e in evs if e.final] == [("a", "completed"),
                                                               ("b", "completed")]


def test_refused_duplicate_does_not_end_the_wait_for_the_original():
    evs = _serve(["a", "a"], 0.05)
    notes = [(e.request_id, e.note) for e in evs]
    assert ("a", "refused") in notes
    assert notes[-1] == ("a", "completed")  # the original's record still arrives
