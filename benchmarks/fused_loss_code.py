"""What Megatron-Core's fused cross entropy compiles to: the loops Inductor generates for the
four functions of ``megatron/core/fusions/fused_cross_entropy.py`` (``--cross-entropy-loss-fusion``,
its native implementation), from which ``planner/graph/unfused.py`` counts the bytes a logit the
``-fused-loss`` stacks price (22 forward, 18 backward) and ``planner/graph/stacks.py`` the clone
of the softmax their backward holds.

For each function: the kernels Inductor generated, each loop over the logits (its trip count)
and the loads and stores in it, so that what walks the ``tokens x vocab`` logits, and in which
type, can be read off. Run on the CPU (``torch.compile``'s C++ backend: the same graph, the
same buffers and copies as on a GPU; the CPU runs the upcast and the maximum as two passes where
a GPU reduction stores the upcast as it reduces). Needs Megatron-LM's source and PyTorch, in
the Python Megatron-LM asks for (3.12), not the planner's environment:

    /tmp/mvenv12/bin/python benchmarks/fused_loss_code.py --megatron /tmp/megatron
"""

from __future__ import annotations

import argparse
import re
import sys

TOKENS, VOCAB = 512, 4096
"""A small slice of logits: every loop over them runs ``TOKENS * VOCAB`` elements."""

_LINES = re.compile(r"for\(int64_t|loadu\(|\.store\(|out_ptr\d+\[|in_ptr\d+\[|empty_strided_cpu\(")


def main() -> None:
    """Print each function's generated loops, loads and stores, and its buffers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron", required=True, help="a Megatron-LM checkout")
    args = parser.parse_args()
    sys.path.insert(0, args.megatron)
    import torch
    from megatron.core.fusions import fused_cross_entropy as fused
    from torch._inductor.utils import run_and_get_code

    logits = torch.randn(TOKENS, 1, VOCAB, dtype=torch.bfloat16)
    target = torch.randint(0, VOCAB, (TOKENS, 1))

    def show(name: str, fn, *inputs):  # type: ignore[no-untyped-def]
        out, sources = run_and_get_code(fn, *inputs)
        print(f"== {name}: {len(sources)} graph(s)")
        for source in sources:
            for line in source.splitlines():
                if _LINES.search(line):
                    print("   ", line.strip()[:110])
        return out

    upcast, maximum = show("calculate_logits_max", fused.calculate_logits_max, logits)
    mask, masked, sums, exp = show("calculate_predicted_logits",
                                   fused.calculate_predicted_logits, upcast, target, maximum, 0,
                                   VOCAB)  # fmt: skip
    softmax, _ = show("calculate_cross_entropy_loss", fused.calculate_cross_entropy_loss, exp, sums)
    show("calculate_gradients", fused.calculate_gradients, softmax, torch.ones(TOKENS, 1), mask,
         masked)  # fmt: skip


if __name__ == "__main__":
    main()
