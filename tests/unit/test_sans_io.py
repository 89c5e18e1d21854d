"""DESIGN §1.1: cores never import grpc, asyncio, time, prometheus_client or random.

Every module under services/ is checked (so a new core module is covered the day it is
added) except the runtime modules listed in RUNTIME_MODULES, which own the I/O and the
clocks. A module whose name matches a runtime pattern (a gRPC ``server.py`` or a
``__main__.py``) is a runtime too. The cores named in the design must exist and must never
be on the runtime list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"

FORBIDDEN = {"grpc", "asyncio", "time", "prometheus_client", "random"}

# Runtime modules: allowed to do I/O, sleep, read the wall clock, talk gRPC.
RUNTIME_MODULES = {
    "services/cli.py",
    "services/common/clock.py",       # wall clock + asyncio sleeping
    "services/common/grpcutil.py",    # channels, servers, health, interceptors
    "services/common/links.py",       # persistent gRPC stream links
    "services/loadgen/service.py",    # load generator process (wall runtime)
    "services/runner/cli.py",         # geoserve run / sim
    "services/runner/local.py",       # processes on loopback
    "services/sim/runtime.py",        # virtual runtime: measures solver time, charges it
    "services/common/metrics.py",     # Prometheus registry and HTTP exposition
    "services/common/healthprobe.py",  # gRPC health probe (container health checks)
    "services/sweep/run.py",          # worker processes of a sweep
    "services/sweep/cli.py",          # geoserve sweep (spawns geoserve run)
    "services/sweep/report.py",       # report writing
    "services/deploy/swap.py",        # Docker SDK
    "services/deploy/compose.py",     # compose file generation
    "services/deploy/cli.py",
}
RUNTIME_NAMES = {"server.py", "__main__.py"}

# Cores named in the design / issue: must exist and be sans-IO.
REQUIRED_CORES = [
    "services/datacenter/engine.py",
    "services/datacenter/dc.py",
    "services/datacenter/perfmodel.py",
    "services/common/calibration.py",
    "services/common/state.py",
    "services/common/vclock.py",
    "services/common/errors.py",
]
# Cores that are checked whenever they exist (other issues add them).
OPTIONAL_CORE_GLOBS = [
    "services/scheduler/estimator.py",
    "services/scheduler/policies/*.py",
    "services/carm/*.py",
    "services/common/carbon.py",
    "services/loadgen/datasets.py",
    "services/loadgen/arrivals.py",
]


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def is_runtime(relpath: str) -> bool:
    return relpath in RUNTIME_MODULES or Path(relpath).name in RUNTIME_NAMES


def checked_modules() -> list[str]:
    return sorted(rel(p) for p in SERVICES.rglob("*.py") if not is_runtime(rel(p)))


def forbidden_imports(source: str, filename: str) -> list[str]:
    """Forbidden top-level packages imported by `source` (any nesting level)."""
    tree = ast.parse(source, filename=filename)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hits += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] in FORBIDDEN:
                hits.append(node.module)
        elif isinstance(node, ast.Call):
            # importlib.import_module("time") / __import__("random")
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in {"import_module", "__import__"} and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if arg.value.split(".")[0] in FORBIDDEN:
                        hits.append(arg.value)
    return hits


def test_required_cores_exist_and_are_not_runtimes() -> None:
    for m in REQUIRED_CORES:
        assert (ROOT / m).is_file(), m
        assert not is_runtime(m)
        assert m in checked_modules()
    for pattern in OPTIONAL_CORE_GLOBS:
        for p in ROOT.glob(pattern):
            r = rel(p)
            if p.name not in RUNTIME_NAMES:
                assert r not in RUNTIME_MODULES, f"{r} is a core, not a runtime"
                assert r in checked_modules()


def test_runtime_list_has_no_stale_entries() -> None:
    for m in RUNTIME_MODULES:
        assert (ROOT / m).is_file(), f"{m} listed as a runtime module but does not exist"


@pytest.mark.parametrize("module", checked_modules())
def test_core_module_is_sans_io(module) -> None:
    path = ROOT / module
    hits = forbidden_imports(path.read_text(), str(path))
    assert not hits, f"{module} imports {hits}; cores must stay sans-IO (DESIGN §1.1)"


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ("import time\n", ["time"]),
        ("import grpc.aio as g\n", ["grpc.aio"]),
        ("from asyncio import sleep\n", ["asyncio"]),
        ("def f():\n    import random\n", ["random"]),
        ("from prometheus_client import Counter\n", ["prometheus_client"]),
        ("import importlib\nimportlib.import_module('time')\n", ["time"]),
        ("import numpy.random\nfrom . import time\nimport timeit\n", []),
        ("from datetime import time\n", []),
    ],
)
def test_detector(src, expected) -> None:
    assert forbidden_imports(src, "<test>") == expected
