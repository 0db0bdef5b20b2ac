"""The switches a framework search sets on every configuration it prices, in one place:
``solve --framework F`` (:func:`planner.uniform.launched.launched_variant`) and
``estimate --framework F`` (:func:`framework_defaults`) draw them from here, so the same
degrees price the same.

The search does not search these switches; it sets them: sequence parallelism whenever tensor
parallelism is on (:func:`sequence_parallel`), and of the two overlap
flags the most overlapped setting the framework launches (overlap never makes a step slower in
the cost model; frameworks fix some overlaps by ZeRO stage and pipeline: DeepSpeed's pipeline
engine reduces gradients after the last microbatch, torchtitan's FSDP2 overlaps its own
gathers...).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from planner.errors import ConfigError
from planner.frameworks import ANY, default_stack, profile
from planner.plan.config import ParallelConfig, ResolvedConfig, resolve
from planner.spec import ClusterSpec, ModelSpec

SEARCH_SWITCHES = ("sp", "overlap_grad_reduce", "overlap_param_gather")
"""The configuration's fields a framework search sets rather than searches."""
FRAMEWORK_DEFAULTS = (*SEARCH_SWITCHES, "cp_algo")
"""The fields :func:`framework_defaults` fills where not given: the search's switches, and
how context parallelism attends where the framework does not run the default ring."""


def sequence_parallel(tp: int, framework: str = ANY, model: ModelSpec | None = None) -> bool:
    """Megatron's sequence parallelism, on whenever tensor parallelism is (it shards the
    activations TP leaves replicated, for no more communication) where ``framework`` runs it
    for ``model`` (:attr:`~planner.frameworks.base.Profile.sequence_parallel`: DeepSpeed never
    does, Colossal-AI not with experts); ``any`` and a model not given: Megatron's rule.

    >>> sequence_parallel(2), sequence_parallel(1)
    (True, False)
    """
    if tp <= 1:
        return False
    return framework == ANY or model is None or profile(framework).sequence_parallel(model)


def launched_overlaps(
    config: ParallelConfig, model: ModelSpec, *, cluster: ClusterSpec, framework: str,
    grads: Sequence[bool] = (True, False), gathers: Sequence[bool] = (True, False),
    tp_comms: Sequence[bool] | None = None,
) -> ParallelConfig | None:  # fmt: skip
    """``config`` with the first setting of the overlap flags (``tp_comm_overlap`` from
    ``tp_comms``, None: as ``config`` has it; ``overlap_grad_reduce`` from ``grads``,
    ``overlap_param_gather`` from ``gathers``, most overlapped first) that ``framework``
    launches; None when it launches none. One that does not even divide is kept as it is,
    for the pricing to refuse with its reason."""
    try:
        resolved = resolve(model, cluster, config)
    except ConfigError:
        return config
    return overlaps_launched(resolved, model, framework=framework, grads=grads, gathers=gathers,
                             tp_comms=tp_comms)  # fmt: skip


def overlaps_launched(
    resolved: ResolvedConfig, model: ModelSpec, *, framework: str,
    grads: Sequence[bool] = (True, False), gathers: Sequence[bool] = (True, False),
    tp_comms: Sequence[bool] | None = None,
) -> ParallelConfig | None:  # fmt: skip
    """:func:`launched_overlaps` of a configuration already resolved."""
    target, config = profile(framework), resolved.config
    if tp_comms is None:  # kept as given (estimate --framework, explain's notches, remedies)
        tp_comms = (config.tp_comm_overlap,)
    # Most rules do not read the flags: asked once, not once a setting (the rules were a
    # third to a half of a framework's search, two to four settings tried a configuration).
    if not target.launches(resolved, model, overlap_rules=False):
        return None
    for tp_comm in tp_comms:
        base = config.model_copy(update={"tp_comm_overlap": tp_comm})
        if tp_comm != config.tp_comm_overlap:
            if tp_comm and (config.tp == 1 or not resolved.sp):
                continue  # nothing to overlap, or no SP for it (divisibility's own rule)
            # rules of the first kind read it (Megatron-LM's only, with SP): asked again
            if not target.launches(replace(resolved, config=base), model, overlap_rules=False):
                continue
        for grad in grads:
            for gather in gathers:
                variant = base.model_copy(update={"overlap_grad_reduce": grad,
                                                  "overlap_param_gather": gather})  # fmt: skip
                # The flags change no divisibility: the resolution holds for every variant.
                if target.launches(replace(resolved, config=variant), model,
                                   overlap_rules=True):  # fmt: skip
                    return variant
    return None


def attending(config: ParallelConfig, framework: str) -> ParallelConfig:
    """``config`` with its context parallelism attending as ``framework`` attends where it
    does not run the configuration's way (torchtitan's ring left at ParallelConfig's default
    becomes PyTorch's all-gather); unchanged without context parallelism or where the
    framework runs it.

    >>> attending(ParallelConfig(cp=2), "torchtitan").cp_algo
    'allgather'
    >>> attending(ParallelConfig(cp=2, cp_algo="ulysses"), "megatron").cp_algo
    'ulysses'
    """
    attends = profile(framework).context_parallelism
    if config.cp > 1 and config.cp_algo not in attends:
        return config.model_copy(update={"cp_algo": attends[0]})
    return config


def framework_defaults(
    config: ParallelConfig, model: ModelSpec, *, cluster: ClusterSpec, framework: str,
    given: Collection[str] = (),
) -> ParallelConfig:  # fmt: skip
    """``config`` with the switches the search for ``framework`` sets
    (:data:`SEARCH_SWITCHES`), each one not ``given`` (by field name) set as the search sets
    it; a switch given stays as given. Context parallelism left to the default ring where the
    framework attends otherwise (torchtitan: K/V all-gathered) attends as it does, unless
    ``cp_algo`` is given. When ``framework`` launches no setting of the overlap
    flags left to it (it cannot launch the configuration for another reason), they stay as
    in ``config``. A stack not given is the framework's (:func:`default_stack`).

    >>> from planner.spec.reading import load_model, load_cluster
    >>> from pathlib import Path
    >>> root = Path(__file__).resolve().parents[2] / "instances"
    >>> model = load_model(root / "models/llama3-8b.json")
    >>> cluster = load_cluster(root / "clusters/dgx-h100-80gb.json", 1)
    >>> for framework in ("megatron", "deepspeed"):
    ...     c = framework_defaults(ParallelConfig(tp=2, pp=2, zero=1), model, cluster=cluster,
    ...                            framework=framework)
    ...     print(framework, c.sp, c.overlap_grad_reduce, c.overlap_param_gather)
    megatron True True True
    deepspeed False False False
    >>> c = framework_defaults(ParallelConfig(tp=2, pp=2, zero=1), model, cluster=cluster,
    ...                        framework="megatron", given=("sp", "overlap_param_gather"))
    >>> c.sp, c.overlap_grad_reduce, c.overlap_param_gather
    (False, True, False)
    >>> framework_defaults(ParallelConfig(cp=2, zero=3), model, cluster=cluster,
    ...                    framework="torchtitan").cp_algo
    'allgather'
    """
    if "sp" not in given:
        config = config.model_copy(update={"sp": sequence_parallel(config.tp, framework, model)})
    if "cp_algo" not in given:
        config = attending(config, framework)
    # The framework's own stack where none is given (DeepSpeed's optimizers for DeepSpeed).
    config = config.model_copy(update={"stack": default_stack(framework, model, config.stack)})
    launched = launched_overlaps(config, model, cluster=cluster, framework=framework,
                                 **overlap_choices(config, given))  # fmt: skip
    return launched if launched is not None else config


def overlap_choices(config: ParallelConfig, given: Collection[str]) -> dict[str, tuple[bool, ...]]:
    """The settings :func:`launched_overlaps` may try of each overlap flag: the
    configuration's where the flag is ``given``, else both, most overlapped first.

    >>> overlap_choices(ParallelConfig(), given=("overlap_param_gather",))
    {'grads': (True, False), 'gathers': (False,)}
    """
    def choices(name: str) -> tuple[bool, ...]:
        return (getattr(config, name),) if name in given else (True, False)

    return {"grads": choices("overlap_grad_reduce"), "gathers": choices("overlap_param_gather")}
