"""The lock files pin every dependency of pyproject.toml, with hashes.

`requirements.lock` (a run: the project's dependencies) and `requirements-dev.lock` (what
`make` installs: with the dev extra) come from `make lock`; this test fails when one of
them no longer satisfies pyproject.toml (a requirement added or its range moved).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _lock(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of a pip-compile style lock."""
    out: dict[str, tuple[str, int]] = {}
    name = ""
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^ \\]+)", line)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            out[name] = (m.group(2), 0)
        elif "--hash=sha256:" in line and name:
            v, n = out[name]
            out[name] = (v, n + 1)
    return out


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for e in extras:
        reqs += project["optional-dependencies"][e]
    return [Requirement(r) for r in reqs]


@pytest.mark.parametrize(("lock", "extras"), [("requirements.lock", ()),
                                              ("requirements-dev.lock", ("dev",))])
def test_lock_pins_every_requirement_with_hashes(lock: str, extras: tuple[str, ...]) -> None:
    pins = _lock(ROOT / lock)
    assert len(pins) >= 10
    for req in _requirements(extras):
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{lock}: {req.name} is not pinned (run `make lock`)"
        version, hashes = pins[name]
        assert req.specifier.contains(version, prereleases=True), (
            f"{lock}: {req.name}=={version} is outside {req.specifier} (run `make lock`)")
    assert all(n > 0 for _, n in pins.values()), f"{lock}: a pin without a hash"


def test_runtime_lock_leaves_out_the_dev_tools() -> None:
    pins = _lock(ROOT / "requirements.lock")
    for tool in ("pytest", "ruff", "mypy", "grpcio-tools", "pulp", "docker", "ray"):
        assert tool not in pins, tool
    assert "matplotlib" in pins  # the reports' plots are part of a run
