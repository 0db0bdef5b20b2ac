"""The accelerators the planner knows by name, with their data-sheet figures: what a cluster
file's device is held to (a warning, never a refusal, when it is far from every one of them).

Every device of a bundled cluster file (``instances/clusters``) is here with the file's own
figures (``tests/test_physics.py`` holds them equal), and beside it the other parts sold under
the same chip's name (H100 PCIe and NVL, A100 PCIe, H200 NVL, HGX B200), so that a file for
one of them is not warned about, and H800, AMD's MI300X and MI325X. Figures are dense (without
sparsity), per device; memory in GiB as ``nvidia-smi`` reports it where known, else the data
sheet's GB read as GiB (NVIDIA's HBM capacities are binary).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

FAR = 1.5
"""A figure more than this factor from every known device of its name is warned about. The
parts of one chip's name spread less (Ascend 910B's SKUs 313-376 TFLOP/s: 1.2x; GB read as
GiB: 1.07x); a part with half the memory or half the FLOP/s (2x), or a digit slipped (10x),
is further."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownDevice:
    """One accelerator as its data sheet gives it."""

    name: str
    """As a bundled cluster file names it, else as its maker does."""
    chip: str
    """The chip's token in a device name, lower case (``h100``): the name a file shares."""
    variants: tuple[str, ...] = ()
    """Tokens that tell this part from others of the chip (``pcie``, ``sxm``), as prefixes."""
    memory_gib: float
    """Device memory, GiB."""
    memory_bandwidth_gb_s: float
    """Memory (HBM) bandwidth, GB/s."""
    peak_tflops: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Dense peak by precision; fp32 lists the non-tensor figure and the TF32 one (a run that
    enables TF32 may give either)."""
    scale_up_gb_s: float | None = None
    """Scale-up (NVLink, Infinity Fabric, HCCS) bandwidth per device and direction, GB/s:
    what the innermost network level's ``bandwidth_gb_s`` holds; None where the part's
    links vary (PCIe cards, with a bridge or without)."""
    source: str
    """The data sheet (and the bundled file) the figures come from."""


KNOWN_DEVICES: tuple[KnownDevice, ...] = (
    KnownDevice(name="A100-SXM4-40GB", chip="a100", variants=("sxm",), memory_gib=40.0,
                memory_bandwidth_gb_s=1555,
                peak_tflops={"bf16": (312,), "fp16": (312,), "fp32": (19.5, 156)},
                scale_up_gb_s=300,
                source="NVIDIA A100 data sheet, SXM 40GB (NVLink 600 GB/s, both ways); "
                "dgx-a100-40gb.json"),
    KnownDevice(name="A100-SXM4-80GB", chip="a100", variants=("sxm",), memory_gib=80.0,
                memory_bandwidth_gb_s=2039,
                peak_tflops={"bf16": (312,), "fp16": (312,), "fp32": (19.5, 156)},
                scale_up_gb_s=300,
                source="NVIDIA A100 data sheet, SXM 80GB (NVLink 600 GB/s, both ways); "
                "dgx-a100-80gb.json"),
    KnownDevice(name="A100-PCIe-80GB", chip="a100", variants=("pcie",), memory_gib=80.0,
                memory_bandwidth_gb_s=1935,
                peak_tflops={"bf16": (312,), "fp16": (312,), "fp32": (19.5, 156)},
                source="NVIDIA A100 data sheet, PCIe 80GB"),
    KnownDevice(name="A100-PCIe-40GB", chip="a100", variants=("pcie",), memory_gib=40.0,
                memory_bandwidth_gb_s=1555,
                peak_tflops={"bf16": (312,), "fp16": (312,), "fp32": (19.5, 156)},
                source="NVIDIA A100 data sheet, PCIe 40GB"),
    KnownDevice(name="H100-SXM5-80GB", chip="h100", variants=("sxm",), memory_gib=79.65,
                memory_bandwidth_gb_s=3350,
                peak_tflops={"bf16": (989,), "fp16": (989,), "fp32": (67, 494.7)},
                scale_up_gb_s=450,
                source="NVIDIA H100 data sheet, H100 SXM (NVLink 900 GB/s, both ways); "
                "dgx-h100-80gb.json"),
    KnownDevice(name="H100-PCIe-80GB", chip="h100", variants=("pcie",), memory_gib=80.0,
                memory_bandwidth_gb_s=2000,
                peak_tflops={"bf16": (756,), "fp16": (756,), "fp32": (51, 378)},
                source="NVIDIA H100 data sheet, H100 PCIe (1,513 TFLOPS BF16 with sparsity)"),
    KnownDevice(name="H100-NVL-94GB", chip="h100", variants=("nvl",), memory_gib=94.0,
                memory_bandwidth_gb_s=3900,
                peak_tflops={"bf16": (835,), "fp16": (835,), "fp32": (60, 417)},
                source="NVIDIA H100 data sheet, H100 NVL (1,671 TFLOPS BF16 with sparsity)"),
    KnownDevice(name="H800-SXM5-80GB", chip="h800", memory_gib=79.65,
                memory_bandwidth_gb_s=3350,
                peak_tflops={"bf16": (989,), "fp16": (989,), "fp32": (67, 494.7)},
                scale_up_gb_s=200,
                source="NVIDIA H800: the H100 SXM5's compute and memory, NVLink cut to 400 GB/s "
                "(both ways)"),
    KnownDevice(name="H200-SXM-141GB", chip="h200", variants=("sxm",), memory_gib=140.4,
                memory_bandwidth_gb_s=4800,
                peak_tflops={"bf16": (989,), "fp16": (989,), "fp32": (67, 494.7)},
                scale_up_gb_s=450,
                source="NVIDIA H200 data sheet, H200 SXM (NVLink 900 GB/s, both ways); "
                "dgx-h200.json"),
    KnownDevice(name="H200-NVL-141GB", chip="h200", variants=("nvl",), memory_gib=140.4,
                memory_bandwidth_gb_s=4800,
                peak_tflops={"bf16": (835,), "fp16": (835,), "fp32": (60, 417)},
                source="NVIDIA H200 data sheet, H200 NVL (1,671 TFLOPS BF16 with sparsity)"),
    KnownDevice(name="B200-GB200", chip="b200", variants=("gb200",), memory_gib=186.0,
                memory_bandwidth_gb_s=8000,
                peak_tflops={"bf16": (2500,), "fp16": (2500,), "fp32": (90,)},
                scale_up_gb_s=900,
                source="NVIDIA GB200 NVL72 data sheet (per GPU; NVLink 1.8 TB/s, both ways); "
                "gb200-nvl72.json"),
    KnownDevice(name="B200-HGX", chip="b200", variants=("hgx", "sxm"), memory_gib=180.0,
                memory_bandwidth_gb_s=8000,
                peak_tflops={"bf16": (2250,), "fp16": (2250,), "fp32": (75,)},
                scale_up_gb_s=900,
                source="NVIDIA HGX B200 data sheet, 8 GPUs: 1.44 TB, 64 TB/s, 18 PFLOPS "
                "BF16 with sparsity, 600 TFLOPS FP32, NVLink 1.8 TB/s a GPU (both ways)"),
    KnownDevice(name="MI300X", chip="mi300x", memory_gib=192.0, memory_bandwidth_gb_s=5300,
                peak_tflops={"bf16": (1307.4,), "fp16": (1307.4,), "fp32": (163.4, 81.7)},
                scale_up_gb_s=448,
                source="AMD Instinct MI300X data sheet (fp32: matrix, vector; seven Infinity "
                "Fabric links of 128 GB/s, both ways)"),
    KnownDevice(name="MI325X", chip="mi325x", memory_gib=256.0, memory_bandwidth_gb_s=6000,
                peak_tflops={"bf16": (1307.4,), "fp16": (1307.4,), "fp32": (163.4, 81.7)},
                scale_up_gb_s=448,
                source="AMD Instinct MI325X data sheet (fp32: matrix, vector; seven Infinity "
                "Fabric links of 128 GB/s, both ways)"),
    KnownDevice(name="Ascend-910B", chip="910b", memory_gib=64.0, memory_bandwidth_gb_s=1600,
                peak_tflops={"bf16": (313, 376), "fp16": (313, 376)},
                scale_up_gb_s=196,
                source="secondary reports (no Huawei data sheet found); ascend-910b.json "
                "(its HCCS level)"),
)  # fmt: skip
"""Every accelerator whose name a cluster file's device is matched against."""


def tokens(name: str) -> list[str]:
    """A device name's words, lower case (``"H100-SXM5-80GB"`` -> ``h100, sxm5, 80gb``)."""
    return re.findall(r"[a-z0-9]+", name.lower())


def _is_chip(token: str, chip: str) -> bool:
    # "h100" in "h100", "gb200" (a B200 in a GB200 superchip), "910b3" (an Ascend 910B SKU)
    return token == chip or token.startswith(chip) or token.endswith(chip)


def namesakes(name: str) -> tuple[KnownDevice, ...]:
    """The known devices a device called ``name`` may be: those of its chip, narrowed to the
    parts its name's other words pick (``PCIe``, ``SXM5``) when any does.

    >>> [d.name for d in namesakes("NVIDIA H100 PCIe")]
    ['H100-PCIe-80GB']
    >>> [d.name for d in namesakes("H100")]
    ['H100-SXM5-80GB', 'H100-PCIe-80GB', 'H100-NVL-94GB']
    >>> namesakes("H20")  # another chip, not an H200
    ()
    """
    words = tokens(name)
    same_chip = [d for d in KNOWN_DEVICES if any(_is_chip(w, d.chip) for w in words)]
    picked = [d for d in same_chip if any(w.startswith(v) for w in words for v in d.variants)]
    return tuple(picked or same_chip)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nearest:
    """The known figure closest to a given one (on a log scale)."""

    value: float
    """The known figure, in the unit of the one compared."""
    device: KnownDevice
    """The device it is a figure of."""

    def factor(self, given: float) -> float:
        """How many times ``given`` is above or below this figure (at least 1)."""
        return math.exp(abs(math.log(given / self.value)))


def nearest(given: float, candidates: list[tuple[float, KnownDevice]]) -> Nearest | None:
    """The candidate figure closest to ``given`` by ratio; None when there is none."""
    if not candidates:
        return None
    value, device = min(candidates, key=lambda c: abs(math.log(given / c[0])))
    return Nearest(value=value, device=device)
