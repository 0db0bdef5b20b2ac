"""The planner's faithful PyTorch layers: a dense decoder layer, an MoE layer around its routed
experts and those experts, the embedding and the head with its loss, built from a
:class:`~planner.spec.ModelSpec` with the operators the planner lowers them to
(:mod:`planner.graph.lower`), at one tensor-parallel rank's shard: heads, KV heads, FFN and
vocabulary divided by ``tensor_parallel`` (a rank's experts by the expert-parallel degree),
the residual stream whole (no sequence parallelism), no communication.

Imports PyTorch: only :mod:`planner.diagnose.profile_torch` imports it, once PyTorch is known
to be there, and ``benchmarks/bench_cpu_step.py``, which trains these same layers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from planner.graph.lower import expert_capacity
from planner.spec import ModelSpec


def _norm(model: ModelSpec) -> nn.Module:
    hidden = model.hidden_size
    if model.normalization == "rmsnorm":
        return nn.RMSNorm(hidden, eps=model.norm_epsilon)
    return nn.LayerNorm(hidden, eps=model.norm_epsilon, bias=model.bias)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on ``[batch, heads, seq, head_dim]`` (halves rotated)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def _angles(head_dim: int, base: float, seq: int,
            like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Rotary cosines and sines for ``seq`` positions over ``head_dim`` dims."""
    half = head_dim // 2
    inverse = base ** (-torch.arange(half, device=like.device) / half)
    angles = torch.outer(torch.arange(seq, device=like.device), inverse)
    angles = torch.cat((angles, angles), dim=-1).to(like.dtype)
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    """A pre-norm attention sublayer: norm, fused QKV (grouped-query), qk-norm, rotary, causal
    fused attention, output projection, residual."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1) -> None:
        super().__init__()
        heads = model.num_attention_heads // tensor_parallel
        groups = max(1, (model.num_query_groups or model.num_attention_heads) // tensor_parallel)
        self.heads, self.groups = heads, groups
        self.head_dim = model.kv_channels or model.hidden_size // model.num_attention_heads
        qkv_bias = model.bias if model.qkv_bias is None else model.qkv_bias
        self.rope = model.position_embedding == "rope"
        self.norm = _norm(model)
        self.qkv = nn.Linear(model.hidden_size, (heads + 2 * groups) * self.head_dim,
                             bias=qkv_bias)  # fmt: skip
        self.q_norm = nn.RMSNorm(self.head_dim) if model.qk_layernorm else None
        self.k_norm = nn.RMSNorm(self.head_dim) if model.qk_layernorm else None
        self.out = nn.Linear(heads * self.head_dim, model.hidden_size, bias=model.bias)
        self.base = model.rotary_base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, seq, hidden]`` in, the same out."""
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).split(
            [self.heads * self.head_dim, self.groups * self.head_dim,
             self.groups * self.head_dim], dim=-1)  # fmt: skip
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            cos, sin = _angles(self.head_dim, self.base, s, q)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=self.groups != self.heads)
        return x + self.out(attended.transpose(1, 2).reshape(b, s, -1))


class LatentAttention(nn.Module):
    """DeepSeek's multi-head latent attention as a pre-norm sublayer: norm; the query through
    its low-rank down projection, norm and up projection (or one projection); keys and values
    through their joint down projection (with the shared rotary key), norm and up projection;
    rotary on the rotary slices, causal fused attention over the concatenated query/key heads,
    output projection, residual. The down projections are whole on every tensor-parallel rank,
    the heads divided (Megatron-Core's ``multi_latent_attention.py``)."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1) -> None:
        super().__init__()
        mla = model.mla
        assert mla is not None  # the caller dispatches on it
        h = model.hidden_size
        self.heads = model.num_attention_heads // tensor_parallel
        self.nope, self.rope_dim, self.v_dim = (mla.qk_nope_head_dim, mla.qk_rope_head_dim,
                                                mla.v_head_dim)  # fmt: skip
        self.kv_rank = mla.kv_lora_rank
        qk_dim = self.nope + self.rope_dim
        self.norm = _norm(model)
        self.q_down: nn.Module | None = None
        if mla.q_lora_rank is None:
            self.q_up = nn.Linear(h, self.heads * qk_dim, bias=False)
        else:
            self.q_down = nn.Sequential(nn.Linear(h, mla.q_lora_rank, bias=False),
                                        nn.RMSNorm(mla.q_lora_rank, eps=model.norm_epsilon))
            self.q_up = nn.Linear(mla.q_lora_rank, self.heads * qk_dim, bias=False)
        self.kv_down = nn.Linear(h, self.kv_rank + self.rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(self.kv_rank, eps=model.norm_epsilon)
        self.kv_up = nn.Linear(self.kv_rank, self.heads * (self.nope + self.v_dim), bias=False)
        self.out = nn.Linear(self.heads * self.v_dim, h, bias=False)
        self.base = model.rotary_base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, seq, hidden]`` in, the same out."""
        b, s, _ = x.shape
        normed = self.norm(x)
        low = normed if self.q_down is None else self.q_down(normed)
        q = self.q_up(low).view(b, s, self.heads, -1).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_down(normed).split([self.kv_rank, self.rope_dim], dim=-1)
        kv = self.kv_up(self.kv_norm(latent)).view(b, s, self.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        cos, sin = _angles(self.rope_dim, self.base, s, q)
        q_rope = _rotate(q_rope, cos, sin)
        k_rope = _rotate(k_rope.unsqueeze(1), cos, sin).expand(b, self.heads, s, self.rope_dim)
        query = torch.cat((q_nope, q_rope), dim=-1)
        key = torch.cat((k_nope, k_rope), dim=-1)
        attended = F.scaled_dot_product_attention(query, key, v, is_causal=True)
        return x + self.out(attended.transpose(1, 2).reshape(b, s, -1))


def _attention(model: ModelSpec, tensor_parallel: int) -> nn.Module:
    """The model's attention sublayer: latent (MLA) or standard."""
    if model.mla is not None:
        return LatentAttention(model, tensor_parallel)
    return Attention(model, tensor_parallel)


class MLP(nn.Module):
    """The feed-forward block without its norm: SwiGLU's fused gate-and-up, or GELU, and the
    down projection, ``ffn / tensor_parallel`` wide."""

    def __init__(self, model: ModelSpec, ffn: int, tensor_parallel: int = 1) -> None:
        super().__init__()
        self.gated = model.activation == "swiglu"
        width = ffn // tensor_parallel
        self.up = nn.Linear(model.hidden_size, (2 if self.gated else 1) * width, bias=model.bias)
        self.down = nn.Linear(width, model.hidden_size, bias=model.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., hidden]`` in, the same out."""
        return self.down(_activate(self.up(x), gated=self.gated))


def _activate(x: torch.Tensor, *, gated: bool) -> torch.Tensor:
    if gated:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(x)


class DecoderLayer(nn.Module):
    """One pre-norm dense decoder layer: the attention sublayer, then norm, MLP, residual."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1) -> None:
        super().__init__()
        self.attention = _attention(model, tensor_parallel)
        self.norm = _norm(model)
        self.mlp = MLP(model, model.ffn_hidden_size or 4 * model.hidden_size, tensor_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, seq, hidden]`` in, the same out."""
        x = self.attention(x)
        return x + self.mlp(self.norm(x))


class RoutedExperts(nn.Module):
    """One rank's routed experts, ``local_experts`` of them, each's FFN divided by
    ``tensor_parallel``, one GEMM pair each, as the Hugging Face stacks run them (Mixtral's
    and Qwen-MoE's eager experts loop; a grouped-GEMM stack is not what this profiles:
    :data:`planner.graph.stacks.GROUPED_EXPERT_STACKS`)."""

    def __init__(self, model: ModelSpec, local_experts: int, tensor_parallel: int = 1) -> None:
        super().__init__()
        assert model.moe is not None  # only an MoE model has routed experts
        self.gated = model.activation == "swiglu"
        width = model.moe.ffn_hidden_size // tensor_parallel
        h = model.hidden_size
        up = (2 if self.gated else 1) * width
        self.up = nn.Parameter(torch.randn(local_experts, h, up) * h**-0.5)
        self.down = nn.Parameter(torch.randn(local_experts, width, h) * width**-0.5)

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        return _activate(rows @ self.up[e], gated=self.gated) @ self.down[e]

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """``[local_experts, rows, hidden]`` in, the same out: balanced routing, each expert
        computing its capacity (what the cost model assumes,
        :func:`planner.graph.lower.expert_capacity`)."""
        return torch.stack([self._expert(e, group) for e, group in enumerate(rows)])

    def routed(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``[rows, hidden]`` in expert order, ``counts[e]`` of them expert ``e``'s (as routing
        left them, unbalanced), the same out."""
        return torch.cat([self._expert(e, group) for e, group in enumerate(rows.split(counts))])


class MoELayer(nn.Module):
    """A pre-norm MoE decoder layer around its routed experts: the attention sublayer, norm,
    router (softmax or sigmoid scores, top-k, normalised when the model says so), the tokens
    permuted into expert order and, after the experts, un-permuted and summed by their
    routing weights (Megatron-Core's ``moe_utils.permute``/``unpermute``), plus the shared
    experts (group-limited routing and the choice bias where the model has them). Without
    ``experts`` (what the profile runs) the permuted rows pass through where the routed experts
    would run: their own work is measured apart, on balanced rows (:class:`RoutedExperts`), as
    the cost model prices it apart (the operators with an ``experts`` dim); with them, the
    whole layer runs, each expert on the rows routing gave it."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1,
                 experts: RoutedExperts | None = None) -> None:  # fmt: skip
        super().__init__()
        moe = model.moe
        assert moe is not None  # the caller dispatches on it
        self.experts = experts
        self.attention = _attention(model, tensor_parallel)
        self.norm = _norm(model)
        self.router = nn.Linear(model.hidden_size, moe.num_experts, bias=False)
        self.top_k = moe.top_k
        self.sigmoid = moe.router_score_function == "sigmoid"
        self.normalize = moe.router_topk_normalized
        self.scaling = moe.router_topk_scaling_factor or 1.0
        self.groups = (moe.router_num_groups or 1, moe.router_group_topk or 1)
        # the load-balancing bias steers the choice only (DeepSeek-V3's aux-loss-free routing)
        self.register_buffer("choice_bias", torch.zeros(moe.num_experts)
                             if moe.router_expert_bias else None)  # fmt: skip
        self.shared = (MLP(model, moe.shared_ffn, tensor_parallel) if moe.shared_ffn
                       else None)  # fmt: skip

    def _choose(self, scores: torch.Tensor) -> torch.Tensor:
        """Each token's top-k experts, within its best groups under group-limited routing
        (each group scored by its two best experts, as DeepSeek-V3's router does)."""
        groups, best = self.groups
        if groups > 1:
            grouped = scores.view(scores.shape[0], groups, -1)
            rank = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
            keep = torch.zeros_like(rank).scatter_(1, rank.topk(best, dim=-1).indices, 1.0)
            scores = scores.masked_fill(keep.repeat_interleave(grouped.shape[-1], 1) == 0,
                                        float("-inf"))  # fmt: skip
        return scores.topk(self.top_k, dim=-1).indices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, seq, hidden]`` in, the same out."""
        x = self.attention(x)
        h = self.norm(x)
        flat = h.reshape(-1, h.shape[-1])
        logits = self.router(flat).float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        chosen = self._choose(scores if self.choice_bias is None else scores + self.choice_bias)
        weights = scores.gather(-1, chosen)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights * self.scaling
        order = chosen.flatten().argsort(stable=True)
        token = order // self.top_k
        rows = flat[token]  # in expert order
        if self.experts is not None:
            counts = chosen.flatten().bincount(minlength=self.router.out_features).tolist()
            rows = self.experts.routed(rows, counts)
        routed = rows * weights.flatten()[order].unsqueeze(-1).to(rows.dtype)
        out = torch.zeros_like(flat, dtype=routed.dtype).index_add_(0, token, routed)
        if self.shared is not None:
            out = out + self.shared(flat)
        return x + out.view_as(x).to(x.dtype)


class Head(nn.Module):
    """The final norm, the output layer over ``vocab / tensor_parallel`` entries and the
    cross-entropy loss on the logits in fp32, as the Hugging Face models compute it."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1) -> None:
        super().__init__()
        self.norm = _norm(model)
        self.vocab = model.vocab_size // tensor_parallel
        self.output = nn.Linear(model.hidden_size, self.vocab, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean loss of hidden states ``x`` against ``labels`` (indices below the shard's
        vocabulary)."""
        logits = self.output(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, self.vocab), labels.reshape(-1))


class Embedding(nn.Module):
    """The token embedding over ``vocab / tensor_parallel`` entries."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1) -> None:
        super().__init__()
        self.vocab = model.vocab_size // tensor_parallel
        self.table = nn.Embedding(self.vocab, model.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[batch, seq]`` token ids in, ``[batch, seq, hidden]`` out."""
        return self.table(tokens)


class FaithfulCode:
    """The layers ``planner profile`` runs by default, each built at a shard: what
    :class:`planner.diagnose.profile_torch.LayerCode` asks of a framework's layer code."""

    name = "planner faithful PyTorch layer (planner.diagnose.faithful_layers)"

    def __init__(self, model: ModelSpec) -> None:
        self.model = model

    def embedding(self, tensor_parallel: int) -> Embedding:
        """The embedding over ``vocab / tensor_parallel`` entries."""
        return Embedding(self.model, tensor_parallel)

    def layer(self, kind: str, tensor_parallel: int) -> nn.Module:
        """A ``dense`` or ``moe`` decoder layer (the MoE one around its experts)."""
        if kind == "moe":
            return MoELayer(self.model, tensor_parallel)
        return DecoderLayer(self.model, tensor_parallel)

    def experts(self, tensor_parallel: int, expert_parallel: int,
                tokens: int) -> tuple[nn.Module, tuple[int, ...]]:  # fmt: skip
        """One rank's routed experts when each of ``expert_parallel`` ranks routes ``tokens``,
        and the shape of their input: the rows each expert computes, balanced."""
        moe = self.model.moe
        assert moe is not None  # only an MoE model's cases have experts
        local = moe.num_experts // expert_parallel
        rows = expert_capacity(tokens * expert_parallel, moe)
        return (RoutedExperts(self.model, local, tensor_parallel),
                (local, rows, self.model.hidden_size))  # fmt: skip

    def head(self, tensor_parallel: int) -> Head:
        """The final norm, output layer and loss over ``vocab / tensor_parallel`` entries."""
        return Head(self.model, tensor_parallel)
