"""An MoE model's profile: the layer around its routed experts (``moe``) and a rank's routed
experts (``experts``) are measured apart, and price back exactly the shards they measured,
whatever the expert-parallel degree the plan runs; the tiny MoE model profiled on the CPU
prices its step from its measurements."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cost.profiled import profiled_kind
from planner.diagnose.profile_torch import profile_cases
from planner.plan.config import ParallelConfig
from planner.plan.degrees import Degrees
from planner.sharding.profiled import with_profile
from planner.sharding.uniform import UniformQuery, uniform_layer, uniform_layout
from planner.spec import TrainingSpec
from planner.spec.profile import LayerMeasurement, LayerProfile, layer_shape
from planner.spec.reading import load_cluster, load_model, read_profile
from planner.uniform.batch import estimate_batch
from planner.uniform.estimate import estimate
from tests.conftest import REPO
from tests.test_profile import (
    CPU_NODE,
    DATA,
    DGX_H100,
    _planner,
    microbatch_s,
    needs_torch,
    priced_from,
)

MIXTRAL = REPO / "instances" / "models" / "mixtral-8x7b.json"
TINY_MOE = DATA / "tiny-moe.json"
TINY_MLA = DATA / "tiny-mla.json"
SEQ = 4096


def _measured(kind: str, tp: int, ep: int, mbs: int, seconds: float) -> LayerMeasurement:
    """A made-up measurement: the backward twice the forward, 1 GiB kept per sequence."""
    return LayerMeasurement(kind=kind, tensor_parallel=tp, expert_parallel=ep,
                            micro_batch_size=mbs, seq_length=SEQ, forward_s=seconds,
                            backward_s=2 * seconds, kept_bytes=mbs * 2.0**30)  # fmt: skip


def _mixtral_profile() -> LayerProfile:
    model = load_model(MIXTRAL)
    measured = [
        _measured("moe", 1, 1, 1, 0.010), _measured("moe", 2, 1, 1, 0.006),
        _measured("moe", 1, 1, 2, 0.019),
        _measured("experts", 1, 1, 1, 0.030), _measured("experts", 1, 2, 1, 0.027),
        _measured("experts", 2, 2, 1, 0.015), _measured("experts", 1, 1, 2, 0.055),
    ]
    return LayerProfile(device=load_cluster(DGX_H100).device.name, model=model.name,
                        shape=layer_shape(model), stack="hf-eager", precision="bf16",
                        layer_code="test", measured=tuple(measured))  # fmt: skip


def _parts(model, cluster, tp: int, ep: int, mbs: int) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    """Forward, backward and kept bytes of the MoE layer's two measured parts at a shard."""
    query = UniformQuery(kind="moe", layout=uniform_layout(Degrees(tp=tp, ep=ep)),
                         micro_batch_size=mbs, seq_length=SEQ, precision="bf16",
                         stack="hf-eager")  # fmt: skip
    totals = {"moe": [0.0, 0.0, 0.0], "experts": [0.0, 0.0, 0.0]}
    for node in uniform_layer(model, cluster, query).nodes:
        s = node.strategies[0]
        part = totals[profiled_kind(node.ops[0])]
        part[0] += s.forward_s
        part[1] += s.backward_s
        part[2] += s.kept_bytes
    return totals


def test_each_measured_part_of_an_moe_layer_prices_as_measured() -> None:
    """At every measured shard (TP 1-2, EP 1-2, microbatch 1-2), the layer around the experts
    prices as the ``moe`` measurement at its TP and the routed experts as the ``experts``
    measurement at their EP: the experts' rows on a rank are the same for any EP (each rank
    receives its share of EP ranks' tokens), their count and so their GEMMs' shape are not."""
    model = load_model(MIXTRAL)
    cluster = load_cluster(DGX_H100)
    profile = _mixtral_profile()
    profiled = with_profile(cluster, model, profile)
    at = {(m.kind, m.tensor_parallel, m.expert_parallel, m.micro_batch_size): m
          for m in profile.measured}  # fmt: skip
    for tp, ep, mbs in ((1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2)):
        parts = _parts(model, profiled, tp, ep, mbs)
        for kind, key in (("moe", ("moe", tp, 1, mbs)), ("experts", ("experts", tp, ep, mbs))):
            m = at.get(key)
            if m is None:
                continue
            assert m.forward_s is not None and m.kept_bytes is not None
            label = f"{kind} tp{tp} ep{ep} mb{mbs}"
            assert parts[kind][0] == pytest.approx(m.forward_s, rel=1e-9), label
            assert parts[kind][1] == pytest.approx(2 * m.forward_s, rel=1e-9), label
            assert parts[kind][2] == pytest.approx(m.kept_bytes, rel=1e-9), label
    bare = _parts(model, cluster, 1, 1, 1)
    assert bare["experts"][0] != pytest.approx(0.030, rel=0.01)  # the profile changed it


def test_an_moe_plan_says_which_expert_shard_was_measured() -> None:
    """Estimate's lines name the experts' shard: measured at EP 2, and priced by the model at
    EP 4 where nothing was measured, saying what was."""
    model = load_model(MIXTRAL)
    cluster = with_profile(load_cluster(DGX_H100, nodes=1), model, _mixtral_profile())
    seq = {"seq_len": SEQ, "stack": "hf-eager", "precision": "bf16"}
    two = estimate(model, cluster, ParallelConfig(tp=1, ep=2, pp=4, **seq))
    assert "experts: measured (tp1 ep2 8192 rows)" in two.profiled
    assert "moe: measured (tp1 1x4096)" in two.profiled
    four = estimate(model, cluster, ParallelConfig(tp=1, ep=4, pp=2, **seq))
    assert ("experts: priced by the model (tp1 ep4 8192 rows outside the profiled "
            "tp1 ep1 8192 rows, tp1 ep1 16384 rows, tp1 ep2 8192 rows, "
            "tp2 ep2 8192 rows)") in four.profiled


def test_deepseek_v3_profiles_every_layer_kind_at_the_shards_that_divide_it() -> None:
    """DeepSeek-V3's cases: its three dense layers' kind, its MLA + MoE layer, the head, and
    the routed experts at each expert-parallel degree that divides its 256 experts."""
    model = load_model(REPO / "instances" / "models" / "deepseek-v3.json")
    cases, skipped = profile_cases(model, seq_length=4096, tensor_parallel=(1,),
                                   micro_batches=(1,), expert_parallel=(8, 3))  # fmt: skip
    assert [c.label for c in cases] == ["embedding tp1 1x4096", "dense tp1 1x4096",
                                        "moe tp1 1x4096", "head tp1 1x4096",
                                        "experts tp1 ep8 1x4096"]  # fmt: skip
    assert [(s.label(), s.reason) for s in skipped] == [
        ("experts tp1 ep3 1x4096", "ep 3 does not divide 256 experts")]


@needs_torch
@pytest.mark.parametrize("model", [TINY_MOE, TINY_MLA], ids=["qk-norm", "mla"])
def test_a_tiny_moe_model_profiled_on_the_cpu_prices_its_step(tmp_path: Path,
                                                              model: Path) -> None:  # fmt: skip
    """``planner profile`` runs a tiny MoE model's dense layer, MoE layer (standard attention
    with qk-norm and softmax routing; or MLA with sigmoid, group-limited routing) and routed
    experts on the CPU; ``estimate --profile`` prices each microbatch as the embedding, the
    dense layer, the MoE layer and its experts and the head as measured."""
    out = tmp_path / "tiny.json"
    done = _planner("profile", CPU_NODE, "--model", model, "--device", "cpu", "--mbs", "1",
                    "--tp", "1", "--ep", "1", "--repeats", "1", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    profile = read_profile(out)
    assert [m.label() for m in profile.measured] == [
        "embedding tp1 1x256", "dense tp1 1x256", "moe tp1 1x256", "head tp1 1x256",
        "experts tp1 ep1 1x256"]
    experts = profile.measured[-1]
    # 256 tokens routed top-2 over 8 experts: each computes 64 rows; it keeps the rows, the
    # gate-and-up output and the activation's, at least (fp32)
    ffn = load_model(model).moe.ffn_hidden_size  # type: ignore[union-attr]
    assert experts.kept_bytes is not None
    assert experts.kept_bytes >= 4 * 512 * (256 + 2 * ffn + ffn)
    result = priced_from(model, out)
    # one layer of each kind, the experts in the MoE one
    assert result["time"]["compute_s"] == pytest.approx(8 * microbatch_s(out, {}), rel=1e-6)
    assert "experts: measured (tp1 ep1 512 rows)" in result["profiled"]


def test_an_mla_layer_split_by_tensor_parallelism_prices_as_measured() -> None:
    """DeepSeek-V3's dense MLA layer measured at TP 1 and 2 prices back as measured at both:
    its down projections, whole on every rank, take the unsplit layer's factor with the norms,
    the split operators what is left of the TP 2 measurement."""
    model = load_model(REPO / "instances" / "models" / "deepseek-v3.json")
    cluster = load_cluster(DGX_H100)

    def priced(c, tp: int) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
        query = UniformQuery(kind="dense", layout=uniform_layout(Degrees(tp=tp)),
                             micro_batch_size=1, seq_length=SEQ, precision="bf16",
                             stack="hf-eager")  # fmt: skip
        nodes = [n.strategies[0] for n in uniform_layer(model, c, query).nodes]
        return (sum(s.forward_s for s in nodes), sum(s.backward_s for s in nodes),
                sum(s.kept_bytes for s in nodes))  # fmt: skip

    measured = []
    for tp, slower in ((1, 1.3), (2, 1.2)):
        f, b, k = priced(cluster, tp)
        measured.append(LayerMeasurement(kind="dense", tensor_parallel=tp, micro_batch_size=1,
                                         seq_length=SEQ, forward_s=slower * f,
                                         backward_s=slower * b, kept_bytes=slower * k))
    profile = LayerProfile(device=cluster.device.name, model=model.name,
                           shape=layer_shape(model), stack="hf-eager", precision="bf16",
                           layer_code="test", measured=tuple(measured))  # fmt: skip
    profiled = with_profile(cluster, model, profile)
    for m in measured:
        assert priced(profiled, m.tensor_parallel) == pytest.approx(
            (m.forward_s, m.backward_s, m.kept_bytes), rel=1e-9), m.label()


def test_the_batch_prices_an_moe_profile_as_estimate_does() -> None:
    """``estimate_batch`` reads the experts' factors as ``estimate`` does, at every EP and
    folded or not: the steps and the lines of what was measured agree."""
    model = load_model(MIXTRAL)
    cluster = with_profile(load_cluster(DGX_H100, nodes=2), model, _mixtral_profile())
    model = model.model_copy(update={"training": TrainingSpec(
        seq_length=SEQ, global_batch_size=64, stack="hf-eager", precision="bf16")})
    configs = [ParallelConfig(tp=t, ep=e, etp=f, pp=p, sp=t > 1)
               for t, e, f, p in ((1, 1, None, 4), (1, 2, None, 4), (2, 2, None, 2),
                                  (2, 4, 1, 2), (1, 4, None, 2))]  # fmt: skip
    batch = estimate_batch(model, cluster, configs)
    for i, config in enumerate(configs):
        one = estimate(model, cluster, config)
        assert batch.columns["step_time_s"][i] == pytest.approx(one.step_time_s, rel=1e-9)
        assert list(batch.columns["profiled"][i]) == list(one.profiled), config
    assert "experts: measured (tp1 ep2 8192 rows)" in estimate(model, cluster, configs[1]).profiled
