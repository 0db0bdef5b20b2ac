"""The code base stays ruff-clean: lint runs with the tests so CI enforces it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: install the test extra, pip install -e '.[test]'")
    return [found]


def test_ruff_clean() -> None:
    """`ruff check` finds nothing in the package, tests and benchmarks."""
    result = subprocess.run(
        [*_ruff(), "check", "planner", "tests", "benchmarks"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
