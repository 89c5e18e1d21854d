"""The summary's per-region scheduler block, defined once for both runtimes.

The virtual runtime calls `scheduler_block` on its `SchedulerCore`s directly; the wall
scheduler sends the same fields in `SchedulerInfo` (its field names are these keys) and
the load generator turns the message back into this dict with `block_from_info`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from services.scheduler.core import SchedulerCore

KEYS = ("policy", "decisions", "local", "forwarded", "forwarded_in", "fallbacks",
        "stale_decisions", "unplaceable", "windows", "mean_window", "solver_status",
        "snapshots")


def scheduler_block(core: SchedulerCore, snapshots: int) -> dict[str, Any]:
    st = core.stats
    return {
        "policy": core.policy.name,
        "decisions": st.decisions,
        "local": st.local,
        "forwarded": st.forwarded,
        "forwarded_in": st.forwarded_in,
        "fallbacks": st.fallbacks,
        "stale_decisions": st.stale_decisions,
        "unplaceable": st.unplaceable,
        "windows": st.windows,
        "mean_window": float(np.mean(st.window_sizes)) if st.window_sizes else 0.0,
        "solver_status": dict(st.solver_status),
        "snapshots": snapshots,
    }


def block_from_info(info: Any) -> dict[str, Any]:
    """The block from a `SchedulerInfo` message."""
    out = {k: getattr(info, k) for k in KEYS}
    out["solver_status"] = dict(info.solver_status)
    return out
