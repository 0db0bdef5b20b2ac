"""Inputs of the planner: the model, the training run and the cluster.

Field names follow Megatron-LM's arguments (which users already know) and carry their unit at
this JSON boundary (``memory_gib``, ``bandwidth_gb_s``). Inside the planner every quantity is in
SI units; the ``*_bytes`` / ``*_flops_per_s`` properties do the conversion once, here.

Hugging Face ``config.json`` files are translated by :mod:`planner.hf`; :func:`load_model`
dispatches on the presence of ``model_type``.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import InputError

Precision = Literal["bf16", "fp16", "fp32"]
Activation = Literal["gelu", "swiglu"]
Normalization = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope"]

GIB = 1024**3
GB = 1e9


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MoESpec(_Frozen):
    """Mixture-of-experts feed-forward blocks (Megatron's ``--num-experts`` family)."""

    num_experts: int = Field(gt=0, description="Routed experts per MoE layer.")
    top_k: int = Field(gt=0, description="Routed experts each token is sent to.")
    ffn_hidden_size: int = Field(gt=0, description="FFN width of one routed expert.")
    shared_experts: int = Field(default=0, ge=0, description="Always-active shared experts.")
    shared_ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        description="Total FFN width of all shared experts together "
        "(Megatron's --moe-shared-expert-intermediate-size); default shared_experts x "
        "ffn_hidden_size.",
    )
    first_dense_layers: int = Field(
        default=0, ge=0, description="Leading layers with a dense FFN instead of experts."
    )
    layer_freq: int = Field(
        default=1,
        gt=0,
        description="After the dense layers, every layer_freq-th layer is MoE (1 = all).",
    )
    router_expert_bias: bool = Field(
        default=False,
        description="A learned per-expert bias on the routing scores (DeepSeek-V3's "
        "aux-loss-free balancing; Megatron's --moe-router-enable-expert-bias).",
    )

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) > num_experts ({self.num_experts})")
        return self

    @property
    def shared_ffn(self) -> int:
        """Total FFN width of the shared experts (0 when there are none)."""
        if self.shared_experts == 0:
            return 0
        return self.shared_ffn_hidden_size or self.shared_experts * self.ffn_hidden_size


class MLASpec(_Frozen):
    """DeepSeek's multi-head latent attention (low-rank compressed queries, keys and values)."""

    q_lora_rank: int | None = Field(
        default=None, gt=0, description="Rank of the query compression; null = no compression."
    )
    kv_lora_rank: int = Field(gt=0, description="Rank of the joint key/value compression.")
    qk_nope_head_dim: int = Field(gt=0, description="Per-head query/key dims without RoPE.")
    qk_rope_head_dim: int = Field(gt=0, description="Per-head query/key dims with RoPE.")
    v_head_dim: int = Field(gt=0, description="Per-head value dims.")


class TrainingSpec(_Frozen):
    """The training run's defaults; CLI options override them."""

    seq_length: int = Field(gt=0, description="Tokens per sample.")
    global_batch_size: int = Field(gt=0, description="Samples per optimizer step.")
    precision: Precision = Field(default="bf16", description="Mixed-precision compute type.")


class ModelSpec(_Frozen):
    """A decoder-only transformer, in Megatron-LM's vocabulary."""

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_query_groups: int | None = Field(
        default=None, gt=0, description="Key/value heads (GQA); default num_attention_heads."
    )
    kv_channels: int | None = Field(
        default=None, gt=0, description="Per-head dims; default hidden_size / heads."
    )
    ffn_hidden_size: int | None = Field(
        default=None, gt=0, description="Dense FFN width; default 4 x hidden_size."
    )
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    activation: Activation = "gelu"
    normalization: Normalization = "layernorm"
    position_embedding: PositionEmbedding = "learned"
    tie_word_embeddings: bool = True
    bias: bool = Field(default=True, description="Biases on every linear layer.")
    qkv_bias: bool | None = Field(
        default=None, description="Biases on the QKV projection only; default = bias."
    )
    qk_layernorm: bool = Field(default=False, description="Per-head norm on queries and keys.")
    hidden_dropout: float = Field(
        default=0.0, ge=0, lt=1, description="Dropout after attention and MLP blocks."
    )
    attention_dropout: float = Field(
        default=0.0, ge=0, lt=1, description="Dropout on the attention probabilities."
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

    max_fraction: float = Field(default=1.0, gt=0, le=1)
    half_saturation_gflop: float = Field(default=0.0, ge=0)
    source: str | None = Field(default=None, description="How these values were obtained.")


class DeviceEfficiency(_Frozen):
    """Calibration of one device: how far real kernels fall short of the data sheet."""

    gemm: GemmEfficiency = GemmEfficiency()
    memory_bound_fraction: float = Field(
        default=1.0, gt=0, le=1, description="Achieved fraction of HBM bandwidth."
    )
    kernel_launch_us: float = Field(default=0.0, ge=0, description="Fixed cost per kernel.")
    source: str | None = Field(default=None, description="How these values were obtained.")


class DeviceSpec(_Frozen):
    """One accelerator."""

    name: str
    memory_gib: float = Field(gt=0)
    memory_bandwidth_gb_s: float = Field(gt=0)
    peak_tflops: dict[Precision, float] = Field(description="Dense peak by compute type.")
    reserved_memory_gib: float = Field(
        default=0.0,
        ge=0,
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

    bandwidth_fraction: float = Field(
        default=1.0, gt=0, le=1, description="Achieved bus bandwidth / nominal, large messages."
    )
    source: str | None = None


class NetworkLevel(_Frozen):
    """One level of the network, from the innermost (NVLink in a node) outwards."""

    name: str
    domain_devices: int = Field(gt=0, description="Devices that share this level's domain.")
    bandwidth_gb_s: float = Field(gt=0, description="Per device, per direction.")
    latency_us: float = Field(ge=0)
    efficiency: LinkEfficiency = LinkEfficiency()

    @property
    def bandwidth_bytes_s(self) -> float:
        """Achieved per-device bandwidth in bytes/s."""
        return self.bandwidth_gb_s * GB * self.efficiency.bandwidth_fraction

    @property
    def latency_s(self) -> float:
        """Per-message latency in seconds."""
        return self.latency_us * 1e-6


class ClusterSpec(_Frozen):
    """A homogeneous cluster: nodes of identical devices on a multi-level network."""

    name: str
    num_nodes: int = Field(gt=0)
    devices_per_node: int = Field(gt=0)
    device: DeviceSpec
    network: tuple[NetworkLevel, ...] = Field(min_length=1)
    notes: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        domains = [level.domain_devices for level in self.network]
        if domains[0] != self.devices_per_node:
            raise ValueError(
                f"network[0] ({self.network[0].name}) must be the node level: domain_devices "
                f"{domains[0]} != devices_per_node {self.devices_per_node}"
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

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        """The same cluster type at another size."""
        if num_nodes <= 0:
            raise InputError(f"--nodes must be positive, got {num_nodes}")
        return self.model_copy(update={"num_nodes": num_nodes})


def read_text(path: Path) -> str:
    """A file's text; an unreadable file raises :class:`InputError`."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None


def read_json(path: Path) -> Any:
    """Parse a JSON file; unreadable or malformed files raise :class:`InputError`."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None


def describe_validation_error(path: Path | str, exc: ValidationError) -> str:
    """One line naming the file, the first failing field, the problem and what is allowed."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        msg = f"got {err.get('input')!r}, allowed: {expected}"
    elif err["type"] == "missing":
        msg = "required field is missing"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{path}: {field}: {msg}{more}"


def model_from_dict(data: Any, *, source: str = "<model>") -> ModelSpec:
    """Build a :class:`ModelSpec` from our native dict or a Hugging Face config dict."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if "model_type" in data:
        from planner.hf import model_from_hf_config  # HF configs are translated, then checked

        return model_from_hf_config(data, source=source)
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc)) from None


def load_model(path: str | Path) -> ModelSpec:
    """Read a model from our ``model.json`` or a Hugging Face ``config.json``.

    >>> from planner import load_model
    >>> load_model("instances/models/gpt3-175b.json").num_layers  # doctest: +SKIP
    96
    """
    path = Path(path)
    return model_from_dict(read_json(path), source=str(path))


def load_cluster(path: str | Path, nodes: int | None = None) -> ClusterSpec:
    """Read a ``cluster.json``; ``nodes`` overrides ``num_nodes``."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:
        cluster = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(path, exc)) from None
    return cluster if nodes is None else cluster.with_nodes(nodes)


def json_schema(kind: Literal["model", "cluster"]) -> dict[str, Any]:
    """The JSON Schema of our ``model.json`` or ``cluster.json``."""
    return (ModelSpec if kind == "model" else ClusterSpec).model_json_schema()
