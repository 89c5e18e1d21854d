"""The shared estimator against what the emulator then realises (virtual runtime).

The estimator's accuracy is judged on the provisioner's snapshot it is given; the
scheduler's projected view (own dispatches since the snapshot added) is reported too — it
errs on the loaded side by design."""

from __future__ import annotations

import numpy as np
import pytest

from services.config.topology import load_topology
from services.sim.runtime import SimRun


def mape(pred: np.ndarray, real: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - real) / real))


@pytest.mark.parametrize(("policy", "rate"), [("greedy", 12.0), ("greedy", 30.0)])
def test_estimated_ttft_tpot_track_realised_ones(policy, rate):
    topo = load_topology("small").with_overrides(policy=policy, rate_rps=rate, duration_s=30,
                                                 warmup_s=5)
    run = SimRun(topo, charge_solver_time=False)
    for s in run.schedulers.values():
        s.record_estimates = True
    summary = run.run()
    est = {k: v for s in run.schedulers.values() for k, v in s.estimates.items()}
    rows = [r for r in run.records() if r.state == "completed" and r.emitted_s >= 5
            and r.output_tokens > 1 and r.id in est]
    assert len(rows) > 0.8 * summary["requests"]["measured_after_warmup"]
    ttft_p = np.array([est[r.id][0] for r in rows])
    tpot_p = np.array([est[r.id][1] for r in rows])
    ttft_r = np.array([r.ttft_s for r in rows])
    tpot_r = np.array([r.tpot_s for r in rows])
    m_ttft, m_tpot = mape(ttft_p, ttft_r), mape(tpot_p, tpot_r)
    v_ttft = mape(np.array([est[r.id][2] for r in rows]), ttft_r)
    v_tpot = mape(np.array([est[r.id][3] for r in rows]), tpot_r)
    print(f"\nestimator MAPE at {rate:g} req/s ({policy}), on the snapshot: TTFT "
          f"{m_ttft * 100:.1f} %, TPOT {m_tpot * 100:.1f} %; on the scheduler's projected "
          f"view: TTFT {v_ttft * 100:.1f} %, TPOT {v_tpot * 100:.1f} % ({len(rows)} requests)")
    # the estimate must carry real information: far better than a constant guess
    const_ttft = mape(np.full_like(ttft_r, np.median(ttft_r)), ttft_r)
    assert m_ttft < 0.5 and m_tpot < 0.5
    assert m_ttft < const_ttft
    # and it ranks requests: forwarded ones (RTT) are estimated slower than local ones
    assert np.corrcoef(ttft_p, ttft_r)[0, 1] > 0.5
