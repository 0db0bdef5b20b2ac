"""Colossal-AI: the plan as a ``HybridParallelPlugin(...)`` call.

Keyword arguments as Colossal-AI spells them, checked in hpcaitech/ColossalAI
``colossalai/booster/plugin/hybrid_parallel_plugin.py`` (commit 0094bc0ae6f7) and
``colossalai/booster/plugin/moe_hybrid_parallel_plugin.py`` (commit 050971275f5b):

- ``tp_size``, ``pp_size``, ``sp_size``, ``precision`` ("fp16", "bf16", "fp32"), ``zero_stage``
  (``assert zero_stage in (0, 1, 2)``; with ``pp_size > 1`` "zero stage must be 0 or 1"),
  ``microbatch_size``, ``num_microbatches``, ``pp_style`` ("1f1b" or "interleaved"),
  ``num_model_chunks`` (> 1 only for "interleaved"), ``num_layers_per_stage`` (one count per
  pipeline stage, ``colossalai/pipeline/stage_manager.py``), ``enable_flash_attention``,
  ``overlap_communication`` (ZeRO's gradient communication), ``overlap_allgather`` (ZeRO's
  parameter all-gather).
- ``enable_sequence_parallelism`` with ``sequence_parallelism_mode``: "split_gather" is
  Megatron-style sequence parallelism inside tensor parallelism (``sp_size`` ignored),
  "ring_attn" is ring attention over ``sp_size`` ranks, "all_to_all" is Ulysses.
- ``MoeHybridParallelPlugin(ep_size=...)`` for expert parallelism; it turns ZeRO-2 and
  ``overlap_communication`` off ("cause program hang when some experts are not routed") and
  handles "split_gather" and "all_to_all" only.
"""

from __future__ import annotations

from planner.export.base import Draft, Export, Layout, Price, finish, start
from planner.plan import Plan

Kwargs = dict[str, object]


def to_colossalai(plan: Plan, *, price: Price | None = None) -> Export:
    """The plan as a Colossal-AI plugin, ready to hand to ``Booster(plugin=plugin)``."""
    layout, draft = start(plan)
    p = layout.parallel
    moe = p.ep > 1
    plugin = "MoeHybridParallelPlugin" if moe else "HybridParallelPlugin"
    kwargs: Kwargs = {"tp_size": p.tp, "pp_size": layout.pp}
    if moe:
        kwargs["ep_size"] = p.ep
    kwargs |= _sequence(layout, draft, moe=moe)
    kwargs["precision"] = plan.precision
    zero = _zero_stage(layout, draft, moe=moe)
    kwargs["zero_stage"] = zero
    kwargs |= _pipeline(plan, layout, draft=draft)
    kwargs["enable_flash_attention"] = plan.flags.flash_attention
    kwargs |= _zero_overlap(plan, zero, draft=draft, moe=moe)
    _not_plugin_arguments(plan, layout, draft=draft)
    return finish(draft, text=render(plugin, kwargs), fmt="colossalai", price=price)


def render(plugin: str, kwargs: Kwargs) -> str:
    """A Python snippet: the import and the plugin's construction, one keyword per line."""
    lines = [f"from colossalai.booster.plugin import {plugin}", "", f"plugin = {plugin}("]
    lines += [f"    {name}={_literal(value)}," for name, value in kwargs.items()]
    return "\n".join([*lines, ")"]) + "\n"


def _literal(value: object) -> str:
    """A Python literal, strings in double quotes as Colossal-AI's examples write them."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _sequence(layout: Layout, draft: Draft, *, moe: bool) -> Kwargs:
    """Sequence parallelism: ring attention for context parallelism, split_gather for SP."""
    p = layout.parallel
    if p.cp > 1:
        mode = "all_to_all" if moe else "ring_attn"
        if moe:
            draft.change(f"MoeHybridParallelPlugin has no ring attention: context parallelism "
                         f"over {p.cp} ranks exported as all_to_all (Ulysses) sequence "
                         f"parallelism")  # fmt: skip
        if p.sp and p.tp > 1:
            draft.change(f"Colossal-AI runs one sequence-parallel mode at a time: {mode} for "
                         f"CP{p.cp} is kept, Megatron-style sequence parallelism inside TP "
                         f"(split_gather) is dropped", sp=False)  # fmt: skip
        return {"sp_size": p.cp, "enable_sequence_parallelism": True,
                "sequence_parallelism_mode": mode}  # fmt: skip
    if p.sp and p.tp > 1:
        return {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"}
    return {}


def _zero_stage(layout: Layout, draft: Draft, *, moe: bool) -> int:
    """The plan's ZeRO stage within what the plugin accepts."""
    planned = zero = layout.parallel.zero_stage
    reasons = []
    if zero == 3:
        zero = 2
        reasons.append("the plugin takes zero_stage 0, 1 or 2")
    if zero == 2 and layout.pp > 1:
        zero = 1
        reasons.append("it allows 0 or 1 with pipeline parallelism")
    if zero == 2 and moe:
        zero = 1
        reasons.append("MoeHybridParallelPlugin turns ZeRO-2 into ZeRO-1")
    if zero != planned:
        draft.change(f"{'; '.join(reasons)}: the plan's ZeRO-{planned} exported as "
                     f"zero_stage={zero}", zero=zero)  # fmt: skip
    return zero


def _pipeline(plan: Plan, layout: Layout, *, draft: Draft) -> Kwargs:
    """Microbatching, schedule and layer split (pipeline arguments mean nothing at pp_size=1)."""
    if layout.pp == 1:
        if plan.num_microbatches > 1:
            draft.changes.append(f"with pp_size=1 the plugin does not accumulate microbatches: "
                                 f"give the dataloader batch_size={plan.micro_batch_size} and "
                                 f"accumulate {plan.num_microbatches} microbatches per step in "
                                 f"the training loop")  # fmt: skip
        return {}
    if plan.schedule.name == "gpipe":
        draft.change("Colossal-AI pipelines with 1F1B or interleaved 1F1B only: the plan's "
                     "GPipe exported as 1F1B", schedule="1f1b")  # fmt: skip
    kwargs: Kwargs = {"microbatch_size": plan.micro_batch_size,
                      "num_microbatches": plan.num_microbatches,
                      "pp_style": "interleaved" if layout.vpp > 1 else "1f1b",
                      "num_model_chunks": layout.vpp}  # fmt: skip
    if not layout.even:
        if layout.vpp > 1:
            draft.changes.append(f"num_layers_per_stage takes one count per pipeline rank, not "
                                 f"per virtual stage: the split {list(layout.layers)} is left "
                                 f"to Colossal-AI's even split")  # fmt: skip
        else:
            kwargs["num_layers_per_stage"] = list(layout.layers)
    return kwargs


def _zero_overlap(plan: Plan, zero: int, *, draft: Draft, moe: bool) -> Kwargs:
    """ZeRO's communication overlap (said explicitly: the plugin defaults it on)."""
    if zero == 0:
        return {}
    grad = plan.flags.overlap_grad_reduce
    if grad and moe:
        draft.change("MoeHybridParallelPlugin turns overlap_communication off (it can hang "
                     "when an expert gets no tokens): gradient reduction not overlapped",
                     overlap_grad_reduce=False)  # fmt: skip
        grad = False
    return {"overlap_communication": grad, "overlap_allgather": plan.flags.overlap_param_gather}


def _not_plugin_arguments(plan: Plan, layout: Layout, *, draft: Draft) -> None:
    """What the plan asks for that no plugin keyword carries."""
    p = layout.parallel
    if p.recompute == "full":
        draft.changes.append("activation recomputation is not a plugin argument: turn on "
                             "gradient checkpointing on the model itself (it recomputes whole "
                             "layers, as the plan's full recompute does)")  # fmt: skip
    elif p.recompute == "selective":
        draft.change("activation recomputation is not a plugin argument, and the model's "
                     "gradient checkpointing recomputes whole layers: the plan's selective "
                     "recompute becomes full recompute", recompute="full")  # fmt: skip
    if plan.flags.tp_comm_overlap and p.tp > 1:
        draft.change("no plugin argument overlaps tensor-parallel communication with the "
                     "GEMMs: not exported", tp_comm_overlap=False)  # fmt: skip
