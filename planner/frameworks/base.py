"""What every framework module provides: its profile (what it launches) and its launcher.

A *profile* is a list of :class:`Rule`\\ s, each a small predicate over a resolved uniform
configuration that names what the framework cannot launch, with the file (and line) of the
framework's own source that establishes it. The search asks the profile before it prices a
configuration, so it only ever produces what the target launches; an export asks the same
rules and refuses, in one line, what the target cannot express. There is no "closest"
configuration: a framework either launches the plan exactly as priced or is not offered it.

A *launcher* turns a configuration the profile accepts into the framework's own launch text
(flags, JSON, Python or TOML), complete: the model's architecture flags too where the framework
takes them on its command line, and the environment it asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from planner.plan.config import ResolvedConfig
from planner.spec import DeviceSpec, ModelSpec
from planner.vocabulary import OP_SAC, ContextParallelism, Platform, Stack

Framework = Literal["megatron", "mindspeed", "deepspeed", "colossalai", "torchtitan"]
FRAMEWORKS: tuple[Framework, ...] = ("megatron", "mindspeed", "deepspeed", "colossalai",
                                     "torchtitan")  # fmt: skip
"""The frameworks the planner writes launch configurations for."""
ANY = "any"
"""The search target with per-operator sharding (MindSpore's semi-auto parallel, Alpa): no
framework of :data:`FRAMEWORKS` launches its plans; it measures what their rules cost."""
TARGETS: tuple[str, ...] = (*FRAMEWORKS, ANY)
"""What ``--framework`` accepts."""

Check = Callable[[ResolvedConfig, ModelSpec], "str | None"]
"""A rule's predicate: why the configuration cannot be launched, or None when it can."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One thing a framework refuses (or cannot express), with its source."""

    name: str
    """A short identifier, e.g. ``zero-with-pipeline``."""
    source: str
    """Where the framework establishes it: repository, commit, file and line, e.g.
    ``NVIDIA/Megatron-LM@000c4ac megatron/training/arguments.py:512``."""
    check: Check
    """The reason the configuration cannot be launched (said as the framework's user would
    read it, with the numbers), or None when it can."""
    reads_overlaps: bool = False
    """Whether ``check`` reads the overlap flags (``overlap_grad_reduce``,
    ``overlap_param_gather``), which the search sets rather than searches: it asks the other
    rules once a configuration and these once a setting of the flags
    (:func:`planner.uniform.defaults.overlaps_launched`; a test checks that no other rule's
    verdict moves with them)."""


def without_pytorch_context_parallel(title: str) -> Check:
    """The check of a framework ``title`` whose context parallelism is not PyTorch's
    (``cp_algo`` allgather: K/V all-gathered, as torchtitan trains). Megatron-LM's
    ``--cp-comm-type all_gather`` and MindSpeed's ``kvallgather_cp_algo`` gather K/V too, in
    their own attention (Transformer Engine's, MindSpeed's), which is not priced."""

    def check(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
        c = resolved.config
        if c.cp == 1 or c.cp_algo != "allgather":
            return None
        return (f"cp({c.cp}) with keys and values all-gathered (cp_algo allgather) is priced as "
                f"PyTorch's context parallelism, torchtitan's: {title}'s own K/V all-gather "
                f"attention, where it has one, is not priced")

    return check


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """A configuration in a framework's own words, ready to paste."""

    text: str
    """What the user pastes: command-line flags, ds_config JSON, Python or a TOML fragment."""
    environment: dict[str, str] = field(default_factory=dict)
    """Environment variables the framework asserts or the prediction relies on."""
    notes: tuple[str, ...] = ()
    """What the user still has to supply that is not part of the plan (data, tokenizer,
    checkpoint paths, the framework version the text is for). Never a change to the plan."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """What one framework can launch, and how to write it."""

    name: Framework
    """The framework as ``--framework`` names it."""
    title: str
    """As users write it: ``Megatron-LM``, ``MindSpeed``, ``DeepSpeed``, ``Colossal-AI``,
    ``torchtitan``."""
    rules: tuple[Rule, ...]
    """What it refuses: a configuration is offered only if none of them refuses it."""
    launch: Callable[[ResolvedConfig, ModelSpec], Launch]
    """The launcher; only called on configurations no rule refuses."""
    zero_bubble: bool = False
    """Whether it launches the zero-bubble schedules (ZB-H1, ZB-V): the uniform search tries
    them only for such a target (its rules still refuse the ones it cannot run)."""
    moe_comm_overlap: bool = False
    """Whether it overlaps the experts' all-to-alls with another microbatch's compute
    (Megatron-Core's combined 1F1B): the uniform search tries that only for such a target."""
    recompute_modules: bool = False
    """Whether it takes Megatron-Core's ``--recompute-modules``: the uniform search tries
    the output-discarding modules under selective recomputation only for such a target."""
    selective_modules: str | None = None
    """What its selective recomputation reruns when that is not Megatron-Core's default (the
    attention core): torchtitan's per-operator policy (``op``), which the uniform search
    tries in the default's place."""
    sequence_parallel: Callable[[ModelSpec], bool] = lambda model: True
    """Whether it runs Megatron's sequence parallelism with tensor parallelism for ``model``:
    the search turns it on with TP only where it does, and else searches TP without it (its
    rules still refuse it)."""
    folds_experts: bool = False
    """Whether it folds the routed experts over the tensor-parallel ranks (expert tensor
    parallelism 1 under tensor parallelism): the uniform search tries that only for such a
    target."""
    context_parallelism: tuple[ContextParallelism, ...] = ("ring", "ulysses")
    """How its context parallelism attends, the way it runs unless told first: exactly the
    ones its rules launch (a test ties the two). The uniform search tries only these, and
    ``estimate --framework`` and ``explain`` attend the first where a configuration leaves
    ``cp_algo`` to the default ring."""

    platforms: tuple[Platform, ...] = ("cuda", "ascend")
    """The accelerators' software it runs on (:data:`~planner.vocabulary.Platform`): a device
    that says another is refused before any configuration is priced."""
    platform_source: str = ""
    """Where the framework (or what it is built on) establishes that, when it runs on one
    only."""

    stacks: tuple[Stack, ...] = ("megatron-te",)
    """The stacks it runs a layer on (:data:`~planner.vocabulary.Stack`), as the planner
    prices them, the one it runs unless told first (:func:`planner.frameworks.default_stack`):
    Megatron-DeepSpeed's layers under DeepSpeed's engine and optimizers for DeepSpeed;
    torchtitan's own model code run eager for torchtitan (the ``compile`` its export leaves
    off); Hugging Face's layers cast to the compute precision for Colossal-AI (its
    shardformer's fused norms are an option its export leaves off); Megatron-Core's fused
    layers for the Megatron family."""

    def refusals(self, resolved: ResolvedConfig, model: ModelSpec) -> tuple[str, ...]:
        """Every reason the framework cannot launch ``resolved`` (empty: it can): a stack it
        does not run, then its rules.

        >>> from planner.frameworks import profile
        >>> from planner.plan.config import ParallelConfig, resolve
        >>> import planner
        >>> model = planner.load_model("instances/models/llama3-8b.json")
        >>> cluster = planner.load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=1)
        >>> profile("megatron").refusals(resolve(model, cluster, ParallelConfig(
        ...     dp=8, stack="hf-eager")), model)  # doctest: +NORMALIZE_WHITESPACE
        ('stack hf-eager: Megatron-LM runs megatron-te, megatron-te-fp8,
          megatron-te-fused-loss, megatron-te-fp8-fused-loss',)
        """
        stack = resolved.training.stack
        wrong = () if stack in self.stacks else (
            f"stack {stack}: {self.title} runs {', '.join(self.stacks)}",)  # fmt: skip
        reasons = (rule.check(resolved, model) for rule in self.rules)
        return wrong + tuple(r for r in reasons if r is not None)

    def platform_refusal(self, device: DeviceSpec) -> str | None:
        """Why it cannot run on ``device`` at all (its platform is not one it runs on), or
        None; a device that does not say its platform is not refused.

        >>> from planner.frameworks import profile
        >>> from planner.spec import DeviceSpec
        >>> npu = DeviceSpec(name="Ascend-910B", memory_gib=64, memory_bandwidth_gb_s=1600,
        ...                  peak_tflops={"bf16": 313}, platform="ascend")
        >>> profile("megatron").platform_refusal(npu)  # doctest: +ELLIPSIS
        "Megatron-LM runs on cuda, not on Ascend-910B's ascend (its layers are Transformer ...)"
        """
        if device.platform is None or device.platform in self.platforms:
            return None
        return (f"{self.title} runs on {', '.join(self.platforms)}, not on {device.name}'s "
                f"{device.platform} ({self.platform_source})")  # fmt: skip

    def launches(
        self, resolved: ResolvedConfig, model: ModelSpec, *, overlap_rules: bool | None = None
    ) -> bool:
        """Whether it runs ``resolved``'s stack and no rule refuses ``resolved``; with
        ``overlap_rules`` True, whether no rule that reads the overlap flags refuses it, and
        with False, whether it runs the stack and none of the other rules refuses it."""
        if overlap_rules is not True and resolved.training.stack not in self.stacks:
            return False
        return all(rule.check(resolved, model) is None for rule in self.rules
                   if overlap_rules is None or rule.reads_overlaps == overlap_rules)


def data_parallel_sync(resolved: ResolvedConfig) -> bool:
    """Whether any gradient is reduced over data-parallel ranks (else overlapping the
    reduction means nothing)."""
    return resolved.dp * resolved.config.cp > 1


def ranks_in_order(resolved: ResolvedConfig, order: tuple[str, ...]) -> bool:
    """Whether ``resolved`` numbers its ranks as ``order`` does (fastest first), among the
    parallel dims of more than one rank (a dim of one rank is in no order).

    >>> from planner.plan.config import ParallelConfig, ResolvedConfig, TrainingSpec
    >>> r = ResolvedConfig(config=ParallelConfig(tp=8, pp=2),
    ...                    training=TrainingSpec(seq_length=8, global_batch_size=8), dp=4,
    ...                    num_microbatches=2, num_devices=64)
    >>> ranks_in_order(r, ("tp", "dp", "pp")), ranks_in_order(r, ("dp", "tp", "pp"))
    (True, False)
    """
    c = resolved.config
    sizes = {"tp": c.tp, "cp": c.cp, "dp": resolved.dp, "pp": c.pp}
    given = [a for a in c.rank_order.split("-") if sizes.get(a, 1) > 1]
    return given == [a for a in order if sizes.get(a, 1) > 1]


MULTI_TOKEN_PREDICTION = ("multi-token-prediction modules (set mtp_layers, a Hugging Face "
                          "config's num_nextn_predict_layers, to 0 to train without them)")
"""How a refusal names a model's multi-token-prediction modules (DeepSeek-V3's)."""


def layer_features(model: ModelSpec) -> tuple[str, ...]:
    """What the model's layers have beyond a GPT's or a Llama's (Gemma 2/3, Phi-3; DeepSeek-V3's
    multi-token prediction), in the words a refusal names them: each framework launches some
    of them, or none."""
    present = (
        (model.post_norms, "post-norms (a norm on each block's output, Gemma's)"),
        (model.activation == "geglu", "a GeGLU MLP (GeLU on the gate)"),
        (model.attn_logit_softcapping is not None, "attention logit soft-capping"),
        (model.final_logit_softcapping is not None, "final logit soft-capping"),
        (model.scale_embeddings, "embeddings scaled by sqrt(hidden_size)"),
        (model.sliding_window is not None, "sliding-window attention"),
        (model.mtp_layers > 0, MULTI_TOKEN_PREDICTION),
    )
    return tuple(name for on, name in present if on)


def unsupported_layers(model: ModelSpec, *, framework: str,
                       supported: frozenset[str] = frozenset()) -> str | None:
    """A refusal naming the first of :func:`layer_features` that ``framework`` does not build,
    or None."""
    missing = [name for name in layer_features(model) if name not in supported]
    if not missing:
        return None
    return f"{model.name} has {missing[0]}, which {framework} does not build"


def moe_comm_in_line(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """A framework that runs each microbatch's expert all-to-alls in line with its own
    compute (no combined 1F1B) cannot overlap them with another microbatch's."""
    if not resolved.config.overlap_moe_expert_parallel_comm:
        return None
    return ("overlap_moe_expert_parallel_comm: the experts' all-to-alls run in line with the "
            "microbatch's own compute here (Megatron-Core's combined 1F1B overlaps them)")


def deepep_not_run(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """A framework whose experts exchange their tokens only with its own all-to-all does not
    run DeepEP (Megatron-Core's flex dispatcher and torchtitan's DeepSeek-V3 do)."""
    if resolved.config.moe_dispatcher != "deepep":
        return None
    return ("moe_dispatcher deepep: the experts' tokens are exchanged with all-to-alls here "
            "(Megatron-LM and torchtitan's DeepSeek-V3 run DeepEP)")


def bf16_moments_not_written(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Adam's moments in bf16 are Megatron-LM's precision-aware optimizer; a framework whose
    launch does not write it keeps them fp32."""
    if resolved.config.optimizer_moments != "bf16":
        return None
    return ("optimizer_moments bf16: Megatron-LM's precision-aware optimizer; this launch "
            "keeps Adam's moments in fp32")


def recompute_modules_unnamed(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """A framework whose selective recomputation is not Megatron-Core's modules cannot be told
    which modules to rerun."""
    modules = resolved.config.recompute_modules
    if modules is None:
        return None
    named = "torchtitan's per-operator policy" if modules == OP_SAC \
        else "Megatron-Core's --recompute-modules"
    return (f"recompute_modules({modules}): {named}; here selective recomputation reruns the "
            f"attention core only")


def sequence_split_over_tp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Sequence parallelism cuts the whole sequence evenly over the TP group (Megatron-
    DeepSpeed's ``--sequence-parallel``, Colossal-AI's ``split_gather``); a rule of the
    profiles that launch it so. Megatron-LM's own splits each context-parallel rank's share
    (:func:`planner.frameworks.megatron.sequence_parallel_split`)."""
    tp, seq = resolved.config.tp, resolved.training.seq_length
    if not resolved.sp or seq % tp == 0:
        return None
    return f"sequence parallelism: seq_len({seq}) is not divisible by tp({tp})"
