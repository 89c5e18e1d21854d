"""The fault suite (`bench/bench_chaos.py`), short: random kills and stops of DCs,
schedulers and the provisioner during a load keep every request in exactly one recorded
state, with a reason for each that did not complete."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_chaos import chaos_run  # noqa: E402


@pytest.mark.parametrize("seed", [3, 8])
def test_random_faults_lose_no_request(tmp_path: Path, seed: int) -> None:
    r = chaos_run("small", duration=20.0, rate=10.0, faults=3, seed=seed, out=tmp_path / "run")
    assert len(r["faults"]) == 3
    assert not r["problems"], r
    rq = r["requests"]
    assert rq["emitted"] == 200 and rq["completed"] > 0
