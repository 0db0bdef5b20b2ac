"""Lowering a :class:`~planner.spec.ModelSpec` to an operator graph.

One node per operator, tagged with its layer and layer kind; edges carry the tensor that flows.
What each operator keeps for backward depends on the stack that runs it
(:mod:`planner.graph.stacks` says what each stack keeps, and from which source); the builders
below apply it operator by operator, through :class:`~planner.graph.builder.LayerBuilder`.

One builder per part of a layer (attention, MLP, experts, embedding, head, the
multi-token-prediction modules), one concern: the graph of one microbatch's forward.
"""

from __future__ import annotations

import math
from dataclasses import replace

import networkx as nx

from planner.graph import unfused
from planner.graph.builder import (
    ACTIVATION_BYTES,
    LOSS_BYTES,
    LayerBuilder,
    decoder_layer_kind,
    is_local,
)
from planner.graph.op_sac import per_operator_checkpoint
from planner.graph.ops import Op, Tensor
from planner.graph.stacks import (
    EAGER_GLU_STACKS,
    EAGER_HEAD_STACKS,
    FP32_BYTES,
    loss_bytes,
    rotates_halves,
)
from planner.spec import ModelSpec, MoESpec, TrainingSpec

__all__ = ["ACTIVATION_BYTES", "decoder_layer_kind", "expert_capacity", "lower"]


def _attention_core(
    b: LayerBuilder, source: str, q_dim: int, v_dim: int, kv_heads: int, *sources: str
) -> str:
    """Scores, softmax, dropout and the weighted sum, for ``heads`` queries of ``q_dim``.

    Saved (Korthikanti Sec. 4.1): Q and K for the scores, V, and the ``s x s`` tensors
    (softmax output 2 bytes, dropout mask 1 byte, dropout output 2 bytes per element).
    """
    m = b.model
    heads, s = m.num_attention_heads, b.seq
    q = b.act(("heads", heads * q_dim))
    k = b.act(("kv_heads", kv_heads * q_dim))
    v = b.act(("kv_heads", kv_heads * v_dim))
    scores = Tensor((("batch", b.batch), ("heads", heads), ("seq", s), ("seq_k", s)), b.act_bytes)
    score_tensors = [scores]
    if m.attention_dropout > 0:
        score_tensors += [b.mask(scores), scores]
    out = b.act(("heads", heads * v_dim))
    # A local layer scores each query against its window only (an unfused kernel still
    # materialises the masked s x s scores, so score_tensors keep their size).
    window = m.sliding_window if is_local(m, b.block) else None
    keys = s if window is None else window.key_span(s)
    flops = 2.0 * b.batch * s * keys * heads * (q_dim + v_dim)
    # HF's rotary embedding runs beside the core (MLA's, on a slice of q and k, is not counted).
    rotary = m.position_embedding == "rope" and m.mla is None
    return b.add(
        "attention", "attention", (source, *sources), inputs=(q, k, v), output=out,
        flops=flops, saved=(q, k, v), score_tensors=tuple(score_tensors),
        key_span=0.0 if window is None else keys, recomputed_by=("core_attn",),
        discarded_by=("mla_up_proj",) if m.mla is not None else (),
        unfused=unfused.rotary(b.stack, q, k, halves=rotates_halves(m)) if rotary else None,
    )  # fmt: skip


def _standard_attention(b: LayerBuilder, x_name: str) -> str:
    """Fused QKV projection, attention core, output projection (GPT, Llama, GQA)."""
    m = b.model
    d, heads, groups = m.head_dim, m.num_attention_heads, m.query_groups
    x = b.hidden()
    qkv = b.linear("qkv_proj", x_name, x, ("heads", (heads + 2 * groups) * d),
                   bias=m.has_qkv_bias, norm_reads=3)  # fmt: skip
    if m.qk_layernorm:  # per head over its dim, on q and k: the stack's norm over their elements
        qkv = b.norm("qk_norm", qkv, ("heads", (heads + groups) * d),
                     params=2 * d * (2 if m.normalization == "layernorm" else 1))  # fmt: skip
    core = _attention_core(b, qkv, d, d, groups)
    return b.linear(
        "out_proj", core, b.act(("heads", heads * d)), ("hidden", m.hidden_size), bias=m.bias
    )


def _latent_attention(b: LayerBuilder, x_name: str) -> str:
    """DeepSeek's MLA: low-rank query and key/value projections, then a standard core."""
    m, mla = b.model, b.model.mla
    assert mla is not None  # the caller dispatches on it
    heads = m.num_attention_heads
    qk_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    x = b.hidden()
    if mla.q_lora_rank is None:
        q = b.linear("q_proj", x_name, x, ("heads", heads * qk_dim), bias=False, norm_reads=1,
                     discarded_by=("layernorm",), recomputed_by=("mla_up_proj",))  # fmt: skip
    else:
        q_low = b.linear("q_down_proj", x_name, x, ("q_lora", mla.q_lora_rank), bias=False,
                         norm_reads=1, discarded_by=("layernorm",))  # fmt: skip
        q_low = b.norm("q_norm", q_low, ("q_lora", mla.q_lora_rank))
        q = b.linear(
            "q_up_proj", q_low, b.act(("q_lora", mla.q_lora_rank)),
            ("heads", heads * qk_dim), bias=False, norm_reads=1, recomputed_by=("mla_up_proj",),
        )  # fmt: skip
    kv_low = b.linear(
        "kv_down_proj", x_name, x, ("kv_lora", mla.kv_lora_rank + mla.qk_rope_head_dim),
        bias=False, norm_reads=1, discarded_by=("layernorm",),
    )  # fmt: skip
    kv_low = b.norm("kv_norm", kv_low, ("kv_lora", mla.kv_lora_rank))
    kv = b.linear(
        "kv_up_proj", kv_low, b.act(("kv_lora", mla.kv_lora_rank)),
        ("heads", heads * (mla.qk_nope_head_dim + mla.v_head_dim)), bias=False, norm_reads=1,
        recomputed_by=("mla_up_proj",),
    )  # fmt: skip
    core = _attention_core(b, q, qk_dim, mla.v_head_dim, heads, kv)
    return b.linear(
        "out_proj", core, b.act(("heads", heads * mla.v_head_dim)),
        ("hidden", m.hidden_size), bias=False,
    )  # fmt: skip


def _mlp(b: LayerBuilder, x_name: str, width: int, prefix: str = "mlp", *,
         discarded_by: tuple[str, ...] = (), checkpointed_by: tuple[str, ...] = ("mlp",),
         input_of: tuple[str, ...] = ()) -> str:  # fmt: skip
    """Up projection (gate and up fused for SwiGLU/GeGLU), activation, down projection, inside
    the checkpointed recompute modules ``checkpointed_by``; ``discarded_by``: the modules that
    discard the up projection's input, ``input_of``: those whose kept input it is."""
    m = b.model
    glu = 2 if m.gated_mlp else 1
    up = b.linear(f"{prefix}_up", x_name, b.hidden(), ("ffn", glu * width), bias=m.bias,
                  norm_reads=glu, compiled_recomputes=True, discarded_by=discarded_by,
                  checkpointed_by=checkpointed_by, checkpoint_input_of=input_of)  # fmt: skip
    act_in, act_out = b.act(("ffn", glu * width)), b.act(("ffn", width))
    # Eager SwiGLU/GeGLU: the product keeps the activation's output beside up.
    kept_out = (act_out,) if b.stack in EAGER_GLU_STACKS and m.gated_mlp else ()
    act = b.add(f"{prefix}_act", "elementwise", (up,), inputs=(act_in,), output=act_out,
                saved=(act_in, *kept_out), checkpointed_by=checkpointed_by,
                unfused=unfused.activation(b.stack, act_out, gated=m.gated_mlp))  # fmt: skip
    return b.linear(f"{prefix}_down", act, act_out, ("hidden", m.hidden_size), bias=m.bias,
                    checkpointed_by=checkpointed_by)  # fmt: skip


def expert_capacity(tokens: int, moe: MoESpec) -> int:
    """Tokens each routed expert computes of ``tokens`` routed ``top_k`` ways: its balanced
    share (dropless routing, assumed balanced), or with a capacity factor that share times
    the factor, rounded up (Megatron-Core's ``get_capacity``,
    ``megatron/core/transformer/moe/moe_utils.py``; padded to it, so every expert computes it).

    >>> from planner.spec import MoESpec
    >>> moe = MoESpec(num_experts=8, top_k=2, ffn_hidden_size=64)
    >>> expert_capacity(4096, moe), expert_capacity(4096, moe.model_copy(update={
    ...     "capacity_factor": 1.25}))
    (1024, 1280)
    """
    if moe.capacity_factor is None:
        return max(1, tokens * moe.top_k // moe.num_experts)
    return max(1, math.ceil(tokens * moe.top_k / moe.num_experts * moe.capacity_factor))


MOE = ("moe",)
"""The checkpointed recompute module an MoE block's ops run inside (Megatron-Core's
``moe``: the router, the dispatch, the experts, the combine and the shared experts)."""


def _moe(b: LayerBuilder, x_name: str) -> tuple[str, ...]:
    """Router, token dispatch, routed experts, combine (+ shared experts); returns outputs."""
    m, moe = b.model, b.model.moe
    assert moe is not None  # the caller dispatches on it
    h, experts, glu = m.hidden_size, moe.num_experts, 2 if m.gated_mlp else 1
    tokens = b.batch * b.seq
    logits = b.act(("experts", experts))
    router_weight = Tensor((("hidden", h), ("experts", experts)), b.act_bytes)
    # The gating GEMM keeps its input (the pre-MLP norm's output) for its weight gradient;
    # Megatron-Core's MoE layer spec keeps that norm a module of its own (TENorm), whose
    # output the layernorm recompute module discards.
    router = b.add(
        "router", "router", (x_name,), inputs=(b.hidden(),), output=logits,
        weight=router_weight, flops=2.0 * tokens * h * experts,
        saved=(b.hidden(), Tensor(logits.dims, LOSS_BYTES), *b.weight_copy(router_weight)),
        bias_params=experts if moe.router_expert_bias else 0, discarded_by=("layernorm",),
        checkpointed_by=MOE, checkpoint_input_of=MOE,
    )  # fmt: skip
    capacity = expert_capacity(tokens, moe)

    def routed(width: int) -> Tensor:
        return Tensor(
            (("experts", experts), ("capacity", capacity), ("ffn", width)), b.act_bytes
        )

    hidden_routed = Tensor(
        (("experts", experts), ("capacity", capacity), ("hidden", h)), b.act_bytes
    )
    dispatch = b.add("dispatch", "dispatch", (x_name, router), inputs=(b.hidden(),),
                     output=hidden_routed, checkpointed_by=MOE)  # fmt: skip
    f = moe.ffn_hidden_size

    def expert_linear(op: str, src: str, x: Tensor, out: Tensor, in_dim: tuple[str, int],
                      out_dim: tuple[str, int], discarded_by: tuple[str, ...] = ()) -> str:
        weight = Tensor((("experts", experts), in_dim, out_dim), b.act_bytes)
        work, fp8 = b.linear_kernels(x, out, weight, 0, quantized_by_norm=False)
        return b.add(
            op, "expert_linear", (src,), inputs=(x,), output=out, weight=weight,
            flops=2.0 * experts * capacity * in_dim[1] * out_dim[1],
            saved=(x, *b.weight_copy(weight)),
            gemm_calls=experts, active_fraction=moe.top_k / experts,
            unfused=work, fp8=fp8, discarded_by=discarded_by, checkpointed_by=MOE,
        )  # fmt: skip

    up = expert_linear("expert_up", dispatch, hidden_routed, routed(glu * f),
                       ("hidden", h), ("ffn", glu * f))  # fmt: skip
    act = b.add("expert_act", "elementwise", (up,), inputs=(routed(glu * f),),
                output=routed(f), saved=(routed(glu * f),),
                recomputed_by=("moe_act",), checkpointed_by=MOE)  # fmt: skip
    down = expert_linear("expert_down", act, routed(f), hidden_routed, ("ffn", f), ("hidden", h),
                         discarded_by=("moe_act",))  # fmt: skip
    combine = b.add("combine", "combine", (down, router), inputs=(hidden_routed,),
                    output=b.hidden(), checkpointed_by=MOE)  # fmt: skip
    if moe.shared_ffn:
        return combine, _mlp(b, x_name, moe.shared_ffn, prefix="shared",
                             discarded_by=("layernorm",),
                             checkpointed_by=(*MOE, "shared_experts"),
                             input_of=("shared_experts",))  # fmt: skip
    return (combine,)


def _decoder_layer(b: LayerBuilder, x_name: str) -> str:
    """One pre-norm decoder layer; returns the name of its output op."""
    m = b.model
    # Megatron-Core's Transformer Engine specs fuse a norm into the linear that reads it
    # (TELayerNormColumnParallelLinear) except MLA's input norm and an MoE layer's pre-MLP
    # norm, the ones its layernorm recompute module reruns (gpt_layer_specs.py).
    separate = ("layernorm",)
    first = len(b.ops)
    normed = b.norm("input_norm", x_name, recomputed_by=separate if m.mla else ())
    attn = _latent_attention(b, normed) if m.mla else _standard_attention(b, normed)
    if m.post_norms:  # Gemma 2/3: the block's output is normed before the residual add
        attn = b.norm("attn_out_norm", attn)
    mid = b.residual("attn_residual", attn, x_name)
    normed = b.norm("post_attention_norm", mid,
                    recomputed_by=separate if b.block_kind == "moe" else ())  # fmt: skip
    if b.block_kind == "moe":
        out = b.residual("mlp_residual", *_moe(b, normed), mid)
    else:
        mlp = _mlp(b, normed, m.ffn)
        if m.post_norms:
            mlp = b.norm("mlp_out_norm", mlp)
        out = b.residual("mlp_residual", mlp, mid)
    if m.mla is None:
        per_operator_checkpoint(b, first)
    return out


def _lookup(b: LayerBuilder, *, tied_to: str | None = None, extra_params: int = 0) -> str:
    """The token embedding's lookup of the microbatch's ids, with the dense gradient of the
    whole table its backward writes (:func:`planner.graph.unfused.embedding`; fp32 under
    autocast, whose table is fp32)."""
    m = b.model
    ids = Tensor((("batch", b.batch), ("seq", b.seq)), 4.0)
    gradient_bytes = FP32_BYTES if b.autocast else b.act_bytes
    return b.add(
        "embedding", "embedding", (), inputs=(ids,), output=b.hidden(),
        weight=Tensor((("vocab", m.vocab_size), ("hidden", m.hidden_size)), b.act_bytes),
        extra_params=extra_params, tied_to=tied_to,
        unfused=unfused.embedding(b.stack, gradient_bytes=gradient_bytes),
    )  # fmt: skip


def _embedding(b: LayerBuilder) -> str:
    m = b.model
    h = b.hidden()
    learned = m.position_embedding == "learned"
    positions = m.max_position_embeddings * m.hidden_size if learned else 0
    embedded = _lookup(b, extra_params=positions)
    if m.hidden_dropout == 0:
        return embedded
    # The dropout runs on the residual stream after the vocab-parallel lookup's reduction
    # (Megatron scatters to the sequence-parallel region first), so it is an op of its own.
    return b.add("embedding_dropout", "residual", (embedded,), inputs=(h,), output=h,
                 saved=(b.mask(h),))  # fmt: skip


def _head(b: LayerBuilder, x_name: str, *, tied_to: str | None = None) -> str:
    """The final norm, the output layer and the loss; ``tied_to``: the op whose weight the
    output layer shares (the embedding's where the model ties them)."""
    m = b.model
    normed = b.norm("final_norm", x_name)
    logits = b.linear("lm_head", normed, b.hidden(), ("vocab", m.vocab_size), bias=False,
                      norm_reads=1)  # fmt: skip
    tied_to = tied_to or ("embedding" if m.tie_word_embeddings else None)
    if tied_to is not None:
        op, inputs = b.ops[-1]
        b.ops[-1] = (_replace(op, tied_to=tied_to), inputs)
    loss_in = b.act(("vocab", m.vocab_size))
    if m.final_logit_softcapping is not None:
        # Gemma 2's c tanh(logits / c): its backward needs the tanh, a logits-sized tensor.
        logits = b.add("logit_softcap", "elementwise", (logits,), inputs=(loss_in,),
                       output=loss_in, saved=(loss_in,))  # fmt: skip
    out = Tensor((("batch", b.batch), ("seq", b.seq)), LOSS_BYTES)
    kept, working = loss_bytes(b.stack, loss_in.element_bytes)
    return b.add("loss", "loss", (logits,), inputs=(loss_in,), output=out,
                 saved=(Tensor(loss_in.dims, kept),), working=(Tensor(loss_in.dims, working),),
                 unfused=unfused.loss(b.stack, loss_in))  # fmt: skip


def _multi_token_prediction(b: LayerBuilder, head: LayerBuilder, x_name: str) -> str:
    """One multi-token-prediction module, in the head (Megatron-Core's
    ``MultiTokenPredictionLayer`` and ``MultiTokenPredictionBlock.forward``,
    ``megatron/core/transformer/multi_token_prediction.py`` at core_v0.12.1): the shared
    embedding of the next tokens and the hidden states ``x_name``, each normed, concatenated and
    projected back to the hidden size (``eh_proj``), the last decoder layer's block
    (``get_gpt_mtp_block_spec`` takes the block's last layer spec), then a norm, the shared
    output layer and a loss; ``b`` adds the block (under FP8 as the decoder's, inside the
    module's ``fp8_autocast``), ``head`` the norm, output layer and loss. The module is not
    checkpointed: no recompute granularity reruns it at core_v0.12.1, so it is priced as the
    head is, keeping everything. Returns the block's output, the next module's input."""
    m = b.model
    h = b.hidden()
    embedded = _lookup(b, tied_to="embedding")
    normed_embedding = b.norm("enorm", embedded)
    normed_hidden = b.norm("hnorm", x_name)
    # The concatenation is read whole by the projection; as MLP's up and down projections,
    # its 2h features split over the tensor-parallel ranks, the projection reduces.
    pair = b.act(("ffn", 2 * m.hidden_size))
    joined = b.add("concat", "elementwise", (normed_embedding, normed_hidden),
                   inputs=(h, h), output=pair)  # fmt: skip
    projected = b.linear("eh_proj", joined, pair, ("hidden", m.hidden_size), bias=False)
    out = _decoder_layer(b, projected)
    _head(head, out, tied_to="lm_head")
    return out


def _replace(op: Op, **changes: object) -> Op:
    return replace(op, **changes)  # type: ignore[arg-type]


def lower(model: ModelSpec, training: TrainingSpec, *, micro_batch_size: int = 1) -> nx.DiGraph:
    """The operator graph of one microbatch's forward pass.

    Nodes are op names with the :class:`~planner.graph.ops.Op` under ``"op"``; edges go from
    producer to consumer. Layer 0 holds the embedding, layers 1..L the decoder layers and
    layer L + 1 the final norm, LM head and loss, and the model's multi-token-prediction
    modules (``mtp1.*``, ...), which Megatron-Core builds on the last pipeline stage.

    >>> from planner.spec import ModelSpec, MoESpec, TrainingSpec
    >>> m = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
    ...               vocab_size=1000, max_position_embeddings=128)
    >>> g = lower(m, TrainingSpec(seq_length=128, global_batch_size=8))
    >>> g.number_of_nodes(), sorted({g.nodes[n]["op"].layer_kind for n in g})
    (24, ['dense', 'embedding', 'head'])
    """
    act_bytes = ACTIVATION_BYTES[training.precision]
    graph = nx.DiGraph(model=model.name, seq_length=training.seq_length,
                       micro_batch_size=micro_batch_size, num_layers=model.num_layers)

    def builder(layer: int, kind: str) -> LayerBuilder:
        return LayerBuilder(model=model, batch=micro_batch_size, seq=training.seq_length,
                        act_bytes=act_bytes, layer=layer, layer_kind=kind, stack=training.stack)

    first = builder(0, "embedding")
    x = _embedding(first)
    builders = [first]
    for layer in range(1, model.num_layers + 1):
        b = builder(layer, decoder_layer_kind(model, layer))
        x = _decoder_layer(b, x)
        builders.append(b)
    last = builder(model.num_layers + 1, "head")
    last.stack = EAGER_HEAD_STACKS.get(training.stack, training.stack)
    _head(last, x)
    builders.append(last)
    for depth in range(1, model.mtp_layers + 1):
        prefix = f"mtp{depth}"
        block = replace(last, ops=[], copies_layer=model.num_layers, prefix=prefix)
        head = replace(last, ops=[], prefix=f"{prefix}.head")
        x = _multi_token_prediction(block, head, x)
        builders += [block, head]
    for b in builders:
        for op, sources in b.ops:
            graph.add_node(op.name, op=op)
            for src in sources:
                graph.add_edge(src, op.name)
    return graph
