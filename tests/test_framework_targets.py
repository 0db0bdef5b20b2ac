"""Framework targets end to end: a plan solved for a framework is one it launches, its launch
prices again to exactly the plan, and it fits beside the memory margin; the search's space
holds only what the framework launches; pins hold, and a pin that prevents a fit is named."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import solve
from planner.baselines.grid import grid_space
from planner.cost import MEMORY_MARGIN
from planner.diagnose.compare import compare_frameworks
from planner.errors import ConfigError, InfeasibleError, InputError
from planner.frameworks import FRAMEWORKS, default_stack, launch, profile
from planner.options import Pins, SolveOptions
from planner.plan.config import ParallelConfig, ResolvedConfig, resolve
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.defaults import framework_defaults, overlaps_launched
from planner.uniform.estimate import estimate
from planner.vocabulary import CONTEXT_PARALLELISMS
from tests.conftest import CLUSTERS, MODELS

H100 = CLUSTERS / "dgx-h100-80gb.json"
LLAMA_RUN = SolveOptions(global_batch_size=128, seq_length=8192)


@pytest.fixture(scope="module")
def llama() -> ModelSpec:
    return load_model(MODELS / "llama3-8b.json")


@pytest.fixture(scope="module")
def two_nodes() -> ClusterSpec:
    return load_cluster(H100, 2)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_solved_plan_launches_as_priced(framework: str, llama: ModelSpec,
                                          two_nodes: ClusterSpec) -> None:  # fmt: skip
    """Llama 3 8B at 8,192 tokens on 16 H100 (MindSpeed: 16 Ascend 910B) for each framework:
    the plan is for it, its profile refuses nothing of it, the launch is written, and the
    configuration the launch carries prices to the plan's step and peak (to 1e-6) within the
    device less the margin."""
    if framework == "mindspeed":
        two_nodes = load_cluster(CLUSTERS / "ascend-910b.json", 2)
    options = SolveOptions(global_batch_size=128, seq_length=8192, framework=framework)
    plan = solve(llama, two_nodes, options)
    assert plan.framework == framework and plan.configuration is not None
    resolved = resolve(llama, two_nodes, plan.configuration)
    assert profile(framework).refusals(resolved, llama) == ()
    assert launch(plan, framework, model=llama, cluster=two_nodes).text
    again = estimate(llama, two_nodes, plan.configuration)
    assert again.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-6)
    assert again.peak_memory_gib == pytest.approx(plan.predicted.peak_memory_gib, rel=1e-6)
    # The margin is the framework's stack's (DeepSpeed's optimizers': 23 %; the others 5 %).
    share = MEMORY_MARGIN[profile(framework).stacks[0]]
    assert plan.memory_margin_gib == pytest.approx(share * two_nodes.device.memory_gib)
    assert plan.predicted.peak_memory_gib <= two_nodes.device.memory_gib - plan.memory_margin_gib


@pytest.mark.parametrize("framework", ["deepspeed", "torchtitan"])
def test_the_space_holds_only_what_the_framework_launches(
    framework: str, llama: ModelSpec, two_nodes: ClusterSpec
) -> None:
    """The search restricts its space by the profile before it prices anything: every
    configuration of it that divides is one the framework launches."""
    options = SolveOptions(global_batch_size=128, seq_length=8192, framework=framework)
    target = profile(framework)
    space = grid_space(llama, two_nodes, options)
    assert space
    for config in space:
        try:
            resolved = resolve(llama, two_nodes, config)
        except ConfigError:
            continue
        assert target.refusals(resolved, llama) == (), config


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_profile_attends_exactly_as_its_rules_launch(
    framework: str, llama: ModelSpec, two_nodes: ClusterSpec
) -> None:
    """``Profile.context_parallelism`` (what the search tries, what ``estimate --framework``
    and ``explain`` attend by default) is exactly the ways of context parallelism the
    framework's rules launch: CP2 of Llama 3 8B on 16 H100, each way, with the switches the
    framework sets, is refused for how it attends iff that way is not in the profile."""
    target = profile(framework)
    zero = 3 if framework == "torchtitan" else 1  # FSDP2 never keeps gradients whole

    def refusals(algo: str) -> tuple[str, ...]:
        config = framework_defaults(
            ParallelConfig(cp=2, cp_algo=algo, zero=zero, global_batch=128, seq_len=8192),
            llama, cluster=two_nodes, framework=framework, given=("cp_algo",))
        return target.refusals(resolve(llama, two_nodes, config), llama)

    assert target.context_parallelism
    for algo in CONTEXT_PARALLELISMS:
        assert (algo in target.context_parallelism) == (refusals(algo) == ()), algo


def test_pins_hold(llama: ModelSpec, two_nodes: ClusterSpec) -> None:
    """Pinned knobs come back as pinned, the others searched."""
    options = SolveOptions(global_batch_size=128, seq_length=8192,
                           pins=Pins(tp=2, pp=2, recompute="full", zero=1))  # fmt: skip
    c = solve(llama, two_nodes, options).configuration
    assert c is not None and (c.tp, c.pp, c.recompute, c.zero) == (2, 2, "full", 1)


def test_a_pin_that_prevents_a_fit_is_named() -> None:
    """Llama 3 70B on 32 H100 without a pipeline and with ZeRO-1 only does not fit on the
    devices; with a pipeline it would, and so would it with ZeRO-3: without host figures (no
    offload) the error says both; with them the optimizer offload is the way to fit."""
    model, cluster = load_model(MODELS / "llama3-70b.json"), load_cluster(H100, 4)
    options = SolveOptions(global_batch_size=64, seq_length=4096, pins=Pins(pp=1, zero=1))
    plan = solve(model, cluster, options)
    assert plan.configuration is not None and plan.configuration.offload == "optimizer"
    with pytest.raises(InfeasibleError) as error:
        solve(model, cluster.model_copy(update={"host": None}), options)
    assert "the pin --pp 1 prevents a fit: without it tp 1, pp 16" in str(error.value)
    assert "the pin --zero 1 prevents a fit: without it" in str(error.value)


def test_a_pin_that_does_not_divide_says_so_as_estimate_does(
    llama: ModelSpec, two_nodes: ClusterSpec
) -> None:
    with pytest.raises(ConfigError, match=r"num_attention_heads\(32\) is not divisible by "
                                          r"tp\(5\) \(pinned: --tp 5\)"):  # fmt: skip
        solve(llama, load_cluster(H100, 5), SolveOptions(global_batch_size=40, pins=Pins(tp=5)))


@pytest.mark.parametrize(("framework", "algo", "reason"), [
    ("deepspeed", "ring", "DeepSpeed's context parallelism (--ds-sequence-parallel-size) is "
                          "Ulysses"),
    ("torchtitan", "ring", "context parallelism all-gathers keys and values"),
    ("megatron", "allgather", "Megatron-LM's own K/V all-gather attention, where it has one, "
                              "is not priced")])
def test_a_context_parallel_pin_the_framework_does_not_run_says_why(
    framework: str, algo: str, reason: str, llama: ModelSpec
) -> None:
    """``--cp-algo`` pinned to a way the framework does not attend: the error is the
    framework's own reason, not that nothing divides (the pin stays in the space for its
    rules to refuse)."""
    options = SolveOptions(global_batch_size=64, seq_length=8192, framework=framework,
                           pins=Pins(cp=2, cp_algo=algo))  # fmt: skip
    with pytest.raises(ConfigError) as error:
        solve(llama, load_cluster(H100, 1), options)
    assert reason in " ".join(str(error.value).split())
    assert "divides" not in str(error.value)


def test_a_dispatcher_pin_leaves_the_framework_s_reason() -> None:
    """DeepEP pinned applies where the experts are spread (EP > 1), so alone it refuses
    nothing: torchtitan refusing Mixtral says why (not a registered model), not that the
    pin's default EP of 1 has nothing to exchange; the pins are spelled as the command
    line spells them."""
    model = load_model(MODELS / "mixtral-8x7b.json")
    with pytest.raises(ConfigError) as error:
        solve(model, load_cluster(H100, 4), SolveOptions(
            framework="torchtitan", pins=Pins(moe_dispatcher="deepep", sp=False)))  # fmt: skip
    message = str(error.value)
    assert "with --no-sp, --moe-dispatcher deepep" in message, message
    assert "registered models" in message and "none to exchange" not in message


def test_unknown_framework_lists_the_known_ones(llama: ModelSpec,
                                                two_nodes: ClusterSpec) -> None:  # fmt: skip
    with pytest.raises(InputError, match="choose from megatron, mindspeed, deepspeed, "
                                         "colossalai, torchtitan, any"):  # fmt: skip
        solve(llama, two_nodes, SolveOptions(framework="jax"))


def test_a_framework_that_launches_nothing_says_why(two_nodes: ClusterSpec) -> None:
    """torchtitan builds only its registered model flavors: GPT-3 has none."""
    with pytest.raises(ConfigError, match=r"torchtitan launches no configuration of gpt3-175b "
                                          r".*none of torchtitan v0\.2\.2's registered models"):
        solve(load_model(MODELS / "gpt3-175b.json"), load_cluster(H100, 128),
              SolveOptions(framework="torchtitan"))


OVERLAP_SETTINGS = ((True, True), (True, False), (False, True), (False, False))
"""``(overlap_grad_reduce, overlap_param_gather)``, most overlapped first, as the search tries
them."""


def _with_flags(resolved: ResolvedConfig, grad: bool, gather: bool) -> ResolvedConfig:
    return replace(resolved, config=resolved.config.model_copy(
        update={"overlap_grad_reduce": grad, "overlap_param_gather": gather}))


def _on_its_stack(resolved: ResolvedConfig, model: ModelSpec, framework: str) -> ResolvedConfig:
    stack = default_stack(framework, model)
    return replace(resolved, config=resolved.config.model_copy(update={"stack": stack}),
                   training=resolved.training.model_copy(update={"stack": stack}))


@pytest.fixture(scope="module")
def spread_configurations(two_nodes: ClusterSpec) -> list[tuple[ModelSpec, ResolvedConfig]]:
    """Some 1,200 configurations that divide, spread over the per-operator search's space (every
    framework's, ZeRO 0-3, pipelines, interleaving, context and expert parallelism) for Llama 3
    8B and Mixtral 8x7B at 8,192 tokens on 16 H100."""
    out = []
    for name in ("llama3-8b", "mixtral-8x7b"):
        model = load_model(MODELS / f"{name}.json")
        space = grid_space(model, two_nodes, replace(LLAMA_RUN, framework="any"))
        for config in space[::max(1, len(space) // 600)]:
            try:
                out.append((model, resolve(model, two_nodes, config)))
            except ConfigError:
                continue
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_only_the_rules_marked_so_read_the_overlap_flags(
    framework: str, spread_configurations: list[tuple[ModelSpec, ResolvedConfig]]
) -> None:
    """The search asks a framework's rules that are not marked ``reads_overlaps`` once a
    configuration, not once a setting of the overlap flags: on every configuration of the
    spread, on the framework's own stack, each such rule says the same under all four
    settings; and each marked rule's verdict does move with them on some configuration (the
    spread reaches what the flags decide, so an unmarked rule that read them would show)."""
    target = profile(framework)
    moved = {rule.name: False for rule in target.rules}
    for model, resolved in spread_configurations:
        on_stack = _on_its_stack(resolved, model, framework)
        variants = [_with_flags(on_stack, *flags) for flags in OVERLAP_SETTINGS]
        for rule in target.rules:
            verdicts = {rule.check(variant, model) for variant in variants}
            moved[rule.name] |= len(verdicts) > 1
    assert {name for name, did in moved.items() if did} == {
        rule.name for rule in target.rules if rule.reads_overlaps}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_launched_overlaps_are_the_first_setting_every_rule_launches(
    framework: str, spread_configurations: list[tuple[ModelSpec, ResolvedConfig]]
) -> None:
    """``overlaps_launched`` (the other rules once, the marked ones a setting) returns what
    asking every rule of each setting in turn returns, on the framework's own stack."""
    target = profile(framework)
    for model, resolved in spread_configurations:
        on_stack = _on_its_stack(resolved, model, framework)
        every_rule = next((variant.config for flags in OVERLAP_SETTINGS
                           if target.launches(variant := _with_flags(on_stack, *flags), model)),
                          None)  # fmt: skip
        assert overlaps_launched(on_stack, model, framework=framework) == every_rule


@pytest.mark.parametrize(("framework", "cluster"), [("mindspeed", "dgx-h100-80gb.json"),
                                                    ("megatron", "ascend-910b.json")])
def test_a_framework_is_refused_off_its_platform(framework: str, cluster: str,
                                                 llama: ModelSpec) -> None:  # fmt: skip
    """MindSpeed imports torch_npu (Ascend only), Megatron-LM's layers are Transformer
    Engine's (CUDA only): each is refused before any search on the other's device, naming the
    frameworks that run there; a device that does not say its platform is not refused, and
    ``compare`` keeps the refusal as the framework's row."""
    nodes = load_cluster(CLUSTERS / cluster, 2)
    options = SolveOptions(global_batch_size=128, seq_length=8192, framework=framework)
    with pytest.raises(InputError, match=r"runs on (ascend|cuda), not on .*: plan with "
                                         r"--framework .*(deepspeed|mindspeed)"):
        solve(llama, nodes, options)
    unsaid = nodes.model_copy(update={"device": nodes.device.model_copy(
        update={"platform": None})})  # fmt: skip
    assert profile(framework).platform_refusal(unsaid.device) is None
    rows = compare_frameworks(llama, nodes, options, ["deepspeed", framework])
    assert rows[0].plan is not None and rows[1].plan is None
    assert rows[1].error is not None and "runs on" in rows[1].error
