"""One notch of each knob of a uniform configuration, either way, and a user's own changes.

:data:`KNOBS` is the table: for each :class:`~planner.plan.config.ParallelConfig` field a user
turns, the values it may take in order. One notch down (up) is the nearest value below (above)
the configuration's that divides; a ladder (recomputation, ZeRO, a switch) moves one rung. A
knob added to ``ParallelConfig`` later is one line here.

The devices stay the same: when a degree that takes devices moves (``tp``, ``pp``, ``cp``),
data parallelism absorbs the difference (``tp 8 -> 4`` doubles ``dp``), as a user who changes
one flag of a fixed-size job would expect; when ``pp`` moves and the layers do not split evenly,
Megatron's uneven first and last stage take the rest (:func:`planner.uniform.space.stage_splits`).

>>> from planner.spec.reading import load_model
>>> model = load_model("instances/models/gpt3-175b.json")
>>> base = ParallelConfig(tp=4, pp=8, dp=32, recompute="selective")
>>> [(knob.name, [c.recompute for c in down], [c.recompute for c in up])
...  for knob, down, up in notches(base, model, 1024) if knob.name == "recompute"]
[('recompute', ['none'], ['full'])]
>>> with_changes(base, {"tp": 8}, model).dp is None  # dp: the devices left over
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from planner.errors import InputError
from planner.plan.chunks import cuts_into
from planner.plan.config import ParallelConfig, stage_layers
from planner.spec import ModelSpec
from planner.spec.reading import fill_training
from planner.uniform.recomputations import lean_recompute_modules
from planner.uniform.space import divisors, stage_splits
from planner.vocabulary import (
    CONTEXT_PARALLELISMS,
    OP_SAC,
    RECOMPUTE_MODES,
    STACK_SWITCHES,
    Stack,
    counted,
    stack_switch,
    switched_on,
    with_switch,
)

Values = Callable[[ParallelConfig, ModelSpec, int], tuple[Any, ...]]
"""The values a knob may take for a configuration, a model and a device count, in order."""
Applies = Callable[[ParallelConfig, ModelSpec], bool]
"""Whether a knob means anything for a configuration and a model."""


def _always(config: ParallelConfig, model: ModelSpec) -> bool:
    return True


def _fixed(*values: Any) -> Values:
    """A ladder of fixed rungs."""
    return lambda config, model, devices: values


def _recompute_modules(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[Any, ...]:
    """Selective recomputation's default modules, and every output-discarding one that
    applies (:func:`~planner.uniform.recomputations.lean_recompute_modules`); torchtitan's
    per-operator policy alone, which no Megatron module is a notch from."""
    if config.recompute_modules == OP_SAC:
        return (OP_SAC,)
    # only the precision and the stack matter: a length and a batch are filled in for
    # configurations that leave them to a model without a training block
    training = fill_training(model, seq_length=config.seq_len or 1,
                             global_batch_size=config.global_batch or 1,
                             precision=config.precision, stack=config.stack)  # fmt: skip
    lean = lean_recompute_modules(model, training)
    return (None,) if lean is None else (None, lean)


def _device_divisors(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[int, ...]:
    return tuple(divisors(devices))


def _stages(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[int, ...]:
    return tuple(d for d in divisors(devices) if d <= model.num_layers)


def _chunks(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[int, ...]:
    # chunks per stage divide its layers (the busiest stage's, with uneven ends)
    return tuple(divisors(max(1, model.num_layers // config.pp)))


def _experts(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[int, ...]:
    return tuple(divisors(model.moe.num_experts)) if model.moe else (1,)


def _schedules(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[str, ...]:
    # without interleaving GPipe, 1F1B, ZB-H1; with two chunks interleaved 1F1B and ZB-V
    return ("gpipe", "1f1b", "zb-h1") if config.vpp == 1 else ("1f1b", "zb-v")


def _recomputed_layers(
    config: ParallelConfig, model: ModelSpec, devices: int
) -> tuple[int | None, ...]:
    # 1 .. a chunk's layers less one, then every layer (None)
    chunk = max(1, model.num_layers // (config.pp * config.vpp))
    return (*range(1, chunk), None)


def _doublings(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[int, ...]:
    # halvings down to 1 and doublings up to 8x: a microbatch moves by factors of two
    down = [config.mbs >> k for k in range(4, 0, -1) if config.mbs % (1 << k) == 0]
    return (*down, *(config.mbs << k for k in range(4)))


def _switched(config: ParallelConfig, model: ModelSpec, devices: int) -> tuple[Any, ...]:
    """The configuration's stack with its switch off, then on
    (:data:`~planner.vocabulary.STACK_SWITCHES`: Megatron's loss eager then fused, the linears
    in FP8 where the configuration's are; torchtitan's blocks eager then compiled)."""
    switch = stack_switch(config.stack)
    return tuple(with_switch(config.stack, switch, on) for on in (False, True)) if switch else ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Knob:
    """One field of :class:`ParallelConfig` a user turns, and how it moves one notch."""

    name: str
    """The ``ParallelConfig`` field (``planner estimate``'s option with ``-`` for ``_``)."""
    values: Values
    """Every value it may take here, in order."""
    reach: int = 1
    """How many values each way are tried, nearest first: the first that divides is the
    notch (degrees skip what does not divide; a ladder moves one rung)."""
    applies: Applies = _always
    """Whether it means anything here (no expert parallelism without experts)."""
    searched: bool = True
    """Whether ``planner solve`` turns it (else it keeps the value its options give)."""
    needs_host: bool = False
    """Whether it means anything only on a cluster with host figures (offload)."""


KNOBS: tuple[Knob, ...] = (
    Knob(name="tp", values=_device_divisors, reach=3),
    Knob(name="pp", values=_stages, reach=3),
    Knob(name="vpp", values=_chunks, reach=4, applies=lambda c, m: c.pp > 1),
    Knob(name="cp", values=_device_divisors, reach=3),
    Knob(name="cp_algo", values=_fixed(*CONTEXT_PARALLELISMS), applies=lambda c, m: c.cp > 1),
    Knob(name="ep", values=_experts, reach=3, applies=lambda c, m: m.moe is not None),
    Knob(name="etp", values=lambda c, m, n: (None, 1) if c.tp > 1 else (None,),
         applies=lambda c, m: m.moe is not None and c.tp > 1),
    Knob(name="mbs", values=_doublings, reach=3),
    Knob(name="recompute", values=_fixed(*RECOMPUTE_MODES)),
    Knob(name="recompute_modules", values=_recompute_modules,
         applies=lambda c, m: c.recompute == "selective"),
    Knob(name="recompute_layers", values=_recomputed_layers,
         applies=lambda c, m: c.recompute == "full"),
    # Megatron's pipelined optimizer offload or DeepSpeed's ZeRO-Offload: the one the plan's
    # framework launches is the notch
    Knob(name="offload", values=_fixed("none", "optimizer", "zero-offload"), reach=2,
         needs_host=True),
    Knob(name="zero", values=_fixed(0, 1, 2, 3)),
    Knob(name="sp", values=_fixed(False, True), applies=lambda c, m: c.tp > 1),
    # interleaving is a 1F1B schedule: GPipe and ZB-H1 are notches only without it, ZB-V only
    # with two chunks
    Knob(name="schedule", values=_schedules, applies=lambda c, m: c.pp > 1 and c.vpp <= 2),
    Knob(name="flash_attention", values=_fixed(False, True), searched=False),  # an option
    Knob(name="overlap_grad_reduce", values=_fixed(False, True)),
    Knob(name="overlap_param_gather", values=_fixed(False, True),
         applies=lambda c, m: c.zero >= 1),
    # solve keeps ParallelConfig's default (off) unless SolveOptions.tp_comm_overlap lets it
    # turn it (planner.uniform.launched)
    Knob(name="tp_comm_overlap", values=_fixed(False, True), applies=lambda c, m: c.tp > 1,
         searched=False),
    Knob(name="overlap_moe_expert_parallel_comm", values=_fixed(False, True),
         applies=lambda c, m: c.ep > 1),
    # a pin, not a choice of the search: DeepEP is software the cluster may not have
    Knob(name="moe_dispatcher", values=_fixed("alltoall", "deepep"),
         applies=lambda c, m: c.ep > 1, searched=False),
    # Megatron's loss eager or fused (--cross-entropy-loss-fusion), torchtitan's blocks eager or
    # compiled: the stack a plan was asked for, which the search keeps
    Knob(name="stack", values=_switched, applies=lambda c, m: stack_switch(c.stack) is not None,
         searched=False),
)
"""The knobs :func:`notches` turns, in the order a report lists them."""

DEVICE_DEGREES = ("tp", "pp", "cp")
"""The degrees that take devices: when one moves, data parallelism takes what is left."""
PROBLEM = ("global_batch", "seq_len", "precision", "optimizer_moments")
"""Fields that define the training run, not how it is parallelised (its numerics, Adam's
moments among them): never changed here."""


def notches(
    config: ParallelConfig, model: ModelSpec, num_devices: int, *, host: bool = True
) -> Iterator[tuple[Knob, list[ParallelConfig], list[ParallelConfig]]]:
    """For each knob of :data:`KNOBS` that applies: the configurations one notch down and one
    notch up, nearest first (the caller keeps the first that divides); an empty list where the
    knob is at its end. ``host``: whether the cluster has host figures (else no offload)."""
    for knob in KNOBS:
        if not knob.applies(config, model) or (knob.needs_host and not host):
            continue
        values = knob.values(config, model, num_devices)
        now = getattr(config, knob.name)
        below = [v for v in values if _rank(values, v) < _rank(values, now)][::-1]
        above = [v for v in values if _rank(values, v) > _rank(values, now)]
        yield (knob, [with_changes(config, {knob.name: v}, model) for v in below[: knob.reach]],
               [with_changes(config, {knob.name: v}, model) for v in above[: knob.reach]])


def _rank(values: tuple[Any, ...], value: Any) -> float:
    """Where ``value`` sits among ``values``; a value off the ladder by its own order."""
    if value in values:
        return values.index(value)
    if value is None or None in values:  # None is every layer: the top rung
        return len(values) - 1 if value is None else float(len(values) - 1) - 0.5
    return float(sum(v < value for v in values)) - 0.5


def with_changes(
    config: ParallelConfig, changes: Mapping[str, Any], model: ModelSpec
) -> ParallelConfig:
    """``config`` with ``changes``, the devices kept, and the knobs that depend on a changed
    one moved with it (unless given; :func:`describe_change` names them): ``dp`` left to take
    the devices when a degree that takes devices changes; the first and last stage's layers
    reset when ``pp`` changes, to Megatron's uneven split when the layers do not divide
    evenly; ZeRO-0 overlaps no parameter gather (there is none); a count of recomputed layers
    dropped when recomputation is named without one (``full`` then recomputes every layer),
    and full recomputation when a count is given;
    :data:`LOSS_FUSION` on or off, the stack with Megatron's loss fused or eager. Raises
    :class:`InputError` when the changes given contradict each other.

    >>> from planner.spec.reading import load_model
    >>> llama = load_model("instances/models/llama3-70b.json")
    >>> partial = ParallelConfig(recompute="full", recompute_layers=20)
    >>> with_changes(partial, {"recompute": "selective"}, llama).recompute_layers is None
    True
    >>> with_changes(partial, {"recompute": "full"}, llama).recompute_layers is None
    True
    >>> with_changes(ParallelConfig(), {"recompute_layers": 4}, llama).recompute
    'full'
    """
    changes = _stack_of_switches(config, changes)
    values = config.model_dump() | dict(changes)
    if "dp" not in changes and any(k in changes for k in DEVICE_DEGREES):
        values["dp"] = None
    if changes.get("zero") == 0 and "overlap_param_gather" not in changes:
        values["overlap_param_gather"] = False  # replicated weights: no gather to overlap
    # --recompute-num-layers is a count of fully recomputed layers (ParallelConfig's rule);
    # recomputation named without a count is every layer's, even where the plan counted some
    # (--why-not recompute=full on a plan recomputing 8 of 32 layers kept the 8, unsaid)
    if "recompute" in changes and "recompute_layers" not in changes:
        values["recompute_layers"] = None
    # so are the modules of selective recomputation
    if "recompute" in changes and "recompute_modules" not in changes \
            and values["recompute"] != "selective":
        values["recompute_modules"] = None
    if changes.get("recompute_modules") is not None and "recompute" not in changes:
        values["recompute"] = "selective"
    if changes.get("recompute_layers") is not None and "recompute" not in changes:
        values["recompute"] = "full"
    ends = ("first_stage_layers", "last_stage_layers")
    if "pp" in changes and not any(k in changes for k in ends):
        pp = changes["pp"]
        splits = stage_splits(model.num_layers, pp) if 0 < pp <= model.num_layers else []
        # the first split whose stages cut into the chunks (DeepSeek-V3's 61 layers on PP8
        # VPP4: 7 + 8 x 6 + 6, the recipe's, not the first split's 6 + 8 x 6 + 7)
        chunked = [s for s in splits if _cuts(model, pp, s, values.get("vpp") or 1)]
        values.update(zip(ends, (chunked or splits or [(None, None)])[0], strict=True))
    try:
        return ParallelConfig(**values)
    except ValidationError as exc:  # only changes given together can still disagree
        given = ", ".join(f"{k.replace('_', '-')}={word(v, k)}" for k, v in changes.items())
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise InputError(f"{given}: {reason}") from None


def _cuts(model: ModelSpec, pp: int, ends: tuple[int | None, int | None], vpp: int) -> bool:
    """Whether ``pp`` stages with these end stages' layers (None: equal stages) cut into
    ``vpp`` model chunks each (:func:`planner.plan.chunks.cuts_into`)."""
    first, last = ends
    layers = stage_layers(model.num_layers, pp=pp, first=first, last=last)
    return cuts_into(layers, vpp, model.mtp_layers)


SWITCHES = {name.replace("-", "_"): name for name in STACK_SWITCHES}
"""The switches ``--why-not`` takes for the stack's notch (``cross_entropy_loss_fusion``,
``compile``), by their field-like names."""


def _stack_of_switches(config: ParallelConfig, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` with each switch (:data:`SWITCHES`) turned into the stack it means: the
    configuration's (or the stack given, else Megatron's default) with it on or off."""
    changes = dict(changes)
    for key, switch in SWITCHES.items():
        if key not in changes:
            continue
        on = changes.pop(key)
        stack = changes.get("stack", config.stack) or "megatron-te"
        changes["stack"] = with_switch(stack, switch, on)
        if changes["stack"] is None:
            runs = ", ".join(STACK_SWITCHES[switch].values())
            raise InputError(f"{switch}: turns {runs} (or their switched stacks) only; the "
                             f"configuration runs {stack}")  # fmt: skip
    return changes


def describe_change(
    before: ParallelConfig, after: ParallelConfig, *, dp: tuple[int, int],
    microbatches: tuple[int, int], knob: str | None = None,
) -> str:  # fmt: skip
    """``tp 4 -> 8 (dp 32 -> 16)``: the knobs that moved (``knob`` first, the others that
    moved with it in brackets), then what moved with them (``dp`` and ``microbatches``:
    before and after).

    >>> describe_change(ParallelConfig(mbs=1), ParallelConfig(mbs=2), dp=(8, 8),
    ...                 microbatches=(16, 8))
    'mbs 1 -> 2 (8 microbatches)'
    >>> describe_change(ParallelConfig(mbs=2), ParallelConfig(mbs=4), dp=(8, 8),
    ...                 microbatches=(2, 1))
    'mbs 2 -> 4 (1 microbatch)'
    >>> describe_change(ParallelConfig(zero=1, overlap_param_gather=True), ParallelConfig(),
    ...                 dp=(8, 8), microbatches=(16, 16), knob="zero")
    'zero 1 -> 0 (overlap-param-gather off)'
    >>> describe_change(ParallelConfig(recompute="full", recompute_layers=20),
    ...                 ParallelConfig(recompute="selective"), dp=(8, 8), microbatches=(16, 16),
    ...                 knob="recompute")
    'recompute full -> selective (recompute-layers 20 dropped)'
    """
    names = [k.name for k in KNOBS if getattr(before, k.name) != getattr(after, k.name)]
    lead = [n for n in names if n == knob] or names
    moved = [f"{said(n, before.stack)} {_state(getattr(before, n), n)} -> "
             f"{_state(getattr(after, n), n)}" for n in lead]
    also = [_moved_with(n, before, after) for n in names if n not in lead]
    if dp[1] and dp[1] != dp[0]:
        also.append(f"dp {dp[0]} -> {dp[1]}")
    elif microbatches[1] and microbatches[1] != microbatches[0]:
        also.append(counted(microbatches[1], "microbatch", "microbatches"))
    ends = (after.first_stage_layers, after.last_stage_layers)
    if ends != (before.first_stage_layers, before.last_stage_layers):
        also.append("equal stages" if ends == (None, None) else
                    f"{ends[0]} and {ends[1]} layers at the ends")  # fmt: skip
    return ", ".join(moved) + (f" ({', '.join(also)})" if also else "")


def _moved_with(name: str, before: ParallelConfig, after: ParallelConfig) -> str:
    """A knob that moved with another, as :func:`describe_change` names it: its new value, or
    that it was dropped (a count of recomputed layers without full recomputation, modules
    without selective recomputation)."""
    owner = {"recompute_layers": "full", "recompute_modules": "selective"}
    if name in owner and after.recompute != owner[name]:
        return f"{said(name, after.stack)} {_state(getattr(before, name), name)} dropped"
    return f"{said(name, after.stack)} {_state(getattr(after, name), name)}"


def said(name: str, stack: Stack | None = None) -> str:
    """Knob ``name`` as a changed notch names it: the option's spelling, or for the stack the
    switch that turns ``stack`` (:func:`~planner.vocabulary.stack_switch`).

    >>> said("overlap_grad_reduce"), said("stack", "megatron-te"), said("stack", "torchtitan-eager")
    ('overlap-grad-reduce', 'cross-entropy-loss-fusion', 'compile')
    """
    if name == "stack":
        return stack_switch(stack) or "stack"
    return name.replace("_", "-")


def _state(value: Any, name: str) -> str:
    """A knob's value as a changed notch says it: the stack's notch as its switch, on or off."""
    if name == "stack" and value is not None:
        return word(switched_on(value))
    return word(value, name)


UNSET = {"recompute_layers": "all", "etp": "tp", "recompute_modules": "core_attn"}
"""What a knob left to its default of None means, as a user says it."""


def word(value: Any, name: str = "") -> str:
    """Knob ``name``'s value as a user says it: switches on and off, a default by what it
    means.

    >>> word(True), word("selective"), word(None, "etp")
    ('on', 'selective', 'tp')
    """
    if value is None:
        return UNSET.get(name, "default")
    return ("on" if value else "off") if isinstance(value, bool) else str(value)
