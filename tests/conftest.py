"""Shared paths and inputs for the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster

REPO = Path(__file__).resolve().parents[1]
# CI clones the repository with shared/ beside it; so is the working copy.
SHARED = REPO.parent / "shared"
MODELS = REPO / "instances" / "models"
CLUSTERS = REPO / "instances" / "clusters"
CALIBRATION_RUNS = SHARED / "validation" / "calibration_runs.json"
PARAM_COUNTS = SHARED / "validation" / "param_counts.json"
HF = SHARED / "reference" / "hf"


@pytest.fixture(scope="session")
def a100() -> ClusterSpec:
    """The bundled DGX A100 80GB cluster (128 nodes)."""
    return load_cluster(CLUSTERS / "dgx-a100-80gb.json")


@pytest.fixture(scope="session")
def h100() -> ClusterSpec:
    """The bundled DGX H100 cluster (128 nodes)."""
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json")
