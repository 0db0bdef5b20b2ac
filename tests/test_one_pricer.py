"""One sharding space, one pricer: a uniform configuration is an assignment of the ILP's own
strategies, and ``planner estimate`` prices it with the ILP's own functions.

For every layer kind of every bundled model, Megatron's assignment under several (TP, SP,
CP, EP) is looked up by name among *all* the strategies the ILP offers on the same mesh, and
the layer priced from the ILP's graph agrees with ``estimate``'s to 1e-9 relative, part by
part; the ILP's integer objective agrees to its rounding (one nanosecond per term).
"""

from __future__ import annotations

import dataclasses

import pytest

from planner.ilp.formulation import evaluate_ns
from planner.ilp.problem import NS, LayerQuery, layer_graph_of, layer_problem
from planner.plan.config import ParallelConfig, resolve
from planner.sharding.assignment import layer_parts
from planner.sharding.uniform import uniform_layer, uniform_parts
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from planner.uniform.stages import uniform_query, uniform_stage
from tests.conftest import CLUSTERS, MODELS

BUNDLED = sorted(p.stem for p in MODELS.glob("*.json"))
SEQ = 1024


def _configs(model: ModelSpec) -> list[dict[str, object]]:
    """A few uniform layer shardings the model divides: wide TP with SP (in 16 bits and in
    FP8), narrow TP without SP with ring context parallelism, with SP and Ulysses context
    parallelism, and for
    mixtures of experts EP over data and context ranks, and folded over the tensor ranks."""
    heads = model.num_attention_heads
    groups = heads if model.mla else model.query_groups
    tps = [t for t in (8, 4, 2) if heads % t == 0 and groups % t == 0 and model.ffn % t == 0]
    out: list[dict[str, object]] = [dict(tp=tps[0], sp=True), dict(tp=tps[-1], cp=2, sp=False),
                                    dict(tp=tps[-1], cp=2, cp_algo="ulysses", sp=True),
                                    dict(tp=tps[0], sp=True, stack="megatron-te-fp8")]
    if model.moe is not None:
        ep = 8 if model.moe.num_experts % 8 == 0 else model.moe.num_experts
        out += [dict(tp=tps[-1], ep=ep, sp=True), dict(tp=1, cp=2, ep=ep), dict(tp=1, cp=4, ep=2)]
        if ep % tps[-1] == 0:  # folded over the tensor-parallel ranks
            out += [dict(tp=tps[-1], ep=ep, etp=1, sp=True)]
    return out


def _cases() -> list[tuple[str, int]]:
    cases = []
    for name in BUNDLED:
        model = load_model(MODELS / f"{name}.json")
        cases += [(name, k) for k in range(len(_configs(model)))]
    return cases


@pytest.fixture(scope="module")
def cluster() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json")


@pytest.fixture(scope="module")
def node() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=1)


@pytest.mark.parametrize(("name", "k"), _cases())
def test_estimate_prices_megatron_as_the_ilp_does(name: str, k: int, cluster: ClusterSpec) -> None:
    """Every field of every layer kind's parts agrees to 1e-9 (tp_comm_overlap on where SP is,
    so the overlap rule is covered too)."""
    model = load_model(MODELS / f"{name}.json")
    knobs = _configs(model)[k]
    config = ParallelConfig(pp=1, mbs=2, seq_len=SEQ, global_batch=4096,
                            tp_comm_overlap=bool(knobs.get("sp")), **knobs)  # type: ignore[arg-type]
    resolved = resolve(model, cluster, config)
    stage = uniform_stage(resolved)
    kinds = ["embedding", "head", "dense", "moe"]
    for kind in kinds:
        query = uniform_query(resolved, stage, kind)
        try:
            uniform = uniform_layer(model, cluster, query)
        except KeyError:
            continue  # the model has no layer of this kind
        names = [n.strategies[0].name for n in uniform.nodes]
        ilp_query = LayerQuery(kind=kind, mesh=stage.layout.shape,
                               mesh_micro_batch_size=2 * stage.layout.data_ways, seq_length=SEQ,
                               precision=resolved.training.precision,
                               stack=resolved.training.stack,
                               tp_comm_overlap=config.tp_comm_overlap)  # fmt: skip
        ilp = layer_graph_of(model, cluster, ilp_query)
        chosen = [[s.name for s in n.strategies].index(name)
                  for n, name in zip(ilp.nodes, names, strict=True)]  # fmt: skip
        ours = uniform_parts(model, cluster, query)
        theirs = layer_parts(ilp, chosen)
        for field in dataclasses.fields(ours):
            got, want = getattr(ours, field.name), getattr(theirs, field.name)
            if field.name == "weights":
                assert [axes for _, axes in got] == [axes for _, axes in want]
                got, want = [n for n, _ in got], [n for n, _ in want]
            assert got == pytest.approx(want, rel=1e-9, abs=0.0), (kind, field.name)


def test_ilp_objective_is_the_same_price(node: ClusterSpec) -> None:
    """The ILP's own integer objective of Megatron's TP 8 + SP GPT-3 layer (a full problem,
    unpruned) is the uniform layer's time to a nanosecond per term."""
    model = load_model(MODELS / "gpt3-175b.json")
    resolved = resolve(model, node, ParallelConfig(tp=8, sp=True, seq_len=2048,
                                                      global_batch=8))  # fmt: skip
    stage = uniform_stage(resolved)
    query = uniform_query(resolved, stage, "dense")
    names = [n.strategies[0].name for n in uniform_layer(model, node, query).nodes]
    ilp_query = LayerQuery(kind="dense", mesh=(8,), mesh_micro_batch_size=1, seq_length=2048)
    problem, layer = layer_problem(model, node, ilp_query, prune=False)
    # The 1-D mesh's names: the tensor axis only (axis 0 there, axis 2 of the uniform mesh).
    short = [name.split(",")[-1].replace("@2", "@0") for name in names]
    chosen = [[s.name for s in n.strategies].index(name)
              for n, name in zip(layer.nodes, short, strict=True)]  # fmt: skip
    parts = uniform_parts(model, node, query)
    for mode in ("none", "selective", "full"):
        # Less the norms' gradient all-reduce over the tensor-parallel ranks, which the
        # layer's parts leave to the step composer.
        sync = sum(n.sync_ns[0][i] for n, i in zip(problem.nodes, chosen, strict=True))
        objective = (evaluate_ns(problem, chosen, mode, 0) - sync) / NS
        want = (parts.forward_s + parts.backward_s + parts.tp_comm_s + parts.cp_comm_s
                + parts.ep_comm_s + parts.rerun_total_s(mode))  # fmt: skip
        terms = len(problem.nodes) + 2 * len(problem.edges)
        assert objective == pytest.approx(want, abs=terms / NS), mode


def test_estimate_uses_those_parts(node: ClusterSpec) -> None:
    """The estimate's compute and tensor-parallel time are the parts times the layers and
    microbatches (one stage, no pipeline): nothing else prices the layer."""
    model = load_model(MODELS / "llama3-8b.json")
    config = ParallelConfig(tp=4, sp=True, seq_len=SEQ, global_batch=64, mbs=1)
    resolved = resolve(model, node, config)
    stage = uniform_stage(resolved)
    result = estimate(model, node, config)
    m = resolved.num_microbatches
    kinds = {"embedding": 1, "dense": model.num_layers, "head": 1}
    compute = tp = 0.0
    for kind, count in kinds.items():
        p = uniform_parts(model, node, uniform_query(resolved, stage, kind))
        compute += count * (p.forward_s + p.backward_s)
        tp += count * p.tp_comm_s
    assert result.time.compute_s == pytest.approx(m * compute, rel=1e-12)
    assert result.time.tensor_parallel_comm_s == pytest.approx(m * tp, rel=1e-12)
