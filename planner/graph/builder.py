"""The builder the lowering (:mod:`planner.graph.lower`) adds one layer's operators with: the
norms, projections and residual adds every layer is made of, each keeping for the backward what
its stack keeps (:mod:`planner.graph.stacks`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.graph import unfused
from planner.graph.fp8 import quantization, runs_fp8
from planner.graph.ops import Op, OpKind, Tensor, Unfused
from planner.graph.stacks import (
    AUTOCAST_STACKS,
    FP32_BYTES,
    SEPARATE_PROJECTION_STACKS,
    UPCAST_NORM_STACKS,
)
from planner.spec import ModelSpec
from planner.vocabulary import Precision, Stack

ACTIVATION_BYTES: dict[Precision, float] = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0}
MASK_BYTES = 1.0  # dropout masks are stored as bytes
LOSS_BYTES = 4.0  # fp32: the router's softmax over the experts, the loss per token


@dataclass(slots=True, kw_only=True)
class LayerBuilder:
    """Collects the ops of one layer and the edges into them."""

    model: ModelSpec
    """The model being lowered."""
    batch: int
    """Sequences per microbatch: the size of every activation's ``batch`` dim."""
    seq: int
    """Tokens per sequence: the size of every activation's ``seq`` dim."""
    act_bytes: float
    """Bytes per activation and weight element at the training precision
    (:data:`ACTIVATION_BYTES`)."""
    layer: int
    """Index of the layer being built (0 embedding, 1..L decoder layers, L + 1 head)."""
    layer_kind: str
    """Its kind: ``embedding``, ``dense``, ``local``, ``moe`` or ``head``."""
    stack: Stack = "megatron-te"
    """The software that runs the layer: what each op keeps for the backward."""
    copies_layer: int | None = None
    """The decoder layer (1-based) whose block this builder adds in another layer, a
    multi-token-prediction module's transformer layer in the head: its kind decides the block's
    MLP or experts, attention window and FP8. None: the builder's own layer."""
    prefix: str = ""
    """What the names of a head's block start with (``mtp1``), apart from the head's own."""
    ops: list[tuple[Op, tuple[str, ...]]] = field(default_factory=list)
    """The ops added so far, in order, each with the names of the ops feeding it (the graph's edges
    into it)."""

    def act(self, *dims: tuple[str, int]) -> Tensor:
        """An activation of shape (batch, seq, *dims)."""
        return Tensor((("batch", self.batch), ("seq", self.seq), *dims), self.act_bytes)

    def hidden(self) -> Tensor:
        """The residual stream, (batch, seq, hidden)."""
        return self.act(("hidden", self.model.hidden_size))

    @property
    def autocast(self) -> bool:
        """The layer runs under ``torch.autocast`` with fp32 weights (:data:`AUTOCAST_STACKS`)
        at a 16-bit precision; in fp32 nothing is cast, so no copies are kept."""
        return self.stack in AUTOCAST_STACKS and self.act_bytes < FP32_BYTES

    def fp32(self, tensor: Tensor) -> Tensor:
        """``tensor`` held in fp32."""
        return Tensor(tensor.dims, FP32_BYTES)

    def mask(self, tensor: Tensor) -> Tensor:
        """A dropout mask for ``tensor``."""
        return Tensor(tensor.dims, MASK_BYTES)

    @property
    def block(self) -> int:
        """The decoder layer whose block the builder adds (:attr:`copies_layer`, else its own)."""
        return self.copies_layer or self.layer

    @property
    def block_kind(self) -> str:
        """The kind of that block: the layer's own kind, or the copied layer's."""
        if self.copies_layer is None:
            return self.layer_kind
        return decoder_layer_kind(self.model, self.copies_layer)

    def name(self, op: str) -> str:
        """The graph-wide name of ``op`` in this layer."""
        if self.prefix:
            return f"{self.prefix}.{op}"
        if self.layer_kind in ("embedding", "head"):
            return op
        return f"layer{self.layer}.{op}"

    def add(self, op: str, kind: OpKind, sources: tuple[str, ...], **fields: object) -> str:
        """Add op ``op`` fed by the ops named ``sources``; returns its graph name."""
        # Heads split by whole key/value groups (every query group keeps its K/V head).
        groups = self.model.num_attention_heads if self.model.mla else self.model.query_groups
        node = Op(
            name=self.name(op),
            kind=kind,
            layer=self.layer,
            layer_kind=self.layer_kind,
            units=(("heads", groups), ("kv_heads", groups)),
            **fields,  # type: ignore[arg-type]
        )
        self.ops.append((node, sources))
        return node.name

    def norm(self, op: str, source: str, width: tuple[str, int] | None = None, *,
             params: int | None = None, **tags: tuple[str, ...]) -> str:
        """A LayerNorm/RMSNorm over ``width`` (default hidden) that keeps its input (on the
        Hugging Face stacks the fp32 residual it reads, and in eager mode its fp32 normalized
        output too: ``LlamaRMSNorm`` upcasts, and keeps it for its weight's gradient; on a
        16-bit input outside autocast, the upcast copy and the normalized output cast back);
        ``params``: its weights' count where it is not one per channel (a per-head norm's)."""
        x = self.act(width) if width else self.hidden()
        per_channel = 2 if self.model.normalization == "layernorm" else 1
        saved: tuple[Tensor, ...] = (x,)
        # Hugging Face writes its RMSNorm out; its LayerNorm is PyTorch's fused one.
        fused = self.stack in UPCAST_NORM_STACKS and self.model.normalization != "rmsnorm"
        if self.stack in AUTOCAST_STACKS:  # the residual stream is fp32, autocast or not
            saved = (self.fp32(x),) * (2 if self.stack == "hf-eager" else 1)
        elif self.stack in UPCAST_NORM_STACKS and not fused:
            saved = (self.fp32(x), x)
        return self.add(
            op, "norm", (source,), inputs=(x,), output=x, saved=saved,
            extra_params=params if params is not None
            else per_channel * (width[1] if width else self.model.hidden_size),
            unfused=None if fused else unfused.norm(self.stack, x), **tags,
        )  # fmt: skip

    def linear(
        self,
        op: str,
        source: str,
        x: Tensor,
        out: tuple[str, int],
        *,
        bias: bool,
        save_input: bool = True,
        norm_reads: int = 0,
        compiled_recomputes: bool = False,
        **tags: tuple[str, ...],
    ) -> str:
        """``y = x W (+ b)`` contracting the last dim of ``x`` into ``out``; ``norm_reads``:
        the separate projections this one stands for that read a norm's output (under eager
        autocast each keeps its own 16-bit copy of it; compiled, one copy, none where
        ``compiled_recomputes``)."""
        in_dim = x.dims[-1]
        y = Tensor((*x.dims[:-1], out), self.act_bytes)
        weight = Tensor((in_dim, out), self.act_bytes)
        # Megatron-Core fuses a norm into the linear reading it, but for the norms its
        # layernorm recompute module reruns (see _decoder_layer).
        fused = norm_reads > 0 and "layernorm" not in tags.get("discarded_by", ())
        separate = self.autocast or self.stack in SEPARATE_PROJECTION_STACKS
        work, fp8 = self.linear_kernels(x, y, weight, norm_reads if separate else 0,
                                        quantized_by_norm=fused)  # fmt: skip
        return self.add(
            op, "linear", (source,), inputs=(x,), output=y, weight=weight,
            bias_params=out[1] if bias else 0,
            flops=2.0 * x.numel * out[1],
            saved=(*self._input_copies(x, norm_reads, save_input, compiled_recomputes),
                   *self.weight_copy(weight)),
            unfused=work, fp8=fp8, **tags,
        )  # fmt: skip

    def linear_kernels(self, x: Tensor, y: Tensor, weight: Tensor, readers: int, *,
                       quantized_by_norm: bool) -> tuple[Unfused | None, bool]:  # fmt: skip
        """A linear's separate kernels on this stack (:func:`unfused.linear`), with an FP8
        linear's quantizations (:func:`quantization`), and whether it runs in FP8."""
        work = unfused.linear(self.stack, x, weight, readers)
        if not runs_fp8(self.stack, self.block_kind):
            return work, False
        q = quantization(x, y, quantized_by_norm=quantized_by_norm)
        return (q if work is None else work.plus(q)), True

    def _input_copies(
        self, x: Tensor, norm_reads: int, save_input: bool, compiled_recomputes: bool
    ) -> tuple[Tensor, ...]:
        if not save_input:
            return ()
        if not self.autocast or norm_reads == 0:
            return (x,)
        if self.stack == "hf-eager":
            return (x,) * norm_reads
        return () if compiled_recomputes else (x,)

    def weight_copy(self, weight: Tensor) -> tuple[Tensor, ...]:
        """Autocast's cached 16-bit copy of an fp32 weight, which the linear keeps."""
        return (weight,) if self.autocast else ()

    def residual(self, op: str, *sources: str) -> str:
        """Residual add after a block, with its dropout mask when dropout is on."""
        h = self.hidden()
        saved = (self.mask(h),) if self.model.hidden_dropout > 0 else ()
        return self.add(op, "residual", sources, inputs=(h,) * len(sources), output=h, saved=saved,
                        unfused=unfused.residual(self.stack, h))  # fmt: skip


def is_local(model: ModelSpec, layer: int) -> bool:
    """Whether decoder layer ``layer`` (1-based) attends to a sliding window only."""
    return model.sliding_window is not None and model.sliding_window.is_local(layer - 1)


def decoder_layer_kind(model: ModelSpec, layer: int) -> str:
    """The kind of decoder layer ``layer`` (1-based): ``dense``, ``moe``, or ``local`` for a
    sliding-window layer of a model that also has global ones (Gemma 2/3; a model whose layers
    are all local has one kind, ``dense``)."""
    if model.is_moe_layer(layer - 1):
        return "moe"
    window = model.sliding_window
    if window is not None and window.global_every and is_local(model, layer):
        return "local"
    return "dense"
