"""Shared paths and inputs for the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster

REPO = Path(__file__).resolve().parents[1]
# CI clones the repository with shared/ beside it; so is the working copy. A clone without it
# runs every test that needs no file of it and skips the others, saying which file is missing.
SHARED = REPO.parent / "shared"
MODELS = REPO / "instances" / "models"
CLUSTERS = REPO / "instances" / "clusters"
CALIBRATION_RUNS = SHARED / "validation" / "calibration_runs.json"
FSDP_RUNS = SHARED / "validation" / "fsdp_runs.json"
PARAM_COUNTS = SHARED / "validation" / "param_counts.json"
HF = SHARED / "reference" / "hf"

_WHAT_LIVES_THERE = {
    "validation": "the published runs live beside the repository",
    "reference": "the reference configs live beside the repository",
}


def missing_reason(path: Path) -> str:
    """Why a test of ``path`` (under ../shared) is skipped: the file and where it lives."""
    relative = path.relative_to(SHARED)
    return f"../shared/{relative.as_posix()} not found: {_WHAT_LIVES_THERE[relative.parts[0]]}"


def shared(path: Path) -> Path:
    """``path`` (under ../shared) when it exists; otherwise skip the calling test with the
    reason."""
    if not path.exists():
        pytest.skip(missing_reason(path))
    return path


def needs_shared(*paths: Path) -> pytest.MarkDecorator:
    """A mark that skips a test (or one parameter) when any of ``paths`` is missing."""
    absent = [path for path in paths if not path.exists()]
    return pytest.mark.skipif(bool(absent), reason=missing_reason(absent[0]) if absent else "")


def stand_in_when_missing(path: Path, *, arity: int = 1) -> list[Any]:
    """Nothing when ``path`` exists; else one skipped parameter (of ``arity`` values) in the
    place of the cases globbed from it, so that a clone without ../shared reports them."""
    if path.exists():
        return []
    return [pytest.param(*[path] * arity, marks=needs_shared(path), id=path.name)]


def skip_module_without(path: Path) -> None:
    """Skip the whole calling module when ``path`` is missing (call it at import time, before
    the module reads the file)."""
    if not path.exists():
        pytest.skip(missing_reason(path), allow_module_level=True)


@pytest.fixture(scope="session")
def a100() -> ClusterSpec:
    """The bundled DGX A100 80GB cluster (128 nodes)."""
    return load_cluster(CLUSTERS / "dgx-a100-80gb.json")


@pytest.fixture(scope="session")
def h100() -> ClusterSpec:
    """The bundled DGX H100 cluster (128 nodes)."""
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json")
