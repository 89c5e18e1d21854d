"""DESIGN §1.1: cores never import grpc, asyncio, time, prometheus_client or random.

A folder rule, so a new module is covered the day it is added: every module under
services/ is a core and is checked, except
* the runtime folders (`RUNTIME_DIRS`): the shared runtime helpers (clocks, gRPC,
  metrics), the local runner, the virtual runtime, sweeps and deployment tooling;
* a component's runtime modules, by name (`RUNTIME_NAMES`): its gRPC ``server.py``, its
  process ``__main__.py``, its command line ``cli.py``, its wall ``runtime.py``.
The shared pure folders (`services/model`, `services/config`) and the drivers must be
checked: they must never match a runtime rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"

FORBIDDEN = {"grpc", "asyncio", "time", "prometheus_client", "random"}

RUNTIME_DIRS = ("services/runtime/", "services/runner/", "services/sim/", "services/sweep/",
                "services/deploy/")
RUNTIME_NAMES = {"server.py", "__main__.py", "cli.py", "runtime.py"}

# Folders and modules that must stay cores (must exist, must be checked).
REQUIRED_CORE_DIRS = ["services/model", "services/config"]
REQUIRED_CORES = [
    "services/datacenter/engine.py",
    "services/datacenter/dc.py",
    "services/datacenter/perfmodel.py",
    "services/datacenter/driver.py",
    "services/provisioner/core.py",
    "services/provisioner/driver.py",
    "services/scheduler/core.py",
    "services/scheduler/driver.py",
    "services/scheduler/estimator.py",
    "services/config/calibration.py",
    "services/config/topology.py",
    "services/model/state.py",
    "services/model/errors.py",
]


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def is_runtime(relpath: str) -> bool:
    return relpath.startswith(RUNTIME_DIRS) or Path(relpath).name in RUNTIME_NAMES


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


def test_required_cores_exist_and_are_checked() -> None:
    checked = checked_modules()
    for m in REQUIRED_CORES:
        assert (ROOT / m).is_file(), m
        assert m in checked, f"{m} must be a core"
    for d in REQUIRED_CORE_DIRS:
        mods = [rel(p) for p in (ROOT / d).rglob("*.py")]
        assert mods, d
        assert all(m in checked for m in mods), d


def test_runtime_dirs_exist() -> None:
    for d in RUNTIME_DIRS:
        assert (ROOT / d).is_dir(), f"{d} listed as a runtime folder but does not exist"


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
