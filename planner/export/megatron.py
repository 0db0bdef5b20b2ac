"""Megatron-LM: the plan as command-line flags of ``pretrain_gpt.py``.

Every flag below is spelled as in ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM (commit
000c4ac24f61), where it was checked, with the rules ``validate_args`` applies to it:

- ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--context-parallel-size``,
  ``--expert-model-parallel-size``, ``--sequence-parallel``: the degrees.
- ``--num-layers-per-virtual-pipeline-stage``: interleaved 1F1B on an even split; it may not be
  combined with ``--decoder-first/last-pipeline-num-layers``, which need
  ``--num-virtual-stages-per-pipeline-rank`` instead.
- ``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``: an uneven first
  or last stage; Megatron-Core splits the remaining layers evenly over the middle stages
  (``get_num_layers_to_build``: "the left over layers must be divisible by left over stages").
- ``--micro-batch-size``, ``--global-batch-size``, ``--seq-length``, ``--bf16``, ``--fp16``.
- ``--recompute-granularity {full,selective}``, ``--recompute-method {uniform,block}``,
  ``--recompute-num-layers``: full recompute of every layer is ``uniform`` with one layer per
  recompute unit; ``--recompute-activations`` is the older shorthand that sets ``selective``, and
  selective refuses a ``--recompute-method``.
- ``--use-distributed-optimizer``: optimizer states sharded over data parallel (ZeRO-1).
  ``--use-torch-fsdp2`` exists but refuses pipeline and expert parallelism and the distributed
  optimizer; ``--use-megatron-fsdp`` with ``--data-parallel-sharding-strategy
  {no_shard,optim,optim_grads,optim_grads_params}`` is Megatron-FSDP.
- ``--overlap-grad-reduce``; ``--overlap-param-gather`` (needs the distributed optimizer and
  ``--overlap-grad-reduce``); ``--tp-comm-overlap`` (needs sequence parallelism).
- ``--attention-backend {flash,fused,unfused,local,auto}`` (default auto: fused attention).
"""

from __future__ import annotations

from planner.export.base import Draft, Export, Layout, Price, finish, plural, start
from planner.plan import Plan

Flag = tuple[str, int | str | None]
"""A flag and its value (None for a switch)."""


def to_megatron(plan: Plan, *, price: Price | None = None) -> Export:
    """The plan as Megatron-LM flags, one per line, ready to paste into a launch script."""
    layout, draft = start(plan)
    flags = [
        *degree_flags(layout),
        *split_flags(layout, draft),
        *batch_flags(plan),
        *precision_flags(plan),
        *recompute_flags(layout),
        *optimizer_flags(layout, draft),
        *data_overlap_flags(plan, layout, draft=draft),
        *tp_overlap_flags(plan, layout, draft=draft),
    ]
    if not plan.flags.flash_attention:
        # auto picks fused attention; the plan was priced with the s x s scores kept.
        flags.append(("--attention-backend", "unfused"))
    return finish(draft, text=render(flags), fmt="megatron", price=price)


def render(flags: list[Flag]) -> str:
    """A shell fragment: one flag per line, continued with a backslash."""
    lines = [name if value is None else f"{name} {value}" for name, value in flags]
    return " \\\n".join(lines) + "\n"


def degree_flags(layout: Layout) -> list[Flag]:
    """Tensor, pipeline, sequence, context and expert parallelism."""
    p = layout.parallel
    flags: list[Flag] = [("--tensor-model-parallel-size", p.tp),
                         ("--pipeline-model-parallel-size", layout.pp)]  # fmt: skip
    if p.sp and p.tp > 1:  # Megatron switches SP off itself when tp == 1
        flags.append(("--sequence-parallel", None))
    if p.cp > 1:
        flags.append(("--context-parallel-size", p.cp))
    if p.ep > 1:
        flags.append(("--expert-model-parallel-size", p.ep))
    return flags


def split_flags(layout: Layout, draft: Draft) -> list[Flag]:
    """How layers are split over the stages (and virtual stages) of the pipeline."""
    if layout.pp == 1:
        return []
    counts = layout.layers if layout.even else first_last_split(layout, draft)
    vpp = interleaving(counts, layout.vpp, draft=draft)
    uneven = len(set(counts)) > 1
    flags: list[Flag] = []
    if vpp > 1:
        per_rank = ("--num-virtual-stages-per-pipeline-rank", vpp)
        per_stage = ("--num-layers-per-virtual-pipeline-stage", counts[0] // vpp)
        flags.append(per_rank if uneven else per_stage)
    if uneven:
        # With two stages the first flag alone fixes both; with more, a flag only where the
        # stage differs from the (equal) middle stages.
        middle = counts[1] if layout.pp > 2 else None
        if counts[0] != middle:
            flags.append(("--decoder-first-pipeline-num-layers", counts[0]))
        if layout.pp > 2 and counts[-1] != middle:
            flags.append(("--decoder-last-pipeline-num-layers", counts[-1]))
    return flags


def first_last_split(layout: Layout, draft: Draft) -> tuple[int, ...]:
    """The closest split Megatron-LM expresses: any first and last stage, equal middle stages.

    Middle stages that differ get the floor of their mean; the layers left over go to the first
    stage, which holds the embedding and so is the one a planner shortens least.
    """
    counts = layout.layers
    middle = counts[1:-1]
    if len(set(middle)) <= 1:
        return counts
    each, left = divmod(sum(middle), len(middle))
    closest = (counts[0] + left, *([each] * len(middle)), counts[-1])
    draft.change(f"Megatron-LM gives every middle pipeline stage the same number of layers: "
                 f"stages 1-{len(middle)} planned with {list(middle)} layers, exported with "
                 f"{plural(each, 'layer')} each and the first stage {closest[0]} "
                 f"(not {counts[0]})")  # fmt: skip
    return closest


def interleaving(counts: tuple[int, ...], vpp: int, *, draft: Draft) -> int:
    """The virtual stages per rank that can be kept: each stage's layers must divide by them."""
    if vpp > 1 and any(c % vpp for c in counts):
        draft.change(f"interleaving needs every stage's layers ({list(counts)}) to divide into "
                     f"{vpp} virtual stages: exported as 1F1B without interleaving",
                     vpp=1)  # fmt: skip
        return 1
    return vpp


def batch_flags(plan: Plan) -> list[Flag]:
    """Microbatch, global batch and sequence length; the data-parallel size follows from the
    world size and the degrees."""
    return [("--micro-batch-size", plan.micro_batch_size),
            ("--global-batch-size", plan.global_batch_size),
            ("--seq-length", plan.seq_length)]  # fmt: skip


def precision_flags(plan: Plan) -> list[Flag]:
    """Mixed precision (fp32 is Megatron's default: no flag)."""
    return {"bf16": [("--bf16", None)], "fp16": [("--fp16", None)]}.get(plan.precision, [])


def recompute_flags(layout: Layout) -> list[Flag]:
    """Activation recomputation."""
    recompute = layout.parallel.recompute
    if recompute == "selective":
        return [("--recompute-granularity", "selective")]
    if recompute == "full":
        # uniform with one layer per unit: every layer's input is kept, the rest recomputed.
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", 1)]  # fmt: skip
    return []


def optimizer_flags(layout: Layout, draft: Draft) -> list[Flag]:
    """ZeRO: Megatron-LM's distributed optimizer shards optimizer states only (ZeRO-1)."""
    zero = layout.parallel.zero_stage
    if zero == 0:
        return []
    if zero >= 2:
        sharded = "gradients and parameters" if zero == 3 else "gradients"
        draft.change(f"Megatron-LM's distributed optimizer shards optimizer states only: the "
                     f"plan's ZeRO-{zero} also shards {sharded}, exported as ZeRO-1 "
                     f"(--use-distributed-optimizer); Megatron-FSDP (--use-megatron-fsdp "
                     f"--data-parallel-sharding-strategy optim_grads_params) is the sharded "
                     f"alternative", zero=1)  # fmt: skip
    return [("--use-distributed-optimizer", None)]


def data_overlap_flags(plan: Plan, layout: Layout, *, draft: Draft) -> list[Flag]:
    """Overlap of the gradient reduce-scatter and the parameter all-gather with compute."""
    flags: list[Flag] = []
    grad, param = plan.flags.overlap_grad_reduce, plan.flags.overlap_param_gather
    if param and layout.parallel.zero_stage == 0:
        draft.change("--overlap-param-gather needs the distributed optimizer (there is no "
                     "parameter all-gather without it): not exported",
                     overlap_param_gather=False)  # fmt: skip
        param = False
    if param and not grad:
        draft.change("Megatron-LM needs --overlap-grad-reduce with --overlap-param-gather: "
                     "both exported", overlap_grad_reduce=True)  # fmt: skip
        grad = True
    flags += [("--overlap-grad-reduce", None)] * grad
    flags += [("--overlap-param-gather", None)] * param
    return flags


def tp_overlap_flags(plan: Plan, layout: Layout, *, draft: Draft) -> list[Flag]:
    """Overlap of tensor-parallel collectives with the GEMMs next to them."""
    p = layout.parallel
    if not plan.flags.tp_comm_overlap or p.tp == 1:
        return []  # without tensor parallelism there is nothing to overlap
    if not p.sp:
        draft.change("--tp-comm-overlap needs --sequence-parallel, which the plan does not "
                     "use: not exported", tp_comm_overlap=False)  # fmt: skip
        return []
    return [("--tp-comm-overlap", None)]
