"""Sweep points as Ray tasks: ``geoserve sweep --executor ray [--address HOST:PORT]``.

Rules
-----
* One task per point (`sweep_point`, 1 CPU). At most as many tasks are in flight as the
  cluster has CPUs, so "running" in the progress line is what the cluster runs and
  "left" is what waits in the sweep's own process.
* A task whose worker process or node dies is re-run by Ray (``max_retries``, system
  failures only: a Python exception in a point is not retried). Its result reaches the
  sweep once, through the task's object reference, and only the sweep's process writes
  the point's JSON, so a point is never lost or written twice, and no shared file system
  is needed.
* A point that still fails ends the sweep after the other points have finished, naming
  every failed point; the points done are kept, and a re-run does only the rest.
* Every node must import the same geoserve and ray: install the project on each node (or
  start the nodes from this checkout's virtual environment, as the tests do).
* Without ``--address`` Ray starts a local cluster of this machine's cores.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from services.model.errors import GeoServeError, InvalidInput
from services.sweep.run import Executor, Point, timed_point

MAX_RETRIES = 3
HEARTBEAT_S = 10.0  # a progress line at least this often while points run


class PointsFailed(GeoServeError):
    """Points of a sweep failed on the cluster (after Ray's retries)."""


def sweep_point(p: Point) -> tuple[str, float, str]:
    """The Ray task of one point (its workers show as ``ray::sweep_point``)."""
    return timed_point(p)


def ray_executor(address: str | None) -> tuple[Executor, str]:
    """(executor, a phrase naming the cluster) for the Ray cluster at `address`."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as exc:
        raise InvalidInput("--executor", "ray is not installed here "
                                         "(pip install 'geoserve[ray]')") from exc
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InvalidInput("--address", f"cannot connect to a Ray cluster at "
                                        f"{address or '(a new local one)'}: {exc}") from exc
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if cpus < 1:
        ray.shutdown()
        raise InvalidInput("--address", f"the Ray cluster at {address} has no CPU to run on")
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(sweep_point)

    def run(todo: Sequence[Point]) -> Iterator[tuple[str | None, float, str, int]]:
        queue = list(todo)
        pending: dict[object, Point] = {}
        failed: list[str] = []
        try:
            while queue or pending:
                while queue and len(pending) < cpus:
                    p = queue.pop(0)
                    pending[task.remote(p)] = p
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=HEARTBEAT_S)
                if not ready:
                    yield None, 0.0, "", len(pending)
                    continue
                for ref in ready:
                    p = pending.pop(ref)
                    try:
                        key, took, text = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        failed.append(f"{p.key} ({type(exc).__name__}: "
                                      f"{str(exc).strip().splitlines()[-1][:200]})")
                        continue
                    yield key, took, text, len(pending) + min(len(queue), cpus - len(pending))
        finally:
            ray.shutdown()
        if failed:
            raise PointsFailed(f"{len(failed)} point(s) failed on the Ray cluster: "
                               + "; ".join(failed))

    return run, f"Ray ({nodes} nodes, {cpus} CPUs)"
