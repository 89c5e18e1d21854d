"""Policy registry and the per-request policies (round-robin, least-loaded, greedy, MOER)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from services.model.errors import InvalidInput, UsageError
from services.model.state import DcView, RequestView, SnapshotView
from services.scheduler.policies import available, get_policy, policy_spec
from services.scheduler.policies import registry as reg
from services.scheduler.policies.base import NO_FEASIBLE, Decision, Policy, PolicyDeps
from services.scheduler.policies.synthetic import SyntheticShape, make_requests, make_snapshot

SETUP = "a100-40gb/llama-3.1-8b-tp1"
ALL = ["facility-milp", "greedy", "green-llm", "ilp", "iterative-ilp", "least-loaded", "moer",
       "round-robin"]  # fmt: skip


def dc(name: str, region: str = "eu", **kw: Any) -> DcView:
    base: dict[str, Any] = dict(
        dc=name, region=region, setup=SETUP, engines=4, max_batch=40, active_batch=5.0,
        queue_tokens=0.0, kv_tokens=2000.0, kv_occupancy_ratio=0.1, prefill_duty_ratio=0.0,
        waiting_requests=0.0, ci_g_per_kwh=300.0, pue=1.1,
    )  # fmt: skip
    base.update(kw)
    return DcView(**base)


def req(i: int = 0, origin: str = "eu", **kw: Any) -> RequestView:
    base: dict[str, Any] = dict(
        id=f"r{i}", model="", isl_tokens=300, osl_tokens=80, origin_region=origin,
        ttft_slo_s=3.0, tpot_slo_s=0.1, arrival_s=0.0,
    )  # fmt: skip
    base.update(kw)
    return RequestView(**base)


def snap(
    *dcs: DcView, rtt: dict[tuple[str, str], float] | None = None, seq: int = 1
) -> SnapshotView:
    return SnapshotView(seq=seq, time_s=0.0, dcs=list(dcs), rtt_s=rtt or {})


# --- registry -------------------------------------------------------------------------------
def test_registry_lists_all_builtins_with_batch_flags() -> None:
    assert set(ALL) <= set(available())
    for name in ALL:
        p = get_policy(name)
        assert p.name == name
        assert p.batch == (name in {"ilp", "iterative-ilp", "facility-milp", "green-llm"})
        assert policy_spec(name).help


def test_registry_config_help_and_validation() -> None:
    assert "alpha" in policy_spec("greedy").config_help()
    assert get_policy("greedy", alpha=0.9).alpha == 0.9  # type: ignore[attr-defined]
    with pytest.raises(InvalidInput):
        get_policy("greedy", beta=1.0)
    with pytest.raises(InvalidInput):
        get_policy("greedy", alpha=1.5)
    with pytest.raises(InvalidInput):
        get_policy("no-such-policy")


def test_duplicate_names_raise() -> None:
    r = reg.PolicyRegistry(builtin_modules=())
    spec = reg.PolicySpec("x", reg.NoConfig, lambda c, d: get_policy("round-robin"), "x")
    r.register(spec)
    with pytest.raises(UsageError):
        r.register(reg.PolicySpec("x", reg.NoConfig, spec.factory, "again"))
    with pytest.raises(UsageError):
        reg.register("greedy")(Policy)  # a built-in name


class _ThirdParty(Policy):
    def decide(self, requests: Any, snapshot: SnapshotView, region: str, now_s: float) -> Decision:
        names = [d.dc for d in snapshot.dcs]
        return Decision(tuple(names[-1:] * len(requests)), (False,) * len(requests),
                        ("",) * len(requests), "heuristic")  # fmt: skip


@dataclass(frozen=True)
class _Cfg:
    k: int = 1


def test_entry_point_policies_are_discovered(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = reg.PolicySpec("third-party", _Cfg, lambda c, d: _ThirdParty(c, d), "from a plugin")

    class FakeEntryPoint:
        name = "third-party"

        def load(self) -> Any:
            return lambda: spec

    seen: list[str] = []

    def fake_entry_points(group: str) -> list[FakeEntryPoint]:
        seen.append(group)
        return [FakeEntryPoint()]

    monkeypatch.setattr(reg, "entry_points", fake_entry_points)
    r = reg.PolicyRegistry()
    assert seen == [] and "third-party" in r.available()
    assert seen == ["geoserve.policies"]
    p = r.get("third-party", k=3)
    assert isinstance(p, _ThirdParty) and p.config == _Cfg(3)
    d = p.decide([req()], snap(dc("a"), dc("b")), "eu", 0.0)
    assert d.targets == ("b",)


# --- round-robin / least-loaded ---------------------------------------------------------------
def test_round_robin_rotates_and_skips_down_dcs() -> None:
    s = snap(dc("a"), dc("b", up=False), dc("c"), dc("d"))
    p = get_policy("round-robin")
    targets = [p.decide([req(i)], s, "eu", 0.0).targets[0] for i in range(6)]
    assert targets == ["a", "c", "d", "a", "c", "d"]
    window = p.decide([req(i) for i in range(3)], s, "eu", 0.0)
    assert window.targets == ("a", "c", "d")


def test_round_robin_state_is_per_object() -> None:
    s = snap(dc("a"), dc("b"))
    p1, p2 = get_policy("round-robin"), get_policy("round-robin")
    assert p1.decide([req()], s, "eu", 0.0).targets == ("a",)
    assert p1.decide([req()], s, "eu", 0.0).targets == ("b",)
    assert p2.decide([req()], s, "eu", 0.0).targets == ("a",)


def test_least_loaded_picks_lowest_load_and_spreads_within_a_snapshot() -> None:
    s = snap(dc("busy", active_batch=30.0), dc("light", active_batch=2.0, engines=1),
             dc("mid", active_batch=10.0))  # fmt: skip
    p = get_policy("least-loaded")
    assert p.decide([req()], s, "eu", 0.0).targets == ("light",)
    # Each request adds 1/engines to light's load: after 8 more it exceeds mid (10/40).
    later = [p.decide([req()], s, "eu", 0.0).targets[0] for _ in range(10)]
    assert "mid" in later and "busy" not in later
    # A new snapshot resets the projected load.
    assert p.decide([req()], snap(*s.dcs, seq=2), "eu", 0.0).targets == ("light",)


# --- greedy / MOER ------------------------------------------------------------------------------
def test_greedy_alpha0_picks_lowest_ci_feasible_dc() -> None:
    s = snap(dc("dirty", ci_g_per_kwh=500.0), dc("green", ci_g_per_kwh=20.0),
             dc("mid", ci_g_per_kwh=200.0))  # fmt: skip
    for name, cfg in (("greedy", {"alpha": 0.0}), ("moer", {}), ("greedy", {"alpha": 0.5})):
        d = get_policy(name, **cfg).decide([req()], s, "eu", 0.0)
        assert d.targets == ("green",), name
        assert d.fallback == (False,)


def test_greedy_skips_dc_infeasible_by_rtt() -> None:
    rtt = {("eu", "asia"): 3.5, ("eu", "us"): 0.1}
    s = snap(dc("eu-dirty", "eu", ci_g_per_kwh=500.0), dc("asia-green", "asia", ci_g_per_kwh=10.0),
             dc("us-mid", "us", ci_g_per_kwh=100.0), rtt=rtt)  # fmt: skip
    d = get_policy("greedy", alpha=0.0).decide([req(origin="eu")], s, "eu", 0.0)
    assert d.targets == ("us-mid",)
    d2 = get_policy("moer").decide([req(origin="eu")], s, "eu", 0.0)
    assert d2.targets == ("us-mid",)


def test_greedy_alpha1_picks_lowest_latency() -> None:
    rtt = {("eu", "us"): 0.15}
    s = snap(dc("us-green", "us", ci_g_per_kwh=10.0), dc("eu-dirty", "eu", ci_g_per_kwh=600.0),
             rtt=rtt)  # fmt: skip
    assert get_policy("greedy", alpha=1.0).decide([req()], s, "eu", 0.0).targets == ("eu-dirty",)
    assert get_policy("greedy", alpha=0.0).decide([req()], s, "eu", 0.0).targets == ("us-green",)


def test_greedy_with_no_feasible_dc_falls_back_to_round_robin_and_counts() -> None:
    s = snap(dc("a"), dc("b"), dc("c", up=False))
    p = get_policy("greedy", alpha=0.5)
    impossible = [req(i, tpot_slo_s=1e-4) for i in range(4)]
    d = p.decide(impossible, s, "eu", 0.0)
    assert d.targets == ("a", "b", "a", "b")
    assert d.fallback == (True,) * 4 and set(d.fallback_reason) == {NO_FEASIBLE}
    assert p.stats.fallbacks == 4 and p.stats.fallback_reasons[NO_FEASIBLE] == 4


def test_moer_equals_greedy_alpha0_on_random_instances() -> None:
    rng = np.random.default_rng(11)
    for _ in range(5):
        s = make_snapshot(rng, SyntheticShape(load=float(rng.uniform(0.1, 1.0))))
        reqs = make_requests(rng, 40)
        a = get_policy("moer").decide(reqs, s, "region-0", 0.0)
        b = get_policy("greedy", alpha=0.0).decide(reqs, s, "region-0", 0.0)
        assert a.targets == b.targets


@pytest.mark.parametrize("name", ALL)
def test_no_policy_chooses_a_down_dc(name: str) -> None:
    rng = np.random.default_rng(5)
    base = make_snapshot(rng, SyntheticShape(regions=2, dcs_per_region=3, load=0.5))
    # The greenest DC and one more are down.
    green = min(base.dcs, key=lambda d: d.ci_g_per_kwh).dc
    down = {green, base.dcs[0].dc}
    dcs = [DcView(**{**d.__dict__, "up": d.dc not in down}) for d in base.dcs]
    s = SnapshotView(seq=1, time_s=0.0, dcs=dcs, rtt_s=base.rtt_s)
    reqs = make_requests(rng, 30, regions=2)
    p = get_policy(name)
    for window in ([reqs[0]], reqs):
        d = p.decide(window, s, "region-0", 0.0)
        assert len(d.targets) == len(window)
        assert all(t is not None and t not in down for t in d.targets)


def test_no_dc_up_gives_none_targets() -> None:
    s = snap(dc("a", up=False))
    for name in ALL:
        d = get_policy(name).decide([req()], s, "eu", 0.0)
        assert d.targets == (None,), name


def test_greedy_herds_without_capacity_limit() -> None:
    s = snap(dc("green", ci_g_per_kwh=10.0, engines=1, active_batch=39.0),
             dc("dirty", ci_g_per_kwh=400.0))  # fmt: skip
    d = get_policy("greedy", alpha=0.0).decide([req(i) for i in range(20)], s, "eu", 0.0)
    assert Counter(d.targets) == {"green": 20}


def test_injected_deps_reach_the_policy() -> None:
    ticks = iter(np.arange(0.0, 100.0, 0.5))
    rng = np.random.default_rng(0)
    p = get_policy("ilp", clock=lambda: float(next(ticks)), rng=rng)
    assert isinstance(p.deps, PolicyDeps) and p.deps.rng is rng
    d = p.decide([req()], snap(dc("a")), "eu", 0.0)
    assert d.solve_s > 0.0 and d.targets == ("a",)
