"""DeepSpeed: the plan as a ``ds_config.json``.

Keys as DeepSpeed spells them, and where each was checked (microsoft/DeepSpeed):

- ``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``:
  ``deepspeed/runtime/constants.py``; the pipeline engine asserts ``train_batch_size ==
  micro_batch_size * micro_batches * data_parallel_size`` (``deepspeed/runtime/pipe/engine.py``).
- ``bf16.enabled``, ``fp16.enabled``: ``deepspeed/runtime/precision_config.py``.
- ``zero_optimization.stage``, ``zero_optimization.overlap_comm`` ("overlap the reduction of the
  gradients with backward computation"): ``deepspeed/runtime/zero/config.py``.
- ``activation_checkpointing`` with ``partition_activations``, ``contiguous_memory_optimization``,
  ``cpu_checkpointing``: ``deepspeed/runtime/activation_checkpointing/config.py``.
- ZeRO-2/3 with pipeline parallelism is refused: ``assert self.zero_optimization_stage() <
  ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"``
  (``deepspeed/runtime/pipe/engine.py``).

Tensor and pipeline degrees are not ds_config keys: Megatron-DeepSpeed takes them as
``--tensor-model-parallel-size`` and ``--pipeline-model-parallel-size``
(microsoft/Megatron-DeepSpeed ``megatron/arguments.py``).
"""

from __future__ import annotations

import json

from planner.export.base import Draft, Export, Layout, Price, finish, start
from planner.plan import Plan


def to_deepspeed(plan: Plan, *, price: Price | None = None) -> Export:
    """The plan as a DeepSpeed config (JSON), ready to save as ``ds_config.json``."""
    layout, draft = start(plan)
    zero = _zero_stage(layout, draft)
    _pipeline_schedule(plan, layout, draft=draft)
    config: dict[str, object] = {
        # DeepSpeed checks train_batch_size = micro x accumulation x data-parallel size.
        "train_batch_size": plan.micro_batch_size * plan.num_microbatches * layout.dp,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        "bf16": {"enabled": plan.precision == "bf16"},
        "fp16": {"enabled": plan.precision == "fp16"},
        "zero_optimization": _zero_block(plan, zero),
    }
    if layout.parallel.recompute != "none":
        # Checkpoints stay whole on each rank, on the device, as the plan priced them.
        config["activation_checkpointing"] = {"partition_activations": False,
                                              "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}  # fmt: skip
    elsewhere = _set_elsewhere(plan, layout)
    if elsewhere:
        where = ("not ds_config keys, to set in the launcher or the model code "
                 "(Megatron-DeepSpeed: --tensor-model-parallel-size, "
                 "--pipeline-model-parallel-size): ")  # fmt: skip
        draft.changes.append(where + "; ".join(elsewhere))
    text = json.dumps(config, indent=2) + "\n"
    return finish(draft, text=text, fmt="deepspeed", price=price)


def _zero_stage(layout: Layout, draft: Draft) -> int:
    """The plan's ZeRO stage, or 1 where the pipeline engine refuses more."""
    zero = layout.parallel.zero_stage
    if layout.pp > 1 and zero > 1:
        draft.change(f"DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 with pipeline "
                     f"parallelism: the plan's ZeRO-{zero} exported as ZeRO-1", zero=1)  # fmt: skip
        return 1
    return zero


def _zero_block(plan: Plan, zero: int) -> dict[str, object]:
    """``zero_optimization``; overlap_comm is a ZeRO setting, so only said under ZeRO."""
    block: dict[str, object] = {"stage": zero}
    if zero >= 1:
        block["overlap_comm"] = plan.flags.overlap_grad_reduce
    return block


def _pipeline_schedule(plan: Plan, layout: Layout, *, draft: Draft) -> None:
    """DeepSpeed's pipeline engine has a single (1F1B-like) training schedule."""
    if layout.pp > 1 and (layout.vpp > 1 or plan.schedule.name == "gpipe"):
        planned = "GPipe" if plan.schedule.name == "gpipe" else f"interleaved 1F1B (v={layout.vpp})"
        draft.change(f"DeepSpeed's pipeline engine runs its own 1F1B-style schedule: the "
                     f"plan's {planned} exported as 1F1B", vpp=1, schedule="1f1b")  # fmt: skip


def _set_elsewhere(plan: Plan, layout: Layout) -> list[str]:
    """What the plan asks for that a ds_config cannot carry."""
    p = layout.parallel
    items = [f"tensor parallelism TP{p.tp}"] * (p.tp > 1)
    items += [f"pipeline parallelism PP{layout.pp}"] * (layout.pp > 1)
    if not layout.even:
        items.append(f"the layer split {list(layout.layers)}")
    items += ["sequence parallelism"] * (p.sp and p.tp > 1)
    items += [f"context parallelism CP{p.cp}"] * (p.cp > 1)
    items += [f"expert parallelism EP{p.ep}"] * (p.ep > 1)
    if p.recompute != "none":
        items.append(f"which activations are recomputed ({p.recompute})")
    items += ["fused (flash) attention"] * plan.flags.flash_attention
    items += ["tensor-parallel communication overlap"] * (plan.flags.tp_comm_overlap and p.tp > 1)
    return items
