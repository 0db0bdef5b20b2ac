"""``planner estimate --framework F``'s remedies for a configuration that does not fit: each one
a configuration F launches (its own rules, with the switches its search sets), priced as a
direct estimate of it; a framework's own reason where it keeps a ZeRO stage from a pipeline, and
its own offload or none."""

from __future__ import annotations

import pytest

from planner.baselines.grid import grid_space
from planner.errors import ConfigError
from planner.frameworks import FRAMEWORKS, profile
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig, resolve
from planner.spec.reading import load_cluster, load_model
from planner.uniform.defaults import framework_defaults
from planner.uniform.estimate import estimate
from planner.uniform.remedies import config_infeasible_message, config_remedies
from tests.conftest import REPO
from tests.test_remedies import _apply

LLAMA3_70B = load_model(REPO / "instances/models/llama3-70b.json")
H100 = REPO / "instances/clusters/dgx-h100-80gb.json"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_remedy_is_a_configuration_the_framework_launches(framework: str) -> None:
    """Llama 3 70B on 16 H100s: configurations of ``framework``'s own space that do not fit;
    every remedy, typed as ``estimate --framework`` takes it, is launched by the framework and
    priced as its estimate."""
    cluster = load_cluster(H100, 2)
    target = profile(framework)
    space = grid_space(LLAMA3_70B, cluster, SolveOptions(framework=framework))
    too_big = []
    for config in space[::97]:
        try:
            if not estimate(LLAMA3_70B, cluster, config).fits:
                too_big.append(config)
        except ConfigError:
            continue
    assert len(too_big) >= 3
    offered = 0
    for config in too_big[:: max(1, len(too_big) // 3)][:3]:
        for remedy in config_remedies(LLAMA3_70B, cluster, config, framework=framework):
            changed, where = _apply(config, cluster, remedy.change)
            changed = framework_defaults(changed, LLAMA3_70B, cluster=where,
                                         framework=framework)  # fmt: skip
            resolved = resolve(LLAMA3_70B, where, changed)
            assert target.refusals(resolved, LLAMA3_70B) == (), remedy.change
            if where.host is not None or changed.offload == "none":
                result = estimate(LLAMA3_70B, where, changed)
                assert (remedy.memory_gib, remedy.fits) == (result.peak_memory_gib,
                                                            result.fits), remedy  # fmt: skip
            offered += 1
    assert offered >= 3


def _changes(framework: str | None) -> dict[str, str | None]:
    """Llama 3 70B on 64 H100s under ZeRO-3 with nothing recomputed (267.5 GiB): each remedy's
    change and note."""
    cluster = load_cluster(H100, 8)
    config = ParallelConfig(zero=3, overlap_grad_reduce=True, overlap_param_gather=True,
                            stack="torchtitan-eager" if framework == "torchtitan" else None)
    return {r.change: r.note for r in config_remedies(LLAMA3_70B, cluster, config,
                                                      framework=framework)}  # fmt: skip


def test_torchtitan_keeps_its_fsdp_reason_and_offers_no_offload() -> None:
    """Under a pipeline torchtitan's FSDP2 is ZeRO-1: the deeper pipeline says so in
    torchtitan's words (not DeepSpeed's rule), and no optimizer offload is offered, since
    torchtitan's CPU offload moves the weights and gradients too."""
    titan = _changes("torchtitan")
    assert (titan["--pp 16 --zero 1"] or "").startswith(
        "ZeRO-3 with pp(16): PyTorch's pipelining keeps FSDP2's gradients")
    assert not any(change.startswith("--offload") for change in titan)
    assert "--tp 8 --sp" in titan and titan["--tp 8 --sp"] == (
        "with sequence parallelism, as torchtitan runs TP")
    megatron_rules = _changes(None)
    assert megatron_rules["--pp 16 --zero 1"] == "no framework here runs ZeRO-3 with a pipeline"
    assert "--offload optimizer" in megatron_rules


def test_deepspeed_is_offered_its_own_offload() -> None:
    """DeepSpeed offloads with ZeRO-Offload, priced as the estimate of it; Megatron-LM with its
    own ``--offload optimizer``."""
    cluster = load_cluster(H100, 8)
    config = ParallelConfig(zero=1)
    for framework, offload in (("deepspeed", "zero-offload"), ("megatron", "optimizer")):
        changed = framework_defaults(config, LLAMA3_70B, cluster=cluster, framework=framework)
        (remedy,) = [r for r in config_remedies(LLAMA3_70B, cluster, changed,
                                                framework=framework)
                     if r.change.startswith("--offload")]  # fmt: skip
        assert remedy.change == f"--offload {offload}"
        offloaded = framework_defaults(changed.model_copy(update={"offload": offload}),
                                       LLAMA3_70B, cluster=cluster, framework=framework)
        priced = estimate(LLAMA3_70B, cluster, offloaded)
        assert remedy.memory_gib == priced.peak_memory_gib
        assert f"step {priced.step_time_s:.2f} s" in (remedy.note or "")


def test_a_switch_given_stays_given() -> None:
    """A switch the user gave is kept in every remedy: TP 2 with sequence parallelism turned
    off is offered Megatron-LM's deeper pipeline without it; left to the framework, with it (as
    its search sets it)."""
    cluster = load_cluster(H100, 8)
    config = ParallelConfig(tp=2, sp=False, zero=1)
    line = config_infeasible_message(LLAMA3_70B, cluster, config, framework="megatron",
                                     given=("sp",))  # fmt: skip
    assert "--pp 16 (146.2 GiB)" in line
    line = config_infeasible_message(LLAMA3_70B, cluster, config, framework="megatron")
    assert "--pp 16 --sp (124.6 GiB)" in line


def test_a_model_the_framework_does_not_build_is_told_so() -> None:
    """GPT-3 175B is none of torchtitan's models: no change makes it one, and the line says
    that no change tried is one torchtitan launches rather than listing Megatron's."""
    gpt3 = load_model(REPO / "instances/models/gpt3-175b.json")
    cluster = load_cluster(REPO / "instances/clusters/dgx-a100-80gb.json", 1)
    assert config_remedies(gpt3, cluster, ParallelConfig(tp=8), framework="torchtitan") == []
    line = config_infeasible_message(gpt3, cluster, ParallelConfig(tp=8), framework="torchtitan")
    assert line.endswith("GiB margin); torchtitan launches none of the changes tried")


def test_deepspeed_widens_tp_without_sequence_parallelism() -> None:
    """DeepSpeed's TP runs without Megatron's sequence parallelism (its norms' gradients go
    unsynchronised under ``--deepspeed``): its wider-TP remedy adds no ``--sp``, and says none
    (it said "with sequence parallelism, as DeepSpeed runs TP"); Megatron-LM's does."""
    deepspeed = _changes("deepspeed")
    wider = [change for change in deepspeed if change.startswith("--tp ")]
    assert wider and not any("--sp" in change or deepspeed[change] for change in wider)
    assert _changes(None)["--tp 4 --sp"] == "with sequence parallelism, as Megatron runs TP"
