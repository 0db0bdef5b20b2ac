"""The recomputations the uniform search tries: no, selective and full recomputation, and
selective recomputation both as Megatron-Core's default (the attention core) and as every
output-discarding recompute module that applies, for a target that takes
``--recompute-modules``; for a target with a selective recomputation of its own (torchtitan's
per-operator policy, priced on dense and MoE blocks), that one in the default's place, and for
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
    named = options.framework == ANY or profile(options.framework).recompute_modules
    out: list[tuple[Recompute, str | None]] = [(r, None) for r in RECOMPUTE_MODES]
    own = own_selective_modules(model, options.framework)
    if own is not None:
        out.insert(2, ("selective", own))
        if options.framework != ANY:  # in place of Megatron's default
            out.pop(1)
    if named and lean:
        out.insert(2, ("selective", lean))
    return out


def own_selective_modules(model: ModelSpec, framework: str) -> str | None:
    """What ``framework``'s selective recomputation of ``model`` reruns where that is not
    Megatron-Core's default: torchtitan's per-operator policy, priced on dense and MoE blocks
    (for ``any``, whose space is the targets' union, the same); None otherwise.

    >>> from planner.spec.reading import load_model
    >>> llama = load_model("instances/models/llama3-8b.json")
    >>> [own_selective_modules(llama, f) for f in ("torchtitan", "any", "megatron")]
    ['op', 'op', None]
    """
    if model.mla is not None:
        return None
    return OP_SAC if framework == ANY else profile(framework).selective_modules


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
