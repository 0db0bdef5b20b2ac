"""``planner explain`` on the plans ``planner solve`` returns: every notch of every knob is a
configuration (a knob that depends on the one turned moves with it, and the change says so),
and explain answers for each solved plan of the bundled instances and the Hugging Face configs
(issue 25: a plan that recomputed some layers crashed the sensitivity step, which turned
``recompute`` and kept ``recompute_layers``)."""

from __future__ import annotations

import itertools

import pytest

from planner import estimate
from planner.diagnose.explain import explain
from planner.diagnose.notches import KNOBS, notches, said, with_changes
from planner.errors import InputError
from planner.frameworks import profile
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig, resolve
from planner.search.targets import solve
from planner.spec.reading import load_cluster, load_model
from planner.uniform.plan import uniform_plan

H100 = "instances/clusters/dgx-h100-80gb.json"
HF = "../shared/reference/hf"
LLAMA70B = f"{HF}/Meta-Llama-3.1-70B.config.json"

# Configurations with every knob that another depends on set away from its default: a count
# of recomputed layers, ZeRO with overlapped gathers, uneven stages with interleaving, ring CP.
BASES = (
    ParallelConfig(tp=1, cp=2, recompute="full", recompute_layers=20, zero=3,
                   overlap_grad_reduce=True, overlap_param_gather=True),
    ParallelConfig(tp=8, pp=4, vpp=5, sp=True, recompute="full", recompute_layers=3, zero=1,
                   overlap_param_gather=True, tp_comm_overlap=True),
    ParallelConfig(tp=4, pp=3, first_stage_layers=26, last_stage_layers=26, recompute="selective",
                   cp=2, cp_algo="ulysses"),
    ParallelConfig(pp=8, vpp=2, schedule="zb-v", offload="optimizer", zero=1),
)  # fmt: skip


def test_every_value_of_every_knob_is_a_configuration() -> None:
    """Brute force: each knob set to each value its ladder offers (not only the notches) from
    each base gives a configuration with that value; a count of recomputed layers stays only
    with full recomputation, and a count given brings full recomputation with it."""
    model = load_model(LLAMA70B)  # 80 layers
    for base, knob in itertools.product(BASES, KNOBS):
        for value in knob.values(base, model, 256):
            changed = with_changes(base, {knob.name: value}, model)
            assert getattr(changed, knob.name) == value, (base, knob.name, value)
            if changed.recompute_layers is not None:
                assert changed.recompute == "full"
            if knob.name == "recompute" and value != "full":
                assert changed.recompute_layers is None
            if knob.name == "recompute_layers" and value is not None:
                assert changed.recompute == "full"


def test_changes_given_together_that_disagree_are_one_line() -> None:
    """Turned together by the user, a count of recomputed layers and selective recomputation
    contradict each other: an InputError naming both, not pydantic's report."""
    model = load_model(LLAMA70B)
    with pytest.raises(InputError, match=r"^recompute=selective, recompute-layers=4: "
                       r"recompute_layers\(4\) needs recompute 'full', not 'selective'$"):
        with_changes(BASES[0], {"recompute": "selective", "recompute_layers": 4}, model)


def test_a_partial_recompute_plan_explains_its_recompute_notch() -> None:
    """The issue's plan (Llama 3.1 70B, 256 H100, 8K tokens): TP1 CP2 ZeRO-3 recomputing 20
    of 80 layers. Turning recompute to selective drops the count, says so, and is estimate's
    price of exactly that; ``--why-not recompute=none`` likewise."""
    model = load_model(LLAMA70B)
    cluster = load_cluster(H100, 32)
    config = BASES[0].model_copy(update={"global_batch": 512, "seq_len": 8192})
    plan = uniform_plan(model, cluster, config, memory_margin_gib=4.0)
    assert plan.configuration is not None
    config = plan.configuration
    e = explain(plan, model, cluster, why_not={"recompute": "none"})
    down = next(n for n in e.sensitivities if n.knob == "recompute" and n.direction == "down")
    assert down.change == "recompute full -> selective (recompute-layers 20 dropped)"
    expected = config.model_copy(update={"recompute": "selective", "recompute_layers": None})
    assert down.config == expected
    assert down.step_time_s == estimate(model, cluster, expected).step_time_s
    none = config.model_copy(update={"recompute": "none", "recompute_layers": None})
    assert e.why_not is not None and e.why_not.config == none
    assert e.why_not.step_time_s == estimate(model, cluster, none).step_time_s
    # full named without a count is every layer's: the plan's 20 were kept, unsaid
    full = explain(plan, model, cluster, why_not={"recompute": "full"}).why_not
    assert full is not None and full.config.recompute_layers is None


def test_a_refused_why_not_is_refused_for_its_own_reasons() -> None:
    """DeepSpeed's ZeRO-3 plan (its overlaps on) asked why not PP2, ZeRO-1 and selective
    recomputation: refused for selective recomputation under flash attention and for Ulysses
    beside the pipeline, not also three times for the plan's overlaps, which DeepSpeed's
    pipeline and ZeRO-1 do not run and which the user never set."""
    model = load_model("instances/models/llama3-8b.json")
    cluster = load_cluster(H100, 1)
    plan = solve(model, cluster, SolveOptions(framework="deepspeed"))
    assert plan.configuration is not None and plan.configuration.zero == 3
    n = explain(plan, model, cluster,
                why_not={"pp": 2, "zero": 1, "recompute": "selective"}).why_not
    assert n is not None and len(n.framework_refusals) == 2
    assert not any("overlap" in reason for reason in n.framework_refusals)
    assert n.config.overlap_grad_reduce is False and n.config.overlap_param_gather is False


# Instances whose default solve (Megatron-LM, H100) takes a few seconds each, and mostly
# returns a plan recomputing some layers (marked *): the bundled models on 4 or 32 nodes at
# their own training run, the Hugging Face configs at 8K tokens and 4 sequences per GPU.
SOLVED = [
    ("instances/models/gpt-18.4b.json", 4, None),  # *
    ("instances/models/gpt-39.1b.json", 4, None),  # *
    ("instances/models/gpt-76.1b.json", 4, None),  # *
    ("instances/models/gpt-145.6b.json", 32, None),  # *
    ("instances/models/gpt3-175b.json", 32, None),  # *
    ("instances/models/pangu-alpha-200b.json", 32, None),  # *
    ("instances/models/gpt-1.7b.json", 4, None),
    ("instances/models/mixtral-8x7b.json", 4, None),
    (f"{HF}/Meta-Llama-3.1-8B.config.json", 32, (8192, 1024)),  # *
    (LLAMA70B, 32, (8192, 512)),  # * the command
    (f"{HF}/Qwen2.5-72B.config.json", 4, (8192, 128)),  # *
]


SWITCHES = ("sp", "overlap_grad_reduce", "overlap_param_gather")
"""The switches a framework's search sets, which a notch sets as it would where the plan's
settings are refused beside the change."""


@pytest.mark.parametrize(("path", "nodes", "run"), SOLVED,
                         ids=[f"{p.rsplit('/', 1)[-1]}@{n}" for p, n, _ in SOLVED])  # fmt: skip
def test_explain_answers_for_every_solved_plan(path: str, nodes: int,
                                               run: tuple[int, int] | None) -> None:  # fmt: skip
    """Each knob's notch either way is the plan's configuration with that knob moved (and what
    depends on it, named in the change), sequence parallelism and the overlap flags moved
    with it only where the plan's framework refuses them beside it, priced by estimate where
    it divides; ``--why-not recompute=none`` is estimate's price of the plan without
    recomputation."""
    model, cluster = load_model(path), load_cluster(H100, nodes)
    seq, batch = run or (None, None)
    plan = solve(model, cluster, SolveOptions(seq_length=seq, global_batch_size=batch))
    config = plan.configuration
    assert config is not None
    e = explain(plan, model, cluster, why_not={"recompute": "none"})
    expected = [(knob.name, way) for knob, down, up in notches(config, model, cluster.num_devices)
                for way, options in (("down", down), ("up", up)) if options]  # fmt: skip
    assert [(n.knob, n.direction) for n in e.sensitivities] == expected
    for n in e.sensitivities:
        changed = with_changes(config, {n.knob: getattr(n.config, n.knob)}, model)
        flags = {f: getattr(changed, f) for f in SWITCHES if f != n.knob}
        assert n.config.model_copy(update=flags) == changed
        if n.config != changed:  # Megatron-LM refused the plan's overlaps beside the change
            assert profile(plan.framework).refusals(resolve(model, cluster, changed), model)
        assert n.change.startswith(said(n.knob, n.config.stack))
        if config.recompute_layers is not None and n.knob == "recompute":
            assert "recompute-layers" in n.change and "dropped" in n.change
        if n.refusal is None:
            assert n.step_time_s == estimate(model, cluster, n.config).step_time_s
    none = config.model_copy(update={"recompute": "none", "recompute_layers": None})
    assert e.why_not is not None and e.why_not.config == none
    assert e.why_not.step_time_s == estimate(model, cluster, none).step_time_s
