"""FP8 training as Transformer Engine runs it under Megatron-Core (the ``megatron-te-fp8``
stack, :mod:`planner.graph.fp8`): which operators run in FP8, what their GEMMs, quantizations
and kept inputs cost, the weights' FP8 copies, the speedup measured on an H100, the export and
the refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cost import saved_activation_bytes, state_bytes_per_param
from planner.cost.compute import op_time
from planner.diagnose.bench_cases import bench_cases
from planner.diagnose.bench_fit import fit_bench
from planner.diagnose.fp8_gemms import fit_fp8, load_fp8_gemms
from planner.errors import InputError
from planner.frameworks import PROFILES
from planner.graph import lower
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig, resolve
from planner.search.targets import solve
from planner.spec import DeviceSpec, Fp8Efficiency, ModelSpec, MoESpec, TrainingSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from tests.conftest import CLUSTERS, MODELS, SHARED, shared

FP8_GEMMS = SHARED / "validation" / "h100" / "gemms_fp8_vs_bf16.jsonl"
TINY_MOE = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=256, num_attention_heads=4,
                     num_query_groups=2, ffn_hidden_size=512, vocab_size=1024,
                     max_position_embeddings=512, activation="swiglu", normalization="rmsnorm",
                     position_embedding="rope", bias=False,
                     moe=MoESpec(num_experts=4, top_k=2, ffn_hidden_size=128,
                                 shared_experts=1))  # fmt: skip


def _ops(stack: str, model: ModelSpec = TINY_MOE) -> dict:
    graph = lower(model, TrainingSpec(seq_length=128, global_batch_size=8, stack=stack))
    return {name: graph.nodes[name]["op"] for name in graph}


@pytest.fixture(scope="module")
def h100() -> DeviceSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json").device


def test_the_decoder_layers_projections_run_in_fp8_and_nothing_else() -> None:
    """Transformer Engine's modules (the projections, the routed experts) run in FP8; the
    router, the embedding, the head and every memory-bound op do not."""
    ops = _ops("megatron-te-fp8")
    fp8 = sorted({name.split(".")[-1] for name, op in ops.items() if op.fp8})
    assert fp8 == ["expert_down", "expert_up", "out_proj", "qkv_proj", "shared_down",
                   "shared_up"]
    dense = _ops("megatron-te-fp8", TINY_MOE.model_copy(update={"moe": None}))
    assert sorted({name.split(".")[-1] for name, op in dense.items() if op.fp8}) == [
        "mlp_down", "mlp_up", "out_proj", "qkv_proj"]
    # The shared experts read the MoE layer's separate pre-MLP norm: they quantize their input.
    assert ops["layer1.shared_up"].unfused.forward_kernels == 1
    assert not any(op.fp8 for op in _ops("megatron-te").values())
    assert not ops["lm_head"].fp8 and not ops["layer1.router"].fp8


def test_quantizations_are_counted_where_transformer_engine_runs_them() -> None:
    """A linear fused with its norm gets its input quantized by the norm (no kernel); the
    others quantize their input, 4 bytes an element; every FP8 linear quantizes its output's
    gradient in the backward, 4 bytes an element."""
    ops = _ops("megatron-te-fp8", TINY_MOE.model_copy(update={"moe": None}))
    qkv, out = ops["layer1.qkv_proj"], ops["layer1.out_proj"]
    assert qkv.unfused.forward == () and qkv.unfused.forward_kernels == 0
    assert out.unfused.forward[0].bytes == 4.0 * out.inputs[0].numel
    for op in (qkv, out, ops["layer1.mlp_up"], ops["layer1.mlp_down"]):
        assert op.unfused.backward[0].bytes == 4.0 * op.output.numel
        assert op.unfused.backward_kernels == 1


@pytest.mark.parametrize("half_gflop", [0.0, 62.47])
def test_an_fp8_gemm_runs_the_devices_speedup_faster(h100: DeviceSpec,
                                                     half_gflop: float) -> None:  # fmt: skip
    """With the memory traffic and the launches aside, an FP8 linear's forward, backward and
    weight gradient each take the 16-bit time over the device's measured speedup, but for the
    GEMM curve's fixed cost a call (its half-saturation, on the bundled H100 curve fitted to
    whole runs time the stack loses beside the kernel), which FP8 does not speed up."""
    curve = h100.efficiency.gemm.model_copy(update={"half_saturation_gflop": half_gflop})
    bare = h100.model_copy(update={"efficiency": h100.efficiency.model_copy(
        update={"kernel_launch_us": 0.0, "gemm": curve})})  # fmt: skip
    up = _ops("megatron-te-fp8", TINY_MOE.model_copy(update={"moe": None}))["layer1.mlp_up"]
    # Large enough to be compute-bound: the op's FLOPs scaled up, its bytes kept.
    fp8 = replace(up, unfused=None, flops=1e13)
    plain = replace(fp8, fp8=False)
    kw = dict(activation_degrees={}, weight_degrees={}, compute_degree=1)
    t16, t8 = op_time(plain, bare, "bf16", **kw), op_time(fp8, bare, "bf16", **kw)
    speedup, half = h100.efficiency.fp8.gemm_speedup, half_gflop * 1e9
    f = fp8.flops  # every GEMM of the three passes is of the forward's size
    for s16, s8 in ((t16.forward_s, t8.forward_s), (t16.backward_s, t8.backward_s),
                    (t16.weight_s, t8.weight_s)):  # fmt: skip
        assert s16 / s8 == pytest.approx((f + half) / (f / speedup + half))
    if half == 0:
        assert t16.forward_s / t8.forward_s == pytest.approx(speedup)


def test_an_fp8_linear_keeps_its_input_in_one_byte() -> None:
    """Its kept input is its FP8 copy (half the bf16 bytes); other ops keep what they kept."""
    fp8, bf16 = _ops("megatron-te-fp8"), _ops("megatron-te")

    def kept(op) -> float:
        return saved_activation_bytes(op, lambda t: {}, recompute="none", flash_attention=True)

    for name in ("layer1.qkv_proj", "layer1.out_proj", "layer2.expert_up", "layer2.expert_down"):
        assert kept(fp8[name]) == kept(bf16[name]) / 2
    for name in ("layer1.input_norm", "layer1.attention", "layer2.router", "lm_head"):
        assert kept(fp8[name]) == kept(bf16[name])


def test_the_weights_fp8_copies_are_held_with_the_weights() -> None:
    """Two bytes a parameter beside the bf16 weight (row-wise and column-wise FP8 copies), not
    sharded by the distributed optimizer; gradients and Adam's states as in bf16."""
    fp8 = state_bytes_per_param("bf16-fp8", zero=1, shards=8)
    bf16 = state_bytes_per_param("bf16", zero=1, shards=8)
    assert (fp8.weights, fp8.gradients, fp8.optimizer) == (4.0, bf16.gradients, bf16.optimizer)


def test_llama3_70b_on_h100_in_fp8(h100: DeviceSpec) -> None:
    """Llama 3 70B at TP8 PP2 on 64 H100: the compute is faster, but by less than the GEMMs'
    speedup (attention, norms and quantizations stay); the weights' memory doubles, the kept
    activations shrink; without sequence parallelism the communication (all-reduces) is
    unchanged."""
    model = load_model(MODELS / "llama3-70b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=8)
    config = ParallelConfig(tp=8, pp=2)
    e16 = estimate(model, cluster, config)
    e8 = estimate(model, cluster, config.model_copy(update={"stack": "megatron-te-fp8"}))
    t16, t8 = e16.stages[0].time, e8.stages[0].time
    assert 1.2 < t16.compute_s / t8.compute_s < h100.efficiency.fp8.gemm_speedup
    assert t8.communication_s == pytest.approx(t16.communication_s)
    assert e8.memory.weights_gib == pytest.approx(2 * e16.memory.weights_gib)
    assert e8.memory.activations_gib < e16.memory.activations_gib
    assert e8.step_time_s < e16.step_time_s
    # With sequence parallelism TE all-gathers an FP8 linear's input, and its output's
    # gradient, in FP8; the reduce-scatters stay 16-bit: per layer and microbatch 6 gathers
    # (2 inputs, 2 kept inputs again, 2 output gradients) and 4 reductions, so 7/10 of the time.
    sp = config.model_copy(update={"sp": True})
    c16 = estimate(model, cluster, sp).stages[0].time.tensor_parallel_comm_s
    c8 = estimate(model, cluster, sp.model_copy(update={"stack": "megatron-te-fp8"})
                  ).stages[0].time.tensor_parallel_comm_s  # fmt: skip
    assert c8 / c16 == pytest.approx(0.7, abs=0.02)


def test_the_bundled_speedup_is_the_fit_of_the_measurements() -> None:
    """Every bundled Hopper file carries the median speedup of the shared H100 measurements."""
    fit = fit_fp8(load_fp8_gemms(shared(FP8_GEMMS)))
    assert fit.shapes == 32 and 1.4 < fit.lowest < fit.speedup < fit.highest < 2.0
    for name in ("dgx-h100-80gb", "h100-3level-oversubscribed", "dgx-h200"):
        assert load_cluster(CLUSTERS / f"{name}.json").device.efficiency.fp8.gemm_speedup == (
            fit.speedup)


def test_megatron_launches_it_and_the_others_refuse_it() -> None:
    """Megatron-LM's export says FP8 (hybrid, delayed scaling); the frameworks that do not run
    Transformer Engine's FP8 linears refuse the stack in one line; a device with no measured
    speedup refuses it too, naming the cluster file's field."""
    model = load_model(MODELS / "llama3-8b.json")
    h100 = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=1)
    config = ParallelConfig(tp=2, stack="megatron-te-fp8")

    def launched(c: ParallelConfig) -> str:
        return PROFILES["megatron"].launch(resolve(model, h100, c), model).text

    text = launched(config)
    assert "--fp8-format hybrid" in text and "--fp8-recipe delayed" in text
    assert "--fp8" not in launched(config.model_copy(update={"stack": "megatron-te"}))
    assert PROFILES["megatron"].refusals(resolve(model, h100, config), model) == ()
    for name in ("mindspeed", "deepspeed", "colossalai", "torchtitan"):
        assert PROFILES[name].refusals(resolve(model, h100, config), model)[0].startswith(
            "stack megatron-te-fp8:")
    a100 = load_cluster(CLUSTERS / "dgx-a100-80gb.json", nodes=1)
    with pytest.raises(InputError, match="has no FP8 GEMM speedup"):
        estimate(model, a100, config)
    with pytest.raises(InputError, match="has no FP8 GEMM speedup"):
        solve(model, a100, SolveOptions(framework="megatron", stack="megatron-te-fp8"))


def test_bench_times_fp8_twins_and_fits_their_speedup() -> None:
    """``planner bench --fp8`` times each decoder layer's forward GEMM again in FP8 (not the
    head's, which stays 16-bit); timed at a known speedup, the fit writes that speedup into
    the cluster file, and the pricing of the FP8 twins then matches them."""
    from tests.test_bench import H100, KNOWN, _timed_by

    model = load_model(MODELS / "llama3-8b.json")
    training = TrainingSpec(seq_length=2048, global_batch_size=1)
    cases = bench_cases(model, training, tensor_parallel=(1, 8), micro_batches=(1,), fp8=True)
    twins = [c for c in cases if c.kind == "fp8_gemm"]
    forwards = [c for c in cases if c.kind == "gemm" and c.label.endswith("fwd")
                and c.label.startswith("layer")]  # fmt: skip
    assert {c.shape for c in twins} == {c.shape for c in forwards} and len(twins) > 0
    device = load_cluster(H100).device
    known = device.model_copy(update={"efficiency": KNOWN.model_copy(
        update={"fp8": Fp8Efficiency(gemm_speedup=1.6)})})  # fmt: skip
    fit = fit_bench(H100, cases, _timed_by(known, cases), model_name="llama3-8b",
                    seq_length=2048)  # fmt: skip
    assert fit.after.fp8.gemm_speedup == pytest.approx(1.6, rel=2e-3)
    assert '"gemm_speedup": 1.6' in fit.updated_json
    assert fit.median_error("fp8_gemm", fitted=True) < 2e-3
    # Without --fp8 the file's speedup is kept as it was.
    plain = [c for c in cases if c.kind != "fp8_gemm"]
    kept = fit_bench(H100, plain, _timed_by(known, plain), model_name="llama3-8b",
                     seq_length=2048)  # fmt: skip
    assert kept.after.fp8 == device.efficiency.fp8


def test_the_plan_records_and_says_fp8() -> None:
    """A plan priced on the FP8 stack records it (read back from its JSON) and says so in its
    summary; a 16-bit plan does neither."""
    from planner.plan.schema import Plan

    model = load_model(MODELS / "llama3-8b.json")
    h100 = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=1)
    fp8 = solve(model, h100, SolveOptions(framework="megatron", stack="megatron-te-fp8"))
    again = Plan.model_validate_json(fp8.to_json())
    assert (again.stack, again.configuration.stack) == ("megatron-te-fp8", "megatron-te-fp8")
    assert again.summary().endswith(", FP8 linears")
    bf16 = solve(model, h100, SolveOptions(framework="megatron"))
    assert bf16.stack == "megatron-te" and "FP8" not in bf16.summary()
    assert fp8.predicted.step_time_s < bf16.predicted.step_time_s


def test_an_fp8_speedup_past_what_hardware_has_is_refused(tmp_path) -> None:
    """A speedup of 5 is past twice the FP8-over-16-bit peak ratio of every data sheet: one
    line naming the field, its value and the range (past 16 the schema's own bound says
    so)."""
    import json

    data = json.loads((CLUSTERS / "dgx-h100-80gb.json").read_text())
    data["device"]["efficiency"]["fp8"]["gemm_speedup"] = 5
    path = tmp_path / "slipped.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"device.efficiency.fp8.gemm_speedup: 5 is outside "
                                         r"the range 0.05 to 4 \(FP8's dense peak"):
        load_cluster(path)
