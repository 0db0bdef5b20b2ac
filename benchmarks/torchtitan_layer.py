"""torchtitan's own decoder block against the ``torchtitan-eager`` stack's count: the bytes its
forward keeps for the backward and the bytes its memory-bound kernels move, from the block
torchtitan builds (``torchtitan/models/llama3/model/model.py``) run once in bf16 on this
machine's CPU, beside what the planner prices for the same layer.

Needs torchtitan (0.2.2; it imports triton, so on a CPU machine ``pip install torchtitan==0.2.2
triton``) and PyTorch. Run from the repository root (a minute on two cores):

    python benchmarks/torchtitan_layer.py [--flavor 8B] [--seq-len 512]

What is counted:

- kept: every distinct storage the block's forward saves for its backward
  (``torch.autograd.graph.saved_tensors_hooks``), its parameters' and the rotary embedding's
  constant frequency table apart;
- moved: the bytes read and written by every kernel that is not a matmul, attention or a view,
  forward and backward (``TorchDispatchMode``), inputs smaller than the output (broadcast
  operands: a norm's weight, the frequencies) not counted.

Both are split into the two ``nn.RMSNorm`` calls and the rest. On CUDA, ``nn.RMSNorm`` on a
bf16 input and weight is one fused kernel (``_fused_rms_norm``) that keeps its bf16 input and
one value a token; on the CPU the same call runs composite in fp32 and keeps more. So the rest
is compared with the planner's count, and the norms are shown beside what the fused kernel
keeps.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from planner.graph.lower import lower
from planner.spec import ModelSpec, TrainingSpec

VIEWS = {"view", "_unsafe_view", "t", "transpose", "detach", "expand", "view_as_complex",
         "view_as_real", "slice", "_conj", "alias", "reshape", "unsqueeze", "squeeze",
         "permute", "select", "split", "split_with_sizes", "as_strided", "unbind",
         "ones_like", "zeros_like", "empty_like"}  # fmt: skip
"""Ops that move no data (or only make a constant), by their ``aten`` name."""
COMPUTE = ("mm", "bmm", "addmm", "_scaled_dot_product")
"""Ops the planner prices as GEMMs or attention, by the start of their ``aten`` name."""


def _tensors(value: Any, torch: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, torch)]
    return []


class _Tagged:
    """Which part of the block runs now: ``norm`` inside an ``nn.RMSNorm``, else ``rest``."""

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
            size = max((t.numel() for t in outs), default=0)
            ins = [t for t in _tensors(args, torch) if t.numel() >= size]
            moved = sum(t.numel() * t.element_size() for t in (*ins, *outs))
            totals[tagged.part] = totals.get(tagged.part, 0.0) + moved
            return out

    return Moved()


@contextmanager
def _kept(torch: Any, module: Any, constant: Any, tagged: _Tagged,
          totals: dict[str, float]) -> Iterator[None]:  # fmt: skip
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
    skip.add(constant.untyped_storage().data_ptr())
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


def measure(flavor: str, seq_length: int) -> tuple[ModelSpec, dict[str, float], dict[str, float],
                                                   dict[str, float]]:  # fmt: skip
    """torchtitan's block of ``flavor`` run once on ``seq_length`` tokens: the model it is, the
    bytes kept, moved forward and moved backward, each by part (``norm``, ``rest``)."""
    import torch
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import TransformerBlock, precompute_freqs_cis

    args = llama3_args[flavor]
    torch.manual_seed(0)
    with torch.device("cpu"):
        block = TransformerBlock(0, args).to(torch.bfloat16)
    head_dim = args.dim // args.n_heads
    freqs = precompute_freqs_cis(head_dim, seq_length, args.rope_theta, args.rope_scaling_args)
    model = ModelSpec(
        name=f"torchtitan llama3 {flavor}", num_layers=1, hidden_size=args.dim,
        num_attention_heads=args.n_heads, num_query_groups=args.n_kv_heads or args.n_heads,
        ffn_hidden_size=block.feed_forward.w1.out_features, vocab_size=args.vocab_size,
        max_position_embeddings=seq_length, activation="swiglu", normalization="rmsnorm",
        position_embedding="rope", bias=False,
    )  # fmt: skip
    tagged = _Tagged()
    tagged.hook(block.attention_norm)
    tagged.hook(block.ffn_norm)
    kept: dict[str, float] = {}
    forward: dict[str, float] = {}
    backward: dict[str, float] = {}
    x = torch.randn(1, seq_length, args.dim, dtype=torch.bfloat16, requires_grad=True)
    with _kept(torch, block, freqs, tagged, kept), _moved_bytes(torch, tagged, forward):
        out = block(x, freqs, None)
    grad = torch.ones_like(out)
    with _moved_bytes(torch, tagged, backward):
        out.backward(grad)
    return model, kept, forward, backward


def priced(model: ModelSpec, seq_length: int) -> tuple[float, float, float, float]:
    """The planner's ``torchtitan-eager`` decoder layer: bytes its norms keep, bytes the rest
    keeps, and bytes its separate kernels move forward and backward (the norms' one fused
    kernel each priced by the op itself, not among them)."""
    training = TrainingSpec(seq_length=seq_length, global_batch_size=1, precision="bf16",
                            stack="torchtitan-eager")  # fmt: skip
    graph = lower(model, training)
    ops = [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 1]
    norms = sum(t.bytes for op in ops if op.kind == "norm" for t in op.saved)
    # SDPA's flash kernel keeps no scores: the op's score tensors are an unfused core's
    rest = sum(t.bytes for op in ops if op.kind != "norm" for t in op.saved)
    forward = sum(t.bytes for op in ops if op.unfused for t in op.unfused.forward)
    backward = sum(t.bytes for op in ops if op.unfused for t in op.unfused.backward)
    return norms, rest, forward, backward


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flavor", default="8B", help="torchtitan's llama3 flavor (8B)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens (512)")
    options = parser.parse_args()
    try:
        model, kept, forward, backward = measure(options.flavor, options.seq_len)
    except ImportError as exc:
        sys.exit(f"needs torchtitan 0.2.2 and PyTorch (pip install torchtitan==0.2.2 triton): "
                 f"{exc}")
    norms, rest, moved_forward, moved_backward = priced(model, options.seq_len)
    tokens = options.seq_len
    print(f"{model.name}: one decoder block, {tokens} tokens, bf16, bytes a token")
    print(f"{'':34s} {'torchtitan':>11s} {'planner':>9s} {'error':>7s}")
    rows = [("kept, outside the norms", kept.get("rest", 0.0), rest),
            ("moved forward, outside the norms", forward.get("rest", 0.0), moved_forward),
            ("moved backward, outside the norms", backward.get("rest", 0.0), moved_backward)]
    for label, measured, count in rows:
        print(f"{label:34s} {measured / tokens:11,.0f} {count / tokens:9,.0f} "
              f"{count / measured - 1:+7.1%}")
    print(f"{'kept by the two norms':34s} {kept.get('norm', 0.0) / tokens:11,.0f} "
          f"{norms / tokens:9,.0f}")
    print("(the norms: composite fp32 on the CPU; the planner counts CUDA's fused kernel,\n"
          " which keeps its bf16 input and a value a token)")


if __name__ == "__main__":
    main()
