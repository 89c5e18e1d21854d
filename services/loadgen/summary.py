"""Run summary: counts, energy, carbon, SLO attainment, latency percentiles, shares.

Rules
-----
* Conservation is checked, not assumed: ``emitted == completed + rejected + failed``;
  `summarize` raises `UsageError` when a record is missing or duplicated.
* Latency percentiles and SLO violation cover requests emitted after the warm-up;
  a rejected or failed request counts as an SLO violation. Counts, energy and carbon
  cover the whole run.
* Energy and carbon come from the DCs' own accounting (`DcFinal`), with PUE in
  ``facility`` and in carbon.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from services.loadgen.records import COMPLETED, FAILED, REJECTED, RecordRow
from services.model.errors import UsageError


@dataclass(frozen=True)
class DcFinal:
    dc: str
    region: str
    zone: str
    gpu_active_j: float
    gpu_idle_j: float
    host_j: float
    training_j: float
    facility_j: float
    renewable_j: float
    grid_j: float
    carbon_g: float
    lateness_s_p99: float = 0.0
    lateness_s_max: float = 0.0
    faithful: bool = True
    mean_ci_g_per_kwh: float = 0.0

    @property
    def it_j(self) -> float:
        return self.gpu_active_j + self.gpu_idle_j + self.host_j + self.training_j


def dc_final_from_states(start: Any, end: Any) -> DcFinal:
    """Energy and carbon between two DC states (`DcState` messages, the load window).

    Both runtimes build their `DcFinal`s here. The DC's mean CI is defined once: carbon
    over grid energy in the window (gCO2 per grid kWh, the grid energy's weighted mean
    CI); with no grid energy, the grid CI at the end."""
    a, b = start.energy, end.energy
    grid_j = b.grid_j - a.grid_j
    carbon = end.carbon_g - start.carbon_g
    mean_ci = carbon / (grid_j / 3.6e6) if grid_j > 0 else end.grid_ci_g_per_kwh
    return DcFinal(
        dc=end.dc,
        region=end.region,
        zone=end.zone,
        gpu_active_j=b.gpu_active_j - a.gpu_active_j,
        gpu_idle_j=b.gpu_idle_j - a.gpu_idle_j,
        host_j=b.host_j - a.host_j,
        training_j=b.training_j - a.training_j,
        facility_j=b.facility_j - a.facility_j,
        renewable_j=b.renewable_j - a.renewable_j,
        grid_j=grid_j,
        carbon_g=carbon,
        lateness_s_p99=end.lateness_s_p99,
        lateness_s_max=end.lateness_s_max,
        faithful=end.faithful,
        mean_ci_g_per_kwh=mean_ci,
    )


def load_window(start_s: float, end_s: float, starts: Mapping[str, Any],
                ends: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's ``window`` key: the load window's bounds (emulated s) and each DC's
    cumulative carbon at its start and end (to cut the window out of other sources of the
    same counters, e.g. Prometheus)."""
    return {
        "start_s": start_s,
        "end_s": end_s,
        "dc_carbon_g": {
            n: {"start": starts[n].carbon_g, "start_time_s": starts[n].time_s,
                "end": ends[n].carbon_g, "end_time_s": ends[n].time_s}
            for n in starts if n in ends
        },
    }


def partial_block(reason: str, planned: int, emitted: int) -> dict[str, Any]:
    """The summary's ``partial`` key of a run that stopped early (None when complete):
    why, and how many of the planned requests were emitted (and are recorded)."""
    return {"reason": reason, "planned": planned, "emitted": emitted}


def occupancy_block(mean_batch_ratio: float | None, samples: int) -> dict[str, Any]:
    """The summary's ``occupancy`` key: mean per-engine batch over the batch limit across
    the provisioner's polls after the warm-up (defines the load regime)."""
    return {"mean_batch_ratio": mean_batch_ratio if samples else None, "samples": samples}


def _pcts(values: Sequence[float]) -> dict[str, float | None]:
    a = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if a.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    q = np.quantile(a, [0.5, 0.9, 0.99])
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "mean": float(a.mean())}


def summarize(
    records: Sequence[RecordRow],
    emitted_ids: Sequence[str],
    dcs: Sequence[DcFinal],
    *,
    runtime: str,
    config: Mapping[str, Any],
    warmup_s: float,
    dilation: float,
    scheduler: Mapping[str, Any] | None = None,
    wall_s: float | None = None,
    emulated_s: float | None = None,
    provisioner: Mapping[str, Any] | None = None,
    occupancy: Mapping[str, Any] | None = None,
    window: Mapping[str, Any] | None = None,
    partial: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's summary. Both runtimes write the same keys: ``provisioner`` (polls and
    snapshots over the load window, `services.provisioner.driver.WindowStats`),
    ``occupancy`` (`occupancy_block`) and ``window`` (`load_window`) are None only where
    the source could not be asked."""
    ids = [r.id for r in records]
    dup = [k for k, c in Counter(ids).items() if c > 1]
    if dup:
        raise UsageError(f"requests recorded more than once: {dup[:5]}")
    missing = sorted(set(emitted_ids) - set(ids))
    if missing:
        raise UsageError(f"{len(missing)} emitted requests have no record, e.g. {missing[:5]}")
    states = Counter(r.state for r in records)
    measured = [r for r in records if not (r.emitted_s < warmup_s)]
    done = [r for r in measured if r.state == COMPLETED]
    violations = sum(not r.slo_met for r in measured)
    ttft_viol = sum(r.state != COMPLETED or r.ttft_s > r.ttft_slo_s for r in measured)
    tpot_viol = sum(
        r.state != COMPLETED or (r.output_tokens > 1 and r.tpot_s > r.tpot_slo_s)
        for r in measured
    )
    n_meas = max(len(measured), 1)
    share = Counter(r.dc for r in records if r.state == COMPLETED)
    n_done = max(sum(share.values()), 1)
    reasons = Counter(r.reason for r in records if r.state != COMPLETED)
    slo_ttft = records[0].ttft_slo_s if records else None
    slo_tpot = records[0].tpot_slo_s if records else None
    total = {
        "gpu_active": sum(d.gpu_active_j for d in dcs),
        "gpu_idle": sum(d.gpu_idle_j for d in dcs),
        "host": sum(d.host_j for d in dcs),
        "training": sum(d.training_j for d in dcs),
    }
    total["total"] = sum(total.values())
    total["facility"] = sum(d.facility_j for d in dcs)
    carbon_total = sum(d.carbon_g for d in dcs)
    decision = [r.decision_s for r in records if not math.isnan(r.decision_s)]
    faithful = all(d.faithful for d in dcs)
    out_tokens = sum(r.output_tokens for r in records if r.state == COMPLETED)
    return {
        "runtime": runtime,
        "partial": dict(partial) if partial is not None else None,
        "requests": {
            "emitted": len(emitted_ids),
            "completed": states.get(COMPLETED, 0),
            "rejected": states.get(REJECTED, 0),
            "failed": states.get(FAILED, 0),
            "forwarded": sum(r.forwarded for r in records),
            "fallback": sum(r.fallback for r in records),
            "measured_after_warmup": len(measured),
            "reasons": dict(reasons.most_common(10)),
        },
        "energy_j": total,
        "carbon_g": {
            "total": carbon_total,
            "per_dc": {d.dc: d.carbon_g for d in dcs},
            "per_region": {
                reg: sum(d.carbon_g for d in dcs if d.region == reg)
                for reg in sorted({d.region for d in dcs})
            },
            "per_output_token": carbon_total / out_tokens if out_tokens else None,
        },
        "slo": {
            "ttft_s": slo_ttft,
            "tpot_s": slo_tpot,
            "violation_ratio": violations / n_meas,
            "ttft_violation_ratio": ttft_viol / n_meas,
            "tpot_violation_ratio": tpot_viol / n_meas,
            "attainment_ratio": 1.0 - violations / n_meas,
        },
        "ttft_s": _pcts([r.ttft_s for r in done]),
        "tpot_s": _pcts([r.tpot_s for r in done if r.output_tokens > 1]),
        "e2e_s": _pcts([r.e2e_s for r in done]),
        "queue_s": _pcts([r.queue_s for r in done]),
        "scheduler": {
            "decision_s": _pcts(decision),
            **({"per_region": dict(scheduler)} if scheduler else {}),
        },
        "dc_share": {dc: c / n_done for dc, c in sorted(share.items())},
        "dcs": [asdict(d) for d in dcs],
        "emulation": {
            "dilation": dilation,
            "lateness_s_p99": max((d.lateness_s_p99 for d in dcs), default=0.0),
            "lateness_s_max": max((d.lateness_s_max for d in dcs), default=0.0),
            "faithful": faithful,
            "wall_s": wall_s,
            "emulated_s": emulated_s,
        },
        "provisioner": dict(provisioner) if provisioner is not None else None,
        "occupancy": dict(occupancy) if occupancy is not None else occupancy_block(None, 0),
        "window": dict(window) if window is not None else None,
        "runner": {"crashed": []},  # services that died during the run (wall runner fills)
        "config": dict(config),
    }


def format_table(summary: Mapping[str, Any]) -> str:
    """A human summary: one block of headline figures and one row per DC."""
    rq = summary["requests"]
    slo = summary["slo"]
    t, p = summary["ttft_s"], summary["tpot_s"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:8.1f}"

    lines = [
        f"runtime {summary['runtime']}  policy {summary['config'].get('policy', '?')}  "
        f"dilation {summary['emulation']['dilation']}  "
        f"faithful {summary['emulation']['faithful']}",
        f"requests  emitted {rq['emitted']}  completed {rq['completed']}  "
        f"rejected {rq['rejected']}  failed {rq['failed']}  forwarded {rq['forwarded']}",
        f"SLO (TTFT {slo['ttft_s']} s, TPOT {slo['tpot_s']} s)  violation "
        f"{slo['violation_ratio'] * 100:.2f} %",
        f"TTFT ms  p50 {ms(t['p50'])}  p90 {ms(t['p90'])}  p99 {ms(t['p99'])}",
        f"TPOT ms  p50 {ms(p['p50'])}  p90 {ms(p['p90'])}  p99 {ms(p['p99'])}",
        f"energy   {summary['energy_j']['facility'] / 3.6e6:.4f} kWh (facility)   "
        f"carbon {summary['carbon_g']['total']:.2f} gCO2",
        "",
        f"{'DC':<14}{'region':<16}{'share %':>9}{'mean CI':>9}{'kWh':>9}{'gCO2':>10}",
    ]
    share = summary["dc_share"]
    for d in summary["dcs"]:
        lines.append(
            f"{d['dc']:<14}{d['region']:<16}{share.get(d['dc'], 0) * 100:>9.1f}"
            f"{d['mean_ci_g_per_kwh']:>9.1f}{d['facility_j'] / 3.6e6:>9.4f}{d['carbon_g']:>10.2f}"
        )
    return "\n".join(lines)
