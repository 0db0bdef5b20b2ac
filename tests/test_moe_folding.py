"""MoE parallel folding: the routed experts split over the tensor-parallel ranks too
(``--expert-tensor-parallel-size 1``), their expert-parallel groups numbered as
Megatron-Core's expert rank generator numbers them, priced, searched and exported."""

from __future__ import annotations

import itertools

import pytest

import planner
from planner.errors import ConfigError
from planner.frameworks import megatron, torchtitan
from planner.frameworks._torchtitan_toml import model_parallel_table
from planner.plan.config import ParallelConfig, resolve
from planner.plan.degrees import Degrees
from planner.sharding.uniform import TENSOR
from planner.uniform.batch import estimate_batch
from planner.uniform.columns import config_columns
from planner.uniform.stages import placed_stage
from tests.conftest import REPO
from tests.test_estimate_batch import agree

MIXTRAL = REPO / "instances" / "models" / "mixtral-8x7b.json"
LLAMA = REPO / "instances" / "models" / "llama3-8b.json"
H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"
ORDER = "tp-cp-ep-dp-pp"


def megatron_expert_groups(world: int, *, etp: int, ep: int, pp: int) -> list[list[int]]:
    """The expert-parallel groups Megatron-Core's expert ``RankGenerator`` makes (order
    ``tp-ep-dp-pp`` with ``tp`` = ``etp``, ``cp`` = 1: ``initialize_model_parallel`` in
    ``megatron/core/parallel_state.py``): a rank is ``t + etp (e + ep (d + edp p))``, and a
    group holds the ranks that differ in ``e`` only."""
    edp = world // (etp * ep * pp)
    return [[t + etp * (e + ep * (d + edp * p)) for e in range(ep)]
            for p in range(pp) for d in range(edp) for t in range(etp)]  # fmt: skip


def megatron_accepts(world: int, *, tp: int, pp: int, ep: int, etp: int, experts: int) -> bool:
    """Megatron-Core's own arithmetic on the expert grid: ``world % (etp x ep x pp) == 0``
    (``parallel_state.py``) and whole experts per rank (``arguments.py``)."""
    return world % (tp * pp) == 0 and world % (etp * ep * pp) == 0 and experts % ep == 0


@pytest.mark.parametrize(("tp", "ep", "etp"), [(2, 8, 1), (2, 4, None), (4, 8, 1), (2, 2, 1)])
def test_expert_groups_are_megatron_cores(tp: int, ep: int, etp: int | None) -> None:
    """The stage's expert group (its size and the spacing of its ranks) and the experts'
    data-parallel group are those of Megatron-Core's expert rank generator, folded or not:
    folded, the experts' ranks are consecutive (the tensor-parallel ranks first)."""
    world = 32
    d = Degrees(tp=tp, ep=ep, etp=etp or 0, sp=True).placed(dp=world // tp)
    stage = placed_stage(d, rank_order=ORDER)
    group = stage.mesh.axes_group(stage.layout.expert_axes)
    first = megatron_expert_groups(world, etp=etp or tp, ep=ep, pp=1)[0]
    assert (group.size, group.stride) == (len(first), first[1] - first[0])
    assert (TENSOR in stage.layout.expert_axes) == (etp == 1)
    outside = tuple(a for a in (0, 1) if a not in stage.layout.expert_axes)
    expert_data = stage.group(outside)
    replicas = world // ((etp or tp) * ep)
    assert (expert_data.size, expert_data.stride) == (replicas, (etp or tp) * ep)


def test_rules_admit_what_megatron_admits_within_the_folding_the_planner_prices() -> None:
    """Every configuration the rules let through, Megatron-Core's expert grid takes; and of
    those it takes, the rules refuse only what the planner does not price: an ``etp`` other
    than ``tp`` or 1, and folded groups that are not whole tensor-parallel groups (``ep`` not
    a multiple of ``tp``). Brute force over Mixtral (8 experts) on 32 GPUs."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 4)
    seen = set()
    for tp, pp, ep, etp in itertools.product((1, 2, 4), (1, 2), (1, 2, 4, 8), (None, 1, 2, 4)):
        config = ParallelConfig(tp=tp, pp=pp, ep=ep, etp=etp, sp=True, seq_len=4096,
                                global_batch=64)  # fmt: skip
        try:
            resolve(model, cluster, config)
            ok = True
        except ConfigError:
            ok = False
        e = etp or tp
        megatron_ok = megatron_accepts(32, tp=tp, pp=pp, ep=ep, etp=e, experts=8)
        priced = e in (1, tp) and (e == tp or ep % tp == 0)
        assert ok == (megatron_ok and priced), (tp, pp, ep, etp)
        seen.add((ok, e == 1 and tp > 1))
    assert seen == {(True, True), (True, False), (False, True), (False, False)}


@pytest.mark.parametrize(("knobs", "message"), [
    (dict(tp=2, ep=4, etp=3), r"etp\(3\) must be tp\(2\) or 1"),
    (dict(tp=4, ep=2, etp=1), r"ep\(2\) must be a multiple of tp\(4\)"),
    (dict(tp=2, ep=4, etp=1, sp=False), r"needs sequence parallelism"),
])  # fmt: skip
def test_refusals_say_why(knobs: dict[str, object], message: str) -> None:
    """One line each, with the degrees."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 4)
    knobs.setdefault("sp", True)
    with pytest.raises(ConfigError, match=message):
        resolve(model, cluster, ParallelConfig(seq_len=4096, global_batch=64, **knobs))


def test_a_dense_model_has_nothing_to_fold() -> None:
    model = planner.load_model(LLAMA)
    with pytest.raises(ConfigError, match=r"etp\(1\) but .* has no experts"):
        resolve(model, planner.load_cluster(H100, 1),
                ParallelConfig(tp=2, etp=1, sp=True, global_batch=64))  # fmt: skip


def test_folding_moves_the_experts_from_tensor_to_expert_parallelism() -> None:
    """Mixtral on 32 H100, TP2: EP8 folded holds one whole expert per GPU, as many weights as
    EP4 split two ways by tensor parallelism (two half experts), and no tensor-parallel
    all-gather and reduce-scatter around the experts; EP8 folded holds twice the expert
    weights of EP8 split by tensor parallelism."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 4)
    knobs = dict(tp=2, sp=True, zero=1, global_batch=64, seq_len=4096)
    folded = planner.estimate(model, cluster, ParallelConfig(ep=8, etp=1, **knobs))
    split4 = planner.estimate(model, cluster, ParallelConfig(ep=4, **knobs))
    split8 = planner.estimate(model, cluster, ParallelConfig(ep=8, **knobs))
    assert folded.memory.weights_gib == pytest.approx(split4.memory.weights_gib, rel=1e-9)
    assert folded.time.tensor_parallel_comm_s < 0.5 * split4.time.tensor_parallel_comm_s
    # The folded GPU holds a whole expert where the split one holds half of it: the
    # difference is half an expert's gated MLP (three hidden x ffn matrices) on every layer,
    # in bf16.
    moe = model.moe
    assert moe is not None
    half_expert = 0.5 * 3 * model.hidden_size * moe.ffn_hidden_size * 2 * model.num_layers
    assert folded.memory.weights_gib - split8.memory.weights_gib == pytest.approx(
        half_expert / 2**30, rel=1e-6)  # fmt: skip


def test_the_batch_prices_folding_as_estimate_does() -> None:
    """Folded and not, with a pipeline and without: the batch pricer and ``estimate`` agree
    on every column."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 4)
    configs = [ParallelConfig(tp=2, sp=True, ep=ep, etp=etp, pp=pp, zero=1, global_batch=64,
                              seq_len=4096)
               for ep, etp in ((4, None), (8, 1), (2, 1)) for pp in (1, 2)]  # fmt: skip
    batch = estimate_batch(model, cluster, config_columns(configs))
    assert agree(batch, configs, model, cluster) == 6


def test_exports_name_the_folding() -> None:
    """Megatron-LM: ``--expert-tensor-parallel-size 1``; torchtitan: ETP 1, one of the two
    values its ``ParallelDims`` takes (``torchtitan/distributed/parallel_dims.py``)."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 4)
    resolved = resolve(model, cluster, ParallelConfig(tp=2, sp=True, ep=8, etp=1, zero=1,
                                                      global_batch=64, seq_len=4096))
    assert not megatron.PROFILE.refusals(resolved, model)
    text = megatron.PROFILE.launch(resolved, model).text
    assert "--expert-tensor-parallel-size 1 " in text
    assert "--expert-model-parallel-size 8 " in text
    table = model_parallel_table(resolved, model)
    assert (table["expert_parallel_degree"], table["expert_tensor_parallel_degree"]) == (8, 1)
    assert torchtitan.PROFILE.folds_experts


def test_solve_folds_when_pinned_and_the_plan_says_so() -> None:
    """``--etp 1`` pins the folding: the plan's stages carry it, its summary says it, and the
    export launches it."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 4)
    options = planner.SolveOptions(framework="megatron", global_batch_size=64,
                                   seq_length=4096, pins=planner.Pins(tp=2, etp=1))
    plan = planner.solve(model, cluster, options)
    assert all(s.parallel.etp == 1 and s.parallel.ep % 2 == 0 for s in plan.stages)
    assert "(ETP1)" in plan.summary()
    assert plan.configuration is not None and plan.configuration.etp == 1
