"""The planner's faithful PyTorch layers: one decoder layer, the embedding and the head with
its loss, built from a :class:`~planner.spec.ModelSpec` with the operators the planner lowers
them to (:mod:`planner.graph.lower`), at one tensor-parallel rank's shard: heads, KV heads, FFN
and vocabulary divided by ``tensor_parallel``, the residual stream whole (no sequence
parallelism), no communication.

Imports PyTorch: only :mod:`planner.diagnose.profile_torch` imports it, once PyTorch is known
to be there, and ``benchmarks/bench_cpu_step.py``, which trains these same layers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

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


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer: norm, fused QKV (grouped-query), rotary, causal fused
    attention, output projection, residual; norm, MLP (SwiGLU's fused gate-and-up, or GELU),
    residual."""

    def __init__(self, model: ModelSpec, tensor_parallel: int = 1) -> None:
        super().__init__()
        heads = model.num_attention_heads // tensor_parallel
        groups = max(1, (model.num_query_groups or model.num_attention_heads) // tensor_parallel)
        self.heads, self.groups = heads, groups
        self.head_dim = model.kv_channels or model.hidden_size // model.num_attention_heads
        ffn = (model.ffn_hidden_size or 4 * model.hidden_size) // tensor_parallel
        qkv_bias = model.bias if model.qkv_bias is None else model.qkv_bias
        self.rope = model.position_embedding == "rope"
        self.gated = model.activation == "swiglu"
        self.norm1, self.norm2 = _norm(model), _norm(model)
        self.qkv = nn.Linear(model.hidden_size, (heads + 2 * groups) * self.head_dim,
                             bias=qkv_bias)  # fmt: skip
        self.q_norm = nn.RMSNorm(self.head_dim) if model.qk_layernorm else None
        self.k_norm = nn.RMSNorm(self.head_dim) if model.qk_layernorm else None
        self.out = nn.Linear(heads * self.head_dim, model.hidden_size, bias=model.bias)
        self.up = nn.Linear(model.hidden_size, (2 if self.gated else 1) * ffn, bias=model.bias)
        self.down = nn.Linear(ffn, model.hidden_size, bias=model.bias)
        self.base = model.rotary_base

    def _angles(self, seq: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.head_dim // 2
        inverse = self.base ** (-torch.arange(half, device=like.device) / half)
        angles = torch.outer(torch.arange(seq, device=like.device), inverse)
        angles = torch.cat((angles, angles), dim=-1).to(like.dtype)
        return angles.cos(), angles.sin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, seq, hidden]`` in, the same out."""
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.groups * self.head_dim,
             self.groups * self.head_dim], dim=-1)  # fmt: skip
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            cos, sin = self._angles(s, q)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=self.groups != self.heads)
        x = x + self.out(attended.transpose(1, 2).reshape(b, s, -1))
        hidden = self.up(self.norm2(x))
        if self.gated:
            gate, up = hidden.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        else:
            hidden = F.gelu(hidden)
        return x + self.down(hidden)


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
