"""The routed experts' GEMMs priced as the stack runs them: one grouped kernel on Megatron-Core
(``--moe-grouped-gemm``) and torchtitan, against ``../shared/validation/h100/expert_gemms.jsonl``
(issue 28's target: within 15 % at 128 tokens per expert and above, met at the median, not at
every shape: see ``benchmarks/expert_gemms.py``); one GEMM per expert in turn elsewhere."""

from __future__ import annotations

import statistics

import pytest

from planner.cost.compute import gemm_fraction, grouped_gemm_fraction
from planner.diagnose.expert_gemms import (
    FIT_MIN_TOKENS,
    fit_grouped_gemm,
    priced_s,
    read_expert_gemms,
)
from planner.plan.config import ParallelConfig
from planner.spec import DeviceSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from tests.conftest import CLUSTERS, MODELS, SHARED, shared

EXPERT_GEMMS = SHARED / "validation" / "h100" / "expert_gemms.jsonl"


@pytest.fixture(scope="module")
def h100() -> DeviceSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json").device


def test_the_bundled_curve_is_the_fit_of_the_measurements(h100: DeviceSpec) -> None:
    """The H100 files' grouped-GEMM curve is what fitting the shared measurements gives now:
    a change to how an expert GEMM is priced must refit it."""
    gemms = read_expert_gemms(shared(EXPERT_GEMMS))
    bare = h100.model_copy(update={"efficiency": h100.efficiency.model_copy(
        update={"grouped_gemm": None})})  # fmt: skip
    fitted = fit_grouped_gemm(gemms, bare, source="test")
    bundled = h100.efficiency.grouped_gemm
    assert bundled is not None
    assert fitted.max_fraction == pytest.approx(bundled.max_fraction, abs=2e-4)
    assert fitted.half_saturation_tokens == pytest.approx(bundled.half_saturation_tokens, abs=0.2)
    assert fitted.half_saturation_k == pytest.approx(bundled.half_saturation_k, abs=0.2)
    assert fitted.call_us == pytest.approx(bundled.call_us, abs=0.02)


def test_grouped_experts_priced_near_the_kernel(h100: DeviceSpec) -> None:
    """At 128+ tokens per expert the grouped price is within 15 % of the measured kernel on 23
    of the 24 shapes, 3.5 % at the median; the 24th, Qwen3-235B's up projection at 512 tokens,
    is priced 16 % slow (the kernel runs it as fast as at 1,024, which no smooth curve
    follows). One GEMM per expert in turn, the price every expert GEMM had before, is 0.3-13
    times too slow over the same shapes."""
    gemms = [g for g in read_expert_gemms(shared(EXPERT_GEMMS))
             if g.tokens_per_expert >= FIT_MIN_TOKENS]  # fmt: skip
    assert len(gemms) == 24
    errors = [priced_s(g, h100) / g.grouped_s - 1 for g in gemms]
    assert statistics.median(abs(e) for e in errors) <= 0.04
    assert max(abs(e) for e in errors) <= 0.17, max(errors, key=abs)
    assert sum(abs(e) <= 0.15 for e in errors) >= 23
    sequential = [priced_s(g, h100, grouped=False) / g.grouped_s - 1 for g in gemms]
    assert min(sequential) > 0.25 and max(sequential) > 10


def test_without_a_curve_the_group_is_one_gemm_of_all_its_flops() -> None:
    """A device with no grouped-GEMM curve (A100: nothing measured) prices the grouped kernel
    on its GEMM curve at the whole group's FLOPs."""
    a100 = load_cluster(CLUSTERS / "dgx-a100-80gb.json").device
    assert a100.efficiency.grouped_gemm is None
    fraction = grouped_gemm_fraction(a100, flops=5e10, tokens_per_expert=256, reduction=4096)
    assert fraction == gemm_fraction(a100.efficiency.gemm, 5e10)


def test_the_stack_decides_grouped_or_in_turn() -> None:
    """Mixtral 8x7B on one H100 node, EP8: Megatron-Core's grouped kernel prices the step
    faster than Megatron-DeepSpeed's loop over the experts, which has 1 expert per rank here
    (8 experts over 8 ranks), so the difference is the curve, not the launches."""
    model = load_model(MODELS / "mixtral-8x7b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=1)
    config = ParallelConfig(tp=1, pp=1, ep=8, dp=8, mbs=1, zero=1, recompute="full",
                            global_batch=64, seq_len=4096)  # fmt: skip
    grouped = estimate(model, cluster, config.model_copy(update={"stack": "megatron-te"}))
    in_turn = estimate(model, cluster, config.model_copy(update={"stack": "megatron-deepspeed"}))
    assert grouped.time.compute_s < in_turn.time.compute_s
