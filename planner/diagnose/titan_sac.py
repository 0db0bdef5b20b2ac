"""torchtitan's per-operator selective activation checkpointing measured on its own block: what
the policy keeps and what it reruns, against what the planner prices for the recompute module
``op`` (:data:`planner.vocabulary.OP_SAC`).

torchtitan's ``TransformerBlock`` (v0.2.2) in bf16, wrapped by torchtitan's own
``_apply_op_sac`` with the Llama 3 save list, runs one forward and backward on this machine's
CPU; under tensor parallelism, on that many CPU processes over gloo, the block sharded by
torchtitan's own ``apply_tp`` (DTensor, sequence parallel). A model with experts runs
torchtitan's Qwen3 block with its MoE layer (grouped experts, no expert parallelism) and
Qwen3's save list, without tensor parallelism. Two things differ from a GPU, and
are set as a GPU runs them: the CPU's fused attention is another ``aten`` op
(``_scaled_dot_product_flash_attention_for_cpu``), added to the save list beside CUDA's flash
kernel; the norms run composite in fp32 on a CPU, which the policy recomputes either way, so
they keep nothing here.

Needs PyTorch and torchtitan 0.2.2 (``pip install -e '.[torchtitan]'``).
"""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.cost.compute import executed_flops
from planner.errors import InputError
from planner.graph.lower import lower
from planner.plan.degrees import Degrees
from planner.sharding.uniform import UniformQuery, uniform_layout, uniform_parts
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.vocabulary import OP_SAC, Stack


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSacCount:
    """One block under the per-operator policy, for one sequence."""

    kept_bytes: float
    """What the block keeps for its backward: its input and the outputs the policy saves."""
    forward_matmul_flops: float | None = None
    """The forward's ``mm`` FLOPs (the projections and a router's gate, not attention nor
    the routed experts' grouped GEMMs); None: not counted."""
    rerun_matmul_flops: float | None = None
    """Of them, the ones the backward runs again."""


def measure_op_sac(model: ModelSpec, seq_length: int, tensor_parallel: int = 1) -> OpSacCount:
    """torchtitan's block of ``model`` on ``seq_length`` tokens under its per-operator policy,
    one rank's share at ``tensor_parallel``: the bytes its checkpoint keeps (the block's
    input and the policy's cache, each storage once) and, unsharded only, the matmul FLOPs of
    its forward and of the backward's rerun (the backward's matmuls less twice the forward's).
    A tensor-parallel block runs on that many CPU processes over gloo, sharded by
    torchtitan's own plan (``apply_tp``); rank 0's bytes are returned."""
    if tensor_parallel == 1:
        return _measure(model, seq_length, rank=0, world=1)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as where:
        out = Path(where) / "count.json"
        mp.spawn(_rank, args=(tensor_parallel, model, seq_length, _free_port(), out),
                 nprocs=tensor_parallel)  # fmt: skip
        return OpSacCount(**json.loads(out.read_text()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, model: ModelSpec, seq_length: int, port: int,
          out: Path) -> None:  # fmt: skip
    """One tensor-parallel rank: rank 0 writes its count to ``out``."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        count = _measure(model, seq_length, rank=rank, world=world)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out.write_text(json.dumps(asdict(count)))


def _measure(model: ModelSpec, seq_length: int, *, rank: int, world: int) -> OpSacCount:
    """:func:`measure_op_sac` on one rank of ``world`` (a process group already up)."""
    import torch
    from torch.utils import checkpoint
    from torch.utils.flop_counter import FlopCounterMode
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed import activation_checkpoint
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list, apply_tp

    from planner.diagnose.titan_layers import (
        Qwen3Block,
        Rotated,
        TorchtitanCode,
        precompute_rope_cache,
        qwen3_args,
    )

    torch.manual_seed(0)
    code = TorchtitanCode(model)
    if model.moe is not None:
        if world > 1:
            raise InputError("torchtitan's MoE block is measured without tensor parallelism")
        from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list as qwen3_saved

        # the block whole, its routed experts in it, as the model builds it
        block = Qwen3Block(0, qwen3_args(model, moe=True))
        with torch.no_grad():
            block.init_weights(buffer_device=torch.device("cpu"))
        rotated = Rotated(block, precompute_rope_cache(model.head_dim, seq_length,
                                                        model.rotary_base))  # fmt: skip
        saved_ops = qwen3_saved
    else:
        rotated, saved_ops = code.layer("dense", 1), _op_sac_save_list
    for p in rotated.parameters():  # FSDP2 casts the parameters, not the frequencies
        p.data = p.data.to(torch.bfloat16)
    x = torch.randn(1, seq_length, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    block, local = rotated.block, x
    if world > 1:  # the block as torchtitan's model holds it, sharded by its own plan
        from torch import nn
        from torch.distributed.device_mesh import init_device_mesh

        holder, h = nn.Module(), model.hidden_size  # the model's other modules, unused
        holder.layers = nn.ModuleDict({"0": block})
        holder.tok_embeddings, holder.norm = nn.Embedding(world, h), nn.RMSNorm(h)
        holder.output = nn.Linear(h, world, bias=False)
        apply_tp(holder, init_device_mesh("cpu", (world,)), loss_parallel=False,
                 enable_float8_tensorwise_tp=False)  # fmt: skip
        block = holder.layers["0"]
        # the block's input is the embedding's local sequence shard, as torchtitan's is
        local = x.detach()[:, rank * seq_length // world:(rank + 1) * seq_length // world].clone()
        x = local.requires_grad_(True)
    caches: list[Any] = []
    create = checkpoint.create_selective_checkpoint_contexts

    def capturing(policy: Any, allow_cache_entry_mutation: bool = False) -> Any:
        caching, cached = create(policy, allow_cache_entry_mutation)
        caches.append(caching.storage)
        return caching, cached

    saved = {*saved_ops, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    config = ActivationCheckpoint(mode="selective", selective_ac_option="op")
    # _apply_op_sac imports the function when it wraps the block
    checkpoint.create_selective_checkpoint_contexts = capturing
    try:
        # as the model's block: its router's gate found by its name (the forced recompute)
        block = activation_checkpoint._apply_op_sac(block, config, base_fqn="layers.0",
                                                    op_sac_save_list=saved)  # fmt: skip
        freqs = rotated.freqs[:seq_length]
        # FlopCounterMode's module tracking upsets the TP plan's input hooks: one rank's
        # FLOPs are counted unsharded only
        def counting() -> Any:
            return FlopCounterMode(display=False) if world == 1 else contextlib.nullcontext()

        with counting() as forward:
            out = block(x, freqs, None)
        kept = _storage_bytes(torch, [local, *caches])
        with counting() as backward:
            out.sum().backward()
    finally:
        checkpoint.create_selective_checkpoint_contexts = create
    if world > 1:
        return OpSacCount(kept_bytes=kept)

    def matmuls(counter: Any) -> float:
        return float(counter.get_flop_counts()["Global"].get(torch.ops.aten.mm, 0))

    return OpSacCount(kept_bytes=kept, forward_matmul_flops=matmuls(forward),
                      rerun_matmul_flops=matmuls(backward) - 2 * matmuls(forward))  # fmt: skip


def _storage_bytes(torch: Any, values: list[Any]) -> float:
    """Bytes of the distinct storages of the tensors in ``values`` (nested in tuples, dicts
    and the policy cache's version wrappers)."""
    seen: dict[int, int] = {}
    stack = list(values)
    while stack:
        v = stack.pop()
        v = getattr(v, "val", v)  # the policy cache's version wrapper
        v = getattr(v, "_local_tensor", v)  # a DTensor's shard
        if type(v).__name__ == "AsyncCollectiveTensor":  # a functional collective's output
            v = v.elem
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return float(sum(seen.values()))


def priced_op_sac(model: ModelSpec, cluster: ClusterSpec, seq_length: int,
                  tensor_parallel: int = 1, *,
                  stack: Stack = "torchtitan-eager") -> OpSacCount:  # fmt: skip
    """The planner's decoder layer of ``model`` (its MoE layer where it has experts) on
    ``seq_length`` tokens under the recompute module ``op`` on ``cluster``'s devices, one
    rank's share at ``tensor_parallel`` (with sequence parallelism, as torchtitan runs it):
    the bytes it keeps and, unsharded, the ``mm`` FLOPs of its forward and of its rerun (the
    projections and the router's gate; the routed experts' grouped GEMMs apart, which a
    FLOP counter does not count). ``stack``: ``torchtitan-compiled`` for the block compiled."""
    modules = (OP_SAC,)
    kind = "moe" if model.moe is not None else "dense"
    query = UniformQuery(kind=kind, layout=uniform_layout(Degrees(
        tp=tensor_parallel, sp=tensor_parallel > 1)), micro_batch_size=1,
        seq_length=seq_length, precision="bf16", stack=stack,
        recompute_modules=modules)  # fmt: skip
    parts = uniform_parts(model, cluster, query)
    if tensor_parallel > 1:
        return OpSacCount(kept_bytes=parts.kept_bytes[1])
    training = TrainingSpec(seq_length=seq_length, global_batch_size=1, precision="bf16",
                            stack=stack)  # fmt: skip
    layer = model.moe.first_dense_layers + 1 if model.moe is not None else 1
    graph = lower(model.model_copy(update={"num_layers": layer}), training)
    ops = [op for op in (graph.nodes[n]["op"] for n in graph) if op.layer == layer]
    matmuls = sum(executed_flops(op, flash_attention=True).forward
                  for op in ops if op.kind in ("linear", "router"))  # fmt: skip
    # attention is saved, so what the layer reruns is matmuls alone: the mms and the experts'
    grouped = sum(executed_flops(op, flash_attention=True).forward
                  for op in ops if op.kind == "expert_linear")  # fmt: skip
    return OpSacCount(kept_bytes=parts.kept_bytes[1], forward_matmul_flops=matmuls,
                      rerun_matmul_flops=parts.rerun_flops[1] - grouped)
