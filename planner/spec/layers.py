"""The parts of a decoder layer a :class:`~planner.spec.ModelSpec` may carry beyond the dense
transformer: routed experts and their router, latent attention, and RoPE's long-context
scaling. Names follow Megatron-LM's arguments; each field says the Hugging Face key it is read
from where the two differ."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.spec import limits as lim
from planner.spec.fields import Float, Frozen, Int, Name


class MoESpec(Frozen):
    """Mixture-of-experts feed-forward blocks (Megatron's ``--num-experts`` family)."""

    num_experts: Int = Field(gt=0, le=lim.MAX_EXPERTS, description="Routed experts per MoE layer.")
    top_k: Int = Field(
        gt=0, le=lim.MAX_EXPERTS, description="Routed experts each token is sent to."
    )
    ffn_hidden_size: Int = Field(
        gt=0, le=lim.MAX_FFN_HIDDEN_SIZE, description="FFN width of one routed expert."
    )
    shared_experts: Int = Field(
        default=0, ge=0, le=lim.MAX_EXPERTS, description="Always-active shared experts."
    )
    shared_ffn_hidden_size: Int | None = Field(
        default=None,
        gt=0,
        le=lim.MAX_FFN_HIDDEN_SIZE,
        description="Total FFN width of all shared experts together "
        "(Megatron's --moe-shared-expert-intermediate-size); default shared_experts x "
        "ffn_hidden_size.",
    )
    first_dense_layers: Int = Field(
        default=0,
        ge=0,
        le=lim.MAX_LAYERS,
        description="Leading layers with a dense FFN instead of experts.",
    )
    layer_freq: Int = Field(
        default=1,
        gt=0,
        le=lim.MAX_LAYERS,
        description="After the dense layers, every layer_freq-th layer is MoE (1 = all).",
    )
    router_expert_bias: bool = Field(
        default=False,
        description="A learned per-expert bias on the routing scores (DeepSeek-V3's "
        "aux-loss-free balancing; Megatron's --moe-router-enable-expert-bias).",
    )
    router_score_function: Literal["softmax", "sigmoid"] | None = Field(
        default=None,
        description="How router logits become scores (Megatron's --moe-router-score-function; "
        "HF scoring_func); default sigmoid with the expert bias (DeepSeek-V3), else softmax.",
    )
    router_topk_normalized: bool = Field(
        default=True,
        description="Whether a token's k routing weights are renormalized to sum to 1 (HF "
        "norm_topk_prob); false is Megatron's --moe-router-pre-softmax (softmax over all).",
    )
    router_topk_scaling_factor: Float | None = Field(
        default=None, gt=0, le=lim.MAX_ROUTER_SCALING,
        description="Factor on the routing weights (HF routed_scaling_factor; Megatron's "
        "--moe-router-topk-scaling-factor); null = 1.",
    )
    router_num_groups: Int | None = Field(
        default=None, gt=0, le=lim.MAX_EXPERTS,
        description="Group-limited routing: groups of experts (HF n_group; Megatron's "
        "--moe-router-num-groups); null = no groups.",
    )
    router_group_topk: Int | None = Field(
        default=None, gt=0, le=lim.MAX_EXPERTS,
        description="Groups each token's experts are drawn from (HF topk_group; Megatron's "
        "--moe-router-group-topk).",
    )
    capacity_factor: Float | None = Field(
        default=None, gt=0, le=lim.MAX_CAPACITY_FACTOR,
        description="Each expert computes this times its balanced share of the tokens, the "
        "rest dropped and the shortfall padded (Megatron's --moe-expert-capacity-factor with "
        "--moe-pad-expert-input-to-capacity; Megatron-DeepSpeed's --moe-train-capacity-factor); "
        "null: dropless, routing assumed balanced (each expert its share, tokens x top_k / "
        "num_experts).",
    )
    expert_load_cv: Float = Field(
        default=0.0, ge=0, le=lim.MAX_EXPERT_LOAD_CV,
        description="Dropless routing's spread of one layer's tokens per expert, standard "
        "deviation over mean: the busiest expert-parallel rank then computes and exchanges "
        "more than its share, and every rank waits for it (planner.cost.expert_load). 0: "
        "balanced, as Megatron's --moe-router-force-load-balancing routes. NVIDIA's dropless "
        "runs at EP8 price at 0.045 (Mixtral 8x22B, its trained router) and 1.65 (Qwen3-235B "
        "at 16K-128K tokens): the router's, not a constant (docs/benchmarks.md).",
    )
    router_aux_loss_coeff: Float | None = Field(
        default=None, ge=0, le=1,
        description="Weight of the load-balancing loss (HF router_aux_loss_coef; Megatron's "
        "--moe-aux-loss-coeff); null = none stated.",
    )

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) > num_experts ({self.num_experts})")
        if self.expert_load_cv > 0 and self.capacity_factor is not None:
            raise ValueError(f"expert_load_cv ({self.expert_load_cv:g}) is dropless routing's "
                             f"spread; with capacity_factor ({self.capacity_factor:g}) every "
                             f"expert is padded to its capacity: set one of them")
        groups, chosen = self.router_num_groups, self.router_group_topk
        if (groups is None) != (chosen is None):
            raise ValueError(f"router_num_groups ({groups}) and router_group_topk ({chosen}) "
                             f"go together")
        if groups is not None and chosen is not None:
            if self.num_experts % groups:
                raise ValueError(f"num_experts ({self.num_experts}) is not divisible by "
                                 f"router_num_groups ({groups})")
            if chosen > groups:
                raise ValueError(f"router_group_topk ({chosen}) > router_num_groups ({groups})")
        return self

    @property
    def score_function(self) -> Literal["softmax", "sigmoid"]:
        """The router's score function, its default resolved."""
        if self.router_score_function is not None:
            return self.router_score_function
        return "sigmoid" if self.router_expert_bias else "softmax"

    @property
    def shared_ffn(self) -> int:
        """Total FFN width of the shared experts (0 when there are none)."""
        if self.shared_experts == 0:
            return 0
        return self.shared_ffn_hidden_size or self.shared_experts * self.ffn_hidden_size


class MLASpec(Frozen):
    """DeepSeek's multi-head latent attention (low-rank compressed queries, keys and values)."""

    q_lora_rank: Int | None = Field(
        default=None,
        gt=0,
        le=lim.MAX_HIDDEN_SIZE,
        description="Rank of the query compression; null = no compression.",
    )
    kv_lora_rank: Int = Field(
        gt=0, le=lim.MAX_HIDDEN_SIZE, description="Rank of the joint key/value compression."
    )
    qk_nope_head_dim: Int = Field(
        gt=0, le=lim.MAX_HEAD_DIM, description="Per-head query/key dims without RoPE."
    )
    qk_rope_head_dim: Int = Field(
        gt=0, le=lim.MAX_HEAD_DIM, description="Per-head query/key dims with RoPE."
    )
    v_head_dim: Int = Field(gt=0, le=lim.MAX_HEAD_DIM, description="Per-head value dims.")


class RopeScaling(Frozen):
    """How RoPE's frequencies are stretched for long contexts (HF ``rope_scaling``): Llama 3.1's
    ``llama3`` and DeepSeek's ``yarn`` are exported; other types are kept and said."""

    rope_type: Name = Field(description="HF rope_type (or type): llama3, yarn, linear, ...")
    factor: Float = Field(gt=0, le=lim.MAX_ROPE_FACTOR, description="The context stretch.")
    original_max_position_embeddings: Int | None = Field(
        default=None, gt=0, le=lim.MAX_SEQ_LENGTH, description="The pre-training context."
    )
    low_freq_factor: Float | None = Field(default=None, gt=0, description="llama3's.")
    high_freq_factor: Float | None = Field(default=None, gt=0, description="llama3's.")
    beta_fast: Float | None = Field(default=None, gt=0, description="yarn's (default 32).")
    beta_slow: Float | None = Field(default=None, gt=0, description="yarn's (default 1).")
    mscale: Float | None = Field(default=None, ge=0, description="yarn's (default 1).")
    mscale_all_dim: Float | None = Field(default=None, ge=0, description="yarn's (default 0).")
