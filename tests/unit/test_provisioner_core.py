"""Provisioner core: poll schedule (sync/async), up/down marking, sequence numbers;
conversions to the wire contract and to the schedulers' views."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from geoserve.v1 import common_pb2 as pb
from hypothesis import given, settings
from hypothesis import strategies as st

from services.model.errors import InvalidInput, UsageError
from services.provisioner import convert
from services.provisioner.core import DcInfo, ProvisionerCore

RTT = {("eu", "eu"): 0.0, ("eu", "us"): 0.1, ("us", "eu"): 0.1, ("us", "us"): 0.0}
DCS = [DcInfo("a", "eu", "NL"), DcInfo("b", "eu", "LT"), DcInfo("c", "us"), DcInfo("d", "us")]


def core(mode: str = "sync", period_s: float = 1.0, start_s: float = 0.0, dcs=DCS):
    return ProvisionerCore(dcs, RTT, period_s=period_s, mode=mode, start_s=start_s)


def state(name: str, t: float, batch: float = 1.0) -> dict:
    return {"dc": name, "time_s": t, "active_batch": batch}


# ------------------------------------------------------------------ schedule
def test_sync_polls_every_dc_at_each_period_tick():
    c = core("sync", period_s=0.5, start_s=10.0)
    first = c.due(10.0)
    assert sorted(p.dc for p in first) == ["a", "b", "c", "d"]
    assert {p.scheduled_s for p in first} == {10.0}
    assert c.next_polls() == [(10.5, "a"), (10.5, "b"), (10.5, "c"), (10.5, "d")]
    for p in first:
        c.on_poll_ok(p, state(p.dc, 10.0), 10.01)
    assert c.due(10.49) == []
    assert c.next_poll_s() == 10.5
    second = c.due(10.5)
    assert {p.scheduled_s for p in second} == {10.5}
    assert len(second) == 4


def test_async_staggers_dc_i_at_offset_i_times_period_over_n():
    c = core("async", period_s=1.0)
    issued: list[tuple[float, str]] = []
    now = 0.0
    while now < 2.0:
        for p in c.due(now):
            issued.append((p.scheduled_s, p.dc))
            c.on_poll_ok(p, state(p.dc, now), now)
        now = c.next_poll_s()
    expected = [(k + i * 0.25, name) for k in (0, 1) for i, name in enumerate("abcd")]
    assert issued == expected


def test_sync_publishes_one_snapshot_per_period_once_every_poll_is_back():
    c = core("sync")
    polls = c.due(0.0)
    outs = [c.on_poll_ok(p, state(p.dc, 0.0), 0.01 * (i + 1)) for i, p in enumerate(polls[:-1])]
    assert all(o.snapshot is None for o in outs)
    last = c.on_poll_failed(polls[-1], 0.3, "DEADLINE_EXCEEDED")
    assert last.snapshot is not None
    assert last.snapshot.seq == 1 and last.snapshot.time_s == 0.3
    assert [e.dc for e in last.snapshot.dcs] == ["a", "b", "c", "d"]
    assert last.snapshot.rtt_s[("eu", "us")] == 0.1
    for p in c.due(1.0):
        out = c.on_poll_ok(p, state(p.dc, 1.0), 1.05)
    assert out.snapshot is not None and out.snapshot.seq == 2
    assert c.latest is out.snapshot
    assert c.stats().snapshots == 2


def test_async_publishes_after_every_poll_with_increasing_seq():
    c = core("async", period_s=1.0)
    seqs, times = [], []
    now = 0.0
    for _ in range(8):
        for p in c.due(now):
            out = c.on_poll_ok(p, state(p.dc, now), now)
            assert out.snapshot is not None
            seqs.append(out.snapshot.seq)
            times.append({e.dc: e.state["time_s"] for e in out.snapshot.dcs if e.state})
        now = c.next_poll_s()
    assert seqs == list(range(1, 9))
    # within one snapshot the DC states were taken at different (staggered) times
    assert sorted(times[-1].values()) == [1.0, 1.25, 1.5, 1.75]


# ------------------------------------------------------------------ up / down
def test_failed_poll_marks_down_keeping_last_counters_and_success_brings_it_back():
    c = core("sync", dcs=[DcInfo("a", "eu"), DcInfo("b", "us")])
    first = {p.dc: p for p in c.due(0.0)}
    kept = state("a", 0.0, batch=7.0)
    up_a = c.on_poll_ok(first["a"], kept, 0.01)
    assert up_a.transition is not None and up_a.transition.up and up_a.transition.dc == "a"
    c.on_poll_ok(first["b"], state("b", 0.0), 0.01)

    second = {p.dc: p for p in c.due(1.0)}
    down = c.on_poll_failed(second["a"], 1.5, "UNAVAILABLE: connection refused")
    assert down.transition is not None
    assert (down.transition.dc, down.transition.up) == ("a", False)
    assert "connection refused" in down.transition.reason
    snap = c.on_poll_ok(second["b"], state("b", 1.0), 1.01).snapshot
    assert snap is not None
    a, b = snap.dcs
    assert (a.up, b.up) == (False, True)
    assert a.state is kept and a.failures == 1 and a.last_ok_s == 0.01
    assert not c.is_up("a")

    # still failing: no new transition, failures count up
    third = {p.dc: p for p in c.due(2.0)}
    again = c.on_poll_failed(third["a"], 2.5, "DEADLINE_EXCEEDED")
    assert again.transition is None
    c.on_poll_ok(third["b"], state("b", 2.0), 2.01)
    assert c.latest is not None and c.latest.dcs[0].failures == 2

    fourth = {p.dc: p for p in c.due(3.0)}
    back = c.on_poll_ok(fourth["a"], state("a", 3.0, batch=2.0), 3.01)
    assert back.transition is not None and back.transition.up
    snap = c.on_poll_ok(fourth["b"], state("b", 3.0), 3.01).snapshot
    assert snap is not None and snap.dcs[0].up and snap.dcs[0].state["active_batch"] == 2.0
    assert snap.dcs[0].failures == 0


def test_dc_never_reached_is_published_down_without_counters():
    c = core("sync", dcs=[DcInfo("a", "eu"), DcInfo("b", "us", "US-NY")])
    pa, pb_ = c.due(0.0)
    c.on_poll_ok(pa, state("a", 0.0), 0.01)
    out = c.on_poll_failed(pb_, 0.2, "UNAVAILABLE")
    assert out.transition is not None and not out.transition.up
    assert out.snapshot is not None
    b = out.snapshot.dcs[1]
    assert (b.up, b.state, b.last_ok_s, b.zone) == (False, None, None, "US-NY")


def test_dc_reporting_not_up_is_marked_down():
    c = core("sync", dcs=[DcInfo("a", "eu")])
    (p,) = c.due(0.0)
    c.on_poll_ok(p, state("a", 0.0), 0.0)
    (p,) = c.due(1.0)
    out = c.on_poll_ok(p, state("a", 1.0), 1.0, dc_up=False)
    assert out.transition is not None and not out.transition.up
    assert "draining" in out.transition.reason
    assert out.snapshot is not None and not out.snapshot.dcs[0].up


# ------------------------------------------------------------------ runtime misuse / lateness
def test_slot_is_skipped_while_the_previous_poll_is_in_flight():
    c = core("sync", dcs=[DcInfo("a", "eu"), DcInfo("b", "us")])
    pa, pb_ = c.due(0.0)
    c.on_poll_ok(pa, state("a", 0.0), 0.1)
    # b's poll is still outstanding at the next tick: only a is polled again
    assert [p.dc for p in c.due(1.0)] == ["a"]
    assert c.stats().skipped == 1
    assert pb_ in c.in_flight()


def test_late_wake_up_issues_only_the_latest_slot_per_dc():
    c = core("sync", period_s=1.0, dcs=[DcInfo("a", "eu")])
    (p,) = c.due(0.0)
    c.on_poll_ok(p, state("a", 0.0), 0.0)
    (late,) = c.due(3.4)
    assert (late.period, late.scheduled_s) == (3, 3.0)
    assert c.stats().skipped == 2  # periods 1 and 2 were overtaken
    assert c.next_poll_s() == 4.0


def test_result_for_a_poll_not_in_flight_is_a_usage_error():
    c = core("sync", dcs=[DcInfo("a", "eu")])
    (p,) = c.due(0.0)
    c.on_poll_ok(p, state("a", 0.0), 0.0)
    with pytest.raises(UsageError):
        c.on_poll_ok(p, state("a", 0.0), 0.0)
    with pytest.raises(UsageError):
        c.is_up("nope")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dcs": []}, "dcs"),
        ({"dcs": [DcInfo("a", "eu"), DcInfo("a", "us")]}, "dcs"),
        ({"period_s": 0.0}, "period_s"),
        ({"period_s": float("nan")}, "period_s"),
        ({"mode": "eventual"}, "mode"),
    ],
)
def test_bad_configuration_names_the_field(kwargs, field):
    args = {"dcs": DCS, "rtt_s": RTT, "period_s": 1.0, "mode": "sync"} | kwargs
    with pytest.raises(InvalidInput) as ei:
        ProvisionerCore(**args)
    assert ei.value.field == field


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["sync", "async"]),
    n=st.integers(1, 5),
    period_s=st.sampled_from([0.2, 0.5, 1.0, 3.0]),
    steps=st.lists(st.floats(0.0, 2.5), min_size=1, max_size=40),
)
def test_polls_land_on_their_slots_and_never_twice_per_period(mode, n, period_s, steps):
    dcs = [DcInfo(f"dc{i}", "eu") for i in range(n)]
    c = ProvisionerCore(dcs, {}, period_s=period_s, mode=mode, start_s=5.0)
    now = 5.0
    seen: dict[str, list[int]] = {d.dc: [] for d in dcs}
    last_seq = 0
    for step in steps:
        for p in c.due(now):
            i = int(p.dc[2:])
            offset = i * period_s / n if mode == "async" else 0.0
            assert p.scheduled_s <= now
            assert p.scheduled_s == pytest.approx(5.0 + p.period * period_s + offset)
            assert now - p.scheduled_s < period_s + 1e-9  # the latest slot, not an old one
            seen[p.dc].append(p.period)
            out = c.on_poll_ok(p, None, now)
            if out.snapshot is not None:
                assert out.snapshot.seq == last_seq + 1
                last_seq = out.snapshot.seq
        now += step * period_s
    for periods in seen.values():
        assert periods == sorted(set(periods))


# ------------------------------------------------------------------ sans-IO rule
def test_core_imports_no_io_modules():
    src = Path(__file__).resolve().parents[2] / "services" / "provisioner" / "core.py"
    tree = ast.parse(src.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    assert names.isdisjoint({"grpc", "asyncio", "time", "prometheus_client", "random", "geoserve"})
    assert ast.get_docstring(tree) and "Theory of operation" in ast.get_docstring(tree)


# ------------------------------------------------------------------ conversions
def dc_state(**kw) -> pb.DcState:
    base = dict(dc="a", region="eu", zone="NL", up=True, engines=2, max_batch=40,
                active_batch=3.5, queue_tokens=120.0, kv_occupancy_ratio=0.25, kv_tokens=900.0,
                prefill_duty_ratio=0.1, waiting_requests=1.5, grid_ci_g_per_kwh=400.0,
                effective_ci_g_per_kwh=0.0, pue=1.2, model="llama-3.1-8b", gpu="a100-40gb",
                tp=1, time_s=12.5)
    return pb.DcState(**(base | kw))


def test_dc_state_to_view_names_the_setup_and_prices_the_right_ci():
    v = convert.dc_state_to_view(dc_state())
    assert v.setup == "a100-40gb/llama-3.1-8b-tp1"
    assert v.ci_g_per_kwh == 400.0 and v.grid_ci_g_per_kwh == 400.0
    assert (v.dc, v.region, v.zone, v.engines, v.max_batch) == ("a", "eu", "NL", 2, 40)
    assert (v.active_batch, v.queue_tokens, v.kv_occupancy_ratio) == (3.5, 120.0, 0.25)
    assert (v.kv_tokens, v.prefill_duty_ratio, v.waiting_requests) == (900.0, 0.1, 1.5)
    assert (v.pue, v.up, v.model) == (1.2, True, "llama-3.1-8b")
    blended = convert.dc_state_to_view(dc_state(effective_ci_g_per_kwh=150.0, tp=4))
    assert blended.ci_g_per_kwh == 150.0 and blended.grid_ci_g_per_kwh == 400.0
    assert blended.setup.endswith("-tp4")


def test_snapshot_to_proto_and_back_to_a_view():
    c: ProvisionerCore[pb.DcState] = ProvisionerCore(
        [DcInfo("a", "eu", "NL"), DcInfo("b", "us", "US-NY")], RTT, period_s=0.5)
    pa, pb_ = c.due(0.0)
    c.on_poll_ok(pa, dc_state(), 0.01)
    data = c.on_poll_failed(pb_, 0.25, "DEADLINE_EXCEEDED").snapshot
    assert data is not None
    snap = convert.snapshot_to_proto(data)
    assert (snap.seq, snap.time_s, snap.poll_period_s) == (1, 0.25, 0.5)
    assert [(d.dc, d.up) for d in snap.dcs] == [("a", True), ("b", False)]
    assert snap.dcs[0].active_batch == 3.5 and snap.dcs[0].time_s == 12.5
    assert (snap.dcs[1].region, snap.dcs[1].zone, snap.dcs[1].engines) == ("us", "US-NY", 0)
    assert {(e.from_region, e.to_region): e.rtt_s for e in snap.rtt} == RTT
    view = convert.snapshot_to_view(pb.Snapshot.FromString(snap.SerializeToString()))
    assert view.seq == 1 and view.time_s == 0.25
    assert [d.up for d in view.dcs] == [True, False]
    assert view.rtt("eu", "us") == 0.1 and view.rtt("us", "us") == 0.0
    # the state object held by the core is not mutated by the conversion
    later = c.due(0.5)
    c.on_poll_failed(later[0], 0.6, "UNAVAILABLE")
    snap2 = convert.snapshot_to_proto(c.on_poll_ok(later[1], dc_state(dc="b", region="us"),
                                                   0.61).snapshot)
    assert snap2.dcs[0].up is False and snap2.dcs[0].active_batch == 3.5
    assert snap.dcs[0].up is True
