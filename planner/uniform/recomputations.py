"""The recomputations the uniform search tries: no, selective and full recomputation, and
selective recomputation both as Megatron-Core's default (the attention core) and as every
output-discarding recompute module that applies, for a target that takes
``--recompute-modules``; for a target with a selective recomputation of its own (torchtitan's
per-operator policy, priced on dense blocks), that one in the default's place, and for
``any``, whose space is the targets' union, beside it."""

from __future__ import annotations

from planner.frameworks import ANY, profile
from planner.graph.stacks import grouped_experts
from planner.options import SolveOptions
from planner.spec import ModelSpec, TrainingSpec
from planner.vocabulary import OP_SAC, RECOMPUTE_MODES, Recompute


def recomputations(
    model: ModelSpec, *, training: TrainingSpec, options: SolveOptions
) -> list[tuple[Recompute, str | None]]:
    """The recomputation modes tried, with the modules selective recomputation reruns: the
    default (the attention core) and, for a target that takes ``--recompute-modules``, every
    output-discarding module that applies (the experts' activation where the experts run
    as a grouped GEMM, the norms that are modules of their own, MLA's up projections: what
    Megatron-Core's MoE recipes rerun); a pinned set alone.

    >>> from pathlib import Path
    >>> from planner.options import SolveOptions, training_of
    >>> from planner.spec.reading import load_model
    >>> root = Path(__file__).resolve().parents[2] / "instances"
    >>> model = load_model(root / "models/deepseek-v3.json")
    >>> options = SolveOptions(framework="megatron")
    >>> recomputations(model, training=training_of(model, options), options=options)[1:3]
    [('selective', None), ('selective', 'moe_act,layernorm,mla_up_proj')]
    """
    pinned = options.pins.recompute_modules
    if pinned is not None:
        return [("selective", pinned)]
    lean = lean_recompute_modules(model, training)
    target = None if options.framework == ANY else profile(options.framework)
    named = target is None or target.recompute_modules
    # torchtitan's per-operator policy is priced on dense blocks; any's union has it too
    dense = model.moe is None and model.mla is None
    own = target.selective_modules if target is not None else OP_SAC if dense else None
    out: list[tuple[Recompute, str | None]] = [(r, None) for r in RECOMPUTE_MODES]
    if own is not None and dense:
        out.insert(2, ("selective", own))
        if target is not None:  # in place of Megatron's default
            out.pop(1)
    if named and lean:
        out.insert(2, ("selective", lean))
    return out


def lean_recompute_modules(model: ModelSpec, training: TrainingSpec) -> str | None:
    """Every output-discarding recompute module that applies to ``model`` run as
    ``training`` runs it, comma-separated (None: none applies): the experts' activation where
    they run as a grouped GEMM, the norms that are modules of their own (an MoE layer's
    pre-MLP norm, MLA's input norm), MLA's up projections."""
    lean = [m for m, applies in (
        ("moe_act", model.moe is not None and grouped_experts(training.stack, training.precision)),
        ("layernorm", model.moe is not None or model.mla is not None),
        ("mla_up_proj", model.mla is not None)) if applies]  # fmt: skip
    return ",".join(lean) or None
