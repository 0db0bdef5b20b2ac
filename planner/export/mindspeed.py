"""MindSpeed (Ascend): Megatron-LM's flags, plus MindSpeed's own where it differs.

MindSpeed patches Megatron-LM and reads the same command line (see :mod:`planner.export.megatron`
for those flags). Its own flags, and where each was checked:

- ``--num-layer-list a,b,...`` (layers per pipeline stage, comma-separated): Ascend/MindSpeed-LLM
  ``mindspeed_llm/features_manager/pipeline_parallel/num_layer_list.py`` (commit 8d0e35b6a8ea),
  earlier ``mindspeed/arguments.py`` of Ascend/MindSpeed (commit 02c49f5de196). Its
  ``validate_args`` wants one entry per pipeline stage, pipeline parallelism, and no virtual
  pipeline ("Dynamic pipeline model and virtual pipeline cannot be enabled at the same time").
- ``--context-parallel-algo megatron_cp_algo``: Megatron's ring attention. The default was
  ``ulysses_cp_algo`` in ``mindspeed/arguments.py`` (commit 02c49f5de196) and is
  ``megatron_cp_algo`` in ``mindspeed/features_manager/context_parallel/
  context_parallel_feature.py`` (commit 010c43dfee81), so it is always spelled out.
- ``--use-flash-attn``: Megatron-LM's flag (``megatron/training/arguments.py``), which MindSpeed
  maps to the NPU's fused attention.
- ``--tp-comm-overlap`` is switched off by MindSpeed's ``validate_args`` ("if args.tp_comm_overlap:
  args.tp_comm_overlap = False", ``mindspeed/arguments.py``); its own TP overlap flags are
  ``--use-ascend-mc2`` and ``--use-ascend-coc`` (same file).
"""

from __future__ import annotations

from planner.export import megatron
from planner.export.base import Draft, Export, Layout, Price, finish, start
from planner.export.megatron import Flag
from planner.plan import Plan


def to_mindspeed(plan: Plan, *, price: Price | None = None) -> Export:
    """The plan as MindSpeed flags, one per line, ready to paste into a launch script."""
    layout, draft = start(plan)
    flags = [
        *megatron.degree_flags(layout),
        *context_parallel_flags(layout),
        *split_flags(layout, draft),
        *megatron.batch_flags(plan),
        *megatron.precision_flags(plan),
        *megatron.recompute_flags(layout),
        *megatron.optimizer_flags(layout, draft),
        *megatron.data_overlap_flags(plan, layout, draft=draft),
    ]
    if plan.flags.tp_comm_overlap and layout.parallel.tp > 1:
        draft.change("MindSpeed switches --tp-comm-overlap off on Ascend; its own overlap of "
                     "tensor-parallel communication (--use-ascend-mc2, --use-ascend-coc) is "
                     "not exported", tp_comm_overlap=False)  # fmt: skip
    if plan.flags.flash_attention:
        flags.append(("--use-flash-attn", None))
    return finish(draft, text=megatron.render(flags), fmt="mindspeed", price=price)


def context_parallel_flags(layout: Layout) -> list[Flag]:
    """Ring attention, as Megatron-LM's context parallelism (which the plan was priced as)."""
    return [("--context-parallel-algo", "megatron_cp_algo")] if layout.parallel.cp > 1 else []


def split_flags(layout: Layout, draft: Draft) -> list[Flag]:
    """An uneven split as ``--num-layer-list``; an even one as in Megatron-LM."""
    if layout.pp == 1 or layout.even:
        return megatron.split_flags(layout, draft)
    if layout.vpp > 1:
        draft.change(f"MindSpeed cannot combine --num-layer-list with virtual pipeline stages: "
                     f"the uneven split is kept and the {layout.vpp} virtual stages dropped "
                     f"(1F1B without interleaving)", vpp=1)  # fmt: skip
    return [("--num-layer-list", ",".join(str(n) for n in layout.layers))]
