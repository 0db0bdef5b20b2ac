"""Inputs of the planner: the model, the training run and the cluster.

Field names follow Megatron-LM's arguments (which users already know) and carry their unit at
this JSON boundary (``memory_gib``, ``bandwidth_gb_s``). Inside the planner every quantity is in
SI units; the ``*_bytes`` / ``*_flops_per_s`` properties do the conversion once, here.

Files and options are read into these specs by :mod:`planner.spec.reading` (Hugging Face
``config.json`` files through :mod:`planner.spec.hf`); the fields' bounds are
:mod:`planner.spec.limits`, their types :mod:`planner.spec.fields`, and a model's experts,
latent attention and RoPE scaling :mod:`planner.spec.layers`.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.errors import InputError
from planner.spec import limits as lim
from planner.spec.attention import SlidingWindowSpec
from planner.spec.fields import Float, Int, Name
from planner.spec.fields import Frozen as _Frozen
from planner.spec.layers import MLASpec, MoESpec, RopeScaling
from planner.vocabulary import GB, GIB, ParallelismKind, Precision

Activation = Literal["gelu", "swiglu", "geglu"]
Normalization = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope"]


class TrainingSpec(_Frozen):
    """The training run's defaults; CLI options override them."""

    seq_length: Int = Field(gt=0, le=lim.MAX_SEQ_LENGTH, description="Tokens per sample.")
    global_batch_size: Int = Field(
        gt=0, le=lim.MAX_GLOBAL_BATCH_SIZE, description="Samples per optimizer step."
    )
    precision: Precision = Field(default="bf16", description="Mixed-precision compute type.")


class ModelSpec(_Frozen):
    """A decoder-only transformer, in Megatron-LM's vocabulary."""

    name: Name
    num_layers: Int = Field(gt=0, le=lim.MAX_LAYERS)
    hidden_size: Int = Field(gt=0, le=lim.MAX_HIDDEN_SIZE)
    num_attention_heads: Int = Field(gt=0, le=lim.MAX_ATTENTION_HEADS)
    num_query_groups: Int | None = Field(
        default=None,
        gt=0,
        le=lim.MAX_ATTENTION_HEADS,
        description="Key/value heads (GQA); default num_attention_heads.",
    )
    kv_channels: Int | None = Field(
        default=None,
        gt=0,
        le=lim.MAX_HEAD_DIM,
        description="Per-head dims; default hidden_size / heads.",
    )
    ffn_hidden_size: Int | None = Field(
        default=None,
        gt=0,
        le=lim.MAX_FFN_HIDDEN_SIZE,
        description="Dense FFN width; default 4 x hidden_size.",
    )
    vocab_size: Int = Field(gt=0, le=lim.MAX_VOCAB_SIZE)
    max_position_embeddings: Int = Field(gt=0, le=lim.MAX_SEQ_LENGTH)
    activation: Activation = "gelu"
    normalization: Normalization = "layernorm"
    position_embedding: PositionEmbedding = "learned"
    tie_word_embeddings: bool = True
    bias: bool = Field(default=True, description="Biases on every linear layer.")
    qkv_bias: bool | None = Field(
        default=None, description="Biases on the QKV projection only; default = bias."
    )
    qk_layernorm: bool = Field(default=False, description="Per-head norm on queries and keys.")
    # Gemma 2/3 and Phi-3 (planner.spec.attention): local layers, soft-capping, sandwich norms.
    sliding_window: SlidingWindowSpec | None = Field(
        default=None, description="Local attention layers; null = every layer is global."
    )
    attn_logit_softcapping: Float | None = Field(
        default=None, gt=0, description="Attention scores soft-capped as c tanh(x / c) (Gemma 2)."
    )
    final_logit_softcapping: Float | None = Field(
        default=None, gt=0, description="Output logits soft-capped as c tanh(x / c) (Gemma 2)."
    )
    post_norms: bool = Field(
        default=False, description="A second norm on each block's output before the residual "
        "add (Gemma 2/3's post-attention and post-feedforward norms).",
    )  # fmt: skip
    scale_embeddings: bool = Field(
        default=False, description="Embeddings multiplied by sqrt(hidden_size) (Gemma)."
    )
    hidden_dropout: Float = Field(
        default=0.0, ge=0, lt=1, description="Dropout after attention and MLP blocks."
    )
    attention_dropout: Float = Field(
        default=0.0, ge=0, lt=1, description="Dropout on the attention probabilities."
    )
    rotary_base: Float = Field(
        default=10000.0, gt=0, le=lim.MAX_ROTARY_BASE,
        description="RoPE's base period (HF rope_theta; Megatron's --rotary-base).",
    )
    rope_scaling: RopeScaling | None = Field(
        default=None, description="RoPE's long-context scaling (HF rope_scaling); null: none."
    )
    norm_epsilon: Float = Field(
        default=1e-5, gt=0, lt=1,
        description="Epsilon of every LayerNorm/RMSNorm (HF rms_norm_eps or layer_norm_epsilon; "
        "Megatron's --norm-epsilon).",
    )
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    training: TrainingSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        heads, groups = self.num_attention_heads, self.query_groups
        if heads % groups:
            raise ValueError(
                f"num_attention_heads ({heads}) is not divisible by num_query_groups ({groups})"
            )
        if self.kv_channels is None and self.hidden_size % heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({heads}); set kv_channels"
            )
        if self.moe is not None and self.sliding_window is not None:
            raise ValueError("sliding_window with moe is not supported: a local and a global "
                             "MoE layer would be one layer kind")
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.first_dense_layers ({self.moe.first_dense_layers}) > num_layers "
                f"({self.num_layers})"
            )
        return self

    @property
    def query_groups(self) -> int:
        """Key/value heads."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        """Per-head dims of queries, keys and values (non-MLA)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def ffn(self) -> int:
        """Dense FFN width."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (SwiGLU, GeGLU): its up projection is two matrices."""
        return self.activation in ("swiglu", "geglu")

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the QKV projection has a bias."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) has routed experts."""
        if self.moe is None or index < self.moe.first_dense_layers:
            return False
        return (index - self.moe.first_dense_layers) % self.moe.layer_freq == 0


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
    source: str | None = Field(default=None, description="How these values were obtained.")


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
    overlap_contention: Float = Field(
        default=0.0, ge=0, le=1, description="Fraction of the time of data-parallel "
        "communication hidden behind compute that the compute still loses (NCCL's kernels "
        "share the SMs and HBM with it)."
    )
    validation: tuple[ValidationBand, ...] = Field(
        default=(), description="Residuals of `planner calibrate` by kind of run; empty for a "
        "device no published run validates."
    )
    memory_bound_fraction: Float = Field(
        default=1.0, gt=0, le=1, description="Achieved fraction of HBM bandwidth."
    )
    kernel_launch_us: Float = Field(
        default=0.0, ge=0, le=lim.MAX_LATENCY_US, description="Fixed cost per kernel."
    )
    source: str | None = Field(default=None, description="How these values were obtained.")


class DeviceSpec(_Frozen):
    """One accelerator."""

    name: Name
    memory_gib: Float = Field(gt=0, le=lim.MAX_DEVICE_MEMORY_GIB)
    memory_bandwidth_gb_s: Float = Field(gt=0, le=lim.MAX_BANDWIDTH_GB_S)
    peak_tflops: dict[Precision, Annotated[Float, Field(gt=0, le=lim.MAX_PEAK_TFLOPS)]] = Field(
        description="Dense peak by compute type."
    )
    reserved_memory_gib: Float = Field(
        default=0.0,
        ge=0,
        le=lim.MAX_DEVICE_MEMORY_GIB,
        description="Memory the framework holds outside the model (CUDA context, "
        "communication buffers, allocator fragmentation).",
    )
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
                f"device {self.name} has no peak_tflops for {precision!r}; "
                f"it has {sorted(self.peak_tflops)}"
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
        if domains[0] % self.devices_per_node:
            raise ValueError(
                f"network[0] ({self.network[0].name}) is the scale-up domain and must hold "
                f"whole nodes: domain_devices {domains[0]} is not a multiple of "
                f"devices_per_node {self.devices_per_node}"
            )
        for inner, outer in pairwise(domains):
            if outer <= inner or outer % inner:
                raise ValueError(
                    f"network levels must grow outwards by whole multiples: {domains}"
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

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        """The same cluster type at another size (``--nodes``)."""
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes <= 0:
            raise InputError(f"--nodes must be a positive integer, got {num_nodes!r}")
        too_many = _too_many_devices(num_nodes, self.devices_per_node)
        if too_many:
            raise InputError(f"--nodes {num_nodes}: {too_many}")
        return self.model_copy(update={"num_nodes": num_nodes})


def _too_many_devices(num_nodes: int, devices_per_node: int) -> str | None:
    """The message for a cluster above :data:`~planner.spec.limits.MAX_DEVICES`, else None."""
    devices = num_nodes * devices_per_node
    if devices <= lim.MAX_DEVICES:
        return None
    return (
        f"num_nodes({num_nodes}) x devices_per_node({devices_per_node}) = {devices} devices is "
        f"above the limit of {lim.MAX_DEVICES} ({lim.reason('num_devices')})"
    )
