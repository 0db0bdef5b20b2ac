"""torchtitan's own layers for ``planner profile --framework torchtitan``: the Llama 3 decoder
block torchtitan builds (``TransformerBlock`` of ``torchtitan/models/llama3/model/model.py``
at v0.2.2, the code the ``torchtitan-eager`` stack is counted from), each at one
tensor-parallel rank's shard.

A shard is the block built from the model's widths with its projections replaced by the local
ones torchtitan's tensor parallelism leaves a rank (``wq``, ``wk``, ``wv`` and ``w1``, ``w3``
column-wise, ``wo`` and ``w2`` row-wise: heads, KV heads and FFN divided, the head dimension
kept; the block reshapes by ``-1`` heads, so it runs a local shard as built), called with the
rotary embedding's frequencies (a buffer: constant, not counted as kept) and no mask (causal
SDPA). The runner casts its parameters to the compute precision with no autocast, as FSDP2
gathers bf16 weights. The embedding is ``nn.Embedding``, the head torchtitan's final
``nn.RMSNorm``, output layer and ``cross_entropy_loss`` (``torchtitan/components/loss.py``: fp32
logits, summed).

Dense Llama-shaped models only (RMSNorm, SwiGLU, RoPE, no biases, the head dimension
``hidden / heads``): torchtitan's MoE and MLA blocks are other classes, not run here.

Imports torchtitan and PyTorch: only :mod:`planner.cli.profile` imports it, once asked.
"""

from __future__ import annotations

import torch
from torch import nn
from torchtitan.components.loss import cross_entropy_loss
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.models.llama3.model.model import TransformerBlock, precompute_freqs_cis

from planner.diagnose.faithful_layers import Embedding
from planner.errors import InputError
from planner.frameworks.torchtitan import VERSION
from planner.spec import ModelSpec


def unlike_llama(model: ModelSpec) -> str | None:
    """What keeps ``model``'s layers from being torchtitan's Llama 3 block, or None.

    >>> from planner.spec.reading import load_model
    >>> unlike_llama(load_model("instances/models/llama3-8b.json")) is None
    True
    >>> unlike_llama(load_model("instances/models/gpt3-175b.json"))
    'layernorm, not RMSNorm'
    """
    checks = (
        (model.normalization == "rmsnorm", f"{model.normalization}, not RMSNorm"),
        (model.activation == "swiglu", f"{model.activation}, not SwiGLU"),
        (model.position_embedding == "rope", f"{model.position_embedding} positions, not RoPE"),
        (not model.bias and not model.has_qkv_bias, "biases"),
        (model.moe is None, "routed experts"),
        (model.mla is None, "latent attention (MLA)"),
        (not model.qk_layernorm, "q/k norms"),
        (model.sliding_window is None, "sliding-window attention"),
        (model.head_dim * model.num_attention_heads == model.hidden_size,
         f"head dimension {model.head_dim}, not hidden / heads"),
    )  # fmt: skip
    return next((why for ok, why in checks if not ok), None)


class _Rotated(nn.Module):
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


class TorchtitanCode:
    """torchtitan's layers of one dense Llama-shaped model, built at a shard for
    ``planner profile``."""

    def __init__(self, model: ModelSpec) -> None:
        why = unlike_llama(model)
        if why is not None:
            raise InputError(f"--framework torchtitan runs torchtitan's Llama 3 block; "
                             f"{model.name} has {why}: without --framework the planner's "
                             f"faithful layer runs")  # fmt: skip
        self.model = model
        self.name = f"torchtitan {VERSION} (TransformerBlock, llama3)"
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
        """torchtitan's block at the shard (``kind`` is ``dense``: the only kind a model
        :func:`unlike_llama` passes has)."""
        m, tp = self.model, tensor_parallel
        block = TransformerBlock(0, self.args)
        d = m.head_dim
        heads, groups, ffn = m.num_attention_heads // tp, m.query_groups // tp, m.ffn // tp
        attention, mlp = block.attention, block.feed_forward
        attention.wq = nn.Linear(m.hidden_size, heads * d, bias=False)
        attention.wk = nn.Linear(m.hidden_size, groups * d, bias=False)
        attention.wv = nn.Linear(m.hidden_size, groups * d, bias=False)
        attention.wo = nn.Linear(heads * d, m.hidden_size, bias=False)
        attention.n_heads, attention.n_kv_heads = heads, groups
        mlp.w1 = nn.Linear(m.hidden_size, ffn, bias=False)
        mlp.w3 = nn.Linear(m.hidden_size, ffn, bias=False)
        mlp.w2 = nn.Linear(ffn, m.hidden_size, bias=False)
        freqs = precompute_freqs_cis(d, m.max_position_embeddings, self.args.rope_theta,
                                     self.args.rope_scaling_args)  # fmt: skip
        return _Rotated(block, freqs)

    def experts(self, tensor_parallel: int, expert_parallel: int,
                tokens: int) -> tuple[nn.Module, tuple[int, ...]]:  # fmt: skip
        """None: a model :func:`unlike_llama` passes routes no experts."""
        raise InputError("--framework torchtitan runs dense Llama 3 blocks only")

    def head(self, tensor_parallel: int) -> nn.Module:
        """The final norm, the output layer over ``vocab / tensor_parallel`` entries and the
        loss."""
        return _Head(self.model, self.model.vocab_size // tensor_parallel)
