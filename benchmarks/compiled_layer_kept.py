"""What a decoder layer under ``torch.compile`` keeps for its backward, read off the compiled
function Inductor builds, against the compiled stacks' count:

- ``--code torchtitan``: torchtitan's ``TransformerBlock`` (v0.2.2) in bf16, compiled as
  ``apply_compile`` compiles it (``fullgraph=True``): the ``torchtitan-compiled`` stack; with
  ``--op-sac``, under its per-operator selective checkpointing first, as torchtitan applies
  it before compiling (``_apply_op_sac``): the recompute module ``op`` on that stack;
- ``--code transformers``: Hugging Face's ``LlamaDecoderLayer`` under bf16 autocast with fp32
  weights, compiled, as ``../shared/validation/h100/scripts/real_layer.py`` ran it on the H100:
  the ``hf-compiled`` stack, and the bytes that script measured on the GPU
  (``../shared/validation/h100/layers.jsonl``), a check that the partitioner chooses on this
  CPU what it chose there.

Inductor's partitioner (``min_cut_rematerialization_partition``) decides what the forward
saves from the joint graph, before any code is generated: the same graph on either device. The
tensors it saved are the backward node's ``saved_tensors``, counted by storage, the layer's
parameters and the rotary tables apart; autocast's bf16 copies of Hugging Face's fp32 weights
are counted, as the planner counts them (a layer's, not a token's: compare Hugging Face's
layer at the H100's 8,192 tokens).

Needs PyTorch and the framework (``pip install -e '.[torchtitan]'`` or ``'.[transformers]'``).
Run from the repository root (Llama 3 8B's block on 1,024 tokens: half a minute on two cores;
Hugging Face's Llama 3.2 1B layer on 8,192, a minute):

    python benchmarks/compiled_layer_kept.py [--code torchtitan|transformers] [--model M]
        [--seq-len S] [--tp 1] [--op-sac]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from planner.diagnose.layer_memory import measured_layer_models
from planner.spec import ModelSpec
from planner.spec.reading import load_model
from planner.vocabulary import Stack

STACKS: dict[str, Stack] = {"torchtitan": "torchtitan-compiled", "transformers": "hf-compiled"}
"""Whose layer, and the stack the planner prices it on."""
MEASURED = Path("../shared/validation/h100/layers.jsonl")
RUNS_ONE_GPU = Path("../shared/validation/h100/runs_one_gpu.json")


def _saved(out: Any, skip: set[int], torch: Any) -> dict[int, int]:
    """Bytes of every storage the autograd graph behind ``out`` keeps, by storage."""
    seen: dict[int, int] = {}
    stack, done = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in done:
            continue
        done.add(node)
        saved = list(getattr(node, "saved_tensors", ()) or ())
        saved += [getattr(node, a) for a in dir(node) if a.startswith("_saved_")]
        for tensor in saved:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in skip:
                    seen[storage.data_ptr()] = storage.nbytes()
        stack += [n for n, _ in node.next_functions]
    return seen


def measure(code: str, model: ModelSpec, seq_length: int, tensor_parallel: int,
            op_sac: bool = False) -> float:  # fmt: skip
    """Bytes a token the compiled layer of ``model`` keeps on ``seq_length`` tokens (under
    torchtitan's per-operator checkpointing where ``op_sac``)."""
    import torch

    torch.manual_seed(0)
    if code == "torchtitan":
        from planner.diagnose.titan_layers import TorchtitanCode

        rotated = TorchtitanCode(model).layer("dense", tensor_parallel)
        for p in rotated.parameters():  # FSDP2 gathers bf16 weights; the frequencies stay
            p.data = p.data.to(torch.bfloat16)
        if op_sac:
            from torchtitan.config.job_config import ActivationCheckpoint
            from torchtitan.distributed.activation_checkpoint import _apply_op_sac
            from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

            # the CPU's flash attention stands for CUDA's in the save list
            cpu_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
            rotated.block = _apply_op_sac(
                rotated.block, ActivationCheckpoint(mode="selective", selective_ac_option="op"),
                base_fqn="layers.0", op_sac_save_list={*_op_sac_save_list, cpu_flash})
        rotated.block = torch.compile(rotated.block, fullgraph=True)
        x = torch.randn(1, seq_length, model.hidden_size, dtype=torch.bfloat16,
                        requires_grad=True)  # fmt: skip
        constants = (*rotated.parameters(), *rotated.buffers())

        def call() -> Any:
            return rotated(x)
    else:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )

        config = LlamaConfig(hidden_size=model.hidden_size, intermediate_size=model.ffn,
                             num_attention_heads=model.num_attention_heads,
                             num_key_value_heads=model.query_groups, num_hidden_layers=1,
                             max_position_embeddings=seq_length, rope_theta=model.rotary_base,
                             vocab_size=16, use_cache=False)  # fmt: skip
        config._attn_implementation = "sdpa"
        layer = LlamaDecoderLayer(config, layer_idx=0)
        compiled = torch.compile(layer)
        x = torch.randn(1, seq_length, model.hidden_size, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rope = LlamaRotaryEmbedding(config)(x, torch.arange(seq_length).unsqueeze(0))
        rope = tuple(t.detach() for t in rope)
        constants = (*layer.parameters(), *rope)

        def call() -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = compiled(x, position_embeddings=rope, attention_mask=None)
            return out[0] if isinstance(out, tuple) else out

    call().float().sum().backward()  # compile and warm up
    out = call()
    skip = {t.untyped_storage().data_ptr() for t in constants}
    skip.add(out.untyped_storage().data_ptr())
    return sum(_saved(out, skip, torch).values()) / seq_length


def priced(model: ModelSpec, seq_length: int, stack: Stack, tensor_parallel: int,
           op_sac: bool = False) -> float:  # fmt: skip
    """Bytes a token the planner's decoder layer on ``stack`` keeps, at one rank's share of
    ``tensor_parallel`` (heads and FFN divided, the residual stream whole, as the shard runs);
    under the recompute module ``op`` where ``op_sac``."""
    from planner.graph.lower import lower
    from planner.spec import TrainingSpec

    if op_sac:
        from planner.diagnose.titan_sac import priced_op_sac
        from planner.spec.reading import load_cluster

        cluster = load_cluster(Path("instances/clusters/dgx-h100-80gb.json"), nodes=1)
        return priced_op_sac(model, cluster, seq_length, tensor_parallel,
                             stack=stack).kept_bytes / seq_length  # fmt: skip

    shard = model.model_copy(update={
        "num_layers": 1, "num_attention_heads": model.num_attention_heads // tensor_parallel,
        "num_query_groups": model.query_groups // tensor_parallel,
        "ffn_hidden_size": model.ffn // tensor_parallel,
        "kv_channels": model.head_dim})  # fmt: skip
    training = TrainingSpec(seq_length=seq_length, global_batch_size=1, precision="bf16",
                            stack=stack)  # fmt: skip
    graph = lower(shard, training)
    ops = [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 1]
    return sum(t.bytes for op in ops for t in op.saved) / seq_length


def on_the_h100(model: ModelSpec, tokens: int) -> float | None:
    """Bytes a token the H100 measured for Hugging Face's compiled layer of ``model``'s widths
    on ``tokens`` tokens (``activations_gib``, which holds the layer's weight copies too, so
    only a run on as many tokens compares), or None where it measured none."""
    if not MEASURED.exists():
        return None
    widths = {2048: "llama3.2-1b", 4096: "llama3.1-8b"}.get(model.hidden_size)
    for line in MEASURED.read_text().splitlines():
        row = json.loads(line)
        if (row.get("kind") == "layer" and row["compiled"] and row["model"] == widths
                and row["tokens"] == tokens):  # fmt: skip
            # real_layer.py allocated the fp32 input before it counted: add it back, as the
            # planner counts it (the first norm's input, which the layer keeps)
            return row["activations_gib"] * 2**30 / tokens + 4 * model.hidden_size
    return None


def main() -> None:
    """Print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", choices=sorted(STACKS), default="torchtitan")
    parser.add_argument("--model", type=Path, help="torchtitan: instances/models/llama3-8b.json; "
                        "transformers: the H100's Llama 3.2 1B layer")
    parser.add_argument("--seq-len", type=int, help="tokens (1,024; the H100's 8,192)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel shard (torchtitan)")
    parser.add_argument("--op-sac", action="store_true",
                        help="under torchtitan's per-operator checkpointing (TP 1)")
    options = parser.parse_args()
    hugging_face = options.code == "transformers"
    if options.model is not None:
        model = load_model(options.model)
    elif hugging_face:
        model = measured_layer_models(RUNS_ONE_GPU)["llama3.2-1b"]
    else:
        model = load_model(Path("instances/models/llama3-8b.json"))
    tokens = options.seq_len or (8192 if hugging_face else 1024)
    tp = 1 if hugging_face else options.tp
    op_sac = options.op_sac and not hugging_face
    if op_sac and tp > 1:
        sys.exit("--op-sac: TP 1 only (the sharded block runs on CPU processes in op_sac.py)")
    try:
        kept = measure(options.code, model, tokens, tp, op_sac)
    except ImportError as exc:
        sys.exit(f"needs PyTorch and {options.code} (pip install -e '.[{options.code}]'): {exc}")
    stack = STACKS[options.code]
    count = priced(model, tokens, stack, tp, op_sac)
    how = ", per-operator checkpointing" if op_sac else ""
    print(f"{model.name}, TP{tp} shard, {tokens} tokens, compiled{how}, against {stack}")
    print(f"{'bytes kept a token':32s} {'compiled':>10s} {'planner':>9s} {'error':>7s}")
    print(f"{'Inductor on this CPU':32s} {kept:10,.0f} {count:9,.0f} {count / kept - 1:+7.2%}")
    measured = on_the_h100(model, tokens) if hugging_face else None
    if measured is not None:
        print(f"{'measured on the H100':32s} {measured:10,.0f} {count:9,.0f} "
              f"{count / measured - 1:+7.2%}")


if __name__ == "__main__":
    main()
