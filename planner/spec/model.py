"""The model and its training run: the transformer's shape (Megatron-LM's argument names),
its attention, experts and position embeddings, and the run's defaults."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from planner.spec import limits as lim
from planner.spec.attention import SlidingWindowSpec
from planner.spec.fields import Float, Int, Name
from planner.spec.fields import Frozen as _Frozen
from planner.spec.layers import MLASpec, MoESpec, RopeScaling
from planner.vocabulary import Precision, Stack

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
    stack: Stack = Field(default="megatron-te", description="The software that runs each layer "
                         "(what it keeps for the backward, how it computes the loss).")

    @model_serializer(mode="wrap")
    def _stack_when_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A model file's training block says its stack only when it is not the default (the
        files written before stacks existed stay as they were)."""
        data: dict[str, Any] = handler(self)
        if data.get("stack") == "megatron-te":
            del data["stack"]
        return data


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
    rotary_percent: Float = Field(
        default=1.0, gt=0, le=1,
        description="The share of each head's dims RoPE rotates (HF partial_rotary_factor; "
        "Megatron's --rotary-percent): Phi-4-mini's 0.75. Priced as a whole head's rotation.",
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
    mtp_layers: Int = Field(
        default=0, ge=0, le=lim.MAX_MTP_LAYERS,
        description="Multi-token-prediction modules trained beside the model (DeepSeek-V3: 1; "
        "HF num_nextn_predict_layers, Megatron's --mtp-num-layers), each the last decoder "
        "layer's kind, on the last pipeline stage; not in the model's published total.",
    )  # fmt: skip
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
            raise ValueError("sliding_window with moe is not supported: the planner has no "
                             "windowed MoE layer; leave the window out (null in a Hugging Face "
                             "config) to plan the layers with full attention")
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

    @property
    def embedding_on_last_stage(self) -> bool:
        """Whether a pipeline's last stage keeps a copy of the word embeddings, its gradient
        summed with the first stage's: tied to the output layer, or read by the
        multi-token-prediction modules there (Megatron-Core's ``GPTModel`` builds the
        embedding where ``mtp_process`` and ``finalize_model_grads.py``'s
        ``_allreduce_word_embedding_grads`` sums it, at core_v0.12.1)."""
        return self.tie_word_embeddings or self.mtp_layers > 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) has routed experts."""
        if self.moe is None or index < self.moe.first_dense_layers:
            return False
        return (index - self.moe.first_dense_layers) % self.moe.layer_freq == 0

