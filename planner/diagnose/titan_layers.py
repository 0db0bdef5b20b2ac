"""torchtitan's own layers for ``planner profile --framework torchtitan``: the decoder blocks
torchtitan builds at v0.2.2 (the code the ``torchtitan-eager`` stack is counted from), each at
one tensor-parallel rank's shard: Llama 3's ``TransformerBlock``
(``torchtitan/models/llama3/model/model.py``) for a Llama-shaped model, Qwen3's
(``torchtitan/models/qwen3/model/model.py``) for one with q/k norms or routed experts.

A shard is the block built from the model's widths with its projections replaced by the local
ones torchtitan's tensor parallelism leaves a rank (``wq``, ``wk``, ``wv`` and ``w1``, ``w3``
column-wise, ``wo`` and ``w2`` row-wise: heads, KV heads and FFN divided, the head dimension
kept; the block reshapes by ``-1`` heads, so it runs a local shard as built), called with the
rotary embedding's frequencies (a buffer: constant, not counted as kept) and no mask (causal
SDPA). The runner casts its parameters to the compute precision with no autocast, as FSDP2
gathers bf16 weights. The embedding is ``nn.Embedding``, the head torchtitan's final
``nn.RMSNorm``, output layer and ``cross_entropy_loss`` (``torchtitan/components/loss.py``: fp32
logits, summed).

An MoE block is measured as the profile prices it, in two parts: the block with its routed
experts passing their rows through (attention, the router, the token reordering, the combine,
the shared experts over a shard of their FFN), and a rank's routed experts apart, torchtitan's
``GroupedExperts`` (``torch._grouped_mm``, its rows padded per expert) on balanced rows.
torchtitan's MLA block (DeepSeek-V3) is another class, not run here.

Imports torchtitan and PyTorch: only :mod:`planner.cli.profile` imports it, once asked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchtitan.components.loss import cross_entropy_loss
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.models.llama3.model.model import TransformerBlock, precompute_freqs_cis
from torchtitan.models.moe import MoEArgs
from torchtitan.models.moe.moe import GroupedExperts
from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
from torchtitan.models.qwen3.model.model import TransformerBlock as Qwen3Block
from torchtitan.models.qwen3.model.model import precompute_rope_cache

from planner.diagnose.faithful_layers import Embedding
from planner.errors import InputError
from planner.frameworks.torchtitan import VERSION
from planner.graph.lower import expert_capacity
from planner.spec import ModelSpec


def unlike_torchtitan(model: ModelSpec) -> str | None:
    """What keeps ``model``'s layers from being one of torchtitan's blocks run here (Llama 3's,
    or Qwen3's for q/k norms or experts), or None.

    >>> from planner.spec.reading import load_model
    >>> unlike_torchtitan(load_model("instances/models/llama3-8b.json")) is None
    True
    >>> unlike_torchtitan(load_model("instances/models/gpt3-175b.json"))
    'layernorm, not RMSNorm'
    """
    llama = not model.qk_layernorm and model.moe is None
    checks = (
        (model.normalization == "rmsnorm", f"{model.normalization}, not RMSNorm"),
        (model.activation == "swiglu", f"{model.activation}, not SwiGLU"),
        (model.position_embedding == "rope", f"{model.position_embedding} positions, not RoPE"),
        (not model.bias and not model.has_qkv_bias, "biases"),
        (model.mla is None, "latent attention (MLA)"),
        (not model.post_norms, "norms after its sublayers"),
        (model.sliding_window is None, "sliding-window attention"),
        (not llama or model.head_dim * model.num_attention_heads == model.hidden_size,
         f"head dimension {model.head_dim}, not hidden / heads"),
    )  # fmt: skip
    return next((why for ok, why in checks if not ok), None)


class Rotated(nn.Module):
    """torchtitan's block called as its model calls it: with the rotary frequencies of the
    input's length and no attention mask."""

    def __init__(self, block: nn.Module, freqs: torch.Tensor) -> None:
        super().__init__()
        self.block = block
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, seq, hidden]`` in, the same out."""
        return self.block(x, self.freqs[: x.shape[1]], None)


class _Head(nn.Module):
    """torchtitan's final norm, output layer over ``vocab`` entries and loss."""

    def __init__(self, model: ModelSpec, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.norm = nn.RMSNorm(model.hidden_size, eps=model.norm_epsilon)
        self.output = nn.Linear(model.hidden_size, vocab, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The summed loss of hidden states ``x`` against ``labels``."""
        return cross_entropy_loss(self.output(self.norm(x)), labels)


class _PassThrough(nn.Module):
    """Where an MoE block's routed experts run: their rows out as they came in (the experts'
    own work is measured apart)."""

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """The routed rows, unchanged."""
        return x


class _Grouped(nn.Module):
    """A rank's routed experts as torchtitan runs them, on ``[experts, rows, hidden]``: each
    expert's rows, in expert order, through ``GroupedExperts``."""

    def __init__(self, experts: GroupedExperts) -> None:
        super().__init__()
        self.experts = experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[experts, rows, hidden]`` in, the same out."""
        local, rows, hidden = x.shape
        counts = torch.full((local,), rows, dtype=torch.int64, device=x.device)
        return self.experts(x.reshape(-1, hidden), counts).view_as(x)


class TorchtitanCode:
    """torchtitan's layers of one model (:func:`unlike_torchtitan`), built at a shard for
    ``planner profile``."""

    def __init__(self, model: ModelSpec) -> None:
        why = unlike_torchtitan(model)
        if why is not None:
            raise InputError(f"--framework torchtitan runs torchtitan's Llama 3 and Qwen3 "
                             f"blocks; {model.name} has {why}: without --framework the "
                             f"planner's faithful layer runs")  # fmt: skip
        self.model = model
        self.qwen3 = model.qk_layernorm or model.moe is not None
        block = "qwen3" if self.qwen3 else "llama3"
        self.name = f"torchtitan {VERSION} (TransformerBlock, {block})"
        if model.moe is not None:
            run_on_cpu()
        self.args = TransformerModelArgs(
            dim=model.hidden_size, n_layers=model.num_layers, n_heads=model.num_attention_heads,
            n_kv_heads=model.query_groups, vocab_size=model.vocab_size,
            norm_eps=model.norm_epsilon, rope_theta=model.rotary_base,
            max_seq_len=model.max_position_embeddings,
        )  # fmt: skip

    def embedding(self, tensor_parallel: int) -> nn.Module:
        """``nn.Embedding`` over ``vocab / tensor_parallel`` entries."""
        return Embedding(self.model, tensor_parallel)

    def layer(self, kind: str, tensor_parallel: int) -> nn.Module:
        """torchtitan's ``dense`` or ``moe`` block at the shard (the MoE one around its
        routed experts)."""
        m, tp = self.model, tensor_parallel
        if self.qwen3:
            block: nn.Module = Qwen3Block(0, qwen3_args(m, moe=kind == "moe"))
            freqs = precompute_rope_cache(m.head_dim, m.max_position_embeddings, m.rotary_base)
        else:
            block = TransformerBlock(0, self.args)
            freqs = precompute_freqs_cis(m.head_dim, m.max_position_embeddings,
                                         self.args.rope_theta,
                                         self.args.rope_scaling_args)  # fmt: skip
        _shard_attention(block.attention, m, tp)
        if kind == "moe":
            assert m.moe is not None
            block.moe.experts = _PassThrough()
            if block.moe.shared_experts is not None:
                _shard_mlp(block.moe.shared_experts, m, m.moe.shared_ffn // tp)
        else:
            _shard_mlp(block.feed_forward, m, m.ffn // tp)
        return Rotated(block, freqs)

    def experts(self, tensor_parallel: int, expert_parallel: int,
                tokens: int) -> tuple[nn.Module, tuple[int, ...]]:  # fmt: skip
        """One rank's routed experts when each of ``expert_parallel`` ranks routes ``tokens``
        (torchtitan's ``GroupedExperts``, each expert's FFN divided by ``tensor_parallel``),
        and the shape of their input: the rows each expert computes, balanced."""
        moe = self.model.moe
        if moe is None:
            raise InputError(f"{self.model.name} routes no experts")
        local = moe.num_experts // expert_parallel
        rows = expert_capacity(tokens * expert_parallel, moe)
        experts = GroupedExperts(dim=self.model.hidden_size,
                                 hidden_dim=moe.ffn_hidden_size // tensor_parallel,
                                 num_experts=local, use_grouped_mm=True)  # fmt: skip
        with torch.no_grad():
            experts.init_weights(0.02)
        return _Grouped(experts), (local, rows, self.model.hidden_size)

    def head(self, tensor_parallel: int) -> nn.Module:
        """The final norm, the output layer over ``vocab / tensor_parallel`` entries and the
        loss."""
        return _Head(self.model, self.model.vocab_size // tensor_parallel)


def qwen3_args(model: ModelSpec, *, moe: bool) -> Qwen3ModelArgs:
    """torchtitan's Qwen3 arguments of ``model``'s widths (a ``moe`` block with its experts
    and router, as ``torchtitan/models/qwen3/__init__.py``'s MoE flavors set them)."""
    m = model
    experts = MoEArgs()
    if moe:
        assert m.moe is not None
        experts = MoEArgs(num_experts=m.moe.num_experts, num_shared_experts=m.moe.shared_experts,
                          top_k=m.moe.top_k, score_func=m.moe.score_function,
                          route_norm=m.moe.router_topk_normalized,
                          score_before_experts=False)  # fmt: skip
    return Qwen3ModelArgs(
        dim=m.hidden_size, n_layers=m.num_layers, n_heads=m.num_attention_heads,
        n_kv_heads=m.query_groups, head_dim=m.head_dim, hidden_dim=m.ffn,
        vocab_size=m.vocab_size, norm_eps=m.norm_epsilon, rope_theta=m.rotary_base,
        qk_norm=m.qk_layernorm, max_seq_len=m.max_position_embeddings, moe_enabled=moe,
        moe_inter_dim=m.moe.ffn_hidden_size if m.moe is not None else m.ffn, moe_args=experts,
    )  # fmt: skip


def _shard_attention(attention: nn.Module, m: ModelSpec, tp: int) -> None:
    """One rank's projections of ``attention``: heads and KV heads divided by ``tp``."""
    d, heads, groups = m.head_dim, m.num_attention_heads // tp, m.query_groups // tp
    attention.wq = nn.Linear(m.hidden_size, heads * d, bias=False)
    attention.wk = nn.Linear(m.hidden_size, groups * d, bias=False)
    attention.wv = nn.Linear(m.hidden_size, groups * d, bias=False)
    attention.wo = nn.Linear(heads * d, m.hidden_size, bias=False)
    attention.n_heads, attention.n_kv_heads = heads, groups


def _shard_mlp(mlp: nn.Module, m: ModelSpec, ffn: int) -> None:
    """One rank's SwiGLU projections of ``mlp``, ``ffn`` wide."""
    mlp.w1 = nn.Linear(m.hidden_size, ffn, bias=False)
    mlp.w3 = nn.Linear(m.hidden_size, ffn, bias=False)
    mlp.w2 = nn.Linear(ffn, m.hidden_size, bias=False)


def run_on_cpu() -> None:
    """Give torchtitan's MoE the CPU paths of two index kernels it runs only on a GPU, as a
    GPU runs them: the router's ``histc`` of the chosen experts' indices (integers, which
    CUDA's kernel takes and the CPU's does not) and the padding of each expert's rows (a
    Triton kernel; torchtitan ships the CPU fallback). Once; tensors on a GPU untouched."""
    import torchtitan.models.moe.utils as moe_utils

    if getattr(torch.histc, "counts_integers", False):
        return
    histc, permute = torch.histc, moe_utils.generate_permute_indices

    def integer_histc(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.is_floating_point() or x.device.type != "cpu":
            return histc(x, *args, **kwargs)
        return histc(x.float(), *args, **kwargs).to(x.dtype)

    def permute_indices(tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return permute(tokens, *args, **kwargs, use_cpu=tokens.device.type == "cpu")

    integer_histc.counts_integers = True  # type: ignore[attr-defined]
    torch.histc = integer_histc  # type: ignore[assignment]
    moe_utils.generate_permute_indices = permute_indices
