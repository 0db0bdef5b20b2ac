"""What would make a run fit (uniform.remedies): every number a direct estimate of the changed
configuration, the node count what brute force over the node counts gives, and one error line
from ``planner solve`` with the least memory and the nodes that would do."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.baselines.grid import grid_space
from planner.errors import ConfigError
from planner.options import SolveOptions, training_of
from planner.plan.config import ParallelConfig, stage_layers
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from planner.uniform.leanest import infeasible_message, leanest_uniform, nodes_to_fit
from planner.uniform.remedies import (
    OFFLOAD,
    Remedy,
    config_infeasible_message,
    config_remedies,
)
from planner.uniform.space import branch_leanest, branch_space
from planner.vocabulary import RECOMPUTE_MODES
from tests.cli_process import cli
from tests.test_cli import A100, GPT3, _assert_one_line_error

REPO = Path(__file__).resolve().parents[1]
OPTIONS = SolveOptions()
COMBINED = "every knob at its leanest, on the fewest nodes"
PRICED = "--offload optimizer"
"""The offload remedy on a cluster with host figures (DGX A100's)."""


@pytest.fixture(scope="module")
def gpt3() -> ModelSpec:
    return load_model(REPO / GPT3)


@pytest.fixture(scope="module")
def one_node() -> ClusterSpec:
    return load_cluster(REPO / A100, 1)


def _apply(
    config: ParallelConfig, cluster: ClusterSpec, change: str
) -> tuple[ParallelConfig, ClusterSpec]:
    """The configuration and cluster a remedy's ``planner estimate`` options describe."""
    update: dict[str, object] = {}
    nodes = cluster.num_nodes
    tokens = change.split()
    while tokens:
        token = tokens.pop(0)
        if token == "without":
            update[tokens.pop(0).removeprefix("--").replace("-", "_")] = None
        elif token in ("--sp", "--no-sp"):
            update["sp"] = token == "--sp"
        elif token == "--nodes":
            nodes = int(tokens.pop(0))
        else:
            name, value = token.removeprefix("--").replace("-", "_"), tokens.pop(0)
            update[name] = value if name in ("recompute", "offload") else int(value)
    return ParallelConfig(**{**config.model_dump(), **update}), cluster.with_nodes(nodes)


def _assert_priced(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
                   remedies: list[Remedy]) -> None:  # fmt: skip
    """Every remedy's memory and fit are those of a direct estimate of the changed
    configuration; offload's are the estimate's peak less its optimizer states."""
    base = estimate(model, cluster, config)
    for remedy in remedies:
        if remedy.change == OFFLOAD:
            expected = base.peak_memory_gib - base.memory.optimizer_gib
            assert remedy.memory_gib == pytest.approx(expected, rel=1e-12)
            assert remedy.fits == (expected <= cluster.device.memory_gib)
            continue
        changed, where = _apply(config, cluster, remedy.change)
        result = estimate(model, where, changed)
        assert (remedy.memory_gib, remedy.fits) == (result.peak_memory_gib, result.fits), remedy


def test_one_node_remedies_are_direct_estimates(gpt3: ModelSpec, one_node: ClusterSpec) -> None:
    """GPT-3 175B with TP8 on one DGX A100 needs ~400 GiB: no single change fits (ZeRO-1 over
    one data-parallel rank saves nothing, so it is not listed; no device is left for a
    pipeline, ZeRO-0 gains nothing from more nodes), so the combination comes, on the 8 nodes
    it needs; offload leaves the weights and gradients, still too many."""
    config = ParallelConfig(tp=8)
    remedies = config_remedies(gpt3, one_node, config)
    assert [r.change for r in remedies] == [
        "--recompute full", "--sp --recompute full --zero 3 --nodes 8", PRICED,
    ]  # fmt: skip
    assert [r.fits for r in remedies] == [False, True, False]
    assert remedies[1].note == COMBINED
    _assert_priced(gpt3, one_node, config, remedies)


def test_every_knob_has_its_remedy(gpt3: ModelSpec) -> None:
    """On 8 nodes, TP4 x PP8 with 4-sequence microbatches and selective recomputation: one
    remedy per knob (microbatch, recomputation, ZeRO, TP, PP), none enough alone, then all at
    once and offload."""
    cluster = load_cluster(REPO / A100, 8)
    config = ParallelConfig(tp=4, pp=8, mbs=4, recompute="selective")
    remedies = config_remedies(gpt3, cluster, config)
    assert [r.change for r in remedies] == [
        "--mbs 1", "--recompute full", "--zero 1", "--tp 8 --sp", "--pp 16",
        "--tp 8 --sp --mbs 1 --recompute full --zero 1", PRICED,
    ]  # fmt: skip
    assert [r.fits for r in remedies[:5]] == [False] * 5 and remedies[5].fits
    _assert_priced(gpt3, cluster, config, remedies)


def test_a_change_that_fits_needs_no_combination(gpt3: ModelSpec) -> None:
    """TP4 x PP8 with ZeRO-1 on 8 nodes is 6 GiB over: full recomputation, TP8, PP16 or twice
    the nodes each fit alone, the mildest setting of each knob is the one given."""
    cluster = load_cluster(REPO / A100, 8)
    config = ParallelConfig(tp=4, pp=8, sp=True, zero=1, recompute="selective")
    remedies = config_remedies(gpt3, cluster, config)
    assert [r.change for r in remedies] == [
        "--recompute full",
        "--tp 8",
        "--pp 16",
        "--nodes 16",
        PRICED,
    ]
    assert all(r.fits for r in remedies)
    _assert_priced(gpt3, cluster, config, remedies)


@pytest.mark.parametrize(
    ("name", "cluster_file", "nodes"),
    [("gpt3-175b", "dgx-a100-80gb", 8), ("mixtral-8x7b", "dgx-h100-80gb", 1),
     ("llama3.1-405b", "dgx-h100-80gb", 4), ("llama3-8b", "dgx-h100-80gb", 1)],
)  # fmt: skip
def test_remedies_lie_in_the_uniform_space(name: str, cluster_file: str, nodes: int) -> None:
    """Every remedy of a configuration of the uniform space (one that does not fit: interleaved,
    uneven, context- or expert-parallel among them) is itself a configuration of that space,
    on the remedy's node count: the remedies change one knob a notch within the degrees, splits,
    interleavings and ZeRO stages the space holds, they derive none of their own."""
    model = load_model(REPO / f"instances/models/{name}.json")
    cluster = load_cluster(REPO / f"instances/clusters/{cluster_file}.json", nodes)
    options = SolveOptions(framework="any")
    too_big = []
    # 1F1B only: the sample stays the one the flags below were chosen for (any's space also
    # holds the zero-bubble schedules, every framework's), and its chunks equal (the slotted
    # interleavings, searched since, would move the sample), and neither folded experts nor
    # recompute modules (searched since too)
    one_f_one_b = [c for c in grid_space(model, cluster, options) if c.schedule == "1f1b"
                   and c.etp is None and c.recompute_modules is None
                   and all(n % c.vpp == 0 for n in stage_layers(
                       model.num_layers, pp=c.pp, first=c.first_stage_layers,
                       last=c.last_stage_layers))]  # fmt: skip
    for config in one_f_one_b[::7]:
        try:
            if not estimate(model, cluster, config).fits:
                too_big.append(config)
        except ConfigError:
            continue
    spaces: dict[int, set[ParallelConfig]] = {}
    flags = set()
    for config in too_big[:: len(too_big) // 6][:6]:
        for remedy in config_remedies(model, cluster, config):
            if remedy.change in (OFFLOAD, "--offload optimizer"):  # the search's variants
                continue
            changed, where = _apply(config, cluster, remedy.change)
            if where.num_nodes not in spaces:
                spaces[where.num_nodes] = set(grid_space(model, where, options))
            assert changed in spaces[where.num_nodes], remedy.change
            flags |= {token for token in remedy.change.split() if token.startswith("--")}
    assert {"--mbs", "--recompute", "--zero", "--tp", "--pp"} <= flags


def test_a_configuration_that_fits_has_no_remedies(gpt3: ModelSpec) -> None:
    """Nothing to remedy: no remedies, and the message refuses; a configuration that does not
    divide is the usual ConfigError."""
    cluster = load_cluster(REPO / A100, 8)
    fits = ParallelConfig(tp=8, pp=8, sp=True, recompute="full", zero=1)
    assert config_remedies(gpt3, cluster, fits) == []
    with pytest.raises(ValueError, match="fits: nothing to remedy"):
        config_infeasible_message(gpt3, cluster, fits)
    with pytest.raises(ConfigError, match=r"does not divide"):
        config_remedies(gpt3, cluster, ParallelConfig(tp=3))


def test_config_message_is_one_line(gpt3: ModelSpec, one_node: ClusterSpec) -> None:
    """The ``planner estimate`` error: the memory, the device, what fits, what does not."""
    line = config_infeasible_message(gpt3, one_node, ParallelConfig(tp=8))
    assert "\n" not in line
    assert line.startswith("tp 8, pp 1, cp 1, ep 1, mbs 1, no recompute, ZeRO-0 needs 428.6 GiB")
    assert "would fit: --sp --recompute full --zero 3 --nodes 8 (55.2 GiB;" in line
    assert "would not fit: --recompute full (402.2 GiB)" in line
    # DGX A100 has host figures: the offload is priced (and its host memory too short)
    assert ("--offload optimizer (164.8 GiB; step " in line
            and "2605 of 1907.35 GiB of host memory per node" in line)


def test_leanest_uniform_is_the_least_of_the_whole_grid(
    gpt3: ModelSpec, one_node: ClusterSpec
) -> None:
    """Pricing each branch's leanest finds the least memory of every configuration the grid
    considers (a smaller grid here, for time)."""
    options = SolveOptions(micro_batch_sizes=(1, 2), interleaved=False)
    least = leanest_uniform(gpt3, one_node, training=training_of(gpt3, options), options=options)
    assert least is not None
    peaks = []
    for config in grid_space(gpt3, one_node, options):
        try:
            peaks.append(estimate(gpt3, one_node, config).peak_memory_gib)
        except ConfigError:
            continue
    assert least[0] == min(peaks)
    assert estimate(gpt3, one_node, least[1]).peak_memory_gib == least[0]


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan", "any"])
@pytest.mark.parametrize(("model_file", "nodes"), [("llama3-8b", 1), ("mixtral-8x7b", 4)])
def test_branch_leanest_is_branch_space_leanest(model_file: str, nodes: int,
                                                framework: str) -> None:  # fmt: skip
    """Each branch's leanest at each ZeRO stage, found leanest first, is the one the whole
    branch space gives (no interleaving, the smallest microbatch, the most recomputation),
    its overlap flags as the framework launches it."""
    model = load_model(REPO / "instances" / "models" / f"{model_file}.json")
    cluster = load_cluster(REPO / "instances" / "clusters" / "dgx-h100-80gb.json", nodes)
    options = SolveOptions(framework=framework, global_batch_size=64, overlap_grad_reduce=True,
                           overlap_param_gather=True)  # fmt: skip
    training = training_of(model, options)
    whole = []
    for _, groups in branch_space(model, cluster, training=training, options=options):
        launched = sorted((c for group in groups for c in group), key=lambda c: (
            c.vpp, c.mbs, -RECOMPUTE_MODES.index(c.recompute)))  # fmt: skip
        whole += [next(c for c in launched if c.zero == z)
                  for z in sorted({c.zero for c in launched}, reverse=True)]  # fmt: skip
    assert len(whole) > 5  # branches with and without a pipeline
    assert branch_leanest(model, cluster, training=training, options=options) == whole


def test_nodes_to_fit_is_brute_force(gpt3: ModelSpec, one_node: ClusterSpec) -> None:
    """GPT-3 175B needs 8 DGX A100 (4 leave 103 GiB per device): the first of 1, 2, 4, 8, ...
    nodes where the leanest uniform configuration fits."""
    training = training_of(gpt3, OPTIONS)
    brute = None
    for nodes in (1, 2, 4, 8, 16):
        found = leanest_uniform(gpt3, one_node.with_nodes(nodes), training=training,
                                options=OPTIONS)
        if found is not None and found[0] <= one_node.device.memory_gib:
            brute = (nodes, *found)
            break
    assert nodes_to_fit(gpt3, one_node, training=training, options=OPTIONS) == brute
    assert brute is not None and brute[0] == 8 and round(brute[1], 1) == 54.0
    assert nodes_to_fit(gpt3, one_node, training=training, options=OPTIONS, max_factor=4) is None


def test_infeasible_message_names_the_ways_out(gpt3: ModelSpec, one_node: ClusterSpec) -> None:
    """The floor and the device, the nodes that fit with the configuration, offload with what
    it saves and that it is not enough, and why a shorter sequence does not help."""
    training = training_of(gpt3, OPTIONS)
    line = infeasible_message(gpt3, one_node, training, OPTIONS, searched="no plan",
                              least_gib=397.6, leanest="some plan")  # fmt: skip
    assert "\n" not in line
    assert line.startswith("no plan fits gpt3-175b on 8 x A100-SXM4-80GB (80 GiB, 4.0 GiB kept")
    assert "the leanest (some plan) needs 397.6 GiB per device" in line
    assert "add nodes: on 8 nodes (64 devices) tp 8, pp 8" in line
    leanest = leanest_uniform(gpt3, one_node, training=training, options=OPTIONS)
    assert leanest is not None
    offload = estimate(gpt3, one_node, leanest[1])
    saved = offload.memory.optimizer_gib
    assert f"saves {saved:.1f} GiB, leaving {offload.peak_memory_gib - saved:.1f} GiB" in line
    off = estimate(gpt3, one_node, leanest[1].model_copy(update={"offload": "optimizer"}))
    assert (f"not enough; its step takes {off.step_time_s:.2f} s, {off.time.optimizer_s:.2f} s "
            f"of them the host copies and CPU Adam") in line
    assert "a shorter sequence would not help" in line


def test_a_narrower_search_hears_of_the_uniform_space(gpt3: ModelSpec) -> None:
    """When the search that failed was narrower than the uniform space, the message says a
    uniform configuration fits and how to ask for it."""
    cluster = load_cluster(REPO / A100, 8)
    line = infeasible_message(gpt3, cluster, training_of(gpt3, OPTIONS), OPTIONS,
                              searched="no plan", least_gib=100.0, leanest="x")  # fmt: skip
    assert "a uniform configuration fits: tp 8, pp 8" in line and "(--method grid)" in line


def test_a_shorter_sequence_when_activations_decide() -> None:
    """Llama 3 8B at a million tokens a sequence on one node: the states fit, the activations
    do not; half the sequence would fit the device but not beside the 5 % margin, a quarter
    fits beside it."""
    model = load_model(REPO / "instances/models/llama3-8b.json")
    cluster = load_cluster(REPO / A100, 1)
    options = SolveOptions(seq_length=1 << 20, global_batch_size=8)
    training = training_of(model, options)
    line = infeasible_message(model, cluster, training, options, searched="x", least_gib=134.5,
                              leanest="y")  # fmt: skip
    assert "a shorter sequence: at 262144 (--seq-len 262144)" in line
    usable = options.usable_bytes(cluster.device, "megatron-te") / 2**30
    for seq, fits in ((1 << 19, False), (1 << 18, True)):
        found = leanest_uniform(model, cluster,
                                training=training.model_copy(update={"seq_length": seq}),
                                options=options)  # fmt: skip
        assert found is not None and (found[0] <= usable) == fits


@pytest.mark.parametrize("method", ["grid", "heuristic"])
def test_solve_says_what_would_fit(method: str) -> None:
    """``planner solve`` on GPT-3 175B and one node: exit 2, one line with the least memory
    per device and the node count that fits."""
    done = cli("solve", GPT3, A100, "--nodes", "1", "--method", method)
    _assert_one_line_error(done, "gpt3-175b", "needs 397.6 GiB per device", "on 8 nodes",
                           "optimizer offload to the CPU")  # fmt: skip


def test_remedies_are_judged_beside_the_users_margin(gpt3: ModelSpec) -> None:
    """A configuration that fits beside the default margin but not beside ``--memory-margin
    10`` is refused with that margin's arithmetic, and every remedy listed as fitting fits
    beside it too (before, the message crashed: estimate's default margin said it fits)."""
    cluster = load_cluster(REPO / A100, 128)
    config = ParallelConfig(tp=8, pp=16, recompute="full", recompute_layers=2,
                            flash_attention=False, precision="fp16")  # fmt: skip
    assert estimate(gpt3, cluster, config).fits
    assert not estimate(gpt3, cluster, config, memory_margin_gib=10).fits
    message = config_infeasible_message(gpt3, cluster, config, memory_margin_gib=10)
    assert "more than the 70.00 GiB a device may use" in message
    assert "80 GiB less a 10.00 GiB margin" in message
    remedies = config_remedies(gpt3, cluster, config, memory_margin_gib=10)
    assert any(r.fits for r in remedies)
    for remedy in remedies:
        assert remedy.fits == (remedy.memory_gib + 10 <= 80), remedy
