"""Scheduling policies: a string-keyed registry plus one module per policy.

``get_policy(name, **config)`` returns a fresh policy object; ``available()`` lists the
names (built-ins plus the ``geoserve.policies`` entry point group). Every policy has
``batch: bool`` and ``decide(requests, snapshot, region, now_s) -> Decision``.
"""

from services.scheduler.policies.base import Decision, Policy, PolicyDeps, PolicyStats
from services.scheduler.policies.registry import (
    PolicySpec,
    available,
    get_policy,
    policy_spec,
    register,
)

__all__ = [
    "Decision",
    "Policy",
    "PolicyDeps",
    "PolicySpec",
    "PolicyStats",
    "available",
    "get_policy",
    "policy_spec",
    "register",
]
