"""Plain data views shared by cores: what a scheduler knows about DCs and requests, and the
one formula of a request's latencies.

Rules
-----
* Frozen dataclasses, no I/O. Runtimes convert protobuf `Snapshot` / `Request` messages to
  these views (see `services.provisioner.convert`) so policies and estimators never touch protos.
* Units in names: seconds, tokens, gCO2/kWh, ratios in [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DcView:
    """One datacenter in a snapshot, per-engine averages (paper 1 §III-A)."""

    dc: str
    region: str
    setup: str                    # calibration setup name, e.g. a100-40gb/llama-3.1-8b-tp1
    engines: int
    max_batch: int                # per-engine batch limit
    active_batch: float           # B_d
    queue_tokens: float           # Q_d
    kv_tokens: float              # mean cached tokens per engine
    kv_occupancy_ratio: float     # KV_d
    prefill_duty_ratio: float     # duty_d
    waiting_requests: float
    ci_g_per_kwh: float           # effective CI the scheduler should price (grid or blended)
    pue: float
    up: bool = True
    model: str = ""
    grid_ci_g_per_kwh: float = 0.0
    zone: str = ""


@dataclass(frozen=True)
class SnapshotView:
    """The provisioner's global view: DC states plus the inter-region RTT matrix."""

    seq: int
    time_s: float
    dcs: Sequence[DcView]
    rtt_s: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def rtt(self, src: str, dst: str) -> float:
        """RTT in seconds between two regions; 0 within a region."""
        if src == dst:
            return 0.0
        return self.rtt_s.get((src, dst), self.rtt_s.get((dst, src), 0.0))


@dataclass(frozen=True)
class RequestView:
    """What a policy may see of a request. `osl_tokens` is the oracle or the prediction,
    depending on the scheduler's OSL mode."""

    id: str
    model: str
    isl_tokens: int
    osl_tokens: int
    origin_region: str
    ttft_slo_s: float
    tpot_slo_s: float
    arrival_s: float
    dataset: str = ""


def latencies(arrival_s: float, first_token_s: float, completed_s: float
              ) -> tuple[float, float]:
    """TTFT and e2e latency (s) of a request arriving at `arrival_s` — the one definition:
    from the arrival at its first scheduler to the first token / the last token, each
    seen where `first_token_s` / `completed_s` were taken (at the origin for records)."""
    return first_token_s - arrival_s, completed_s - arrival_s
