"""An example third-party GeoServe policy, registered through a Python entry point.

``nearest-lowest-ci``: keep each request in its origin region, on the up DC with the
lowest carbon intensity there; only when the region has none, go to the lowest-CI DC
anywhere. Install this package (``pip install -e examples/third_party_policy``) and
``geoserve sim --policy nearest-lowest-ci`` finds it through the ``geoserve.policies``
entry point group.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.model.state import RequestView, SnapshotView
from services.scheduler.policies.base import Decision, Policy
from services.scheduler.policies.registry import NoConfig, PolicySpec


class NearestLowestCi(Policy):
    name = "nearest-lowest-ci"
    batch = False

    def decide(
        self, requests: Sequence[RequestView], snapshot: SnapshotView, region: str,
        now_s: float,
    ) -> Decision:
        up = [d for d in snapshot.dcs if d.up]
        targets: list[str | None] = []
        for r in requests:
            serving = [d for d in up if not d.model or d.model == r.model]
            local = [d for d in serving if d.region == r.origin_region]
            pool = local or serving
            targets.append(min(pool, key=lambda d: d.ci_g_per_kwh).dc if pool else None)
        n = len(requests)
        decision = Decision(tuple(targets), (False,) * n, ("",) * n, "heuristic")
        self.stats.record(decision)
        return decision


def spec() -> PolicySpec:
    """Entry point target: the policy's registry entry."""
    return PolicySpec("nearest-lowest-ci", NoConfig, NearestLowestCi,
                      "stay in the origin region, lowest CI there", False)
