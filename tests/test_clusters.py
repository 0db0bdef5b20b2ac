"""The bundled cluster files load, have the expected shape and carry the data-sheet numbers."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster

CLUSTERS = Path(__file__).resolve().parent.parent / "instances" / "clusters"
EXPECTED = {"dgx-a100-80gb", "dgx-h100-80gb", "dgx-h200", "ascend-910b", "gb200-nvl72",
            "h100-3level-oversubscribed"}
# Clusters whose nodes are not 8-GPU boards or whose size is not 128 nodes: (devices per node,
# nodes) as built.
SHAPES = {"gb200-nvl72": (4, 144), "h100-3level-oversubscribed": (8, 3072)}

# Known answers from the vendor data sheets (dense, no sparsity): TFLOPS, then HBM, NVLink
# and per-GPU NIC bandwidth in GB/s per direction.
NVIDIA_DATA_SHEET = {
    "dgx-a100-80gb": {"bf16": 312, "fp16": 312, "fp32": 19.5, "hbm": 2039, "links": [300, 25]},
    "dgx-h100-80gb": {"bf16": 989, "fp16": 989, "fp32": 67, "hbm": 3350, "links": [450, 50]},
    "dgx-h200": {"bf16": 989, "fp16": 989, "fp32": 67, "hbm": 4800, "links": [450, 50]},
    "gb200-nvl72": {"bf16": 2500, "fp16": 2500, "fp32": 90, "hbm": 8000, "links": [900, 50]},
    "h100-3level-oversubscribed": {"bf16": 989, "fp16": 989, "fp32": 67, "hbm": 3350,
                                   "links": [450, 50, 50]},
}
# Llama 3.1 405B was trained on 16,384 H100: the outermost domain must hold such a job.
LARGEST_PUBLISHED_JOB = 16384


def _paths() -> list[Path]:
    return sorted(CLUSTERS.glob("*.json"))


def _load(name: str) -> ClusterSpec:
    return load_cluster(CLUSTERS / f"{name}.json")


def test_every_expected_cluster_is_bundled() -> None:
    assert {p.stem for p in _paths()} >= EXPECTED


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_cluster_loads_with_expected_shape(path: Path) -> None:
    cluster = load_cluster(path)
    assert cluster.name == path.stem
    per_node, nodes = SHAPES.get(path.stem, (8, 128))
    assert (cluster.devices_per_node, cluster.num_nodes) == (per_node, nodes)
    assert load_cluster(path, nodes=384).num_devices == 384 * per_node


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_network_domains_grow_outwards(path: Path) -> None:
    cluster = load_cluster(path)
    domains = [level.domain_devices for level in cluster.network]
    assert domains[0] % cluster.devices_per_node == 0  # the scale-up domain holds whole nodes
    assert all(outer > inner and outer % inner == 0 for inner, outer in pairwise(domains))
    assert domains[-1] >= LARGEST_PUBLISHED_JOB
    # Inner levels are no slower than outer ones (as achieved: oversubscription included).
    bandwidths = [level.bandwidth_bytes_s for level in cluster.network]
    assert bandwidths == sorted(bandwidths, reverse=True)


@pytest.mark.parametrize("name", sorted(NVIDIA_DATA_SHEET))
def test_nvidia_numbers_match_data_sheets(name: str) -> None:
    cluster, sheet = _load(name), NVIDIA_DATA_SHEET[name]
    for precision in ("bf16", "fp16", "fp32"):
        assert cluster.device.peak_tflops[precision] == sheet[precision], precision
        assert cluster.device.peak_flops_per_s(precision) == sheet[precision] * 1e12
    assert cluster.device.memory_bandwidth_gb_s == sheet["hbm"]
    assert [level.bandwidth_gb_s for level in cluster.network] == sheet["links"]


def test_ascend_is_within_the_reported_range_and_has_no_invented_fp32() -> None:
    device = _load("ascend-910b").device
    assert 313 <= device.peak_tflops["bf16"] <= 376
    assert "fp32" not in device.peak_tflops
    with pytest.raises(InputError, match="fp32"):
        device.peak_flops_per_s("fp32")
    notes = _load("ascend-910b").notes or ""
    assert "approximate" in notes


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_every_efficiency_states_its_source(path: Path) -> None:
    cluster = load_cluster(path)
    assert (cluster.device.efficiency.source or "").strip()
    for level in cluster.network:
        assert (level.efficiency.source or "").strip(), level.name
    assert (cluster.notes or "").strip()


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_efficiencies_are_written_out_not_defaulted(path: Path) -> None:
    # A missing key would silently fall back to the optimistic defaults (1.0, 0 us).
    raw = json.loads(path.read_text())
    device_keys = raw["device"]["efficiency"].keys()
    assert {"memory_bound_fraction", "kernel_launch_us", "source"} <= device_keys
    assert "reserved_memory_gib" in raw["device"]
    for level in raw["network"]:
        assert {"bandwidth_fraction", "source"} <= level["efficiency"].keys()
        assert "latency_us" in level


@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.stem)
def test_calibrated_numbers_are_plausible(path: Path) -> None:
    cluster = load_cluster(path)
    device = cluster.device
    assert 0.5 <= device.efficiency.memory_bound_fraction < 1.0
    assert 0 < device.efficiency.kernel_launch_us < 20
    assert 0 < device.reserved_memory_gib <= 0.1 * device.memory_gib
    for level in cluster.network:
        assert 0.5 <= level.efficiency.bandwidth_fraction < 1.0, level.name
        assert 0 < level.latency_us < 50, level.name
