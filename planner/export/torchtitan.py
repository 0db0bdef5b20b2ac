"""torchtitan v0.2: the plan as a fragment of a job TOML, laid out as torchtitan's own
``train_configs/*.toml`` (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``).

Keys checked in ``torchtitan/config/job_config.py`` of torchtitan 0.2.2 (the PyPI wheel):
``training.local_batch_size``, ``training.global_batch_size``, ``training.seq_len``,
``training.mixed_precision_param`` ("bfloat16" | "float32"); ``parallelism.
data_parallel_replicate_degree``, ``data_parallel_shard_degree``, ``fsdp_reshard_after_forward``
("default" | "always" | "never"), ``tensor_parallel_degree``, ``enable_async_tensor_parallel``
("only effective when compile is enabled"), ``pipeline_parallel_degree``,
``module_fqns_per_model_part``, ``pipeline_parallel_schedule``,
``pipeline_parallel_microbatch_size``, ``context_parallel_degree``, ``expert_parallel_degree``,
``expert_tensor_parallel_degree`` (1 or the TP degree); ``activation_checkpoint.mode``
("selective" | "full" | "memory_budget" | "none"), ``selective_ac_option`` ("op" or every n-th
layer). Schedule names from ``get_schedule_class`` in PyTorch's
``torch/distributed/pipelining/schedules.py``: "1F1B", "Interleaved1F1B", "GPipe".

How torchtitan 0.2.2 behaves, from the same wheel:

- Data parallelism is FSDP2 over ``data_parallel_shard_degree x context_parallel_degree``
  (``ParallelDims.fsdp_enabled``), HSDP with a replicate degree too, and DDP only when data
  parallelism is the only parallelism ("DDP has not supported > 1D parallelism",
  ``models/llama3/infra/parallelize.py``).
- ``fsdp_reshard_after_forward = "default"`` reshards after forward except under pipeline
  parallelism (``apply_fsdp``); it is spelled out: "always" for ZeRO-3, "never" otherwise.
- Under pipeline parallelism PyTorch turns FSDP's gradient sync and resharding off for every
  microbatch's backward but the last (``backward_maybe_with_nosync`` in
  ``torch/distributed/pipelining/stage.py``, pytorch/pytorch commit 0138610331c9), so gradients
  and parameters stay whole through the step: FSDP2 then behaves as ZeRO-1.
- The training loop accumulates microbatches without ``no_sync`` (``train.py``): without pipeline
  parallelism gradients are reduced after every microbatch.
- Without ``module_fqns_per_model_part`` the pipeline split gives the first and last stage one
  layer less (``pipeline_parallel_first/last_stage_less_layers = 1``), so the plan's split is
  written out as module names (``generate_llm_fqn_per_model_part``'s ``tok_embeddings``,
  ``layers.<i>``, ``norm``, ``output``).
- Tensor parallelism always shards the norms along the sequence (``SequenceParallel``).
- Selective "op" checkpointing saves matmul (every other one) and attention outputs and
  recomputes the rest (``_op_sac_save_list``, ``activation_checkpoint.py``).
"""

from __future__ import annotations

from planner.export.base import Draft, Export, Layout, Price, finish, start
from planner.plan import Plan

Table = dict[str, object]

_PRECISION = {"bf16": "bfloat16", "fp32": "float32"}


def to_torchtitan(plan: Plan, *, price: Price | None = None) -> Export:
    """The plan as torchtitan v0.2 TOML tables, to merge into a train config."""
    layout, draft = start(plan)
    parallelism = {
        **_data_parallel(plan, layout, draft=draft),
        **_model_parallel(plan, layout, draft=draft),
        **_pipeline(plan, layout, draft=draft),
    }
    tables = {
        "training": _training(plan, layout, draft=draft),
        "parallelism": parallelism,
        "activation_checkpoint": _activation_checkpoint(layout, draft),
    }
    if not plan.flags.flash_attention:
        draft.change("torchtitan's attention is always fused (SDPA or flex attention): the "
                     "plan's unfused attention exported as fused",
                     flash_attention=True)  # fmt: skip
    return finish(draft, text=render(tables), fmt="torchtitan", price=price)


def render(tables: dict[str, Table]) -> str:
    """TOML: one table after another, a list of lists one inner list per line."""
    lines: list[str] = []
    for name, table in tables.items():
        lines += [*([""] * bool(lines)), f"[{name}]"]
        for key, value in table.items():
            if isinstance(value, list) and value and isinstance(value[0], list):
                lines += [f"{key} = [", *(f"  {_value(v)}," for v in value), "]"]
            else:
                lines.append(f"{key} = {_value(value)}")
    return "\n".join(lines) + "\n"


def _value(value: object) -> str:
    """A TOML value (strings, integers, booleans and lists of them are all the plan needs)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _training(plan: Plan, layout: Layout, *, draft: Draft) -> Table:
    """Batch and sequence; with pipelining the local batch holds all of a step's microbatches."""
    if plan.precision == "fp16":
        draft.change("torchtitan trains in bfloat16 or float32 only: the plan's fp16 "
                     "exported as bfloat16", precision="bf16")  # fmt: skip
    per_rank = plan.micro_batch_size * (plan.num_microbatches if layout.pp > 1 else 1)
    return {
        "local_batch_size": per_rank,
        # torchtitan accumulates gradients over global / (local x data-parallel) steps.
        "global_batch_size": plan.micro_batch_size * plan.num_microbatches * layout.dp,
        "seq_len": plan.seq_length,
        "mixed_precision_param": _PRECISION.get(plan.precision, "bfloat16"),
    }


def _data_parallel(plan: Plan, layout: Layout, *, draft: Draft) -> Table:
    """ZeRO as torchtitan's replicate (DDP) and shard (FSDP2) degrees."""
    p = layout.parallel
    if p.zero_stage <= 1 and p.tp == layout.pp == p.cp == p.ep == 1:
        return _replicate(plan, layout, draft=draft)
    table: Table = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": layout.dp}
    ranks = layout.dp * p.cp  # FSDP2 shards over the data- and context-parallel ranks
    if ranks == 1:
        return table
    how = (f"torchtitan shards with FSDP2 over {ranks} ranks (DP{layout.dp} x CP{p.cp}) and "
           f"replicates (DDP) only when data parallelism is the only parallelism")  # fmt: skip
    if layout.pp > 1:
        # PyTorch's pipelining turns FSDP's gradient sync and resharding off until the last
        # microbatch's backward: gradients and parameters stay whole through the step.
        if p.zero_stage != 1:
            draft.change(f"{how}; under pipeline parallelism gradients and parameters stay whole "
                         f"until the last microbatch, so the plan's ZeRO-{p.zero_stage} runs "
                         f"as ZeRO-1 (optimizer states sharded)", zero=1)  # fmt: skip
        table["fsdp_reshard_after_forward"] = "never"
        return table
    if p.zero_stage <= 1:
        draft.change(f"{how}: the plan's ZeRO-{p.zero_stage} exported as gradients and "
                     f"optimizer states sharded, parameters gathered from forward to the end "
                     f"of backward (ZeRO-2)", zero=2)  # fmt: skip
    # ZeRO-3 frees the gathered parameters after forward; ZeRO-2 keeps them for backward.
    table["fsdp_reshard_after_forward"] = "always" if p.zero_stage == 3 else "never"
    return table


def _replicate(plan: Plan, layout: Layout, *, draft: Draft) -> Table:
    """Plain data parallelism (DDP): the only kind torchtitan runs without sharding."""
    if layout.dp > 1 and layout.parallel.zero_stage == 1:
        draft.change("torchtitan's DDP keeps the whole optimizer state on every rank: the "
                     "plan's ZeRO-1 exported as plain data parallelism", zero=0)  # fmt: skip
    if layout.dp > 1 and plan.num_microbatches > 1:
        draft.changes.append(f"torchtitan's training loop all-reduces gradients after each of "
                             f"the {plan.num_microbatches} accumulated microbatches, not once "
                             f"per step")  # fmt: skip
    return {"data_parallel_replicate_degree": layout.dp, "data_parallel_shard_degree": 1}


def _model_parallel(plan: Plan, layout: Layout, *, draft: Draft) -> Table:
    """Tensor, context and expert parallelism."""
    p = layout.parallel
    table: Table = {"tensor_parallel_degree": p.tp}
    if p.tp > 1 and not p.sp:
        draft.change("torchtitan's tensor parallelism always shards the norms along the "
                     "sequence: exported with sequence parallelism", sp=True)  # fmt: skip
    if plan.flags.tp_comm_overlap and p.tp > 1:
        table["enable_async_tensor_parallel"] = True
        draft.changes.append("torchtitan overlaps tensor-parallel communication (async TP) "
                             "only when the model is compiled: add [compile] enable = "
                             "true")  # fmt: skip
    table["context_parallel_degree"] = p.cp
    if p.ep > 1:
        # Megatron-LM's experts are tensor-parallel like the rest (expert TP = TP).
        table["expert_parallel_degree"] = p.ep
        table["expert_tensor_parallel_degree"] = p.tp
    return table


def _pipeline(plan: Plan, layout: Layout, *, draft: Draft) -> Table:
    """Pipeline degree, schedule, microbatch and the exact layers of every (virtual) stage."""
    table: Table = {"pipeline_parallel_degree": layout.pp}
    if layout.pp == 1:
        return table
    vpp = layout.vpp
    if vpp > 1 and any(n % vpp for n in layout.layers):
        draft.change(f"interleaving needs every stage's layers ({list(layout.layers)}) to "
                     f"divide into {vpp} virtual stages: exported as 1F1B", vpp=1)  # fmt: skip
        vpp = 1
    if plan.schedule.name == "gpipe":
        table["pipeline_parallel_schedule"] = "GPipe"
    else:
        table["pipeline_parallel_schedule"] = "Interleaved1F1B" if vpp > 1 else "1F1B"
    table["pipeline_parallel_microbatch_size"] = plan.micro_batch_size
    table["module_fqns_per_model_part"] = model_parts(layout.layers, vpp)
    return table


def model_parts(layers: tuple[int, ...], vpp: int) -> list[list[str]]:
    """torchtitan's module names for each (virtual) stage, in model order.

    A looped schedule runs part ``k`` on pipeline rank ``k % pp``, so with interleaving each
    rank's layers are cut into ``vpp`` equal chunks that take turns with the other ranks'.

    >>> model_parts((2, 1), 1)
    [['tok_embeddings', 'layers.0', 'layers.1'], ['layers.2', 'norm', 'output']]
    """
    sizes = [layers[k % len(layers)] // vpp for k in range(len(layers) * vpp)]
    parts: list[list[str]] = []
    first = 0
    for size in sizes:
        parts.append([f"layers.{i}" for i in range(first, first + size)])
        first += size
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _activation_checkpoint(layout: Layout, draft: Draft) -> Table:
    """Recomputation: full is torchtitan's full; selective is its per-op policy."""
    recompute = layout.parallel.recompute
    if recompute != "selective":
        return {"mode": recompute}
    draft.changes.append("torchtitan's selective checkpointing is per operator: it keeps the "
                         "attention output and every other matmul output and recomputes the "
                         "rest, more than Megatron-style selective recompute (attention "
                         "only)")  # fmt: skip
    return {"mode": "selective", "selective_ac_option": "op"}
