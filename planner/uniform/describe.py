"""A uniform configuration as the errors name it, and which of its memory knobs are at their
leanest (the uniform space's, :mod:`planner.uniform.space`)."""

from __future__ import annotations

from planner.plan.config import ParallelConfig
from planner.uniform import space


def describe(config: ParallelConfig) -> str:
    """A configuration as the errors name it.

    >>> describe(ParallelConfig(tp=8, pp=4, first_stage_layers=31, last_stage_layers=31))
    'tp 8, pp 4 with 31 and 31 layers at the ends, cp 1, ep 1, mbs 1, no recompute, ZeRO-0'
    """
    c = config
    pp = f"pp {c.pp}"
    if c.first_stage_layers is not None or c.last_stage_layers is not None:
        pp += f" with {c.first_stage_layers} and {c.last_stage_layers} layers at the ends"
    if c.vpp > 1:
        pp += f", vpp {c.vpp}"
    recompute = "no" if c.recompute == "none" else c.recompute
    if c.recompute_modules is not None:
        recompute += f" ({c.recompute_modules})"
    if c.recompute_layers is not None:
        recompute += f" ({c.recompute_layers} per chunk)"
    offload = ", optimizer offloaded" if c.offload == "optimizer" else ""
    return (
        f"tp {c.tp}, {pp}, cp {c.cp}, ep {c.ep}{' (etp 1)' * (c.etp == 1 and c.tp > 1)}, "
        f"mbs {c.mbs}, {recompute} recompute, ZeRO-{c.zero}{offload}"
    )


def describe_leanest(config: ParallelConfig) -> str:
    """:func:`describe`, and which memory knobs are already at their leanest: a microbatch of
    1, full recomputation, ZeRO-3 (ZeRO-1 with a pipeline, as in the grid's space).

    >>> describe_leanest(ParallelConfig(tp=8, pp=8, recompute="full", zero=1))
    'tp 8, pp 8, cp 1, ep 1, mbs 1, full recompute, ZeRO-1: microbatch, recomputation and ZeRO \
at their leanest (no framework here runs ZeRO-2/3 with a pipeline)'
    """
    c = config
    zero = c.zero >= leanest_zero(c.pp)
    lean = [name for name, at in (("microbatch", c.mbs == 1), ("recomputation",
            c.recompute == "full"), ("ZeRO", zero)) if at]  # fmt: skip
    if not lean:
        return describe(c)
    names = lean[0] if len(lean) == 1 else f"{', '.join(lean[:-1])} and {lean[-1]}"
    text = f"{describe(c)}: {names} at {'its' if len(lean) == 1 else 'their'} leanest"
    return text + (" (no framework here runs ZeRO-2/3 with a pipeline)" if zero and c.zero < 3
                   else "")


def leanest_zero(pp: int) -> int:
    """The highest ZeRO stage launched with ``pp`` pipeline stages."""
    return max(space.zero_stages(pp))
