"""A framework's own eager decoder layer against the stack the planner prices it on: the bytes
its forward keeps for the backward and the bytes its memory-bound kernels move, from the layer
the framework builds run once on this machine's CPU, beside the planner's count of the same
layer:

- ``--code torchtitan``: torchtitan's ``TransformerBlock`` (v0.2.2), in bf16 as FSDP2 gathers
  it: the ``torchtitan-eager`` stack;
- ``--code transformers``: Hugging Face's ``LlamaDecoderLayer`` cast to bf16, as Colossal-AI's
  ``HybridParallelModule`` casts it: the ``colossalai-hf`` stack.

Needs PyTorch and the framework (torchtitan 0.2.2 imports triton: ``pip install -e
'.[torchtitan]'``; ``'.[transformers]'``). Run from the repository root (a minute on two
cores):

    python benchmarks/eager_layer_bytes.py [--code torchtitan|transformers]
        [--model instances/models/llama3-8b.json] [--seq-len 512]

What is counted:

- kept: every distinct storage the layer's forward saves for its backward
  (``torch.autograd.graph.saved_tensors_hooks``), its parameters' and buffers' apart and the
  rotary embedding's cosines and sines (computed once for all layers) apart;
- moved: the bytes read and written by every op that is not a matmul, attention or a view,
  forward and backward (``TorchDispatchMode``), an input broadcast against the output (a
  norm's weight, the rotary frequencies) not counted;
- kernels: those ops, one launch each, against the stack's kernel counts (what a launch-bound
  layer is priced on).

Each is split into the two norms and the rest. torchtitan's ``nn.RMSNorm`` is PyTorch's fused
kernel on CUDA (it keeps its bf16 input and a value a token, and the planner prices it as the
op's own bytes), composite in fp32 on a CPU: its rows are shown, not compared. Hugging Face's
RMSNorm is written out and runs the same ops on both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from planner.graph.lower import lower
from planner.spec import ModelSpec, TrainingSpec
from planner.spec.reading import load_model
from planner.vocabulary import Stack

VIEWS = {"view", "_unsafe_view", "t", "transpose", "detach", "expand", "view_as_complex",
         "view_as_real", "slice", "_conj", "alias", "reshape", "unsqueeze", "squeeze",
         "permute", "select", "split", "split_with_sizes", "as_strided", "unbind",
         "ones_like", "zeros_like", "empty_like"}  # fmt: skip
"""Ops that move no data (or only make a constant), by their ``aten`` name."""
COMPUTE = ("mm", "bmm", "addmm", "_scaled_dot_product")
"""Ops the planner prices as GEMMs or attention, by the start of their ``aten`` name."""
STACKS: dict[str, Stack] = {"torchtitan": "torchtitan-eager", "transformers": "colossalai-hf"}
"""Whose layer, and the stack the planner prices it on."""
WHOSE = {"torchtitan": "torchtitan's block", "transformers": "transformers' layer"}


def _tensors(value: Any, torch: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, torch)]
    return []


def _broadcast(t: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``t`` is expanded to ``shape`` (fewer dims, or a dim of 1 where it is wider)."""
    if t.dim() < len(shape):
        return True
    return any(a == 1 < b for a, b in zip(t.shape[-len(shape):], shape, strict=False))


class _Tagged:
    """Which part of the layer runs now: ``norm`` inside one of its norms, else ``rest``."""

    def __init__(self) -> None:
        self.part = "rest"

    def hook(self, module: Any) -> None:
        """Tag the forward and backward of ``module`` as ``norm``."""

        def enter(*_: Any) -> None:
            self.part = "norm"

        def leave(*_: Any) -> None:
            self.part = "rest"

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)
        module.register_full_backward_pre_hook(enter)
        module.register_full_backward_hook(leave)


def _moved_bytes(torch: Any, tagged: _Tagged, totals: dict[str, float]) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Moved(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name in VIEWS or name.startswith(COMPUTE):
                return out
            outs = _tensors(out, torch)
            shape = max((tuple(t.shape) for t in outs), key=len, default=())
            ins = [t for t in _tensors(args, torch) if not _broadcast(t, shape)]
            moved = sum(t.numel() * t.element_size() for t in (*ins, *outs))
            totals[tagged.part] = totals.get(tagged.part, 0.0) + moved
            kernels = f"{tagged.part} kernels"
            totals[kernels] = totals.get(kernels, 0.0) + 1
            return out

    return Moved()


@contextmanager
def _kept(torch: Any, module: Any, constants: tuple[Any, ...], tagged: _Tagged,
          totals: dict[str, float]) -> Iterator[None]:  # fmt: skip
    skip = {t.untyped_storage().data_ptr()
            for t in (*module.parameters(), *module.buffers(), *constants)}  # fmt: skip
    seen: dict[int, tuple[str, int]] = {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip and storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = (tagged.part, storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    for part, size in seen.values():
        totals[part] = totals.get(part, 0.0) + size


def _layer(code: str, model: ModelSpec, seq_length: int, torch: Any) -> tuple[Any, Any, tuple]:
    """The framework's layer in bf16, a call of it on hidden states, its norms (and q/k norms)
    and the constants it is called with."""
    if code == "torchtitan":
        from planner.diagnose.titan_layers import TorchtitanCode

        rotated = TorchtitanCode(model).layer("dense", 1)
        for p in rotated.parameters():  # FSDP2 casts the parameters, not the frequencies
            p.data = p.data.to(torch.bfloat16)
        block, attention = rotated.block, rotated.block.attention
        # Qwen3's block (q/k norms) norms q and k per head as well
        qk = tuple(n for n in (getattr(attention, "q_norm", None),
                               getattr(attention, "k_norm", None)) if n is not None)  # fmt: skip
        return rotated, (block.attention_norm, block.ffn_norm, *qk), ()
    from transformers import AutoConfig, AutoModelForCausalLM

    # Qwen3's layer is Llama's with per-head RMSNorms on q and k
    config = AutoConfig.for_model(
        "qwen3" if model.qk_layernorm else "llama", hidden_size=model.hidden_size,
        intermediate_size=model.ffn, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.query_groups, head_dim=model.head_dim, num_hidden_layers=1,
        max_position_embeddings=seq_length, rms_norm_eps=model.norm_epsilon,
        rope_theta=model.rotary_base, vocab_size=16)  # fmt: skip
    config._attn_implementation = "sdpa"
    with torch.device("meta"):  # the classes only
        built = AutoModelForCausalLM.from_config(config).model
    LlamaDecoderLayer, LlamaRotaryEmbedding = type(built.layers[0]), type(built.rotary_emb)
    layer = LlamaDecoderLayer(config, 0).to(torch.bfloat16)
    attention = layer.self_attn
    qk_norms = (attention.q_norm, attention.k_norm) if model.qk_layernorm else ()
    positions = torch.arange(seq_length).unsqueeze(0)
    probe = torch.zeros(1, seq_length, model.hidden_size, dtype=torch.bfloat16)
    cos, sin = LlamaRotaryEmbedding(config)(probe, positions)

    def call(x: Any) -> Any:
        out = layer(x, attention_mask=None, position_ids=positions, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out

    layer.call = call
    return layer, (layer.input_layernorm, layer.post_attention_layernorm, *qk_norms), (cos, sin)


def measure(code: str, model: ModelSpec, seq_length: int) -> dict[str, dict[str, float]]:
    """The framework's layer of ``model`` run once on ``seq_length`` tokens in bf16: bytes
    kept, moved forward and moved backward, each by part (``norm``, ``rest``)."""
    import torch

    torch.manual_seed(0)
    layer, norms, constants = _layer(code, model, seq_length, torch)
    tagged = _Tagged()
    for norm in norms:
        tagged.hook(norm)
    totals: dict[str, dict[str, float]] = {"kept": {}, "forward": {}, "backward": {}}
    x = torch.randn(1, seq_length, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    call = getattr(layer, "call", layer)
    with (_kept(torch, layer, constants, tagged, totals["kept"]),
          _moved_bytes(torch, tagged, totals["forward"])):  # fmt: skip
        out = call(x)
    with _moved_bytes(torch, tagged, totals["backward"]):
        out.backward(torch.ones_like(out))
    return totals


def priced(model: ModelSpec, seq_length: int, stack: Stack) -> dict[str, dict[str, float]]:
    """The planner's decoder layer on ``stack``, in the parts :func:`measure` gives (a norm
    with no separate kernels moves nothing here: one fused kernel, priced as the op)."""
    training = TrainingSpec(seq_length=seq_length, global_batch_size=1, precision="bf16",
                            stack=stack)  # fmt: skip
    graph = lower(model.model_copy(update={"num_layers": 1}), training)
    ops = [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 1]
    totals: dict[str, dict[str, float]] = {"kept": {}, "forward": {}, "backward": {}}
    for op in ops:
        part = "norm" if op.kind == "norm" else "rest"
        # SDPA's flash kernel keeps no scores: the op's score tensors are an unfused core's
        kept = sum(t.bytes for t in op.saved)
        totals["kept"][part] = totals["kept"].get(part, 0.0) + kept
        for passed in ("forward", "backward"):
            moved = sum(t.bytes for t in getattr(op.unfused, passed)) if op.unfused else 0.0
            totals[passed][part] = totals[passed].get(part, 0.0) + moved
            launched = getattr(op.unfused, f"{passed}_kernels") if op.unfused else 0
            kernels = f"{part} kernels"
            totals[passed][kernels] = totals[passed].get(kernels, 0.0) + launched
    return totals


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", choices=sorted(STACKS), default="torchtitan")
    parser.add_argument("--model", type=Path, default=Path("instances/models/llama3-8b.json"))
    parser.add_argument("--seq-len", type=int, default=512, help="tokens (512)")
    options = parser.parse_args()
    model = load_model(options.model)
    try:
        measured = measure(options.code, model, options.seq_len)
    except ImportError as exc:
        sys.exit(f"needs PyTorch and {options.code} (pip install -e '.[{options.code}]'): {exc}")
    stack = STACKS[options.code]
    count = priced(model, options.seq_len, stack)
    tokens = options.seq_len
    print(f"{model.name}: {WHOSE[options.code]} on {tokens} tokens in bf16 against {stack}")
    print(f"bytes a token {'':19s} {'measured':>10s} {'planner':>9s} {'error':>7s}")
    fused = stack == "torchtitan-eager"
    for what in ("kept", "forward", "backward"):
        for part in ("norm", "rest"):
            where = "norms" if part == "norm" else "the rest"
            label = f"{'moved ' if what != 'kept' else ''}{what}, {where}"
            got, want = measured[what].get(part, 0.0), count[what].get(part, 0.0)
            shown = "(fused)" if fused and part == "norm" else f"{want / got - 1:+7.1%}"
            print(f"{label:33s} {got / tokens:10,.0f} {want / tokens:9,.0f} {shown:>7s}")
    print(f"kernels a layer {'':17s} {'measured':>10s} {'planner':>9s}")
    for what in ("forward", "backward"):
        for part in ("norm", "rest"):
            where = "norms" if part == "norm" else "the rest"
            got = measured[what].get(f"{part} kernels", 0.0)
            want = count[what].get(f"{part} kernels", 0.0)
            shown = "(fused)" if fused and part == "norm" else ""
            print(f"{what + ', ' + where:33s} {got:10.0f} {want:9.0f} {shown:>7s}")
    if fused:
        print("(torchtitan's norms: composite fp32 on the CPU; the planner counts CUDA's fused\n"
              " kernel, which keeps its bf16 input and a value a token)")


if __name__ == "__main__":
    main()
