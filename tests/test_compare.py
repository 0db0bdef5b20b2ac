"""``planner compare``: the ILP search never loses to the baselines under the same cost model
on the bundled large-scale instances, and the command's table, JSON and bar chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.diagnose.compare import METHODS, MethodResult, compare, compare_frameworks, to_json
from planner.errors import InfeasibleError, InputError
from planner.options import Pins, SolveOptions
from planner.plan.schema import Plan
from planner.spec.reading import load_cluster, load_model
from tests.cli_process import cli
from tests.conftest import CLUSTERS, MODELS
from tests.test_cli import _assert_one_line_error

DEEPSEEK_OPTIONS = SolveOptions(max_mesh_nodes=1, pins=Pins(pp=16, mbs=2))
"""DeepSeek-V3's whole search takes 100 s on two cores, nearly all of it in the layer ILPs of
its two-node stage meshes; here both searches keep to one-node meshes at the pipeline depth
and microbatch they choose unpinned (docs/benchmarks.md), 4 s; Mixtral 8x7B's case searches
two-node meshes. The whole search is checked the same way by ``benchmarks/compare_methods.py``."""
BUNDLED = [
    ("gpt3-175b", "dgx-a100-80gb", 128, SolveOptions()),
    ("gpt-1t", "dgx-a100-80gb", 384, SolveOptions()),
    ("llama3.1-405b", "dgx-h100-80gb", 2048, SolveOptions()),
    ("mixtral-8x7b", "dgx-h100-80gb", 8, SolveOptions()),
    ("deepseek-v3", "dgx-h100-80gb", 256, DEEPSEEK_OPTIONS),
]
"""The benchmark instances (docs/benchmarks.md), at their published training settings."""
LLAMA = "instances/models/llama3-8b.json"
H100 = "instances/clusters/dgx-h100-80gb.json"


@pytest.mark.parametrize(("model", "cluster", "nodes", "options"), BUNDLED,
                         ids=[b[0] for b in BUNDLED])  # fmt: skip
def test_any_is_never_slower_than_the_frameworks(
    model: str, cluster: str, nodes: int, options: SolveOptions
) -> None:
    """The per-operator search (``any``) offers every layer the uniform shardings a framework
    launches on the meshes it visits, beside its ILP frontier, so its plan is at least as fast
    as Megatron-LM's best (the exhaustive search over what Megatron launches) and Megatron
    users' rule of thumb, but for how the runtimes differ: ``any`` reduces a weight's gradients
    over all its copies at once, Megatron over tensor-parallel ranks first for the norms it
    replicates (well under 0.1 % of a step). Every plan fits its devices with the margin."""
    spec = load_model(MODELS / f"{model}.json")
    machine = load_cluster(CLUSTERS / f"{cluster}.json", nodes)
    by_target = {r.method: r for r in compare_frameworks(spec, machine, options,
                                                         ["any", "megatron"])}  # fmt: skip
    heuristic = compare(spec, machine, options, ["heuristic"])[0]
    best = by_target["any"].step_time_s
    assert best is not None
    for r in (by_target["megatron"], heuristic):
        if r.step_time_s is not None:
            assert best <= r.step_time_s * 1.001, (r.method, r.plan.summary())  # type: ignore[union-attr]
    for r in (*by_target.values(), heuristic):
        if r.plan is not None:
            capacity = r.plan.cluster.device_memory_gib - r.plan.memory_margin_gib
            assert r.plan.predicted.peak_memory_gib <= capacity


def test_unknown_method_and_all_infeasible_are_errors() -> None:
    """A method not in METHODS is an input error naming the choices; when no method finds a
    plan, the error gives each method's reason."""
    model = load_model(MODELS / "gpt3-175b.json")
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 1)
    with pytest.raises(InputError, match="choose from ilp, heuristic, grid"):
        compare(model, cluster, SolveOptions(), ["ilp", "milp"])
    with pytest.raises(InfeasibleError, match=r"heuristic: .*; grid: "):
        compare(model, cluster, SolveOptions(), ["heuristic", "grid"])
    assert list(METHODS) == ["ilp", "heuristic", "grid"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, object]], Path]:
    """``planner compare --json --plot`` on Llama 3 8B on one DGX H100."""
    plot = tmp_path_factory.mktemp("compare") / "methods.png"
    done = cli("compare", LLAMA, H100, "--nodes", "1", "--global-batch", "64", "--json",
                "--plot", plot)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), plot


def test_json_lists_every_method_with_its_plan(
    compared: tuple[list[dict[str, object]], Path],
) -> None:
    """One object per method with the fields the issue names; ratios are to the fastest."""
    rows, _ = compared
    assert [r["method"] for r in rows] == ["ilp", "heuristic", "grid"]
    steps = [float(r["step_time_s"]) for r in rows]  # type: ignore[arg-type]
    for row, step in zip(rows, steps, strict=True):
        assert {"method", "step_time_s", "mfu", "peak_memory_gib", "solve_time_s", "plan"} <= set(
            row
        )
        plan = Plan.model_validate(row["plan"])
        assert plan.predicted.step_time_s == step
        assert row["ratio_to_best"] == pytest.approx(step / min(steps))
        assert row["summary"] == plan.summary()
    assert min(steps) == steps[0]  # the ILP


def test_plot_is_a_png(compared: tuple[list[dict[str, object]], Path]) -> None:
    """``--plot`` writes the bar chart in the format its suffix names."""
    _, plot = compared
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_and_bad_method() -> None:
    """The human table has a row per method and a ratio column; an unknown method is one
    line and exit code 2."""
    done = cli("compare", LLAMA, H100, "--nodes", "1", "--global-batch", "64",
                "--methods", "heuristic,grid")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "x best" in done.stdout
    rows = [line.split()[0] for line in done.stdout.splitlines()[4:] if line.strip()]
    assert rows[:2] == ["heuristic", "grid"]
    _assert_one_line_error(
        cli("compare", LLAMA, H100, "--nodes", "1", "--methods", "ilp,simplex"),
        "--methods: simplex: choose from ilp, heuristic, grid",
    )


def test_to_json_marks_a_method_without_plan() -> None:
    """A method that found nothing keeps its row, with its reason and no numbers."""
    model = load_model(MODELS / "llama3-8b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)
    plan = compare(model, cluster, SolveOptions(global_batch_size=64), ["heuristic"])[0].plan
    assert plan is not None
    rows = to_json([MethodResult(method="heuristic", plan=plan, solve_time_s=0.1),
                    MethodResult(method="grid", plan=None, solve_time_s=0.2, error="x")])
    assert rows[1]["step_time_s"] is None and rows[1]["error"] == "x"
    assert rows[0]["ratio_to_best"] == 1.0


def test_a_per_operator_row_that_reads_as_a_frameworks_says_why_it_differs() -> None:
    """``any``'s per-operator plan can print the very summary of a framework's uniform plan
    and price otherwise (Mixtral on 32 H100: 4.586 s against Megatron-LM's 4.590 s, both
    "TP1 x PP1 x DP32 x EP8, mbs 1, 1F1B, ZeRO-2"); a line says the difference is in its
    operators' shardings, which the summary does not show."""
    from planner.diagnose.compare import MethodResult
    from planner.plan.config import ParallelConfig
    from planner.report.tables import compare_tables
    from planner.spec.reading import load_cluster, load_model
    from planner.uniform.plan import uniform_plan
    from tests.test_stage_tables import _text

    model = load_model("instances/models/llama3-8b.json")
    cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=1)
    uniform = uniform_plan(model, cluster, ParallelConfig(tp=2, global_batch=64))
    step = uniform.predicted.step_time_s
    faster = uniform.predicted.model_copy(update={"step_time_s": 0.99 * step})
    per_op = uniform.model_copy(update={"configuration": None, "framework": "any",
                                        "predicted": faster})  # fmt: skip
    assert per_op.summary() == uniform.summary()
    rows = [MethodResult(method="any", plan=per_op, solve_time_s=1.0, label="framework"),
            MethodResult(method="megatron", plan=uniform, solve_time_s=1.0, label="framework")]
    text = " ".join(_text(compare_tables(rows), 120).split())
    assert "any and megatron read alike but differ in any's per-operator shardings" in text
    same = [rows[1], MethodResult(method="grid", plan=uniform, solve_time_s=1.0)]
    assert "read alike" not in " ".join(_text(compare_tables(same), 120).split())
