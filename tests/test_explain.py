"""``planner explain``: every number it shows is the plan's own or :func:`planner.estimate`'s
on the configuration it names, and every verdict is the test that decides it (estimate's
``fits``, the divisibility rules, the framework profile's refusals)."""

from __future__ import annotations

import json

import pytest

from planner import cost, estimate
from planner.cost.memory import NCCL_ALL_TO_ALL_PEER_BYTES
from planner.diagnose.explain import explain, memory_binding
from planner.diagnose.explanation import Explanation
from planner.diagnose.notches import KNOBS, notches, with_changes
from planner.diagnose.whatif import hardware_changes, wider_scale_up
from planner.diagnose.why_not import parse_changes
from planner.errors import ConfigError, InputError
from planner.frameworks import profile
from planner.plan.config import ParallelConfig, resolve
from planner.plan.inputs import check_inputs, model_hashes
from planner.plan.schema import Plan
from planner.report.explain import explain_json, reasons, verdict, why_this_plan
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.plan import uniform_plan
from planner.vocabulary import GIB
from tests.test_cli_width import planner

GPT3 = "instances/models/gpt3-175b.json"
A100 = "instances/clusters/dgx-a100-80gb.json"
# The quick start's GPT-3 plan (README.md; docs/explain.md): memory binds its faster neighbours
PLAN = ParallelConfig(tp=4, pp=8, vpp=6, sp=True, zero=1, overlap_grad_reduce=True,
                      overlap_param_gather=True, global_batch=1536, seq_len=2048)  # fmt: skip
MARGIN_GIB = 4.0


@pytest.fixture(scope="module")
def gpt3() -> ModelSpec:
    return load_model(GPT3)


@pytest.fixture(scope="module")
def a100() -> ClusterSpec:
    return load_cluster(A100)


@pytest.fixture(scope="module")
def plan(gpt3: ModelSpec, a100: ClusterSpec):  # type: ignore[no-untyped-def]
    return uniform_plan(gpt3, a100, PLAN, memory_margin_gib=MARGIN_GIB)


@pytest.fixture(scope="module")
def explained(plan, gpt3: ModelSpec, a100: ClusterSpec) -> Explanation:  # type: ignore[no-untyped-def]
    return explain(plan, gpt3, a100, why_not={"tp": 8, "pp": 16})


def _usable_gib(cluster: ClusterSpec) -> float:
    d = cluster.device
    return (d.memory_bytes - cost.memory_margin_bytes(d.memory_gib, MARGIN_GIB)) / GIB


def test_every_sensitivity_is_estimate_of_the_configuration_it_names(
    explained: Explanation, gpt3: ModelSpec, a100: ClusterSpec
) -> None:
    """Step, peak, fit and the framework's verdict of each one-notch change are those of
    ``estimate`` and Megatron-LM's profile on that configuration; one that does not divide
    carries estimate's own message."""
    base = estimate(gpt3, a100, PLAN, memory_margin_gib=MARGIN_GIB)
    assert explained.sensitivities
    for n in explained.sensitivities:
        if n.refusal is not None:
            with pytest.raises(ConfigError) as exc:
                estimate(gpt3, a100, n.config)
            assert str(exc.value) == n.refusal
            continue
        direct = estimate(gpt3, a100, n.config, memory_margin_gib=MARGIN_GIB)
        assert n.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12), n.change
        assert n.delta_s == pytest.approx(direct.step_time_s - base.step_time_s, abs=1e-9)
        assert n.peak_memory_gib == pytest.approx(direct.peak_memory_gib, rel=1e-12)
        assert n.fits == direct.fits, n.change
        assert n.over_gib == pytest.approx(direct.peak_memory_gib - _usable_gib(a100))
        refusals = profile("megatron").refusals(resolve(gpt3, a100, n.config), gpt3)
        assert n.framework_refusals == refusals, n.change


def test_a_notch_keeps_the_devices_and_moves_one_knob(
    explained: Explanation, gpt3: ModelSpec, a100: ClusterSpec
) -> None:
    """tp 4 -> 2 doubles dp (the devices kept); every change moves its own knob alone, but
    ZeRO-0, which also stops overlapping a parameter gather it no longer has, and the
    gradients' overlap off, which Megatron-LM launches only with the gathers' off too
    (``param_gather_without_grad_overlap``)."""
    by_change = {n.change: n for n in explained.sensitivities}
    assert "tp 4 -> 2 (dp 32 -> 64)" in by_change
    assert "tp 4 -> 8 (dp 32 -> 16)" in by_change
    assert "mbs 1 -> 2 (24 microbatches)" in by_change
    assert "zero 1 -> 0 (overlap-param-gather off)" in by_change
    plan = PLAN.model_copy(update={"stack": "megatron-te"})  # the default, filled in
    for n in explained.sensitivities:
        moved = {k.name for k in KNOBS if getattr(n.config, k.name) != getattr(plan, k.name)}
        coupled = {"overlap_param_gather"} if (n.knob, n.config.zero) == ("zero", 0) or (
            n.knob, n.config.overlap_grad_reduce) == ("overlap_grad_reduce", False) else set()
        assert moved == {n.knob} | coupled, n.change
        if n.refusal is None:
            r = resolve(gpt3, a100, n.config)
            assert r.dp * n.config.tp * n.config.pp * n.config.cp == a100.num_devices


def test_memory_binds_the_faster_notches(explained: Explanation) -> None:
    """The plan's faster neighbours (tp 4 -> 2, mbs 1 -> 2) do not fit: memory is what binds;
    ZeRO-2 with a pipeline is Megatron-FSDP's refusal."""
    by_change = {n.change: n for n in explained.sensitivities}
    for change in ("tp 4 -> 2 (dp 32 -> 64)", "mbs 1 -> 2 (24 microbatches)"):
        n = by_change[change]
        assert n.delta_s is not None and n.delta_s < 0
        assert not n.fits and n.over_gib is not None and n.over_gib > 0
    zero2 = by_change["zero 1 -> 2"]
    assert zero2.fits and not zero2.feasible
    assert any("pipeline" in r for r in zero2.framework_refusals)


def test_binding_memory_is_the_most_loaded_stage(plan, explained: Explanation) -> None:  # type: ignore[no-untyped-def]
    """The stage with the highest peak; free = capacity - margin - peak; parts add up."""
    m = explained.memory
    peaks = [s.memory.total_gib for s in plan.stages]
    assert m.stage == peaks.index(max(peaks))
    assert m.peak_gib == pytest.approx(plan.predicted.peak_memory_gib)
    assert m.free_gib == pytest.approx(80 - MARGIN_GIB - m.peak_gib)
    assert sum(p.value for p in m.parts) == pytest.approx(m.peak_gib)
    assert [p.value for p in m.parts] == sorted((p.value for p in m.parts), reverse=True)
    step = explained.step
    assert sum(p.value for p in step) == pytest.approx(explained.step_time_s)
    assert step[0].name == "compute_s"


def test_a_plan_at_its_memory_edge_is_bound_by_memory(gpt3: ModelSpec, a100: ClusterSpec) -> None:
    """A margin that leaves 0.5 GiB free: the binding stage's free memory is that 0.5 GiB, and
    the next larger microbatch is over by its extra memory less those 0.5 GiB."""
    peak = estimate(gpt3, a100, PLAN).peak_memory_gib
    margin = 80 - peak - 0.5
    plan = uniform_plan(gpt3, a100, PLAN, memory_margin_gib=margin)
    assert memory_binding(plan).free_gib == pytest.approx(0.5)
    e = explain(plan, gpt3, a100)
    mbs2 = next(n for n in e.sensitivities if n.knob == "mbs" and n.direction == "up")
    bigger = estimate(gpt3, a100, PLAN.model_copy(update={"mbs": 2})).peak_memory_gib
    assert mbs2.over_gib == pytest.approx(bigger - peak - 0.5)


def test_why_not_the_plan_itself_differs_by_nothing(plan, gpt3, a100) -> None:  # type: ignore[no-untyped-def]
    e = explain(plan, gpt3, a100, why_not={"tp": 4})
    assert e.why_not is not None
    assert e.why_not.delta_s == 0.0
    assert e.why_not.step_time_s == plan.predicted.step_time_s


def test_why_not_is_estimate_of_the_plan_with_the_changes(
    explained: Explanation, gpt3: ModelSpec, a100: ClusterSpec
) -> None:
    """tp=8,pp=16: the rest from the plan, dp left to take the devices; priced by estimate."""
    n = explained.why_not
    assert n is not None
    config = PLAN.model_copy(update={"tp": 8, "pp": 16, "dp": None})
    direct = estimate(gpt3, a100, config, memory_margin_gib=MARGIN_GIB)
    assert n.step_time_s == direct.step_time_s
    assert n.delta_s == pytest.approx(direct.step_time_s - explained.step_time_s)
    assert n.fits == direct.fits


def test_why_not_that_does_not_divide_is_estimates_message(plan, gpt3, a100) -> None:  # type: ignore[no-untyped-def]
    config = PLAN.model_copy(update={"tp": 7, "dp": None})
    with pytest.raises(ConfigError) as direct:
        estimate(gpt3, a100, config)
    with pytest.raises(ConfigError) as mine:
        explain(plan, gpt3, a100, why_not={"tp": 7})
    assert str(mine.value) == str(direct.value)


@pytest.mark.parametrize(("text", "message"), [
    ("tp", "'tp' is not knob=value"),
    ("tp=x", "tp=x: not an integer"),
    ("foo=1", "no knob 'foo'"),
    ("seq-len=4096", "seq-len is the training run"),
    ("sp=maybe", "a switch takes on or off"),
    ("cross-entropy-loss-fusion=2", "a switch takes on or off"),
    ("stack=megatron-te-fused", "stack=megatron-te-fused: input should be"),
    ("recompute=some", "recompute=some: input should be"),
    ("tp=2,tp=4", "tp is given twice"),
    (" , ", "no knob=value given"),
])  # fmt: skip
def test_why_not_that_does_not_parse(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_changes(text)


def test_why_not_reads_what_the_notches_say(gpt3: ModelSpec) -> None:
    """A notch's own words read back: ``cross-entropy-loss-fusion=on`` is the stack's fused
    loss in the configuration's precision of the linears (and ``off`` the eager one), refused
    off Megatron's stacks, as ``compile=on`` is off torchtitan's and Hugging Face's; a stack,
    recomputed modules or layers given alone read as their types and imply their
    recomputation."""
    fp8 = ParallelConfig(stack="megatron-te-fp8")
    fused = with_changes(fp8, parse_changes("cross-entropy-loss-fusion=on"), gpt3)
    assert fused.stack == "megatron-te-fp8-fused-loss"
    assert with_changes(fused, {"cross_entropy_loss_fusion": False}, gpt3).stack == fp8.stack
    assert with_changes(ParallelConfig(), {"cross_entropy_loss_fusion": True}, gpt3).stack == (
        "megatron-te-fused-loss")  # Megatron's default stack where none is given
    assert parse_changes("stack=megatron-te-fused-loss") == {"stack": "megatron-te-fused-loss"}
    assert with_changes(ParallelConfig(), parse_changes("recompute-modules=core_attn"),
                        gpt3).recompute == "selective"  # fmt: skip
    assert with_changes(ParallelConfig(), parse_changes("recompute-layers=4"),
                        gpt3).recompute == "full"  # fmt: skip
    deepspeed = ParallelConfig(stack="megatron-deepspeed")
    with pytest.raises(InputError, match=r"turns megatron-te, megatron-te-fp8 \(or their "
                       r"switched stacks\) only; the configuration runs megatron-deepspeed"):
        with_changes(deepspeed, {"cross_entropy_loss_fusion": True}, gpt3)
    # torchtitan's [compile] enable, the same way: its blocks compiled, or eager again
    titan = ParallelConfig(stack="torchtitan-eager")
    compiled = with_changes(titan, parse_changes("compile=on"), gpt3)
    assert compiled.stack == "torchtitan-compiled"
    assert with_changes(compiled, parse_changes("compile=off"), gpt3).stack == "torchtitan-eager"
    with pytest.raises(InputError, match="compile: turns hf-eager, torchtitan-eager"):
        with_changes(fp8, {"compile": True}, gpt3)


def test_pp_changes_take_megatrons_uneven_split(gpt3: ModelSpec) -> None:
    """126 layers on 16 stages: 7 + 8 x 14 + 7 (Llama 3.1 405B's split); 96 on 16: equal."""
    llama = gpt3.model_copy(update={"num_layers": 126})
    changed = with_changes(ParallelConfig(pp=8, dp=4), {"pp": 16}, llama)
    assert (changed.first_stage_layers, changed.last_stage_layers, changed.dp) == (7, 7, None)
    assert with_changes(ParallelConfig(pp=8), {"pp": 16}, gpt3).first_stage_layers is None


def test_notches_are_the_neighbouring_values() -> None:
    """Degrees step to the next divisor each way, mbs by factors of two, ladders one rung;
    knobs that mean nothing are left out (ep without experts, cp_algo without cp)."""
    model = load_model(GPT3)
    found = {k.name: ([c.model_dump()[k.name] for c in down], [c.model_dump()[k.name] for c in up])
             for k, down, up in notches(PLAN, model, 1024)}  # fmt: skip
    assert found["tp"] == ([2, 1], [8, 16, 32])
    assert found["mbs"] == ([], [2, 4, 8])
    assert found["recompute"] == ([], ["selective"])
    assert found["zero"] == ([0], [2])
    assert found["vpp"] == ([4, 3, 2, 1], [12])
    assert "ep" not in found and "cp_algo" not in found


def test_hardware_what_ifs_are_estimate_on_the_changed_cluster(
    explained: Explanation, gpt3: ModelSpec, a100: ClusterSpec
) -> None:
    """Each what-if is estimate on its changed cluster; twice the memory does not move the
    step, and makes tp 4 -> 2 (36 GiB over on 80 GiB) feasible and the best change there."""
    changes = hardware_changes(a100)
    assert [w.change for w in explained.hardware] == [c for c, _ in changes]
    for w, (_, cluster) in zip(explained.hardware, changes, strict=True):
        direct = estimate(gpt3, cluster, PLAN, memory_margin_gib=MARGIN_GIB)
        assert w.priced.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12)
    hbm = explained.hardware[1]
    assert hbm.priced.step_time_s == pytest.approx(explained.step_time_s, rel=1e-12)
    assert hbm.best is not None and hbm.best.change == "tp 4 -> 2 (dp 32 -> 64)"
    faster_net = explained.hardware[0]
    assert faster_net.priced.delta_s is not None and faster_net.priced.delta_s < 0
    assert a100.network[1].bandwidth_gb_s == 25  # the spec itself is untouched


def test_a_wider_scale_up_domain_keeps_the_spec_rules() -> None:
    """NVL72 doubled: the outer level grows to hold whole 144-GPU domains; a cluster of one
    domain has none wider."""
    nvl72 = load_cluster("instances/clusters/gb200-nvl72.json")
    found = wider_scale_up(nvl72)
    assert found is not None
    text, wider = found
    assert text == "nvlink5 domain 72 -> 144 devices"
    assert wider.network[0].domain_devices == 144
    assert wider.network[1].domain_devices % 144 == 0
    one_node = load_cluster(A100, 1)
    assert wider_scale_up(one_node) is None


def test_the_json_round_trips(explained: Explanation) -> None:
    data = json.loads(json.dumps(explain_json(explained)))
    assert Explanation.model_validate(data) == explained


def test_without_model_and_cluster_only_the_plan_is_explained(plan) -> None:  # type: ignore[no-untyped-def]
    e = explain(plan)
    assert not e.sensitivities and not e.hardware and e.limits
    with pytest.raises(InputError, match="--why-not prices a configuration"):
        explain(plan, why_not={"tp": 8})


def test_inputs_that_are_not_the_plans_are_refused(plan, gpt3, a100) -> None:  # type: ignore[no-untyped-def]
    other = gpt3.model_copy(update={"num_layers": 48})
    with pytest.raises(InputError, match="is not the model the plan was made for"):
        check_inputs(plan, other, a100)
    with pytest.raises(InputError, match="is not the cluster the plan was made for"):
        explain(plan, gpt3, load_cluster("instances/clusters/dgx-h100-80gb.json"))


def test_plans_made_before_the_rope_norm_and_router_fields_still_name_their_model(
        plan, gpt3, a100) -> None:  # type: ignore[no-untyped-def]
    """A plan saved before ModelSpec had RoPE, norm and router fields hashed its model without
    them: the hashes printed by that version for two bundled files are still accepted, and a
    plan naming the model by either hash is checked as before."""
    older = {"gpt-1.7b": "f213cef977f36603c3209c28496ff553f7e4ba9728e1e789e213eb9d3b77607e",
             "llama3-8b": "740823a2bf388e49a767f508770b6ed0ef8751c1a429220dec6de2681f33a4e8"}
    for stem, sha in older.items():
        assert sha in model_hashes(load_model(f"instances/models/{stem}.json")), stem
    for sha in model_hashes(gpt3):
        named = plan.model_copy(update={"model": plan.model.model_copy(update={"sha256": sha})})
        check_inputs(named, gpt3, a100)


def test_a_per_operator_plan_keeps_its_own_numbers(plan, gpt3, a100) -> None:  # type: ignore[no-untyped-def]
    """No configuration to turn: memory and step from the plan; a why-not from estimate's
    defaults on the plan's training run."""
    any_plan = plan.model_copy(update={"configuration": None, "framework": "any"})
    e = explain(any_plan, gpt3, a100, why_not={"tp": 8, "pp": 16})
    assert not e.sensitivities and not e.hardware
    assert "per-operator" in e.limits[0]
    assert e.memory == explain(plan).memory
    assert e.why_not is not None
    defaults = ParallelConfig(tp=8, pp=16, global_batch=1536, seq_len=2048, precision="bf16")
    assert e.why_not.config == defaults
    assert e.why_not.step_time_s == estimate(gpt3, a100, defaults).step_time_s


def test_the_command_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The plan alone explains its memory and step; --model without --cluster and a --why-not
    that does not parse are one-line errors."""
    plan_file = tmp_path / "plan.json"
    done = planner(200, "estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--out", plan_file)
    assert done.code == 0, done.stderr
    alone = planner(80, "explain", plan_file)
    assert alone.code == 0, alone.stderr
    assert "memory: stage" in alone.stdout and "give its model and cluster" in alone.stdout
    half = planner(80, "explain", plan_file, "--model", GPT3)
    assert half.code == 2 and "give both --model and --cluster" in half.stderr
    bad = planner(80, "explain", plan_file, "--model", GPT3, "--cluster", A100, "--why-not",
                  "tp=8,pp")  # fmt: skip
    assert bad.code == 2 and "'pp' is not knob=value" in bad.stderr
    wrong = planner(80, "explain", plan_file, "--model", GPT3, "--cluster", A100, "--why-not",
                    "tp=7")  # fmt: skip
    assert wrong.code == 2 and "tp(7) x pp(16) x cp(1) = 112 does not divide" in wrong.stderr
    as_json = planner(80, "explain", plan_file, "--model", GPT3, "--cluster", A100, "--json")
    assert Explanation.model_validate(json.loads(as_json.stdout)).sensitivities


def test_why_this_plan_lists_every_faster_notch_with_what_rules_it_out(
    plan, explained: Explanation  # type: ignore[no-untyped-def]
) -> None:
    """One line per faster change, fastest first: memory (its GiB over), solve's untouched
    switch, and a feasible change whose step lies inside the plan's band (+/- 4 %: the fused
    loss's 0.012 s, not the TP overlap's 1.011 s) said to be so; the table's verdict is
    ``over`` exactly where a change does not fit."""
    faster = sorted((n for n in explained.sensitivities if (n.delta_s or 0) < 0),
                    key=lambda n: n.delta_s or 0)  # fmt: skip
    lines = why_this_plan(explained, plan)
    assert lines[0] == f"why this plan: {len(faster)} one-notch changes would make the step faster:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [n.change for n in faster]
    assert lines[1:] == [
        "  tp 4 -> 2 (dp 32 -> 64): 1.138 s faster, does not fit (43.9 GiB over)",
        "  tp-comm-overlap off -> on: 1.011 s faster, feasible; solve turns this knob only with "
        "--tp-comm-overlap",
        "  mbs 1 -> 2 (24 microbatches): 0.493 s faster, does not fit (10.3 GiB over)",
        "  cross-entropy-loss-fusion off -> on: 0.012 s faster (inside the plan's band, "
        "+/- 4 %), feasible; solve keeps the stack it is given (--stack megatron-te-fused-loss)",
    ]
    for n in explained.sensitivities:
        assert verdict(n, plan).startswith("over") == (n.refusal is None and not n.fits)


def _llama_fsdp_plan(framework: str, stack: str) -> tuple[ModelSpec, ClusterSpec, Plan]:
    """Llama 3 8B on one DGX H100 under ZeRO-3 with every layer recomputed, as ``framework``
    launches it on ``stack``."""
    model = load_model("instances/models/llama3-8b.json")
    cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", 1)
    config = ParallelConfig(dp=8, zero=3, overlap_grad_reduce=True, overlap_param_gather=True,
                            recompute="full", stack=stack, global_batch=64, seq_len=8192)
    return model, cluster, uniform_plan(model, cluster, config, framework=framework)


@pytest.mark.parametrize(("framework", "stack", "attends"), [
    ("torchtitan", "torchtitan-eager", "allgather"), ("megatron", "megatron-te", "ring")])
def test_the_notch_into_context_parallelism_attends_as_the_framework_does(
    framework: str, stack: str, attends: str
) -> None:
    """torchtitan all-gathers K/V (PyTorch's context parallelism): its plan's ``cp 1 -> 2`` and
    ``--why-not cp=2`` are priced that way and launchable, not as ParallelConfig's default
    ring, which torchtitan refuses; ``cp_algo`` given is kept (and refused); Megatron's stay
    the ring."""
    model, cluster, plan = _llama_fsdp_plan(framework, stack)
    why = explain(plan, model, cluster, why_not={"cp": 2})
    up = next(n for n in why.sensitivities if n.knob == "cp" and n.direction == "up")
    for n in (up, why.why_not):
        assert n is not None and n.config.cp == 2 and n.config.cp_algo == attends
        assert n.framework_refusals == ()
        assert n.step_time_s == pytest.approx(estimate(model, cluster, n.config).step_time_s)
    assert up.change == ("cp 1 -> 2 (cp-algo allgather, dp 8 -> 4)" if attends == "allgather"
                         else "cp 1 -> 2 (dp 8 -> 4)")  # fmt: skip
    ring = explain(plan, model, cluster, why_not={"cp": 2, "cp_algo": "ring"}).why_not
    assert ring is not None and ring.config.cp_algo == "ring"
    assert bool(ring.framework_refusals) == (framework == "torchtitan")


@pytest.mark.parametrize(("framework", "stack", "modules"), [
    ("torchtitan", "torchtitan-eager", "op"), ("megatron", "megatron-te", None)])
def test_a_notch_to_selective_recomputation_reruns_what_the_framework_reruns(
    framework: str, stack: str, modules: str | None
) -> None:  # fmt: skip
    """torchtitan's selective recomputation is its per-operator policy: its plan's ``recompute
    full -> selective`` and ``--why-not recompute=selective`` price ``op`` and are launchable
    (they priced the attention core's, which torchtitan refuses); Megatron's keep its
    default modules."""
    model, cluster, plan = _llama_fsdp_plan(framework, stack)
    why = explain(plan, model, cluster, why_not={"recompute": "selective"})
    down = next(n for n in why.sensitivities if n.knob == "recompute"
                and n.config.recompute == "selective")  # fmt: skip
    for n in (down, why.why_not):
        assert n is not None and n.config.recompute_modules == modules
        assert n.framework_refusals == ()


def test_a_notch_sets_the_overlaps_as_the_framework_launches_them() -> None:
    """DeepSpeed gathers ZeRO-1's and ZeRO-2's updated weights inside its optimizer step, so
    a ZeRO-3 plan's ``zero 3 -> 2`` and ``--why-not zero=1`` turn ``overlap_param_gather`` off
    as DeepSpeed's search would, and are priced as launched (they read "refused" while the
    plan's flag stayed on beside them); flags the user gives are kept, and refused."""
    model = load_model("instances/models/llama3-8b.json")
    cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", 2)
    config = ParallelConfig(tp=2, mbs=2, zero=3, overlap_grad_reduce=True,
                            overlap_param_gather=True, stack="megatron-deepspeed",
                            global_batch=128, seq_len=8192)  # fmt: skip
    plan = uniform_plan(model, cluster, config, framework="deepspeed")
    why = explain(plan, model, cluster, why_not={"zero": 1})
    down = next(n for n in why.sensitivities if n.knob == "zero" and n.direction == "down")
    assert down.change == "zero 3 -> 2 (overlap-param-gather off)"
    for n in (down, why.why_not):
        assert n is not None and not n.config.overlap_param_gather
        assert n.framework_refusals == ()
        assert n.step_time_s == pytest.approx(estimate(model, cluster, n.config).step_time_s)
    kept = explain(plan, model, cluster, why_not={"zero": 1, "overlap_param_gather": True})
    assert kept.why_not is not None and kept.why_not.config.overlap_param_gather
    assert any("overlap_param_gather" in r for r in kept.why_not.framework_refusals)


def test_a_notch_into_tensor_parallelism_runs_sequence_parallel_as_the_search_would() -> None:
    """Megatron-Core trains MoE layers with TP only under SP: a TP1 plan's ``tp 1 -> 2`` and
    ``--why-not tp=2`` turn SP on, as the search sets it (they read "refused" with the plan's
    SP off beside them); ``sp`` given stays as given, and is refused."""
    model = load_model("instances/models/mixtral-8x7b.json")
    cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", 2)
    config = ParallelConfig(ep=8, zero=1, overlap_grad_reduce=True, overlap_param_gather=True,
                            recompute="full", global_batch=64, seq_len=4096)  # fmt: skip
    plan = uniform_plan(model, cluster, config, framework="megatron")
    why = explain(plan, model, cluster, why_not={"tp": 2})
    up = next(n for n in why.sensitivities if n.knob == "tp" and n.direction == "up")
    assert up.change == "tp 1 -> 2 (sp on, dp 16 -> 8)"
    for n in (up, why.why_not):
        assert n is not None and n.config.sp and n.framework_refusals == ()
    kept = explain(plan, model, cluster, why_not={"tp": 2, "sp": False}).why_not
    assert kept is not None and not kept.config.sp
    assert any("sequence parallelism" in r for r in kept.framework_refusals)


def test_a_change_no_switch_launches_gives_the_changes_own_reasons() -> None:
    """torchtitan runs ZeRO-3 under no pipeline: ``--why-not tp=2,pp=2`` on its TP1 ZeRO-3
    plan is refused for that alone, its SP set as torchtitan runs it (always with TP), not
    also for TP without SP."""
    model = load_model("instances/models/llama3-8b.json")
    cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", 2)
    config = ParallelConfig(zero=3, overlap_grad_reduce=True, overlap_param_gather=True,
                            stack="torchtitan-eager", global_batch=128, seq_len=8192)
    plan = uniform_plan(model, cluster, config, framework="torchtitan")
    mine = explain(plan, model, cluster, why_not={"tp": 2, "pp": 2}).why_not
    assert mine is not None and mine.config.sp
    assert len(mine.framework_refusals) == 1
    assert mine.framework_refusals[0].startswith("ZeRO-3 with pp(2)")


def test_a_cluster_of_another_size_is_read_at_the_plans() -> None:
    """The library's ``explain`` and ``launch`` given the plan's cluster at another node count
    (the inputs' check ignores it, as the commands read a plan's file at its size): they price
    the plan on its own devices, as ``planner explain`` does, where explain raised a TypeError
    (its configuration did not divide the other count) and launch a misleading ConfigError."""
    from planner.frameworks import launch

    model = load_model("instances/models/gpt3-175b.json")
    cluster = load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=128)
    plan = uniform_plan(model, cluster, ParallelConfig(tp=8, pp=16, mbs=1))
    other = load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=64)
    assert explain(plan, model, other) == explain(plan, model, cluster)
    assert (launch(plan, "megatron", model=model, cluster=other).text
            == launch(plan, "megatron", model=model, cluster=cluster).text)


def test_a_new_pipeline_takes_the_split_that_cuts_into_its_chunks() -> None:
    """``--why-not pp=8,vpp=4`` on DeepSeek-V3 (61 layers, one multi-token-prediction module):
    the first uneven split, 6 + 8 x 6 + 7, does not cut into four chunks a stage and was
    refused; the recipe's 7 + 8 x 6 + 6 (``Et|(tt|)*30mL``) does and is taken."""
    from planner.diagnose.notches import with_changes

    model = load_model("instances/models/deepseek-v3.json")
    changed = with_changes(ParallelConfig(tp=4, pp=4, vpp=4, ep=64), {"pp": 8, "tp": 2}, model)
    assert (changed.first_stage_layers, changed.last_stage_layers) == (7, 6)
    plain = with_changes(ParallelConfig(), {"pp": 8}, model)  # no chunks: the first split
    assert (plain.first_stage_layers, plain.last_stage_layers) == (6, 7)


def test_a_refused_faster_notch_names_the_rule() -> None:
    """Mixtral with the experts' all-to-alls overlapped: turning on TP's overlap would be
    faster, and Megatron-LM launches it, but not beside the all-to-alls' overlap; the line
    names that (it said only "Megatron-LM does not launch it")."""
    model = load_model("instances/models/mixtral-8x7b.json")
    cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", 4)
    config = ParallelConfig(tp=2, sp=True, pp=2, vpp=4, ep=8, mbs=1, recompute="selective",
                            overlap_moe_expert_parallel_comm=True, zero=1,
                            overlap_grad_reduce=True, overlap_param_gather=True)  # fmt: skip
    plan = uniform_plan(model, cluster, config)
    (line,) = [x for x in why_this_plan(explain(plan, model, cluster), plan)
               if x.startswith("  tp-comm-overlap off -> on")]
    assert line.endswith("Megatron-LM does not launch it (overlap_moe_expert_parallel_comm "
                         "with tp_comm_overlap)")


def test_a_wider_domain_says_its_reserve_grew() -> None:
    """DeepSeek-V3's plan on 16-GPU NVLink domains: more of its experts' all-to-all peers
    share a domain, each with NCCL's buffers, and it no longer fits; the what-if row said
    only "over". It now says the reserve grew, and by how much."""
    model = load_model("instances/models/deepseek-v3.json")
    cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", 64)
    config = ParallelConfig(tp=4, pp=4, vpp=4, ep=128, etp=1, sp=True, mbs=1,
                            first_stage_layers=15, last_stage_layers=14, recompute="selective",
                            recompute_modules="moe_act,layernorm,mla_up_proj", zero=1,
                            overlap_grad_reduce=True, overlap_param_gather=True,
                            overlap_moe_expert_parallel_comm=True, global_batch=2048)
    plan = uniform_plan(model, cluster, config)
    explained = explain(plan, model, cluster)
    (wider,) = [w.priced for w in explained.hardware if w.change.startswith("nvlink domain")]
    grown = [r for r in reasons(wider, plan) if r.startswith("its reserve")]
    busiest = max(plan.stages, key=lambda s: s.memory.total_gib).memory
    assert wider.memory is not None
    assert grown == [f"its reserve (CUDA, NCCL's buffers, the allocator's cache) grows "
                     f"{wider.memory.other_gib - busiest.other_gib:.1f} GiB: NCCL holds "
                     f"buffers for each all-to-all peer inside a scale-up domain"]
    # EP128 over 8-GPU domains: 7 peers inside; over 16-GPU ones, 15: 8 more of NCCL's buffers
    peers = 8 * NCCL_ALL_TO_ALL_PEER_BYTES / GIB
    assert wider.memory.other_gib - busiest.other_gib == pytest.approx(peers, abs=0.2)


def test_a_refused_row_says_how_it_was_priced(
    plan, explained: Explanation  # type: ignore[no-untyped-def]
) -> None:
    """GPT-3's ``zero 1 -> 2`` is refused and priced with the plan's overlaps, where
    ``estimate --framework`` of the same knobs leaves them off and differs: a note under the
    table says so (the two commands disagreed without a word)."""
    from planner.report.explain import explain_tables
    from tests.test_stage_tables import _text

    assert any(n.framework_refusals for n in explained.sensitivities)
    text = " ".join(_text(explain_tables(explained, plan), 100).split())
    assert ("note: a refused change is priced with the plan's other settings, its overlap "
            "flags included") in text
