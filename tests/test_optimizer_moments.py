"""Adam's moments in bf16 (Megatron-LM's precision-aware optimizer, ``optimizer_moments``):
the states it keeps, a plan priced and exported with it, and where it is refused."""

from __future__ import annotations

import pytest

import planner
from planner import cost
from planner.cost.memory import adam_traffic_bytes
from planner.errors import ConfigError
from planner.frameworks import megatron
from planner.plan.config import ParallelConfig, resolve
from tests.framework_cases import load

RECIPE = dict(tp=2, pp=8, vpp=4, ep=64, etp=1, sp=True, zero=1, first_stage_layers=7,
              last_stage_layers=6, recompute="selective", recompute_modules="mla_up_proj,mlp",
              overlap_moe_expert_parallel_comm=True, global_batch=8192, seq_len=4096,
              overlap_grad_reduce=True, overlap_param_gather=True, moe_dispatcher="deepep",
              stack="megatron-te-fp8")  # fmt: skip
"""NVIDIA's DeepSeek-V3 H100 recipe (yanring/Megatron-MoE-ModelZoo at e865051), which keeps
Adam's moments in bf16 (``sbatch_benchmarking.sh``: ``--use-precision-aware-optimizer
--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``), priced in delayed-scaling FP8."""


def _h100(nodes: int) -> planner.ClusterSpec:
    return planner.load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=nodes)


def test_state_bytes() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/optimizer/distrib_optimizer.py:1007-1013;
    TransformerEngine transformer_engine/pytorch/optimizers/fused_adam.py (store_param_remainders)

    The moments in bf16 (2 + 2) and the fp32 master as its 16 low bits (2): 6 bytes of
    optimizer state a parameter, sharded by the distributed optimizer, beside the bf16 weight
    and the fp32 main gradient; FP8's weight copies as without it. Adam's update moves 12
    bytes fewer a parameter."""
    held = cost.state_bytes_per_param("bf16-m16", zero=1, shards=8)
    assert (held.weights, held.gradients, held.optimizer) == (2, 4, 6 / 8)
    fp8 = cost.state_bytes_per_param("bf16-fp8-m16", zero=1, shards=8)
    assert (fp8.weights, fp8.optimizer) == (4, 6 / 8)
    assert adam_traffic_bytes("bf16") - adam_traffic_bytes("bf16-m16") == 12
    assert cost.states_precision("bf16", "megatron-te", "bf16") == "bf16-m16"
    with pytest.raises(ConfigError, match="not fp16 on megatron-te"):
        cost.states_precision("fp16", "megatron-te", "bf16")
    with pytest.raises(ConfigError, match="not bf16 on megatron-deepspeed"):
        cost.states_precision("bf16", "megatron-deepspeed", "bf16")


def test_recipe_fits_with_bf16_moments() -> None:
    """The recipe with its moments in bf16: the optimizer's part of the peak halves (6 of 12
    bytes), nothing else of it moves, and the plan fits; ``estimate_batch`` agrees."""
    model, cluster = load("deepseek-v3"), _h100(128)
    fp32 = planner.estimate(model, cluster, ParallelConfig(**RECIPE))
    bf16 = planner.estimate(model, cluster, ParallelConfig(**RECIPE, optimizer_moments="bf16"))
    assert bf16.memory.optimizer_gib == pytest.approx(fp32.memory.optimizer_gib / 2)
    assert (bf16.memory.weights_gib, bf16.memory.gradients_gib, bf16.memory.activations_gib) == \
        (fp32.memory.weights_gib, fp32.memory.gradients_gib, fp32.memory.activations_gib)
    assert not fp32.fits and bf16.fits
    assert bf16.step_time_s < fp32.step_time_s  # a lighter Adam step
    batch = planner.estimate_batch(model, cluster, [
        ParallelConfig(**RECIPE, optimizer_moments="bf16"), ParallelConfig(**RECIPE)])
    assert batch.columns["peak_memory_gib"].tolist() == pytest.approx(
        [bf16.peak_memory_gib, fp32.peak_memory_gib])
    assert batch.columns["step_time_s"].tolist() == pytest.approx(
        [bf16.step_time_s, fp32.step_time_s])


def test_exported_as_the_precision_aware_optimizer() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:3667-3680

    Megatron-LM's launch turns the precision-aware optimizer on with both moments in bf16,
    inside the distributed optimizer."""
    model = load("deepseek-v3")
    resolved = resolve(model, _h100(128), ParallelConfig(**RECIPE, optimizer_moments="bf16"))
    assert megatron.PROFILE.refusals(resolved, model) == ()
    text = megatron.PROFILE.launch(resolved, model).text
    for flag in ("--use-distributed-optimizer", "--use-precision-aware-optimizer",
                 "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"):
        assert flag in text


def test_refused_where_it_is_not_priced() -> None:
    """Another stack's optimizer (one line from estimate and a refusal in the batch), and
    Megatron-LM without the distributed optimizer, under Megatron-FSDP or with the optimizer
    offloaded."""
    llama, cluster = load("llama3-8b"), _h100(1)
    eager = ParallelConfig(dp=8, global_batch=64, stack="hf-eager", optimizer_moments="bf16")
    with pytest.raises(ConfigError, match="precision-aware optimizer under bf16"):
        planner.estimate(llama, cluster, eager)
    batch = planner.estimate_batch(llama, cluster, [eager, ParallelConfig(
        dp=8, global_batch=64, stack="hf-eager")])  # fmt: skip
    assert batch.columns["divides"].tolist() == [False, True]
    assert "precision-aware" in (batch.refusal(0) or "")
    for zero, offload, said in ((0, "none", "needs the distributed optimizer"),
                                (3, "none", "Megatron-FSDP keeps its own"),
                                (1, "optimizer", "offloaded")):  # fmt: skip
        resolved = resolve(llama, cluster, ParallelConfig(
            dp=8, global_batch=64, zero=zero, offload=offload, optimizer_moments="bf16",
            overlap_grad_reduce=zero == 3, overlap_param_gather=zero == 3))  # fmt: skip
        assert any(said in r for r in megatron.PROFILE.refusals(resolved, llama)), zero


def test_solve_keeps_the_pin() -> None:
    """``--optimizer-moments bf16`` is kept on the distributed optimizer's configurations:
    GPT 1.7B in bf16 on one A100 node plans the distributed optimizer either way, the pinned
    plan with bf16 moments, no slower (only a lighter Adam step) and in less memory. In the
    model's own fp16 no configuration can keep the pin: refused before searching, not a plan
    that goes without it."""
    model = load("gpt-1.7b")
    cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=1)
    options = dict(framework="megatron", precision="bf16")
    free = planner.solve(model, cluster, planner.SolveOptions(**options))
    pinned = planner.solve(model, cluster, planner.SolveOptions(
        **options, pins=planner.Pins(optimizer_moments="bf16")))  # fmt: skip
    assert pinned.configuration is not None and free.configuration is not None
    assert (free.configuration.zero, free.configuration.optimizer_moments) == (1, "fp32")
    assert (pinned.configuration.zero, pinned.configuration.optimizer_moments) == (1, "bf16")
    assert pinned.summary().endswith("Adam moments in bf16")
    assert pinned.predicted.step_time_s <= free.predicted.step_time_s
    assert pinned.predicted.peak_memory_gib < free.predicted.peak_memory_gib
    with pytest.raises(ConfigError, match="not fp16 on megatron-te"):
        planner.solve(model, cluster, planner.SolveOptions(
            framework="megatron", pins=planner.Pins(optimizer_moments="bf16")))


def test_per_operator_search_keeps_the_moments() -> None:
    """Pinned bf16, the per-operator search gives every stage ZeRO 1 (the precision-aware
    optimizer runs inside Megatron-LM's distributed optimizer) and says so; its plan needs
    less memory for its states than the same stages would with fp32 moments."""
    from planner.search.per_operator import solve_per_operator

    model = planner.load_model("instances/models/mixtral-8x7b.json")
    cluster = planner.load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=4)
    plan = solve_per_operator(model, cluster, planner.SolveOptions(
        pins=planner.Pins(optimizer_moments="bf16")))  # fmt: skip
    assert {s.parallel.zero for s in plan.stages} == {1}
    assert plan.flags.optimizer_moments == "bf16"
    assert "Adam moments in bf16" in plan.summary()


def test_fused_adamw_reads_the_fp32_weights_it_updates() -> None:
    """Under autocast (the ``hf-*`` stacks) the fp32 weights are the master copy: AdamW reads
    and writes them and both moments and reads the gradient, 28 bytes a parameter
    (``_fused_adamw_``'s four tensor lists, params, grads, exp_avgs and exp_avg_sqs, all stored
    but the grads: pytorch/pytorch ``aten/src/ATen/native/cuda/fused_adamw_impl.cu``);
    Megatron-LM's bf16 run reads and writes its fp32 master and moments, reads the fp32 main
    gradient and writes the bf16 weight, 30. Priced at the device's memory-bound rate, the
    one-GPU H100 step's optimizer is its parameters' 28 bytes."""
    assert cost.states_precision("bf16", "hf-eager") == "fp32"
    assert (adam_traffic_bytes("fp32"), adam_traffic_bytes("bf16")) == (28, 30)
    model = planner.load_model("instances/models/llama3-8b.json")
    cluster = _h100(1)
    config = planner.ParallelConfig(tp=1, pp=1, dp=8, mbs=1, global_batch=8, seq_len=2048,
                                    recompute="full", stack="hf-eager")  # fmt: skip
    step = planner.estimate(model, cluster, config)
    params = step.memory.weights_gib * 2**30 / 4  # fp32 weights, nothing sharded
    device = cluster.device
    rate = device.memory_bandwidth_bytes_s * device.efficiency.memory_bound_fraction
    expected = params * 28 / rate + device.efficiency.kernel_launch_us * 1e-6
    assert step.time.optimizer_s == pytest.approx(expected, rel=1e-9)
