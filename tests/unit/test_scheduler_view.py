"""The snapshot a scheduler's policy sees between polls (`SchedulerCore.view`).

Three regions with one DC each; a test policy sends every request to DC ``a``. The
expected views are worked out by hand from the projection rule in
`services/scheduler/core.py`: each own dispatch since the snapshot joins the batch (per
engine: requests / engines, up to the batch limit, the rest wait) and its prompt joins
the queue and the KV cache -- once per regional scheduler with ``project_peers``, once
without.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from services.config.topology import DcSpec, SchedulerSpec
from services.model.state import DcView, RequestView, SnapshotView
from services.scheduler.core import SchedulerCore
from services.scheduler.policies.base import Decision, Policy

SETUP = "a100-40gb/llama-3.1-8b-tp1"


class AllToA(Policy):
    """Every request to DC ``a`` (per-request policy)."""

    name = "all-to-a"

    def decide(self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str,
               now_s: float) -> Decision:
        col = [d.dc for d in snapshot.dcs].index("a")
        return self.build([d.dc for d in snapshot.dcs], np.full(len(requests), col),
                          [""] * len(requests), "heuristic")


def dc_view(name: str, region: str, batch: float) -> DcView:
    return DcView(dc=name, region=region, setup=SETUP, engines=4, max_batch=40,
                  active_batch=batch, queue_tokens=50.0, kv_tokens=1000.0,
                  kv_occupancy_ratio=0.1, prefill_duty_ratio=0.0, waiting_requests=0.0,
                  ci_g_per_kwh=100.0, pue=1.1)


def core(project_peers: bool, project_dispatches: bool = True) -> SchedulerCore:
    specs = [DcSpec(name=n, region=r, zone="", nodes=1, gpus_per_node=4, setup=SETUP,
                    pue=1.1, ci={"constant": 100})
             for n, r in (("a", "r1"), ("b", "r2"), ("c", "r3"))]
    spec = SchedulerSpec(policy="all-to-a", project_peers=project_peers,
                         project_dispatches=project_dispatches)
    c = SchedulerCore("r1", spec, specs, AllToA())
    snap = SnapshotView(seq=1, time_s=0.0, dcs=(dc_view("a", "r1", 10.0),
                                                dc_view("b", "r2", 10.0),
                                                dc_view("c", "r3", 10.0)))
    c.on_snapshot(snap, now=0.0)
    return c


def submit(c: SchedulerCore, n: int, isl: int = 100) -> None:
    for i in range(n):
        out = c.submit(RequestView(id=f"q{i}", model="", isl_tokens=isl, osl_tokens=50,
                                   origin_region="r1", ttft_slo_s=3.0, tpot_slo_s=0.1,
                                   arrival_s=0.0), now=0.01)
        assert [d.dc for d in out] == ["a"]


def dc_of(view: SnapshotView | None, name: str) -> DcView:
    assert view is not None
    return next(d for d in view.dcs if d.dc == name)


@pytest.mark.parametrize(("project_peers", "batch", "queue", "kv"), [
    # 8 dispatches of 100 tokens onto 4 engines, counted 3 times (3 schedulers) or once
    (True, 10.0 + 3 * 8 / 4, 50.0 + 3 * 800 / 4, 1000.0 + 3 * 800 / 4),
    (False, 10.0 + 8 / 4, 50.0 + 800 / 4, 1000.0 + 800 / 4),
], ids=["peers", "own-only"])
def test_own_dispatches_projected_once_per_scheduler(project_peers: bool, batch: float,
                                                     queue: float, kv: float) -> None:
    c = core(project_peers)
    assert c.projection_scale == (3.0 if project_peers else 1.0)
    submit(c, 8)
    a = dc_of(c.view(), "a")
    assert a.active_batch == pytest.approx(batch)
    assert a.queue_tokens == pytest.approx(queue)
    assert a.kv_tokens == pytest.approx(kv)
    assert a.waiting_requests == pytest.approx(0.0)
    # DCs that got nothing are as in the snapshot
    assert dc_of(c.view(), "b") == c.snapshot.dcs[1]  # type: ignore[union-attr]


def test_projection_past_the_batch_limit_waits() -> None:
    c = core(project_peers=True)
    submit(c, 48)  # 10 + 3 x 48 / 4 = 46 per engine: 40 in the batch (the limit), 6 wait
    a = dc_of(c.view(), "a")
    assert a.active_batch == pytest.approx(40.0)
    assert a.waiting_requests == pytest.approx(6.0)


def test_a_new_snapshot_clears_the_projection() -> None:
    c = core(project_peers=True)
    submit(c, 8)
    fresh = SnapshotView(seq=2, time_s=1.0, dcs=(dc_view("a", "r1", 12.0),
                                                 dc_view("b", "r2", 10.0),
                                                 dc_view("c", "r3", 10.0)))
    c.on_snapshot(fresh, now=1.0)
    assert c.view() is fresh


def test_no_projection_without_project_dispatches() -> None:
    c = core(project_peers=True, project_dispatches=False)
    submit(c, 8)
    assert c.view() is c.snapshot
