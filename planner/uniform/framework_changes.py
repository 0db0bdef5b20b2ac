"""Which changed configurations a framework launches, for the remedies of a configuration that
does not fit (:mod:`planner.uniform.remedies`): each change with the switches the framework's
search sets (:func:`~planner.uniform.defaults.framework_defaults`), kept only if its rules
(:mod:`planner.frameworks`) accept it, and the framework's own reason where it does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import ConfigError
from planner.frameworks import profile
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform import space
from planner.uniform.defaults import framework_defaults

Option = tuple[ParallelConfig, ClusterSpec, str | None]
"""A changed configuration, the cluster it runs on, and what else the change means."""
ZERO_NOTES = {
    1: "Megatron's --use-distributed-optimizer",
    3: "DeepSpeed ZeRO-3 or FSDP; DeepSpeed runs it only without a pipeline",
}
"""The ZeRO stages a user is told of, in Megatron-LM's and DeepSpeed's words."""
_ZERO_SHARDS = {
    1: "the optimizer states sharded over the data-parallel ranks",
    2: "gradients and optimizer states sharded over the data-parallel ranks",
    3: "weights, gradients and optimizer states sharded over the data-parallel ranks",
}
"""What each ZeRO stage shards, said of a framework's own (it launches them under its own
names, and its rules say which)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkChanges:
    """The framework a remedy is for (None: Megatron-LM's flags and DeepSpeed's ZeRO rule):
    which changed configurations it launches, and as what.

    >>> import planner
    >>> model = planner.load_model("instances/models/llama3-8b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=1)
    >>> titan = FrameworkChanges(model=model, framework="torchtitan")
    >>> deeper = (ParallelConfig(pp=2, zero=3, stack="torchtitan-eager"), cluster, None)
    >>> titan(deeper) is None, titan.refusal(deeper)[:26]
    (True, 'ZeRO-3 with pp(2): PyTorch')
    >>> changed, _, _ = titan((ParallelConfig(zero=3), cluster, None))
    >>> changed.stack, changed.overlap_grad_reduce, changed.overlap_param_gather
    ('torchtitan-eager', True, True)
    """

    model: ModelSpec
    """The model the changed configurations train."""
    framework: str | None
    """The framework that launches them (``--framework``); None: Megatron-LM's flags, with
    DeepSpeed's rule of ZeRO-1 at most under a pipeline."""
    given: tuple[str, ...] = ()
    """The switches the user gave (field names): kept as given, the others set as the
    framework's search sets them."""

    @property
    def title(self) -> str:
        """Whose rules a note names: the framework as its users write it, Megatron without
        one."""
        return "Megatron" if self.framework is None else profile(self.framework).title

    def __call__(self, option: Option) -> Option | None:
        """``option`` with the framework's switches, or None when it does not launch it (or it
        does not divide); unchanged without a framework."""
        launched, refusals = self._launched(option)
        return None if refusals else launched

    def refusal(self, option: Option) -> str | None:
        """The framework's first reason not to launch ``option`` (None: it does, or there is
        no framework)."""
        return next(iter(self._launched(option)[1]), None)

    def _launched(self, option: Option) -> tuple[Option, tuple[str, ...]]:
        """``option`` with the framework's switches, and its refusals of it (that it does not
        divide among them)."""
        if self.framework is None:
            return option, ()
        changed, where, note = option
        changed = framework_defaults(changed, self.model, cluster=where,
                                     framework=self.framework, given=self.given)  # fmt: skip
        try:
            resolved = resolve(self.model, where, changed)
        except ConfigError as exc:
            return option, (str(exc),)
        return (changed, where, note), profile(self.framework).refusals(resolved, self.model)

    def zero_stages(self, config: ParallelConfig) -> tuple[int, ...]:
        """The ZeRO stages above ``config``'s a remedy tries, mildest first: those a user is
        told of (:data:`ZERO_NOTES`) that the uniform space launches at its pipeline depth, or
        every stage, for the framework's rules to choose from."""
        stages = space.zero_stages(config.pp) if self.framework is None else _ZERO_SHARDS
        return tuple(z for z in stages if z > config.zero
                     and (self.framework is not None or z in ZERO_NOTES))  # fmt: skip

    def zero_note(self, zero: int) -> str:
        """What ZeRO stage ``zero`` is, in the words of whoever launches it."""
        if self.framework is None:
            return ZERO_NOTES[zero]
        return f"{_ZERO_SHARDS[zero]}, as {self.title} runs it"
