"""Hugging Face ``transformers``' own layers for ``planner profile --framework transformers``:
the decoder layer classes ``transformers`` builds from the model's ``config.json`` (the code
the ``hf-eager`` and ``hf-compiled`` stacks are), each at one tensor-parallel rank's shard.

A shard is the config with its heads, KV heads and FFN widths divided (the head dimension
kept), built as one layer of the index whose kind it is (a dense or an MoE layer, as
``transformers`` decides from the config), with the model's rotary embedding class computing
its positions. An MoE layer is measured as the planner prices it, in two parts:

- ``moe``: the whole layer with its experts module replaced by one that returns the tokens
  weighted by their routing weights (the router, the shared experts, attention and norms run
  as ``transformers`` wrote them);
- ``experts``: the model's own experts module (``layer.mlp.experts(hidden, top_k_index,
  top_k_weights)``, the ``transformers`` 5 interface), built with ``num_experts / ep``
  experts, on every token routed ``top_k`` ways round-robin over them: balanced, as the cost
  model assumes. Its gathering and scattering of tokens run inside it, so the permutation's
  time is in the experts' measurement, not the layer's (at a measured shard the two still add
  up to the layer).

The embedding is ``nn.Embedding`` as in every ``transformers`` model; the head is the model's
final norm class, the output layer and ``transformers``' causal-LM loss (logits upcast to fp32).

Imports ``transformers`` and PyTorch: only :mod:`planner.diagnose.profile_torch` imports it,
once both are known to be there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.loss.loss_utils import ForCausalLMLoss

from planner.diagnose.faithful_layers import Embedding
from planner.errors import InputError
from planner.spec import ModelSpec
from planner.spec.hf import hf_key

INIT_STD = 0.02
"""The standard deviation random weights are drawn with (``initializer_range``'s usual
value): ``transformers`` leaves some expert weights uninitialised until a checkpoint loads."""


def _randomised(module: nn.Module) -> nn.Module:
    """``module`` with every matrix drawn at :data:`INIT_STD` (vectors, norms' and biases,
    kept as built)."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.normal_(0.0, INIT_STD)
    return module


class _Positioned(nn.Module):
    """A ``transformers`` decoder layer called as a training forward calls it: positions
    0..seq-1, the rotary embedding's cosines and sines, no mask (causal SDPA)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, seq, hidden]`` in, the same out."""
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        out = self.layer(x, attention_mask=None, position_ids=positions,
                         position_embeddings=self.rotary(x, positions))  # fmt: skip
        return out[0] if isinstance(out, tuple) else out


class _Weighted(nn.Module):
    """In place of an experts module: each token times its routing weights' sum, so the
    router's backward runs and no expert computes."""

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The ``transformers`` experts' interface."""
        del top_k_index
        return hidden * top_k_weights.sum(dim=-1, keepdim=True).to(hidden.dtype)


class _Balanced(nn.Module):
    """A ``transformers`` experts module on balanced routing: token ``t``'s ``j``-th choice is
    expert ``(t * top_k + j) mod experts``, each weight ``1 / top_k``."""

    def __init__(self, experts: nn.Module, count: int, top_k: int) -> None:
        super().__init__()
        self.experts, self.count, self.top_k = experts, count, top_k

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[tokens, hidden]`` in, the same out."""
        tokens = hidden.shape[0]
        index = torch.arange(tokens * self.top_k, device=hidden.device) % self.count
        index = index.view(tokens, self.top_k)
        weights = torch.full((tokens, self.top_k), 1.0 / self.top_k, device=hidden.device)
        return self.experts(hidden, index, weights)


class _Head(nn.Module):
    """The model's final norm, the output layer over ``vocab`` entries and ``transformers``'
    causal-LM loss."""

    def __init__(self, norm: nn.Module, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm, self.vocab = norm, vocab
        self.output = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean loss of hidden states ``x`` against ``labels``."""
        return ForCausalLMLoss(self.output(self.norm(x)), labels, vocab_size=self.vocab)


class TransformersCode:
    """``transformers``' layers of one model, built at a shard for ``planner profile``."""

    def __init__(self, model: ModelSpec, config: Mapping[str, Any]) -> None:
        self.model, self.config = model, dict(config)
        self.model_type = str(config.get("model_type", ""))
        self.name = f"transformers {transformers.__version__}"
        try:
            with torch.device("meta"):  # the classes only: nothing allocated
                built = AutoModelForCausalLM.from_config(self._shard(1, layers=1))
        except (ValueError, KeyError) as exc:
            raise InputError(f"transformers cannot build {model.name} "
                             f"({self.model_type}): {exc}") from None  # fmt: skip
        inner = getattr(built, "model", None)
        if inner is None or not hasattr(inner, "layers"):
            raise InputError(f"--framework transformers: {self.model_type} models keep their "
                             "layers elsewhere than model.layers; the faithful layer runs "
                             "without --framework")  # fmt: skip
        self.layer_class = type(inner.layers[0])
        self.rotary_class = type(inner.rotary_emb)
        self.norm_class = type(inner.norm)

    def _shard(self, tensor_parallel: int, *, layers: int | None = None,
               experts: int | None = None) -> Any:  # fmt: skip
        """The config of one tensor-parallel rank's layer: heads, KV heads and FFN widths
        divided, the head dimension kept; ``experts`` routed experts where given."""
        m, fields = self.model, dict(self.config)
        divided = {hf_key(self.model_type, field) for field in (
            "num_attention_heads", "num_query_groups", "ffn_hidden_size", "moe.ffn_hidden_size",
            "moe.shared_ffn_hidden_size")}  # fmt: skip
        for key in divided:
            # a width (a shared experts' count, DeepSeek's, scales a width divided already)
            if ("heads" in key or key.endswith("_size")) and isinstance(fields.get(key), int):
                fields[key] //= tensor_parallel
        if m.mla is None:
            fields["head_dim"] = m.head_dim
        if layers is not None:
            fields["num_hidden_layers"] = layers
        if experts is not None:
            fields[hf_key(self.model_type, "moe.num_experts")] = experts
        fields.pop("quantization_config", None)  # a checkpoint's, not the layer's
        config = AutoConfig.for_model(**fields)
        config._attn_implementation = "sdpa"
        config._experts_implementation = "eager"  # the experts' loop, as an eager model runs
        return config

    def embedding(self, tensor_parallel: int) -> nn.Module:
        """``nn.Embedding`` over ``vocab / tensor_parallel`` entries."""
        return Embedding(self.model, tensor_parallel)

    def layer(self, kind: str, tensor_parallel: int) -> nn.Module:
        """The model's decoder layer of ``kind`` (``dense`` or ``moe``) at the shard, called
        with its positions; an MoE layer's experts replaced (the module docstring says why)."""
        m = self.model
        index = next(i for i in range(m.num_layers) if m.is_moe_layer(i) == (kind == "moe"))
        config = self._shard(tensor_parallel, layers=index + 1)
        layer = _randomised(self.layer_class(config, layer_idx=index))
        if kind == "moe":
            layer.mlp.experts = _Weighted()
        return _Positioned(layer, self.rotary_class(config))

    def experts(self, tensor_parallel: int, expert_parallel: int,
                tokens: int) -> tuple[nn.Module, tuple[int, ...]]:  # fmt: skip
        """The model's experts module with ``num_experts / expert_parallel`` experts, on
        ``tokens`` routed ``top_k`` ways over them (balanced), and its input's shape."""
        moe = self.model.moe
        assert moe is not None  # only an MoE model's cases have experts
        local = moe.num_experts // expert_parallel
        index = next(i for i in range(self.model.num_layers) if self.model.is_moe_layer(i))
        config = self._shard(tensor_parallel, layers=index + 1, experts=local)
        with torch.device("meta"):
            experts_class = type(self.layer_class(config, layer_idx=index).mlp.experts)
        experts = _randomised(experts_class(config))
        return _Balanced(experts, local, moe.top_k), (tokens, self.model.hidden_size)

    def head(self, tensor_parallel: int) -> nn.Module:
        """The model's final norm, the output layer over ``vocab / tensor_parallel`` entries
        and the causal-LM loss."""
        m = self.model
        norm = self.norm_class(m.hidden_size, eps=m.norm_epsilon)
        return _Head(norm, m.hidden_size, m.vocab_size // tensor_parallel)
