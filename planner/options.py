"""What a user asks of a search: the run, the framework target, the knobs they pinned, the
margin to leave free and how long to try; and the progress a search reports back.

Every search reads the same :class:`SolveOptions`: the per-operator search
(:mod:`planner.search`), the enumeration of uniform configurations (:mod:`planner.uniform`)
and the baselines. Training settings the options leave out come from the model's own
training block (:func:`training_of`, through :func:`planner.spec.reading.fill_training`, which
``planner estimate``, ``planner layer`` and ``planner info`` use too).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

from planner import cost
from planner.cost.risk import QUANTILE, parse_objective
from planner.cost.uncertainty import memory_band
from planner.errors import InputError
from planner.frameworks import check_framework, default_stack
from planner.ilp.backends import Backend
from planner.plan.config import check_sequence, recompute_modules_of
from planner.spec import DeviceSpec, ModelSpec, TrainingSpec
from planner.spec.reading import fill_training
from planner.vocabulary import (
    STACKS,
    ContextParallelism,
    MoeDispatcher,
    Objective,
    OptimizerMoments,
    Precision,
    Recompute,
    Stack,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pins:
    """Knobs the user fixed (``--tp 8`` ...); None leaves one to the search. Spelled as
    ``planner estimate`` spells them.

    >>> pins = Pins(tp=8, recompute="selective")
    >>> pins.given()
    {'tp': 8, 'recompute': 'selective'}
    >>> pins.admits(tp=8, pp=4), pins.admits(tp=4)
    (True, False)
    """

    tp: int | None = None
    """Tensor-parallel degree."""
    pp: int | None = None
    """Pipeline stages."""
    cp: int | None = None
    """Context-parallel degree."""
    cp_algo: ContextParallelism | None = None
    """ring or ulysses."""
    ep: int | None = None
    """Expert-parallel degree."""
    etp: int | None = None
    """Expert tensor-parallel degree (tp, or 1: the experts folded over the tensor-parallel
    ranks)."""
    vpp: int | None = None
    """Virtual stages per pipeline rank (1: no interleaving)."""
    mbs: int | None = None
    """Sequences per data-parallel rank and microbatch."""
    zero: int | None = None
    """ZeRO stage."""
    recompute: Recompute | None = None
    """none, selective or full."""
    recompute_modules: str | None = None
    """What selective recomputation reruns (Megatron-Core's ``--recompute-modules``,
    comma-separated)."""
    sp: bool | None = None
    """Sequence parallelism (with TP)."""
    moe_dispatcher: MoeDispatcher | None = None
    """How configurations with expert parallelism exchange the experts' tokens (alltoall or
    deepep: the cluster has DeepEP installed); those without exchange none. Not a choice
    the search makes: DeepEP is software a cluster may not have. None: alltoall. The
    per-operator search (``any``) prices DeepEP too, and spreads the experts over no group
    of ranks DeepEP refuses."""
    optimizer_moments: OptimizerMoments | None = None
    """Adam's moments in bf16 (Megatron-LM's precision-aware optimizer) or fp32: a numerical
    choice the search keeps as given, on every configuration it prices (those with ZeRO 1:
    Megatron-LM runs the precision-aware optimizer inside its distributed optimizer). None:
    fp32. Pinned bf16, the per-operator search (``any``) gives every layer ZeRO 1 and bf16
    moments."""

    def __post_init__(self) -> None:
        # A pin no configuration can keep is refused here, in the flag's words, before any
        # search builds a configuration from it.
        for name in _DEGREES:
            value = getattr(self, name)
            if value is not None and not _is_count(value):
                raise InputError(f"--{name} {value!r}: a degree is a whole number, at least 1")
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise InputError(f"--zero {self.zero!r}: ZeRO stages are 0, 1, 2, 3")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value is not None and value not in get_args(choices):
                raise InputError(f"--{name.replace('_', '-')} {value!r}: choose from "
                                 f"{', '.join(get_args(choices))}")  # fmt: skip
        if self.sp is not None and not isinstance(self.sp, bool):
            raise InputError(f"--sp {self.sp!r}: True or False")
        if self.recompute_modules is None:
            return
        flag = f"--recompute-modules {self.recompute_modules!r}"
        try:
            recompute_modules_of(self.recompute_modules)
        except ValueError as exc:
            raise InputError(f"{flag}: {exc}") from None
        if self.recompute not in (None, "selective"):
            raise InputError(f"{flag} says what selective recomputation reruns: it needs "
                             f"--recompute selective, not {self.recompute}")  # fmt: skip

    def given(self) -> dict[str, object]:
        """The pinned knobs and their values."""
        return {name: getattr(self, name) for name in self.__slots__
                if getattr(self, name) is not None}  # fmt: skip

    def flags(self) -> dict[str, str]:
        """Each pinned knob as the command line spells it (``planner estimate``'s options).

        >>> Pins(tp=8, sp=False, moe_dispatcher="deepep").flags()
        {'tp': '--tp 8', 'sp': '--no-sp', 'moe_dispatcher': '--moe-dispatcher deepep'}
        """
        out = {}
        for name, value in self.given().items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                out[name] = flag if value else f"--no-{flag[2:]}"
            else:
                out[name] = f"{flag} {value}"
        return out

    def admits(self, **knobs: object) -> bool:
        """Whether every pinned knob among ``knobs`` has its pinned value."""
        return all(getattr(self, k) is None or getattr(self, k) == v for k, v in knobs.items())


_DEGREES = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs")
"""The pins that are counts of ranks or sequences."""
_CHOICES = {"cp_algo": ContextParallelism, "recompute": Recompute,
            "moe_dispatcher": MoeDispatcher, "optimizer_moments": OptimizerMoments}  # fmt: skip
"""The pins that are one of a few words."""


def _is_count(value: object) -> bool:
    """A whole number at least 1 (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


NO_PINS = Pins()


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveOptions:
    """What the search may choose from, and how hard it tries.

    >>> options = SolveOptions(framework="deepspeed", global_batch_size=512, pins=Pins(pp=1))
    >>> options.framework, options.micro_batch_sizes, options.pins.given()
    ('deepspeed', (1, 2, 4, 8), {'pp': 1})

    The memory a plan leaves free on an 80 GiB device, by default and when given:

    >>> from planner.spec import DeviceSpec
    >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
    ...                  peak_tflops={"bf16": 300})
    >>> SolveOptions().margin_bytes(gpu, "megatron-te") / 2**30, options.memory_margin_gib
    (4.0, None)
    >>> SolveOptions(memory_margin_gib=8).margin_bytes(gpu, "hf-eager") / 2**30
    8.0
    """

    global_batch_size: int | None = None
    """Sequences per optimizer step (``--global-batch``); None: the model's training block."""
    seq_length: int | None = None
    """Tokens per sequence (``--seq-len``); None: the model's training block."""
    precision: Precision | None = None
    """Mixed-precision compute type; None: the model's training block, else bf16."""
    stack: Stack | None = None
    """The software that runs each layer; None: the model's training block, else
    megatron-te."""
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Sequences per data-parallel rank and microbatch (Megatron's ``--micro-batch-size``);
    a mesh takes this times the data-parallel ways inside it (:func:`mesh_microbatches`)."""
    interleaved: bool = True
    """Whether interleaved 1F1B (virtual pipeline stages) may be chosen."""
    max_mesh_nodes: int | None = None
    """A stage's mesh spans part of a node or 1, 2, 4, ... nodes up to this (Alpa allows any
    count). None: one node for dense models, two for mixtures of experts and on scale-up
    domains wider than a node (an NVL72 rack's trays of 4 GPUs talk over NVLink). Across
    nodes joined only by the scale-out network a mesh axis is mostly data parallel, which
    replicas of the pipeline already give; expert parallelism is the common reason to span
    them. Each wider mesh makes its layer ILPs slower (a second instead of milliseconds):
    Llama 3.1 405B on 576 GB200 searches 1.8 s on one-tray meshes (38.07 s a step), 9.5 s
    up to two trays (34.51 s), 81 s up to 16 (34.51 s)."""
    backend: Backend = "ortools"
    """The ILP solver of the per-operator search."""
    ilp_time_limit_s: float = 10.0
    """Per layer ILP (cut short by :attr:`time_limit_s` too)."""
    time_limit_s: float | None = None
    """The whole search. Past it the best plan found so far is returned, with status
    ``time_limit`` and its gap to the least bound of the candidates left; None: no limit."""
    flash_attention: bool = True
    """Fused (flash) attention."""
    overlap_grad_reduce: bool = True
    """Whether the gradient reduction may overlap the backward pass."""
    overlap_param_gather: bool = True
    """Whether ZeRO's parameter all-gathers may overlap the forward pass."""
    tp_comm_overlap: bool = False
    """Whether the tensor-parallel collectives may overlap their GEMMs where the framework
    launches it (Megatron-LM's ``--tp-comm-overlap``, Transformer Engine's userbuffers, with
    sequence parallelism; Colossal-AI's ``ring`` sequence parallelism for Llama and Qwen):
    off by default, as Megatron-LM's is, since it needs TE built with userbuffers and a
    bootstrap backend a cluster may not have. A framework's search tries each configuration
    with it, then without (``any``'s per-operator plans do not)."""
    framework: str = "megatron"
    """The framework that will launch the plan (:data:`planner.frameworks.TARGETS`): the search
    produces only what its profile launches; ``any`` searches per-operator shardings."""
    pins: Pins = NO_PINS
    """Knobs the user fixed."""
    memory_margin_gib: float | None = None
    """Device memory plans leave free; None: the stack's share of the device
    (:data:`planner.cost.MEMORY_MARGIN`: the memory model's measured error on it)."""
    objective: Objective = "expected"
    """What plans are ranked by: the predicted step (``expected``), or its error band's slow
    end at the 80th or 95th percentile (``p80``, ``p95``; :mod:`planner.cost.risk`), so that
    a plan the validated runs vouch for wins over a slightly faster one they do not."""

    def __post_init__(self) -> None:
        # Checked here, in the fields' names, as the command line checks its flags: a library
        # caller's or a sweep's bad value would otherwise fail after a whole search, or not
        # (the run's length and batch are checked with the model's, by training_of).
        if not self.micro_batch_sizes or not all(map(_is_count, self.micro_batch_sizes)):
            raise InputError(f"micro_batch_sizes {self.micro_batch_sizes!r}: one or more whole "
                             "numbers, each at least 1")  # fmt: skip
        if self.memory_margin_gib is not None:
            cost.memory_margin_bytes(1.0, self.memory_margin_gib)  # refuses a negative one
        # 0 is a limit already passed: the search says so (TimeLimitError), as --time-limit 0
        for name in ("time_limit_s", "ilp_time_limit_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, numbers.Real) and value >= 0):
                raise InputError(f"{name} {value!r}: seconds, at least 0")
        parse_objective(self.objective)
        if not isinstance(self.pins, Pins):
            raise InputError(f"pins {self.pins!r}: a Pins")
        check_framework(self.framework, option="framework")
        for name, choices in (("stack", STACKS), ("backend", get_args(Backend)),
                              ("precision", get_args(Precision))):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise InputError(f"{name} {value!r}: choose from {', '.join(choices)}")
        if self.max_mesh_nodes is not None and not _is_count(self.max_mesh_nodes):
            raise InputError(f"max_mesh_nodes {self.max_mesh_nodes!r}: a whole number, at "
                             "least 1")  # fmt: skip

    def margin_bytes(self, device: DeviceSpec, stack: Stack) -> float:
        """The memory a plan run by ``stack`` leaves free on ``device``: the margin given, or
        the stack's (:func:`planner.cost.memory_margin_bytes`); ranked at a quantile
        (:attr:`objective`), at least the memory band at that quantile
        (:func:`planner.cost.uncertainty.memory_band`), so that the headroom covers what the
        memory model was seen to miss by."""
        margin = cost.memory_margin_bytes(device.memory_gib, self.memory_margin_gib, stack)
        quantile = QUANTILE[self.objective]
        if quantile is None or self.memory_margin_gib is not None:
            return margin
        band = memory_band(device, stack).at(quantile)
        return margin if band is None else max(margin, band * device.memory_bytes)

    def usable_bytes(self, device: DeviceSpec, stack: Stack) -> float:
        """What a plan run by ``stack`` may fill on ``device``: its memory less
        :meth:`margin_bytes`."""
        return device.memory_bytes - self.margin_bytes(device, stack)


def check_memory_margin(margin_gib: float | None, device: DeviceSpec) -> None:
    """Refuse a margin (``--memory-margin``) that leaves nothing of ``device`` to fill: no
    plan could fit, and every way out a search would suggest would fail the same way.

    >>> from planner.spec import DeviceSpec
    >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
    ...                  peak_tflops={"bf16": 300})
    >>> check_memory_margin(200, gpu)
    Traceback (most recent call last):
    planner.errors.InputError: --memory-margin 200 GiB leaves nothing of x's 80 GiB to fill
    """
    if margin_gib is not None and margin_gib >= device.memory_gib:
        raise InputError(f"--memory-margin {margin_gib:g} GiB leaves nothing of "
                         f"{device.name}'s {device.memory_gib:g} GiB to fill")


DEFAULT_OPTIONS = SolveOptions()
"""What ``solve`` searches when given no options."""

SEARCH_TIME_LIMIT_S = 600.0
"""The default bound on a search a user starts (the command line, a sweep's points): no bundled
instance takes a fifth of it, and a user who forgot a huge cluster gets a plan and its gap
rather than a hang."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """Reported after each candidate: how far the search is and the best step so far."""

    done: int
    """Candidates searched so far."""
    total: int
    """Candidates in all."""
    best_step_s: float | None
    """The best step time found so far; None before any plan fits."""
    searching: str = ""
    """The candidate being searched, as a user would say it (empty once done)."""


ProgressFn = Callable[[Progress], None]


def training_of(model: ModelSpec, options: SolveOptions) -> TrainingSpec:
    """The run's sequence length, global batch, precision and stack: the options, else the
    model's training block (:func:`~planner.spec.reading.fill_training`), the stack else the
    framework's (:func:`~planner.frameworks.default_stack`); a sequence longer than a model
    with learned positions has positions for is refused."""
    stack = default_stack(options.framework, model, options.stack)
    training = fill_training(model, seq_length=options.seq_length,
                             global_batch_size=options.global_batch_size,
                             precision=options.precision, stack=stack)  # fmt: skip
    check_sequence(model, training.seq_length)
    return training
