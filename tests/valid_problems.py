"""Hypothesis strategies for small valid problems (a model, a cluster, a training run) and the
property every solve must keep: a plan that satisfies the invariants, or a PlannerError.

Shared by ``tests/test_fuzz_solve.py`` (a few cases in CI) and ``benchmarks/fuzz_solve.py``
(thousands). The models are tiny (a few layers, narrow) so that a solve takes a fraction of a
second, but every feature the search branches on appears: GQA, SwiGLU, RoPE, untied heads,
mixtures of experts with dense leading layers, one or two nodes of one to eight devices, and
device memories from a few MiB (nothing fits) to 80 GiB.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from planner.errors import InvalidPlanError, PlannerError
from planner.options import SolveOptions
from planner.plan.invariants import plan_violations
from planner.plan.schema import Plan
from planner.search.per_operator import solve_per_operator
from planner.spec import ClusterSpec, ModelSpec

FUZZ_OPTIONS = SolveOptions(time_limit_s=3.0, ilp_time_limit_s=1.0)
"""A bound on each solve: most take a tenth of a second, but a mixture of experts on a
two-node mesh runs 100+ layer ILPs of a few tenths each, and the property must hold when the
limit cuts a search short too (a plan marked ``time_limit``, or a TimeLimitError)."""


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    """A small decoder-only transformer with a training block."""
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([8, 16, 32, 64]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8) if heads % g == 0]))
    hidden = heads * head_dim
    layers = draw(st.integers(1, 6))
    max_positions = draw(st.sampled_from([128, 512, 2048]))
    data: dict[str, Any] = {
        "name": "fuzz",
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": groups,
        "ffn_hidden_size": draw(st.sampled_from([hidden, 2 * hidden, 4 * hidden])),
        "vocab_size": draw(st.integers(16, 4096)),
        "max_position_embeddings": max_positions,
        "activation": draw(st.sampled_from(["gelu", "swiglu"])),
        "normalization": draw(st.sampled_from(["layernorm", "rmsnorm"])),
        "position_embedding": draw(st.sampled_from(["learned", "rope"])),
        "tie_word_embeddings": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "training": {
            "seq_length": draw(st.sampled_from([s for s in (32, 128, 512) if s <= max_positions])),
            "global_batch_size": draw(st.sampled_from([1, 2, 3, 8, 16])),
            "precision": draw(st.sampled_from(["bf16", "fp16", "fp32"])),
        },
    }
    if draw(st.booleans()):
        experts = draw(st.sampled_from([2, 4, 8]))
        data["moe"] = {
            "num_experts": experts,
            "top_k": draw(st.integers(1, min(2, experts))),
            "ffn_hidden_size": draw(st.sampled_from([hidden // 2 or 1, hidden])),
            "shared_experts": draw(st.integers(0, 1)),
            "first_dense_layers": draw(st.integers(0, layers)),
        }
    return ModelSpec.model_validate(data)


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSpec:
    """One or two nodes of one to eight devices on a two-level network."""
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.sampled_from([1, 2]))
    memory_gib = draw(st.sampled_from([0.005, 0.05, 0.5, 16.0, 80.0]))
    return ClusterSpec.model_validate({
        "name": "fuzz",
        "num_nodes": nodes,
        "devices_per_node": per_node,
        "device": {
            "name": "fuzz-gpu",
            "memory_gib": memory_gib,
            "memory_bandwidth_gb_s": draw(st.sampled_from([900.0, 3350.0])),
            "peak_tflops": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
            "reserved_memory_gib": draw(st.sampled_from([0.0, memory_gib / 4])),
        },
        "network": [
            {"name": "node", "domain_devices": per_node, "bandwidth_gb_s": 300.0,
             "latency_us": 2.0},
            {"name": "fabric", "domain_devices": per_node * 64, "bandwidth_gb_s": 25.0,
             "latency_us": 5.0},
        ],
    })  # fmt: skip


def solve_checked(
    model: ModelSpec, cluster: ClusterSpec, options: SolveOptions = FUZZ_OPTIONS
) -> Plan | PlannerError:
    """Solve, and hold the result to the property: a plan that keeps every invariant, or a
    PlannerError other than an invalid plan (which is a planner bug). Anything else raises."""
    try:
        plan = solve_per_operator(model, cluster, options)
    except InvalidPlanError:
        raise
    except PlannerError as exc:
        assert str(exc), "an error a user sees must say something"
        return exc
    violations = plan_violations(plan, model)
    assert not violations, violations
    return plan
