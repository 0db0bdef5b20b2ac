"""What a compiled loss compiles to: the loops Inductor generates for

- ``--code megatron``: the four functions of Megatron-Core's fused cross entropy
  (``megatron/core/fusions/fused_cross_entropy.py``, ``--cross-entropy-loss-fusion``, its native
  implementation), from which ``planner/graph/unfused.py`` counts the bytes a logit the
  ``-fused-loss`` stacks price (22 forward, 18 backward) and ``planner/graph/stacks.py`` the
  clone of the softmax their backward holds;
- ``--code torchtitan``: torchtitan's ``cross_entropy_loss`` (``torchtitan/components/loss.py``,
  v0.2.2) under ``torch.compile``, forward and backward, as ``compile.components`` compiles it
  by default, from which the ``torchtitan-compiled`` stack counts its loss (2 bytes a logit
  forward on a GPU, 4 backward; the bf16 logits kept and the bf16 gradient its one buffer).

For each graph: the kernels Inductor generated, each loop over the logits (its trip count) and
the loads and stores in it, and its buffers, so that what walks the ``tokens x vocab`` logits,
and in which type, can be read off. Run on the CPU (``torch.compile``'s C++ backend: the same
graph, the same buffers and copies as on a GPU; the CPU runs a row's maximum and its sum of
exponentials as two passes, where a GPU reduction stores the upcast as it reduces and Triton's
online softmax takes both in one). Megatron's needs Megatron-LM's source, in the Python it asks
for (3.12), not the planner's environment; torchtitan's the ``[torchtitan]`` extra:

    /tmp/mvenv12/bin/python benchmarks/fused_loss_code.py --code megatron --megatron /tmp/megatron
    python benchmarks/fused_loss_code.py --code torchtitan
"""

from __future__ import annotations

import argparse
import re
import sys

TOKENS, VOCAB = 512, 4096
"""A small slice of logits: every loop over them runs ``TOKENS * VOCAB`` elements."""

_LINES = re.compile(r"for\(int64_t|loadu\(|\.store\(|out_ptr\d+\[|in_ptr\d+\[|empty_strided_cpu\(")


def _show(name: str, fn, *inputs):  # type: ignore[no-untyped-def]
    """Run ``fn`` compiled on ``inputs`` and print the loops, loads, stores and buffers of the
    code Inductor generated for it."""
    from torch._inductor.utils import run_and_get_code

    out, sources = run_and_get_code(fn, *inputs)
    print(f"== {name}: {len(sources)} graph(s)")
    for source in sources:
        for line in source.splitlines():
            if _LINES.search(line):
                print("   ", line.strip()[:110])
    return out


def megatron(checkout: str) -> None:
    """Megatron-Core's four fused functions, each as ``jit_fuser`` compiles it."""
    sys.path.insert(0, checkout)
    import torch
    from megatron.core.fusions import fused_cross_entropy as fused

    logits = torch.randn(TOKENS, 1, VOCAB, dtype=torch.bfloat16)
    target = torch.randint(0, VOCAB, (TOKENS, 1))
    upcast, maximum = _show("calculate_logits_max", fused.calculate_logits_max, logits)
    mask, masked, sums, exp = _show("calculate_predicted_logits",
                                    fused.calculate_predicted_logits, upcast, target, maximum, 0,
                                    VOCAB)  # fmt: skip
    softmax, _ = _show("calculate_cross_entropy_loss", fused.calculate_cross_entropy_loss, exp,
                       sums)  # fmt: skip
    _show("calculate_gradients", fused.calculate_gradients, softmax, torch.ones(TOKENS, 1), mask,
          masked)  # fmt: skip


def torchtitan() -> None:
    """torchtitan's loss under ``torch.compile``: its forward and backward graphs."""
    import torch
    from torchtitan.components.loss import cross_entropy_loss

    compiled = torch.compile(cross_entropy_loss)
    logits = torch.randn(1, TOKENS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, VOCAB, (1, TOKENS))
    _show("cross_entropy_loss, forward and backward",
          lambda: compiled(logits, target).backward())  # fmt: skip


def main() -> None:
    """Print each function's generated loops, loads and stores, and its buffers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", choices=("megatron", "torchtitan"), default="megatron")
    parser.add_argument("--megatron", help="a Megatron-LM checkout (--code megatron)")
    args = parser.parse_args()
    if args.code == "torchtitan":
        torchtitan()
    elif args.megatron is None:
        parser.error("--code megatron needs --megatron, a Megatron-LM checkout")
    else:
        megatron(args.megatron)


if __name__ == "__main__":
    main()
