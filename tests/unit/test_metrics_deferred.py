"""`Deferred` metric updates (the virtual runtime's) give the series that updates at once
give: counters and histogram buckets and counts exactly, sums to rounding."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.runtime.metrics import TTFT_BUCKETS, Deferred


def _samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in reg.collect() for s in fam.samples if not s.name.endswith("_created")}


def _pair() -> tuple[CollectorRegistry, Counter, Histogram]:
    reg = CollectorRegistry()
    c = Counter("x", "x", ("k",), registry=reg)
    h = Histogram("h", "h", ("k",), buckets=TTFT_BUCKETS, registry=reg)
    return reg, c, h


def test_deferred_equals_immediate() -> None:
    rng = np.random.default_rng(3)
    vals = [float(v) for v in rng.exponential(1.0, 5000)]
    vals += [float(b) for b in TTFT_BUCKETS[:-1]]  # values exactly on bucket bounds
    vals += [1e9, 0.0]                             # past every finite bound; zero
    now_reg, now_c, now_h = _pair()
    later_reg, later_c, later_h = _pair()
    d = Deferred()
    for i, v in enumerate(vals):
        k = "ab"[i % 2]
        now_c.labels(k).inc(i % 3)
        now_h.labels(k).observe(v)
        d.inc(later_c.labels(k), i % 3)
        d.observe(later_h.labels(k), v)
    assert _samples(later_reg)[("h_count", (("k", "a"),))] == 0.0  # nothing before flush
    d.flush()
    a, b = _samples(now_reg), _samples(later_reg)
    assert a.keys() == b.keys()
    for key in a:
        if key[0] == "h_sum":
            assert b[key] == pytest.approx(a[key], rel=1e-12)
        else:
            assert b[key] == a[key], key
    d.flush()  # a second flush adds nothing
    assert _samples(later_reg) == b
