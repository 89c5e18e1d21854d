"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A running Docker engine (``deploy/setup-docker.sh`` installs and starts one where
    missing; skips only when Docker cannot be had at all)."""
    setup = subprocess.run(["bash", "deploy/setup-docker.sh"], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    if setup.returncode != 0:
        if shutil.which("docker") is None and shutil.which("apt-get") is None:
            pytest.skip(f"Docker cannot be installed here: {setup.stderr.strip()}")
        pytest.fail(f"deploy/setup-docker.sh failed:\n{setup.stderr}")
    print(setup.stderr.strip())
