"""Cluster files checked against physics (:mod:`planner.spec.physics`): the slips of issue 25
(an H100 with 800 GiB, 9,890 TFLOP/s, a 400 Gb/s NIC written as 400 GB/s) refused naming the
field, the value and the range; figures far from every known device of the name warned about;
unknown keys named with the nearest known one; ``--nodes`` past the fabric refused; and every
cluster file that loaded before still loads, the bundled ones without a warning."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from planner.errors import InputError
from planner.spec.devices import FAR, KNOWN_DEVICES, namesakes
from planner.spec.physics import RANGES, cluster_warnings
from planner.spec.reading import load_cluster, load_model
from tests.cli_process import cli
from tests.conftest import CLUSTERS, MODELS, SHARED

REPO = Path(__file__).resolve().parents[1]
H100 = CLUSTERS / "dgx-h100-80gb.json"
THREE_LEVEL = CLUSTERS / "h100-3level-oversubscribed.json"
CLUSTER_FILES = sorted(
    path
    for folder in (CLUSTERS, REPO / "tests" / "data", SHARED)
    for path in folder.rglob("*.json")
    if '"devices_per_node"' in path.read_text(errors="replace") and path.parent.name != "sites"
)
"""Every cluster file of the repository and of ../shared."""


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _with(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``data`` with the field at ``dotted`` (``network.1.bandwidth_gb_s``) set to ``value``."""
    out = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return out


def _written(tmp_path: Path, data: dict[str, Any], name: str = "c.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: str(p.relative_to(REPO.parent)))
def test_every_cluster_file_loads_without_warnings(path: Path) -> None:
    """Nothing that loaded before is refused, and no file we ship or measure on is warned
    about (the PCIe H100 of tests/data is told apart from the SXM part by its name)."""
    assert cluster_warnings(load_cluster(path), source=str(path)) == ()


def test_the_cluster_files_are_found() -> None:
    """The parametrization above covers the bundled files and those of tests/data."""
    names = {p.name for p in CLUSTER_FILES}
    assert {f.name for f in CLUSTERS.glob("*.json")} <= names
    assert {"cpu-node.json", "h100-pcie-nvlink-pair.json"} <= names


@pytest.mark.parametrize("path", sorted(CLUSTERS.glob("*.json")), ids=lambda p: p.stem)
def test_every_bundled_device_is_known_with_its_figures(path: Path) -> None:
    """Each bundled device is one of :data:`KNOWN_DEVICES` under its own name, with the file's
    figures: the warnings hold files to what the bundled files say."""
    device = load_cluster(path).device
    known = {d.name: d for d in KNOWN_DEVICES}[device.name]
    assert known in namesakes(device.name)
    assert (known.memory_gib, known.memory_bandwidth_gb_s) == (device.memory_gib,
                                                               device.memory_bandwidth_gb_s)
    for precision, tflops in device.peak_tflops.items():
        assert tflops == known.peak_tflops[precision][0]
    assert load_cluster(path).network[0].bandwidth_gb_s == known.scale_up_gb_s


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("device.memory_gib", 800, "device.memory_gib: 800 GiB is outside the range 1 to 640 GiB"),
     ("device.peak_tflops.bf16", 9890,
      "device.peak_tflops.bf16: 9890 TFLOP/s is outside the range 0.01 to 8000 TFLOP/s"),
     ("network.1.bandwidth_gb_s", 400,
      "network.1.bandwidth_gb_s: 400 GB/s is outside the range 0.1 to 250 GB/s"),
     ("network.0.latency_us", 1900,
      "network.0.latency_us: 1900 us is outside the range 0 to 1000 us"),
     ("device.memory_bandwidth_gb_s", 335_000, "device.memory_bandwidth_gb_s: 335000 GB/s"),
     ("device.efficiency.kernel_launch_us", 3000, "device.efficiency.kernel_launch_us: 3000 us"),
     ("host.memory_gib", 200_000, "host.memory_gib: 200000 GiB is outside the range"),
     ("device.reserved_memory_gib", 79.65, "device.reserved_memory_gib: 79.65 GiB leaves "
      "nothing of the device's 79.65 GiB (device.memory_gib)")],
)  # fmt: skip
def test_a_slip_is_refused_naming_field_value_and_range(
    tmp_path: Path, field: str, value: float, needle: str
) -> None:
    """A digit or a unit slipped (the first three are issue 25's) is one InputError naming
    the file, the field's JSON path, the value and the range with where it comes from."""
    path = _written(tmp_path, _with(_json(H100), field, value))
    with pytest.raises(InputError, match=f"^{re.escape(f'{path}: {needle}')}") as caught:
        load_cluster(path)
    assert "\n" not in str(caught.value)


def test_every_range_leaves_room_over_the_bundled_figures() -> None:
    """Each range's top is at least twice the largest figure of its kind in any bundled file
    (the next generation of devices loads), and no range is empty."""
    from planner.spec.physics import _ranged

    largest: dict[int, float] = {}
    for path in CLUSTERS.glob("*.json"):
        for _, value, allowed in _ranged(load_cluster(path)):
            largest[id(allowed)] = max(largest.get(id(allowed), 0.0), value)
    for name, allowed in RANGES.items():
        assert allowed.low < allowed.high and allowed.why, name
        if id(allowed) in largest:
            assert allowed.high >= 2 * largest[id(allowed)], name


def _future(tmp_path: Path, name: str, scale_up_gb_s: float = 900, **device: Any) -> Path:
    data = _json(CLUSTERS / "gb200-nvl72.json")
    data["device"] |= {"name": name, **device}
    data["network"][0]["bandwidth_gb_s"] = scale_up_gb_s
    return _written(tmp_path, data, f"{name}.json")


@pytest.mark.parametrize(
    ("name", "device"),
    [("AMD Instinct MI300X", {"memory_gib": 192, "memory_bandwidth_gb_s": 5300,
                              "peak_tflops": {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4},
                              "scale_up_gb_s": 448}),
     ("B300", {"memory_gib": 288, "memory_bandwidth_gb_s": 8000,
               "peak_tflops": {"bf16": 2500, "fp16": 2500}}),
     ("MI400", {"memory_gib": 432, "memory_bandwidth_gb_s": 19_600,
                "peak_tflops": {"bf16": 5000, "fp16": 5000}}),
     ("Ascend-910C", {"memory_gib": 128, "memory_bandwidth_gb_s": 3200,
                      "peak_tflops": {"bf16": 780, "fp16": 780}})],
)  # fmt: skip
def test_devices_of_the_next_generations_load(
    tmp_path: Path, name: str, device: dict[str, Any]
) -> None:
    """Parts beyond the bundled ones load without a warning (MI300X as its data sheet gives
    it; no known part shares the others' names)."""
    cluster = load_cluster(_future(tmp_path, name, **device))
    assert cluster_warnings(cluster, source="c.json") == ()


def test_an_nvl576_domain_on_a_100k_gpu_fabric_loads(tmp_path: Path) -> None:
    """A 576-device NVLink domain at 1.8 TB/s per direction (a part after the B200, whose
    900 it would be warned against), 100,008 devices on a fabric of 131,328 (NICs of
    800 Gb/s): within every range, and no warning."""
    data = _json(CLUSTERS / "gb200-nvl72.json")
    data["device"]["name"] = "Rubin-Ultra"
    data["num_nodes"] = 100_008 // 4
    data["network"][0] |= {"domain_devices": 576, "bandwidth_gb_s": 1800}
    data["network"][1] |= {"domain_devices": 576 * 228, "bandwidth_gb_s": 100}
    cluster = load_cluster(_written(tmp_path, data))
    assert cluster.num_devices == 100_008
    assert cluster_warnings(cluster, source="c.json") == ()


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("device.memory_gib", 40.0,
      "device.memory_gib 40 GiB is 2.0x below the 79.65 of H100-SXM5-80GB"),
     ("device.peak_tflops.bf16", 494.5,
      "device.peak_tflops.bf16 494.5 TFLOP/s is 2.0x below the 989 of H100-SXM5-80GB"),
     ("device.memory_bandwidth_gb_s", 33_500,
      "device.memory_bandwidth_gb_s 33500 GB/s is 10.0x above the 3350 of H100-SXM5-80GB")],
)  # fmt: skip
def test_an_h100_off_by_half_is_warned_about(field: str, value: float, needle: str,
                                             tmp_path: Path) -> None:  # fmt: skip
    """Inside the ranges but far from every H100 the planner knows: one warning naming the
    field, the value and the known figure (with its data sheet), and the file still loads."""
    path = _written(tmp_path, _with(_json(H100), field, value))
    warnings = cluster_warnings(load_cluster(path), source=str(path))
    assert warnings == (f"{path}: {needle}, the nearest known device of its name (NVIDIA H100 "
                        "data sheet, H100 SXM (NVLink 900 GB/s, both ways); dgx-h100-80gb.json):"
                        " another part, or a slip?",)  # fmt: skip


def test_a_scale_up_level_of_both_directions_is_warned_about(tmp_path: Path) -> None:
    """GB200's NVLink written as the data sheet's 1.8 TB/s (both directions summed) is twice
    what a level holds, and the warning says so; the H100 level in Gb/s (8x) is a slip
    too, without that hint."""
    gb200 = _written(tmp_path, _with(_json(CLUSTERS / "gb200-nvl72.json"),
                                     "network.0.bandwidth_gb_s", 1800))  # fmt: skip
    (warning,) = cluster_warnings(load_cluster(gb200), source="c.json")
    assert warning.startswith("c.json: network.0.bandwidth_gb_s (nvlink5) 1800 GB/s is 2.0x "
                              "above the 900 of B200-GB200")  # fmt: skip
    assert warning.endswith("A level holds one direction's; data sheets print both summed.")
    h100 = _written(tmp_path, _with(_json(H100), "network.0.bandwidth_gb_s", 3600))
    first = cluster_warnings(load_cluster(h100), source="c.json")[0]
    assert "3600 GB/s is 8.0x above the 450 of H100-SXM5-80GB" in first
    assert first.endswith("another part, or a slip?")


def test_an_unqualified_h100_is_held_to_every_h100() -> None:
    """A name without a part (``H100``) is held to the nearest of the SXM, PCIe and NVL parts:
    the PCIe part's memory bandwidth is no warning, half the SXM part's FLOP/s is (756 / 494.5
    is past :data:`FAR`), 60 % of it is not (the NVL and PCIe parts lie between)."""
    assert [d.name for d in namesakes("NVIDIA H100 80GB HBM3")] == [
        "H100-SXM5-80GB", "H100-PCIe-80GB", "H100-NVL-94GB"]
    assert 756 / 494.5 > FAR > 756 / 600
    cluster = load_cluster(H100)

    def warned(**device: Any) -> tuple[str, ...]:
        changed = cluster.device.model_copy(update={"name": "H100", **device})
        return cluster_warnings(cluster.model_copy(update={"device": changed}), source="c")

    assert warned(memory_bandwidth_gb_s=2000.0) == ()
    assert warned(peak_tflops={"bf16": 600.0}) == ()
    assert len(warned(peak_tflops={"bf16": 494.5})) == 1


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("network.0.bandwidth_gb_s", 25, "network.0.bandwidth_gb_s (nvlink) 25 GB/s is below "
      "network.1.bandwidth_gb_s (infiniband) 50: an inner level is the faster one"),
     ("network.0.latency_us", 10, "network.0.latency_us (nvlink) 10 us is above "
      "network.1.latency_us (infiniband) 4: an inner level is the faster one"),
     ("device.peak_tflops.fp32", 2000, "device.peak_tflops.fp32 2000 TFLOP/s is above bf16's "
      "989: no accelerator computes fp32 faster than bf16"),
     ("device.memory_bandwidth_gb_s", 400, "network.0.bandwidth_gb_s (nvlink) 450 GB/s is "
      "above device.memory_bandwidth_gb_s 400, which every byte it carries passes through")],
)  # fmt: skip
def test_figures_inconsistent_with_one_another_are_warned_about(
    tmp_path: Path, field: str, value: float, needle: str
) -> None:
    """An inner network level slower than an outer one, fp32 faster than bf16, a link faster
    than the device's memory: possible to write, unlikely to be true."""
    path = _written(tmp_path, _with(_json(H100), field, value))
    assert f"{path}: {needle}" in cluster_warnings(load_cluster(path), source=str(path))


def test_nodes_beyond_the_fabric_are_refused() -> None:
    """Issue 25: ``--nodes 16384`` on a fabric of 32,768 devices is refused naming both; the
    fabric's full size still loads."""
    assert load_cluster(H100, nodes=4096).num_devices == 32768
    with pytest.raises(InputError, match=re.escape(
        "--nodes 16384: 16384 nodes x 8 devices = 131072 devices, more than the 32768 of the "
        "outermost network level (network.1 infiniband, domain_devices); at most 4096 nodes"
    )):  # fmt: skip
        load_cluster(H100, nodes=16384)


def test_a_file_with_more_nodes_than_its_fabric_is_refused(tmp_path: Path) -> None:
    """The file's own ``num_nodes`` is held to its outermost level (the 3-level file's spine
    holds 3,072 nodes), unless ``--nodes`` brings it within."""
    path = _written(tmp_path, _json(THREE_LEVEL) | {"num_nodes": 3073})
    with pytest.raises(InputError, match=re.escape(
        f"{path}: num_nodes 3073: 3073 nodes x 8 devices = 24584 devices, more than the 24576 "
        "of the outermost network level (network.2 spine"
    )):  # fmt: skip
        load_cluster(path)
    assert load_cluster(path, nodes=16).num_nodes == 16


@pytest.mark.parametrize(
    ("field", "spelt", "needle"),
    [("device.memory_gib", "memory_gb",
      "device.memory_gb: unknown field (did you mean 'memory_gib'?) (and 1 more)"),
     ("num_nodes", "num_node", "num_node: unknown field (did you mean 'num_nodes'?)"),
     ("network.1.bandwidth_gb_s", "bandwith_gb_s",
      "network.1.bandwith_gb_s: unknown field (did you mean 'bandwidth_gb_s'?)"),
     ("device.efficiency.kernel_launch_us", "kernel_launch",
      "device.efficiency.kernel_launch: unknown field (did you mean 'kernel_launch_us'?)")],
)  # fmt: skip
def test_a_misspelt_key_is_named_with_the_nearest_known_one(
    tmp_path: Path, field: str, spelt: str, needle: str
) -> None:
    """Issue 25: a misspelt key said ``required field is missing (and 1 more)``; the unknown
    key is what the user must change, so it comes first, with the key it was likely meant as
    (at its own level of the file)."""
    data = _json(H100)
    *parents, last = field.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[spelt] = node.pop(last)
    path = _written(tmp_path, data)
    with pytest.raises(InputError, match=f"^{re.escape(f'{path}: {needle}')}"):
        load_cluster(path)


def test_a_misspelt_model_key_is_named_too(tmp_path: Path) -> None:
    """The same for a model.json: the unknown key first, with its nearest known key."""
    data = _json(MODELS / "gpt3-175b.json")
    data["num_layer"] = data.pop("num_layers")
    path = _written(tmp_path, data, "m.json")
    with pytest.raises(InputError, match=re.escape(
        f"{path}: num_layer: unknown field (did you mean 'num_layers'?)")):  # fmt: skip
        load_model(path)


def test_the_cli_refuses_a_slip_and_prints_warnings(tmp_path: Path) -> None:
    """``planner estimate``: a slip is one ``error:`` line and exit 2 with nothing on stdout;
    a warning goes to stderr and the estimate is still printed (exit 0)."""
    model = MODELS / "llama3-8b.json"
    args = ("--tp", "8", "--seq-len", "4096", "--global-batch", "64", "--nodes", "1")
    slipped = _written(tmp_path, _with(_json(H100), "device.peak_tflops.bf16", 9890))
    done = cli("estimate", model, slipped, *args)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"error: {slipped}: device.peak_tflops.bf16: 9890 TFLOP/s")
    _, *rest = done.stderr.splitlines()  # one message, wrapped at words
    assert all(line.startswith("  ") for line in rest) and "error:" not in "".join(rest)
    halved = _written(tmp_path, _with(_json(H100), "device.memory_gib", 40.0), "h.json")
    done = cli("estimate", model, halved, *args)
    assert done.returncode == 0 and "step" in done.stdout.lower(), done.stderr
    assert done.stderr.startswith(f"warning: {halved}: device.memory_gib 40 GiB is 2.0x below")


def test_a_sweep_point_beyond_the_fabric_is_refused(tmp_path: Path) -> None:
    """A sweep's device count is held to the outermost level as ``--nodes`` is: the point
    named, with both numbers, before any search."""
    from planner.sweep import read_sweep, sweep_points

    path = tmp_path / "sweep.toml"
    path.write_text(f'model = "{MODELS / "llama3-8b.json"}"\ncluster = "{H100}"\n'
                    "[training]\nseq_length = 4096\nglobal_batch_size = 64\n"
                    '[axes]\n"cluster.num_nodes" = [16, 8192]\n')  # fmt: skip
    with pytest.raises(InputError, match=re.escape(
        f"{path}: point 1 (cluster.num_nodes=8192): cluster.num_nodes 8192: 8192 nodes x 8 "
        "devices = 65536 devices, more than the 32768 of the outermost network level"
    )):  # fmt: skip
        sweep_points(read_sweep(path))


def test_a_single_level_wider_than_any_nvlink_domain_is_priced_as_nics(tmp_path: Path) -> None:
    """One level for the whole fabric (the scale-up level of a flat cluster) of more than
    1,024 devices is NICs: 50 GB/s loads, 450 GB/s (NVLink's figure on 32,768 devices) is
    refused."""
    data = _json(H100)
    data["network"] = [data["network"][1]]
    assert load_cluster(_written(tmp_path, data)).network[0].domain_devices == 32768
    data["network"][0]["bandwidth_gb_s"] = 450
    with pytest.raises(InputError, match=r"network\.0\.bandwidth_gb_s: 450 GB/s is outside "
                       r"the range 0\.1 to 250 GB/s \(a level of more than 1024 devices"):
        load_cluster(_written(tmp_path, data))


def test_remedies_add_no_more_nodes_than_the_fabric_holds() -> None:
    """``planner estimate``'s remedies price more nodes only as far as the outermost level
    holds them: on 2,048 DGX H100 nodes (a fabric of 4,096) the ZeRO remedy is priced on
    4,096 nodes (it was on 32,768, a cluster ``--nodes`` now refuses)."""
    from planner.plan.config import ParallelConfig
    from planner.uniform.remedies import config_infeasible_message

    config = ParallelConfig(tp=8, pp=2, zero=1, recompute="full", seq_len=8192,
                            global_batch=16384)  # fmt: skip
    message = config_infeasible_message(load_model(MODELS / "llama3.1-405b.json"),
                                        load_cluster(H100, nodes=2048), config)  # fmt: skip
    nodes = [int(n) for n in re.findall(r"--nodes (\d+)", message)]
    assert nodes == [4096], message


def test_a_cloudmatrix_supernode_loads(tmp_path: Path) -> None:
    """A scale-up domain of 384 NPUs (Huawei's CloudMatrix 384, 910C class) on 8-NPU nodes."""
    data = _json(CLUSTERS / "ascend-910b.json")
    data["network"][0]["domain_devices"] = 384
    data["network"][1]["domain_devices"] = 384 * 85  # levels nest
    cluster = load_cluster(_written(tmp_path, data))
    assert cluster.scale_up_devices == 384
    assert cluster_warnings(cluster, source="c.json") == ()


def test_an_unknown_kernel_names_the_known_ones(tmp_path: Path) -> None:
    """Issue 28's bad input: a kernel curve the planner does not know (``flash3`` in the
    efficiency block, close to no field) is one line listing the block's known fields, the
    kernel curves among them."""
    data = _json(H100)
    data["device"]["efficiency"]["flash3"] = {"max_fraction": 0.7}
    path = _written(tmp_path, data)
    with pytest.raises(InputError, match=re.escape(
            f"{path}: device.efficiency.flash3: unknown field (known: gemm, attention, "
            "grouped_gemm, fp8, ")):  # fmt: skip
        load_cluster(path)
