"""torchtitan's per-operator selective activation checkpointing measured on its own block: what
the policy keeps and what it reruns, against what the planner prices for the recompute module
``op`` (:data:`planner.vocabulary.OP_SAC`).

torchtitan's ``TransformerBlock`` (v0.2.2) in bf16, wrapped by torchtitan's own
``_apply_op_sac`` with the Llama 3 save list, runs one forward and backward on this machine's
CPU. Two things differ from a GPU, and are set as a GPU runs them: the CPU's fused attention is
another ``aten`` op (``_scaled_dot_product_flash_attention_for_cpu``), added to the save list
beside CUDA's flash kernel; the norms run composite in fp32 on a CPU, which the policy
recomputes either way, so they keep nothing here.

Needs PyTorch and torchtitan 0.2.2 (``pip install -e '.[torchtitan]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.cost.activations import saved_activation_bytes
from planner.cost.compute import executed_flops
from planner.graph.lower import lower
from planner.spec import ModelSpec, TrainingSpec
from planner.vocabulary import OP_SAC


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSacCount:
    """One dense block under the per-operator policy, for one sequence."""

    kept_bytes: float
    """What the block keeps for its backward: its input and the outputs the policy saves."""
    forward_matmul_flops: float
    """The forward's matmul FLOPs (the projections, not attention)."""
    rerun_matmul_flops: float
    """Of them, the ones the backward runs again."""


def measure_op_sac(model: ModelSpec, seq_length: int) -> OpSacCount:
    """torchtitan's block of ``model`` on ``seq_length`` tokens under its per-operator policy:
    the bytes its checkpoint keeps (the block's input and the policy's cache, each storage
    once) and the matmul FLOPs of its forward and of the backward's rerun (the backward's
    matmuls less twice the forward's)."""
    import torch
    from torch.utils import checkpoint
    from torch.utils.flop_counter import FlopCounterMode
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed import activation_checkpoint
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    from planner.diagnose.titan_layers import TorchtitanCode

    torch.manual_seed(0)
    rotated = TorchtitanCode(model).layer("dense", 1)
    for p in rotated.parameters():  # FSDP2 casts the parameters, not the frequencies
        p.data = p.data.to(torch.bfloat16)
    caches: list[Any] = []
    create = checkpoint.create_selective_checkpoint_contexts

    def capturing(policy: Any, allow_cache_entry_mutation: bool = False) -> Any:
        caching, cached = create(policy, allow_cache_entry_mutation)
        caches.append(caching.storage)
        return caching, cached

    saved = {*_op_sac_save_list, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    config = ActivationCheckpoint(mode="selective", selective_ac_option="op")
    x = torch.randn(1, seq_length, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    # _apply_op_sac imports the function when it wraps the block
    checkpoint.create_selective_checkpoint_contexts = capturing
    try:
        rotated.block = activation_checkpoint._apply_op_sac(rotated.block, config,
                                                            op_sac_save_list=saved)  # fmt: skip
        with FlopCounterMode(display=False) as forward:
            out = rotated(x)
        kept = _storage_bytes(torch, [x, *caches])
        with FlopCounterMode(display=False) as backward:
            out.backward(torch.ones_like(out))
    finally:
        checkpoint.create_selective_checkpoint_contexts = create
    mm = torch.ops.aten.mm

    def matmuls(counter: Any) -> float:
        return float(counter.get_flop_counts()["Global"].get(mm, 0))

    return OpSacCount(kept_bytes=kept, forward_matmul_flops=matmuls(forward),
                      rerun_matmul_flops=matmuls(backward) - 2 * matmuls(forward))  # fmt: skip


def _storage_bytes(torch: Any, values: list[Any]) -> float:
    """Bytes of the distinct storages of the tensors in ``values`` (nested in tuples, dicts
    and the policy cache's version wrappers)."""
    seen: dict[int, int] = {}
    stack = list(values)
    while stack:
        v = stack.pop()
        v = getattr(v, "val", v)
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return float(sum(seen.values()))


def priced_op_sac(model: ModelSpec, seq_length: int) -> OpSacCount:
    """The planner's decoder layer of ``model`` on ``seq_length`` tokens under the recompute
    module ``op``, unsharded: the bytes it keeps and the matmul FLOPs it reruns."""
    training = TrainingSpec(seq_length=seq_length, global_batch_size=1, precision="bf16",
                            stack="torchtitan-eager")  # fmt: skip
    graph = lower(model.model_copy(update={"num_layers": 1}), training)
    ops = [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 1]
    modules = (OP_SAC,)
    kept = sum(saved_activation_bytes(op, lambda t: {}, recompute="selective",
                                      flash_attention=True, modules=modules) for op in ops)
    linear = [op for op in ops if op.kind == "linear"]
    flops = [executed_flops(op, flash_attention=True).forward for op in linear]
    rerun = sum(f * (1 - op.output_saved(modules)) for op, f in zip(linear, flops, strict=True))
    return OpSacCount(kept_bytes=kept, forward_matmul_flops=sum(flops), rerun_matmul_flops=rerun)
