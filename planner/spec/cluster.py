"""The cluster: its devices with their data-sheet figures and calibrated efficiencies, its
network levels and its hosts.

Field names carry their unit at this JSON boundary (``memory_gib``, ``bandwidth_gb_s``); the
``*_bytes`` / ``*_flops_per_s`` properties convert to SI units once, here. Re-exported from
:mod:`planner.spec`, which holds the model and the training run; a device's figures are held
to the known accelerators by :mod:`planner.spec.physics`.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Any

from pydantic import Field, model_validator

from planner.errors import InputError
from planner.spec import limits as lim
from planner.spec.evidence import ValidatedRun
from planner.spec.fields import Float, Int, Name
from planner.spec.fields import Frozen as _Frozen
from planner.spec.profile import ProfileFactors
from planner.vocabulary import GB, GIB, AttentionKernel, ParallelismKind, Platform, Precision


class GemmEfficiency(_Frozen):
    """Achieved fraction of peak FLOP/s for a matrix multiply of a given size.

    ``fraction(f) = max_fraction * f / (f + half_saturation_gflop * 1e9)`` for a GEMM of ``f``
    FLOPs on one device: small GEMMs leave the device idle, large ones approach
    ``max_fraction``. The defaults (1.0, 0) mean "uncalibrated: the roofline peak".
    """

    max_fraction: Float = Field(default=1.0, gt=0, le=1)
    half_saturation_gflop: Float = Field(default=0.0, ge=0, le=lim.MAX_HALF_SATURATION_GFLOP)
    source: str | None = Field(default=None, description="How these values were obtained.")


class AttentionEfficiency(_Frozen):
    """Achieved fraction of peak FLOP/s for a fused attention kernel (FlashAttention's).

    ``fraction(s, d) = max_fraction * s / (s + half_saturation_tokens) * d / (d +
    half_saturation_head_dim)`` for a kernel whose queries each attend to ``s`` keys on
    average (half the sequence under a causal mask) with heads of ``d`` dims: short key blocks
    leave the kernel's tiles and SMs partly idle, and the softmax's exponentials and
    rescaling, which run on units far slower than the tensor cores, cost a share that shrinks
    as the head dim grows (Dao, 2023, FlashAttention-2, Sec. 3.1 and 4.1). Absent, fused
    attention runs at the GEMM curve's efficiency, which overstates it.
    """

    max_fraction: Float = Field(gt=0, le=1, description="The long-sequence limit.")
    half_saturation_tokens: Float = Field(
        ge=0, le=lim.MAX_SEQ_LENGTH, description="Keys per query at which half the limit is "
        "reached."
    )
    half_saturation_head_dim: Float = Field(
        default=0.0, ge=0, le=lim.MAX_HEAD_DIM, description="Head dim at which half the limit "
        "is reached: the softmax's work per score is fixed while the matmuls' grows with the "
        "head dim, so small heads run further from peak (0: no such effect)."
    )
    backward_fraction: Float = Field(
        default=1.0, gt=0, le=2, description="The backward's rate as a share of the "
        "forward's: it recomputes the scores and writes three gradients (1: the same rate)."
    )
    forward_call_us: Float = Field(
        default=0.0, ge=0, le=lim.MAX_LATENCY_US, description="Fixed cost of a forward call "
        "beyond the kernel launch: what dominates at short sequences."
    )
    backward_call_us: Float = Field(
        default=0.0, ge=0, le=lim.MAX_LATENCY_US, description="Fixed cost of a backward call "
        "beyond its launches (its pre- and post-processing kernels)."
    )
    kernel: AttentionKernel | None = Field(
        default=None, description="The kernel the curve was measured on "
        "(planner.vocabulary.AttentionKernel): a property of the software, not the chip."
    )
    source: str | None = Field(default=None, description="How these values were obtained.")


class GroupedGemmEfficiency(_Frozen):
    """Achieved fraction of peak FLOP/s for a rank's routed experts run as one grouped GEMM
    (``torch._grouped_mm`` in torchtitan; Megatron-Core's ``TEGroupedMLP`` under
    ``--moe-grouped-gemm`` is priced on it too, though Transformer Engine runs it as one
    cuBLAS GEMM per expert over several streams).

    ``fraction(t, k) = max_fraction * t / (t + half_saturation_tokens) * k / (k +
    half_saturation_k)`` for experts of ``t`` tokens each and a reduction dim of ``k``: each
    expert's GEMM is its own rows of tiles, part empty when it has few tokens, and a short
    reduction loads each tile's operands for little work; each call costs ``call_us`` on top
    (the group's offsets and tile schedule set up before its tiles run), which is what
    dominates at a few tokens per expert. Absent, the grouped kernel runs at the GEMM curve's
    efficiency for all the local experts' FLOPs at once.
    """

    max_fraction: Float = Field(gt=0, le=1, description="The limit for many tokens and a long "
                                "reduction.")
    half_saturation_tokens: Float = Field(ge=0, le=lim.MAX_SEQ_LENGTH, description="Tokens "
                                          "per expert at which half the limit is reached.")
    half_saturation_k: Float = Field(ge=0, le=lim.MAX_SEQ_LENGTH, description="Reduction dim "
                                     "at which half the limit is reached.")
    call_us: Float = Field(default=0.0, ge=0, le=lim.MAX_LATENCY_US, description="Fixed cost "
                           "of a grouped call beyond the kernel launch.")
    source: str | None = Field(default=None, description="How these values were obtained.")


class Fp8Efficiency(_Frozen):
    """How much faster the device runs a GEMM on FP8 operands than on 16-bit ones (Transformer
    Engine's FP8 linears, the ``megatron-te-fp8`` stack: :mod:`planner.graph.fp8`). Absent,
    the device is not priced in FP8."""

    gemm_speedup: Float = Field(gt=0, le=lim.MAX_FP8_SPEEDUP, description="The 16-bit GEMM's "
                                "time over the FP8 GEMM's, for the same shapes.")  # fmt: skip
    source: str | None = Field(default=None, description="How this value was obtained.")


class ValidationBand(_Frozen):
    """How far predictions missed the published runs of one kind on this device: what the
    error band printed beside a step time rests on."""

    parallelism: ParallelismKind = Field(
        description="The runs' kind (planner.vocabulary.ParallelismKind): ZeRO-3/FSDP with no "
        "model parallelism; plain data parallelism (ZeRO 0-2); tensor or pipeline parallelism; "
        "context parallelism; expert parallelism."
    )
    runs: Int = Field(gt=0, description="How many runs the band rests on.")
    p80_abs_error: Float = Field(
        ge=0, description="80th percentile of |predicted / measured - 1| over those runs."
    )
    median_error: Float = Field(
        ge=-1, description="Median signed error (negative: predicted too fast)."
    )
    families: tuple[str, ...] = Field(description="The framework families of those runs.")


class DeviceEfficiency(_Frozen):
    """Calibration of one device: how far real kernels fall short of the data sheet."""

    gemm: GemmEfficiency = GemmEfficiency()
    attention: AttentionEfficiency | None = None
    grouped_gemm: GroupedGemmEfficiency | None = None
    fp8: Fp8Efficiency | None = None
    overlap_contention: Float = Field(
        default=0.0, ge=0, le=1, description="Fraction of the time of data-parallel "
        "communication hidden behind compute that the compute still loses (NCCL's kernels "
        "share the SMs and HBM with it)."
    )
    validation: tuple[ValidationBand, ...] = Field(
        default=(), description="Residuals by kind of run, as `planner calibrate` wrote them "
        "before it kept each run (`evidence`): the band of a file without evidence."
    )
    evidence: tuple[ValidatedRun, ...] = Field(
        default=(), description="Every validated run on this device, its regime and its error "
        "(`planner validate --write`, `planner calibrate --write`): what error bands rest on; "
        "empty for a device no run validates."
    )
    profile: ProfileFactors | None = Field(
        default=None, description="Real layers measured on this device (`planner profile`, "
        "set beside the cluster by `--profile`): each as its measured over its priced forward, "
        "backward and kept bytes, by layer kind, shard and microbatch, for one model and stack."
    )
    memory_bound_fraction: Float = Field(
        default=1.0, gt=0, le=1, description="Achieved fraction of HBM bandwidth."
    )
    kernel_launch_us: Float = Field(
        default=0.0, ge=0, le=lim.MAX_LATENCY_US, description="Fixed cost per kernel."
    )
    source: str | None = Field(default=None, description="How these values were obtained.")


ALLOCATOR_FRAGMENTATION = 0.08
"""What PyTorch's caching allocator reserves beyond the peak it allocates, as a share of that
peak: 6.6-9.2 % (median 7.9 %) over the five one-GPU H100 training steps of
``../shared/validation/h100/runs_one_gpu.json`` (``max_memory_reserved`` over
``max_memory_allocated``), rounded up. ``expandable_segments:True`` in
``PYTORCH_CUDA_ALLOC_CONF`` (one growing segment per stream, no slivers left between segments)
lowers it; a cluster file says so in ``device.allocator_fragmentation``."""


class DeviceSpec(_Frozen):
    """One accelerator."""

    name: Name
    memory_gib: Float = Field(gt=0, le=lim.MAX_DEVICE_MEMORY_GIB)
    memory_bandwidth_gb_s: Float = Field(gt=0, le=lim.MAX_BANDWIDTH_GB_S)
    peak_tflops: dict[Precision, Annotated[Float, Field(gt=0, le=lim.MAX_PEAK_TFLOPS)]] = Field(
        description="Dense peak by compute type."
    )
    platform: Platform | None = Field(
        default=None, description="The software its kernels run through: cuda (NVIDIA) or "
        "ascend (CANN, torch_npu). A framework that runs on one only is refused on the "
        "other (MindSpeed needs Ascend; Megatron-LM's Transformer Engine, CUDA). None: not "
        "said, and not checked.",
    )
    reserved_memory_gib: Float = Field(
        default=0.0,
        ge=0,
        le=lim.MAX_DEVICE_MEMORY_GIB,
        description="Memory outside the framework's allocator that no tensor uses: the CUDA "
        "context and driver. NCCL's buffers and the allocator's fragmentation are priced per "
        "plan on top.",
    )
    allocator_fragmentation: Float = Field(
        default=ALLOCATOR_FRAGMENTATION, ge=0, le=1,
        description="What the caching allocator reserves beyond the peak it allocates, as a "
        "share of that peak (default 0.08, measured on one H100; lower with "
        "expandable_segments).",
    )  # fmt: skip
    compute_units: Int | None = Field(
        default=None, gt=0, le=lim.MAX_COMPUTE_UNITS,
        description="Streaming multiprocessors (or compute units) that run kernels side by "
        "side: what a communication kernel that holds some of them leaves the compute beside "
        "it (DeepEP's 20). None: not known, and not priced.",
    )  # fmt: skip
    efficiency: DeviceEfficiency = DeviceEfficiency()

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes."""
        return self.memory_gib * GIB

    @property
    def memory_bandwidth_bytes_s(self) -> float:
        """HBM bandwidth in bytes/s."""
        return self.memory_bandwidth_gb_s * GB

    def peak_flops_per_s(self, precision: Precision) -> float:
        """Dense peak FLOP/s for ``precision``."""
        if precision not in self.peak_tflops:
            raise InputError(
                f"device {self.name} has no peak_tflops for {precision!r}; it has "
                f"{', '.join(sorted(self.peak_tflops))}: add device.peak_tflops.{precision} to "
                f"the cluster file, or train in {' or '.join(sorted(self.peak_tflops))} "
                f"(--precision)"
            )
        return self.peak_tflops[precision] * 1e12


class LinkEfficiency(_Frozen):
    """Calibration of one network level."""

    bandwidth_fraction: Float = Field(
        default=1.0, gt=0, le=1, description="Achieved bus bandwidth / nominal, large messages."
    )
    source: str | None = None


class NetworkLevel(_Frozen):
    """One level of the network, from the innermost (NVLink in a node) outwards."""

    name: Name
    domain_devices: Int = Field(
        gt=0, le=lim.MAX_DEVICES, description="Devices that share this level's domain."
    )
    bandwidth_gb_s: Float = Field(
        gt=0, le=lim.MAX_BANDWIDTH_GB_S, description="Per device, per direction."
    )
    latency_us: Float = Field(ge=0, le=lim.MAX_LATENCY_US)
    oversubscription: Float = Field(
        default=1.0, ge=1, le=lim.MAX_OVERSUBSCRIPTION,
        description="Downlink over uplink bandwidth of this level's switches: traffic that "
        "crosses the level with every device sending at once gets bandwidth_gb_s / this "
        "(1: non-blocking).",
    )
    efficiency: LinkEfficiency = LinkEfficiency()

    @property
    def bandwidth_bytes_s(self) -> float:
        """Achieved per-device bandwidth in bytes/s: nominal, times the measured fraction,
        over the oversubscription (collectives have every device sending at once)."""
        return (self.bandwidth_gb_s * GB * self.efficiency.bandwidth_fraction
                / self.oversubscription)  # fmt: skip

    @property
    def latency_s(self) -> float:
        """Per-message latency in seconds."""
        return self.latency_us * 1e-6


class HostSpec(_Frozen):
    """A node's host side: its memory, the link from each device to it, and the bandwidth of
    the memory the CPU's Adam step streams through (what an offload is priced with)."""

    memory_gib: Float = Field(
        gt=0, le=lim.MAX_HOST_MEMORY_GIB, description="Host (CPU) memory of one node."
    )
    link_bandwidth_gb_s: Float = Field(
        gt=0, le=lim.MAX_BANDWIDTH_GB_S, description="Device to host bandwidth, per device, "
        "per direction, with every device of the node copying at once (PCIe 4.0 x16: 31.5; "
        "PCIe 5.0 x16: 63; NVLink-C2C: 450 per Grace CPU).",
    )  # fmt: skip
    memory_bandwidth_gb_s: Float = Field(
        gt=0, le=lim.MAX_BANDWIDTH_GB_S, description="Host memory bandwidth of one node (all "
        "its CPUs' channels): the CPU's Adam step is memory-bound, as on the device.",
    )  # fmt: skip
    source: str | None = Field(default=None, description="How these values were obtained.")

    @property
    def memory_bytes(self) -> float:
        """Host memory of one node in bytes."""
        return self.memory_gib * GIB

    @property
    def link_bytes_s(self) -> float:
        """Device to host bandwidth per device and direction, bytes/s."""
        return self.link_bandwidth_gb_s * GB

    @property
    def memory_bandwidth_bytes_s(self) -> float:
        """Host memory bandwidth of one node, bytes/s."""
        return self.memory_bandwidth_gb_s * GB


class ClusterSpec(_Frozen):
    """A homogeneous cluster: nodes of identical devices on a multi-level network."""

    name: Name
    num_nodes: Int = Field(gt=0, le=lim.MAX_DEVICES)
    devices_per_node: Int = Field(gt=0, le=lim.MAX_DEVICES_PER_NODE)
    device: DeviceSpec
    network: tuple[NetworkLevel, ...] = Field(min_length=1)
    host: HostSpec | None = Field(
        default=None, description="Each node's host memory and links (needed only to price "
        "an offload).",
    )  # fmt: skip
    notes: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        too_many = _too_many_devices(self.num_nodes, self.devices_per_node)
        if too_many:
            raise ValueError(too_many)
        domains = [level.domain_devices for level in self.network]
        # outermost first: shrinking levels that end at a node's size (not a scale-up domain
        # wider than the fabric beside it, a co-design sweep's slip, named below)
        if len(domains) > 1 and domains == sorted(set(domains), reverse=True) \
                and domains[-1] <= lim.MAX_DEVICES_PER_NODE:
            raise ValueError(f"network levels go innermost first (the scale-up domain, then "
                             f"outwards): domain_devices {domains} list them outermost first; "
                             f"reverse the levels' order")  # fmt: skip
        if domains[0] % self.devices_per_node:
            raise ValueError(
                f"network[0] ({self.network[0].name}) is the scale-up domain and must hold "
                f"whole nodes: domain_devices {domains[0]} is not a multiple of "
                f"devices_per_node {self.devices_per_node}"
            )
        for i, (inner, outer) in enumerate(pairwise(domains)):
            if outer <= inner or outer % inner:
                # the usual slip: a wider scale-up domain beside the file's outer level
                fit = max(2, -(-outer // inner)) * inner  # rounded up: it must hold them
                what = "larger than" if outer <= inner else "a whole multiple of"
                raise ValueError(
                    f"network levels must grow outwards by whole multiples: {domains}: "
                    f"network[{i + 1}].domain_devices {outer} is not {what} "
                    f"network[{i}]'s {inner} (set it to a multiple such as {fit})"
                )
        return self

    @property
    def num_devices(self) -> int:
        """Devices in the cluster."""
        return self.num_nodes * self.devices_per_node

    @property
    def scale_up_devices(self) -> int:
        """Devices of one domain of the innermost, fastest level: a node of 8 GPUs on NVLink,
        or a rack of 72 (GB200 NVL72) whose trays of 4 share one NVLink domain."""
        return self.network[0].domain_devices

    def host_for(self, what: str) -> HostSpec:
        """The host block, or an :class:`InputError` naming the missing field when ``what``
        (an offload) needs it."""
        if self.host is None:
            raise InputError(f"cluster {self.name}: {what} needs the cluster's host figures: "
                             f"field 'host' (memory_gib, link_bandwidth_gb_s, "
                             f"memory_bandwidth_gb_s) is missing")  # fmt: skip
        return self.host

    def priced_json(self) -> str:
        """The cluster as JSON without what the cost model never reads
        (:data:`UNPRICED`): the key of what is computed from it once."""
        return self.model_dump_json(exclude=UNPRICED)

    def priced_dump(self) -> dict[str, Any]:
        """:meth:`priced_json`'s content as JSON types: what a plan's hash of its cluster
        covers (:func:`planner.plan.inputs.input_hash`)."""
        return self.model_dump(mode="json", exclude=UNPRICED)

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        """The same cluster type at another size (``--nodes``)."""
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes <= 0:
            raise InputError(f"--nodes must be a positive integer, got {num_nodes!r}")
        too_many = _too_many_devices(num_nodes, self.devices_per_node)
        if too_many:
            raise InputError(f"--nodes {num_nodes}: {too_many}")
        return self.model_copy(update={"num_nodes": num_nodes})


UNPRICED: dict[str, Any] = {"device": {"efficiency": {"evidence", "validation"},
                                        "platform": True}}
"""What no price reads: the validated runs and bands a device's error bands rest on, and its
platform (which frameworks launch on it: checked on its own). Keeping another run (``planner
validate --write``), or saying the platform, changes neither a layer's price nor which
cluster a plan was made for."""


def _too_many_devices(num_nodes: int, devices_per_node: int) -> str | None:
    """The message for a cluster above :data:`~planner.spec.limits.MAX_DEVICES`, else None."""
    devices = num_nodes * devices_per_node
    if devices <= lim.MAX_DEVICES:
        return None
    return (
        f"num_nodes({num_nodes}) x devices_per_node({devices_per_node}) = {devices} devices is "
        f"above the limit of {lim.MAX_DEVICES} ({lim.reason('num_devices')})"
    )
