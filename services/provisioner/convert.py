"""Conversions between the provisioner's data, the wire contract and the schedulers' views.

* `snapshot_to_proto` turns the core's `SnapshotData[pb.DcState]` into a `pb.Snapshot`:
  each DC's last known state with ``up`` set by the provisioner (down DCs keep their last
  counters), a DC never reached as a bare entry (name, region, zone, ``up=False``), and the
  RTT matrix as sorted `RttEntry` rows.
* `snapshot_to_view` / `dc_state_to_view` turn a received `pb.Snapshot` into the plain
  `SnapshotView` / `DcView` that estimators and policies use (they never touch protos).
  The setup name is ``f"{gpu}/{model}-tp{tp}"`` (the calibration file's name) and the CI
  to price is the effective CI when the DC reports one (> 0), else the grid CI.
"""

from __future__ import annotations

from typing import Any

from geoserve.v1 import common_pb2 as pb

from services.model.state import DcView, SnapshotView
from services.provisioner.core import DcEntry, SnapshotData
from services.provisioner.driver import WindowStats


def setup_name(gpu: str, model: str, tp: int) -> str:
    """Calibration setup name of a DC, e.g. ``a100-40gb/llama-3.1-8b-tp1``."""
    return f"{gpu}/{model}-tp{tp}"


def dc_state_to_view(s: pb.DcState) -> DcView:
    ci = s.effective_ci_g_per_kwh if s.effective_ci_g_per_kwh > 0 else s.grid_ci_g_per_kwh
    return DcView(
        dc=s.dc,
        region=s.region,
        setup=setup_name(s.gpu, s.model, s.tp) if s.gpu else "",
        engines=s.engines,
        max_batch=s.max_batch,
        active_batch=s.active_batch,
        queue_tokens=s.queue_tokens,
        kv_tokens=s.kv_tokens,
        kv_occupancy_ratio=s.kv_occupancy_ratio,
        prefill_duty_ratio=s.prefill_duty_ratio,
        waiting_requests=s.waiting_requests,
        ci_g_per_kwh=ci,
        pue=s.pue,
        up=s.up,
        model=s.model,
        grid_ci_g_per_kwh=s.grid_ci_g_per_kwh,
        zone=s.zone,
    )


def snapshot_to_view(s: pb.Snapshot) -> SnapshotView:
    return SnapshotView(
        seq=s.seq,
        time_s=s.time_s,
        dcs=tuple(dc_state_to_view(d) for d in s.dcs),
        rtt_s={(e.from_region, e.to_region): e.rtt_s for e in s.rtt},
    )


def dc_entry_to_proto(e: DcEntry[pb.DcState]) -> pb.DcState:
    out = pb.DcState()
    if e.state is not None:
        out.CopyFrom(e.state)
    out.dc = e.dc
    out.region = e.region
    out.zone = out.zone or e.zone
    out.up = e.up
    return out


def snapshot_to_proto(data: SnapshotData[pb.DcState]) -> pb.Snapshot:
    snap = pb.Snapshot(seq=data.seq, time_s=data.time_s, poll_period_s=data.period_s)
    snap.dcs.extend(dc_entry_to_proto(e) for e in data.dcs)
    snap.rtt.extend(
        pb.RttEntry(from_region=a, to_region=b, rtt_s=v)
        for (a, b), v in sorted(data.rtt_s.items())
    )
    return snap


def batch_occupancy(s: pb.DcState) -> float:
    """Mean per-engine active batch over the batch limit (the load regime's measure)."""
    return s.active_batch / s.max_batch if s.max_batch > 0 else 0.0


def window_stats_from_proto(m: Any) -> WindowStats:
    """A `ProvisionerStats` message as the driver's `WindowStats`."""
    return WindowStats(m.mode, m.period_s, m.polls, m.snapshots, m.failures, m.skipped,
                       m.mean_batch_ratio if m.occupancy_samples else None,
                       m.occupancy_samples)
