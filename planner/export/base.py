"""What every exporter shares: the :class:`Export` it returns, and what it reads from a plan.

An exporter writes what the framework can express and says, in :attr:`Export.changes`, every way
that differs from the plan. The plan itself is never altered: the closest expressible plan is
described as a :class:`~planner.config.ParallelConfig` (``Draft.config``), which the caller's
``price`` turns into a step time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from planner.config import ParallelConfig
from planner.errors import ConfigError
from planner.plan import Plan, StageParallel

Format = Literal["megatron", "mindspeed", "deepspeed", "colossalai", "torchtitan"]
Price = Callable[[ParallelConfig], float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Export:
    """A plan spelled for one framework."""

    text: str
    """What the user pastes into the launcher (flags, JSON, Python or TOML)."""
    format: Format
    """The framework the text is for."""
    changes: tuple[str, ...] = ()
    """Every way the text differs from the plan, because the framework cannot express it."""
    changed_step_time_s: float | None = None
    """Predicted step time of the closest expressible plan (from ``price``, when given and the
    export changed something)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """The plan as one sharding for every stage: what a framework's flags can say."""

    parallel: StageParallel
    """The sharding of every stage (the most common one when the stages differ)."""
    layers: tuple[int, ...]
    """Decoder layers on each pipeline stage, first to last."""
    dp: int
    """Data-parallel size: replicas of the pipeline x data-parallel ways inside a stage."""
    vpp: int
    """Virtual stages per pipeline rank (> 1 only for the interleaved schedule)."""

    @property
    def pp(self) -> int:
        """Pipeline stages."""
        return len(self.layers)

    @property
    def even(self) -> bool:
        """Every stage holds the same number of layers."""
        return len(set(self.layers)) == 1


@dataclass(slots=True)
class Draft:
    """An export being written: the changes found so far and the closest plan they leave."""

    config: ParallelConfig
    changes: list[str] = field(default_factory=list)

    def change(self, why: str, **closest: object) -> None:
        """Record a difference from the plan; ``closest`` updates the closest plan's config."""
        self.changes.append(why)
        if closest:
            self.config = self.config.model_copy(update=closest)


def describe(p: StageParallel) -> str:
    """A stage's sharding as a user would say it.

    >>> describe(StageParallel(tp=8, dp=1, sp=True, zero_stage=1, recompute="selective"))
    'TP8, DP1, SP, ZeRO-1, selective recompute'
    """
    parts = [f"TP{p.tp}", f"DP{p.dp}"]
    parts += [f"CP{p.cp}"] * (p.cp > 1) + [f"EP{p.ep}"] * (p.ep > 1) + ["SP"] * p.sp
    parts += [f"ZeRO-{p.zero_stage}"] * (p.zero_stage > 0)
    parts += [f"{p.recompute} recompute"] * (p.recompute != "none")
    return ", ".join(parts)


def _closest_uniform(plan: Plan) -> tuple[StageParallel, str | None]:
    """The most common stage sharding, and what exporting it changes (None if nothing)."""
    if plan.uniform is not None:
        return plan.uniform, None
    # Counter keeps first-seen order among equal counts, so ties go to the earlier stage.
    common, count = Counter(s.parallel for s in plan.stages).most_common(1)[0]
    others = [s for s in plan.stages if s.parallel != common]
    listed = "; ".join(f"stage {s.index} ({describe(s.parallel)})" for s in others)
    why = (f"the framework gives every pipeline stage the same sharding: {listed} exported as "
           f"{describe(common)}, the sharding of {count} of {len(plan.stages)} stages")  # fmt: skip
    return common, why


def _first_last(layers: tuple[int, ...]) -> dict[str, int]:
    """Megatron's uneven split: any first and last stage around equal middle stages (middle
    stages that differ get their mean, the rest going to the first stage, as the Megatron
    exporter writes them)."""
    if len(set(layers)) <= 1 or len(layers) < 2:
        return {}
    middle = layers[1:-1]
    each, left = divmod(sum(middle), len(middle)) if middle else (0, 0)
    first, last = layers[0] + left, layers[-1]
    out = {}
    if not middle or first != each:
        out["first_stage_layers"] = first
    if middle and last != each:
        out["last_stage_layers"] = last
    if not middle:
        out["last_stage_layers"] = last
    return out


def start(plan: Plan) -> tuple[Layout, Draft]:
    """Read the plan once: its uniform layout, and a draft whose closest plan is the plan."""
    parallel, why = _closest_uniform(plan)
    layout = Layout(
        parallel=parallel,
        layers=tuple(s.num_layers for s in plan.stages),
        dp=plan.data_parallel_replicas * parallel.dp,
        vpp=plan.schedule.virtual_stages if plan.schedule.name == "interleaved" else 1,
    )
    config = ParallelConfig(
        tp=parallel.tp, pp=layout.pp, dp=layout.dp, cp=parallel.cp, ep=parallel.ep,
        vpp=layout.vpp, sp=parallel.sp, mbs=plan.micro_batch_size,
        global_batch=plan.global_batch_size, seq_len=plan.seq_length,
        recompute=parallel.recompute, zero=parallel.zero_stage, precision=plan.precision,
        schedule="gpipe" if plan.schedule.name == "gpipe" else "1f1b",
        flash_attention=plan.flags.flash_attention,
        overlap_grad_reduce=plan.flags.overlap_grad_reduce,
        overlap_param_gather=plan.flags.overlap_param_gather,
        tp_comm_overlap=plan.flags.tp_comm_overlap, **_first_last(layout.layers),
    )  # fmt: skip
    draft = Draft(config=config)
    if why is not None:
        draft.changes.append(why)
    return layout, draft


def finish(draft: Draft, *, text: str, fmt: Format, price: Price | None) -> Export:
    """The export, priced when it changed something and a price function was given.

    A closest plan that is not a uniform configuration the cost model accepts (say 94 layers
    on 16 stages) raises :class:`ConfigError` in ``price``: it then has no price (None) rather
    than failing the export, which is still what the user should paste.
    """
    step_time_s = None
    if draft.changes and price is not None:
        try:
            step_time_s = price(draft.config)
        except ConfigError:
            step_time_s = None
    return Export(text=text, format=fmt, changes=tuple(draft.changes),
                  changed_step_time_s=step_time_s)  # fmt: skip


def plural(n: int, word: str) -> str:
    """``3 layers``, ``1 layer``."""
    return f"{n} {word}{'s' * (n != 1)}"
