"""A cluster file checked against physics: each figure within what hardware has, the figures
consistent with one another, and the device like the known devices of its name.

:mod:`planner.spec.limits` bounds what the planner can compute with (past it, a search
explodes or a number overflows); the ranges here bound what hardware is: a value outside one
is a slip (a digit, a unit: an H100 file with ``memory_gib: 800``, ``bf16: 9890``, or a
400 Gb/s NIC written as 400 GB/s) and is refused, naming the field, the value and the range.
Each range leaves 2-5x over the largest figure on a data sheet (cited beside it), so that the
next generation of devices loads. A value inside its range but far from every known device of
the same name (:mod:`planner.spec.devices`) is a warning: the library returns warnings, the
CLI prints them.

The checks run on files (:func:`planner.spec.reading.load_cluster`), not on every
:class:`~planner.spec.ClusterSpec`: tests and what-if studies build clusters no hardware has
on purpose. Efficiency fractions and fitted curves are bounded by the spec's own fields
(``(0, 1]``) and by the fits that write them (``planner calibrate``, ``planner bench``);
domain sizes by :mod:`~planner.spec.limits`, by the bandwidth a domain that large can have
(only NICs span more than a node's largest size), and by the outermost level, which must
hold every device (:func:`check_fabric`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

from planner.errors import InputError
from planner.spec import ClusterSpec
from planner.spec import limits as lim
from planner.spec.devices import FAR, KnownDevice, namesakes, nearest


@dataclass(frozen=True, slots=True, kw_only=True)
class Range:
    """What hardware has for one kind of figure, and where the bounds come from."""

    low: float
    """The least value hardware has, in ``unit``."""
    high: float
    """The most, in ``unit``."""
    unit: str
    """As the JSON field's name says it (``GiB``, ``GB/s``, ``TFLOP/s``, ``us``)."""
    why: str
    """The data sheets the bounds are set against, quoted in the refusal."""

    def describe(self) -> str:
        """``1 to 640 GiB``."""
        return f"{self.low:.10g} to {self.high:.10g} {self.unit}".rstrip()


RANGES: dict[str, Range] = {
    "device.memory_gib": Range(
        low=1, high=640, unit="GiB",
        why="2.2x the 288 GB of HBM3E of a B300 or an MI355X, 1.5x the 432 GB AMD announced "
        "for MI400: NVIDIA and AMD data sheets"),
    "device.memory_bandwidth_gb_s": Range(
        low=10, high=40_000, unit="GB/s",
        why="5x the 8 TB/s of a B200, NVIDIA GB200 NVL72 data sheet; 2x the 19.6 TB/s AMD "
        "announced for MI400; one DDR4-3200 channel is 25.6 GB/s"),
    "device.peak_tflops": Range(
        low=0.01, high=8_000, unit="TFLOP/s",
        why="dense, 3.2x a B200's 2,500 TFLOP/s BF16, NVIDIA GB200 NVL72 data sheet; the "
        "1,979 or 4,500 printed for H100 or B200 are with sparsity or FP8"),
    "device.reserved_memory_gib": Range(
        low=0, high=128, unit="GiB",
        why="the CUDA context and driver take ~0.3-0.4 GB, pytorch/pytorch#107667; 128 GiB "
        "is more than any device's whole memory"),
    "device.efficiency.kernel_launch_us": Range(
        low=0, high=1_000, unit="us",
        why="a CUDA launch takes 3.0-3.3 us, meta-pytorch/tritonbench#1017; 3,000 is "
        "nanoseconds written as microseconds"),
    "device.efficiency.fp8.gemm_speedup": Range(
        low=0.05, high=4, unit="",
        why="FP8's dense peak is twice the 16-bit one on the H100, H200, B200 and MI300X data "
        "sheets, and one H100's FP8 GEMMs ran 1.48-1.99x its bf16 ones "
        "(../shared/validation/h100/gemms_fp8_vs_bf16.jsonl); a CPU runs them slower"),
    "scale-up bandwidth_gb_s": Range(
        low=0.1, high=4_000, unit="GB/s",
        why="per device and direction, 4.4x NVLink 5's 900 GB/s, NVIDIA GB200 NVL72 data "
        "sheet; 1 GbE is 0.125 GB/s"),
    "scale-out bandwidth_gb_s": Range(
        low=0.1, high=250, unit="GB/s",
        why=f"a level of more than {lim.MAX_DEVICES_PER_NODE} devices is reached through "
        "NICs: per device and direction, 2.5x an 800 Gb/s ConnectX-8's 100 GB/s; a 400 Gb/s "
        "NIC is 50 GB/s, not 400"),
    "latency_us": Range(
        low=0, high=1_000, unit="us",
        why="NCCL's tuner prices a hop at 0.6-4.0 us and a collective at 6.6-14 us more, "
        "src/graph/tuning.cc; 1,900 is NVLink's 1.9 us in nanoseconds"),
    "host.memory_gib": Range(
        low=1, high=65_536, unit="GiB",
        why="2x the ~30 TB of an 8-socket server; a DGX H100 has 2 TB and a GB200 tray "
        "960 GB, data sheets"),
    "host.link_bandwidth_gb_s": Range(
        low=0.1, high=1_000, unit="GB/s",
        why="2.2x NVLink-C2C's 450 GB/s per direction, NVIDIA Grace Hopper data sheet; PCIe "
        "5.0 x16 is 63 GB/s"),
    "host.memory_bandwidth_gb_s": Range(
        low=1, high=20_000, unit="GB/s",
        why="3.8x the 5.3 TB/s of an MI300A, whose host memory is its HBM; a DGX H100's CPUs "
        "have 614 GB/s, a GB200 tray's 1,024, data sheets"),
}  # fmt: skip
"""Each figure's range, by its JSON path (a network level's by whether it is scale-up)."""


def _ranged(cluster: ClusterSpec) -> Iterator[tuple[str, float, Range]]:
    """Every ranged figure of ``cluster``: its JSON path, its value and its range."""
    device = cluster.device
    for name in ("memory_gib", "memory_bandwidth_gb_s", "reserved_memory_gib"):
        yield f"device.{name}", getattr(device, name), RANGES[f"device.{name}"]
    for precision, tflops in device.peak_tflops.items():
        yield f"device.peak_tflops.{precision}", tflops, RANGES["device.peak_tflops"]
    launch = "device.efficiency.kernel_launch_us"
    yield launch, device.efficiency.kernel_launch_us, RANGES[launch]
    if device.efficiency.fp8 is not None:
        speedup = "device.efficiency.fp8.gemm_speedup"
        yield speedup, device.efficiency.fp8.gemm_speedup, RANGES[speedup]
    for i, level in enumerate(cluster.network):
        # A level past the largest node the planner accepts (1.8x NVL576) is no one NVLink or
        # HCCS domain: its devices reach one another through NICs, whichever level it is.
        scale = "scale-out" if level.domain_devices > lim.MAX_DEVICES_PER_NODE else "scale-up"
        bandwidth = RANGES[f"{scale} bandwidth_gb_s"]
        yield f"network.{i}.bandwidth_gb_s", level.bandwidth_gb_s, bandwidth
        yield f"network.{i}.latency_us", level.latency_us, RANGES["latency_us"]
    if cluster.host is not None:
        for name in ("memory_gib", "link_bandwidth_gb_s", "memory_bandwidth_gb_s"):
            yield f"host.{name}", getattr(cluster.host, name), RANGES[f"host.{name}"]


def check_cluster(cluster: ClusterSpec, *, source: str) -> None:
    """Refuse (:class:`InputError`, one line) a figure of ``cluster`` (read from ``source``)
    outside what hardware has, or a reserve that leaves no memory.

    >>> from planner.spec.reading import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json")
    >>> check_cluster(h100, source="h100.json")
    >>> slipped = h100.model_copy(update={"device": h100.device.model_copy(
    ...     update={"peak_tflops": {"bf16": 9890.0}})})
    >>> check_cluster(slipped, source="h100.json")
    Traceback (most recent call last):
    planner.errors.InputError: h100.json: device.peak_tflops.bf16: 9890 TFLOP/s is outside the \
range 0.01 to 8000 TFLOP/s (dense, 3.2x a B200's 2,500 TFLOP/s BF16, NVIDIA GB200 NVL72 data \
sheet; the 1,979 or 4,500 printed for H100 or B200 are with sparsity or FP8)
    """
    for path, value, allowed in _ranged(cluster):
        if not allowed.low <= value <= allowed.high:
            shown = f"{value:.10g} {allowed.unit}".rstrip()
            raise InputError(f"{source}: {path}: {shown} is outside the range "
                             f"{allowed.describe()} ({allowed.why})")  # fmt: skip
    device = cluster.device
    if device.reserved_memory_gib >= device.memory_gib:
        raise InputError(f"{source}: device.reserved_memory_gib: {device.reserved_memory_gib:.10g}"
                         f" GiB leaves nothing of the device's {device.memory_gib:.10g} GiB "
                         f"(device.memory_gib); it must be less")  # fmt: skip


def most_nodes(cluster: ClusterSpec) -> int:
    """The most nodes of ``cluster``'s size its outermost network level holds.

    >>> from planner.spec.reading import load_cluster
    >>> most_nodes(load_cluster("instances/clusters/gb200-nvl72.json"))
    8190
    """
    return cluster.network[-1].domain_devices // cluster.devices_per_node


def check_fabric(cluster: ClusterSpec, *, field: str) -> None:
    """Refuse a cluster with more devices than its outermost network level holds: no level
    prices the traffic between the rest. ``field`` names where the node count came from
    (``num_nodes`` in a file, ``--nodes`` on the command line).

    >>> from planner.spec.reading import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json")
    >>> check_fabric(h100.with_nodes(16384), field="--nodes")
    Traceback (most recent call last):
    planner.errors.InputError: --nodes 16384: 16384 nodes x 8 devices = 131072 devices, more \
than the 32768 of the outermost network level (network.1 infiniband, domain_devices); at most \
4096 nodes, or a network level that holds them all
    """
    outer = cluster.network[-1]
    if cluster.num_devices <= outer.domain_devices:
        return
    raise InputError(
        f"{field} {cluster.num_nodes}: {cluster.num_nodes} nodes x {cluster.devices_per_node} "
        f"devices = {cluster.num_devices} devices, more than the {outer.domain_devices} of the "
        f"outermost network level (network.{len(cluster.network) - 1} {outer.name}, "
        f"domain_devices); at most {most_nodes(cluster)} nodes, "
        f"or a network level that holds them all"
    )


def cluster_warnings(cluster: ClusterSpec, *, source: str) -> tuple[str, ...]:
    """What in ``cluster`` (read from ``source``) is possible but unlikely, one line each: a
    device (or its scale-up bandwidth) far from every known device of its name, a precision
    faster than a narrower one, an inner network level slower than an outer one, a link
    faster than the device's memory.

    >>> from planner.spec.reading import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json")
    >>> cluster_warnings(h100, source="h100.json")
    ()
    >>> half = h100.model_copy(update={"device": h100.device.model_copy(
    ...     update={"memory_gib": 40.0})})
    >>> print(*cluster_warnings(half, source="h100.json"))
    h100.json: device.memory_gib 40 GiB is 2.0x below the 79.65 of H100-SXM5-80GB, the nearest \
known device of its name (NVIDIA H100 data sheet, H100 SXM (NVLink 900 GB/s, both ways); \
dgx-h100-80gb.json): another part, or a slip?
    """
    found = [*_unlike_namesakes(cluster), *_precisions(cluster), *_network(cluster)]
    return tuple(f"{source}: {text}" for text in found)


def _unlike_namesakes(cluster: ClusterSpec) -> Iterator[str]:
    """A figure of the device, or of its scale-up level, far
    (:data:`~planner.spec.devices.FAR`) from every known device of its name."""
    device = cluster.device
    known = namesakes(device.name)
    if not known:
        return
    figures: list[tuple[str, float, str, list[tuple[float, KnownDevice]]]] = [
        ("device.memory_gib", device.memory_gib, "GiB", [(d.memory_gib, d) for d in known]),
        ("device.memory_bandwidth_gb_s", device.memory_bandwidth_gb_s, "GB/s",
         [(d.memory_bandwidth_gb_s, d) for d in known]),
    ]  # fmt: skip
    for precision, tflops in device.peak_tflops.items():
        figures.append((f"device.peak_tflops.{precision}", tflops, "TFLOP/s",
                        [(v, d) for d in known for v in d.peak_tflops.get(precision, ())]))
    inner = cluster.network[0]
    if 1 < inner.domain_devices <= lim.MAX_DEVICES_PER_NODE:  # a scale-up level
        figures.append((f"network.0.bandwidth_gb_s ({inner.name})", inner.bandwidth_gb_s, "GB/s",
                        [(d.scale_up_gb_s, d) for d in known if d.scale_up_gb_s]))
    for path, given, unit, candidates in figures:
        near = nearest(given, candidates)
        if near is None or near.factor(given) <= FAR:
            continue
        side = "above" if given > near.value else "below"
        # data sheets print a link's bandwidth both ways summed; a level holds one direction's
        both = " A level holds one direction's; data sheets print both summed." * (
            path.startswith("network.") and 1.8 <= given / near.value <= 2.2)
        yield (f"{path} {given:.10g} {unit} is {near.factor(given):.1f}x {side} the "
               f"{near.value:.10g} of {near.device.name}, the nearest known device of its name "
               f"({near.device.source}): another part, or a slip?{both}")


def _precisions(cluster: ClusterSpec) -> Iterator[str]:
    """fp32 faster than a 16-bit type: no tensor or matrix unit runs the wider type faster."""
    peaks = cluster.device.peak_tflops
    wide = peaks.get("fp32")
    for narrow in ("bf16", "fp16"):
        if wide is not None and narrow in peaks and wide > peaks[narrow]:
            yield (f"device.peak_tflops.fp32 {wide:.10g} TFLOP/s is above {narrow}'s "
                   f"{peaks[narrow]:.10g}: no accelerator computes fp32 faster than {narrow}")


def _network(cluster: ClusterSpec) -> Iterator[str]:
    """An inner level slower (less bandwidth or more latency) than the one outside it: the
    planner puts the busiest groups inside, on the promise that inside is faster. A level
    faster than the device's own memory, which every byte it carries passes through."""
    levels = list(enumerate(cluster.network))
    for (i, inner), (j, outer) in pairwise(levels):
        if inner.bandwidth_gb_s < outer.bandwidth_gb_s:
            yield (f"network.{i}.bandwidth_gb_s ({inner.name}) {inner.bandwidth_gb_s:.10g} GB/s is"
                   f" below network.{j}.bandwidth_gb_s ({outer.name}) {outer.bandwidth_gb_s:.10g}:"
                   f" an inner level is the faster one")  # fmt: skip
        if inner.latency_us > outer.latency_us:
            yield (f"network.{i}.latency_us ({inner.name}) {inner.latency_us:.10g} us is above "
                   f"network.{j}.latency_us ({outer.name}) {outer.latency_us:.10g}: an inner level "
                   f"is the faster one")  # fmt: skip
    memory = cluster.device.memory_bandwidth_gb_s
    for i, level in levels:
        if level.bandwidth_gb_s > memory:
            yield (f"network.{i}.bandwidth_gb_s ({level.name}) {level.bandwidth_gb_s:.10g} GB/s is "
                   f"above device.memory_bandwidth_gb_s {memory:.10g}, which every byte it "
                   f"carries passes through")  # fmt: skip
