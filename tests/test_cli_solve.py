"""``planner solve`` as a user runs it: tables by default, exactly the library's plan with
``--json``, the plan on disk with ``--out``, the baselines by ``--method``, a launch
configuration with ``--export``, and one-line errors."""

from __future__ import annotations

import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

from planner import solve
from planner.options import SolveOptions
from planner.plan.files import plan_from_json
from planner.plan.schema import Plan
from planner.spec.reading import load_cluster, load_model
from tests.cli_process import cli
from tests.test_cli import A100, GPT3, REPO, _assert_one_line_error

LLAMA = "instances/models/llama3-8b.json"
H100 = "instances/clusters/dgx-h100-80gb.json"
ONE_NODE = ("--nodes", "1")


@pytest.fixture(scope="module")
def human() -> subprocess.CompletedProcess[str]:
    """The default output, with the Megatron export under it."""
    done = cli("solve", LLAMA, H100, *ONE_NODE, "--export", "megatron")
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path]:
    """``--json --out``: the printed plan and the file."""
    out = tmp_path_factory.mktemp("solve") / "plan.json"
    done = cli("solve", LLAMA, H100, *ONE_NODE, "--json", "--out", out)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress bar with --json
    return plan_from_json(done.stdout), out


def _without_time(plan: Plan) -> Plan:
    return plan.model_copy(update={"solver": plan.solver.model_copy(update={"time_s": 0.0})})


def test_human_output_has_summary_and_stage_table(
    human: subprocess.CompletedProcess[str], written: tuple[Plan, Path]
) -> None:
    """The summary line, the step time, a row per stage and the solver line."""
    plan, _ = written
    lines = human.stdout.splitlines()
    assert lines[0] == plan.summary()
    assert f"step {plan.predicted.step_time_s:.3f} s" in human.stdout
    assert "MFU" in human.stdout and "bubble" in human.stdout
    assert "TP/DP/CP/EP" in human.stdout and "recompute" in human.stdout
    first, last = plan.stages[0].layers
    assert any(line.split()[:2] == ["0", f"{first}-{last}"] for line in lines)
    assert any(line.startswith("solver: search for megatron") for line in lines)
    assert any(line.startswith("groups: ") for line in lines)
    assert "time per step (critical stage)" in human.stdout


def test_json_is_the_library_plan(written: tuple[Plan, Path]) -> None:
    """``--json`` prints ``solve(...)``'s plan for the same inputs (all but the wall time)."""
    plan, _ = written
    expected = solve(load_model(REPO / LLAMA), load_cluster(REPO / H100, 1))
    assert _without_time(plan) == _without_time(expected)


def test_out_writes_the_plan(written: tuple[Plan, Path]) -> None:
    """The file holds the printed plan, in canonical JSON."""
    plan, out = written
    text = out.read_text()
    assert plan_from_json(text) == plan
    assert text == plan.to_json()


def test_export_megatron_follows_the_tables(
    human: subprocess.CompletedProcess[str], written: tuple[Plan, Path]
) -> None:
    """The Megatron flags come after the tables and carry the plan's degrees."""
    plan, _ = written
    flags = human.stdout.split("Megatron-LM launch configuration")[1].replace("\\\n", " ").split()
    values = dict(pairwise(flags))
    assert values["--tensor-model-parallel-size"] == str(plan.stages[0].parallel.tp)
    assert values["--pipeline-model-parallel-size"] == str(len(plan.stages))


@pytest.mark.parametrize("method", ["grid", "heuristic"])
def test_baseline_methods(method: str) -> None:
    """``--method grid|heuristic`` gives a plan made by that method."""
    done = cli("solve", LLAMA, H100, *ONE_NODE, "--method", method, "--json")
    assert done.returncode == 0, done.stderr
    plan = plan_from_json(done.stdout)
    assert plan.method == method
    assert plan.predicted.peak_memory_gib <= 80


def test_infeasible_is_one_line() -> None:
    """GPT-3 175B on one node: exit 2, one line naming the model and the way out."""
    done = cli("solve", GPT3, A100, *ONE_NODE, "--global-batch", "1536", "--seq-len", "2048")
    _assert_one_line_error(done, "gpt3-175b", "add nodes")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--method", "alpa"), "--method"),
        (("--backend", "gurobi"), "--backend"),
        (("--export", "jax"), "--export"),
        (("--json", "--export", "megatron"), "--export and --json"),
    ],
)
def test_bad_options_are_one_line(args: tuple[str, ...], needle: str) -> None:
    """Unknown choices are usage errors; ``--json`` with ``--export`` is refused before any
    search."""
    _assert_one_line_error(cli("solve", LLAMA, H100, *ONE_NODE, *args), needle)


def test_framework_any_is_the_ilp_search() -> None:
    """``--framework any`` runs the per-operator search (layer ILPs and the stage DP)."""
    done = cli("solve", LLAMA, H100, *ONE_NODE, "--framework", "any", "--json")
    assert done.returncode == 0, done.stderr
    plan = plan_from_json(done.stdout)
    assert (plan.method, plan.framework, plan.configuration) == ("ilp", "any", None)
    assert plan.solver.ilp_count > 0


def test_pins_and_margin_are_the_librarys(tmp_path: Path) -> None:
    """Pinned degrees come back as pinned; the margin is kept free, as the library does."""
    done = cli("solve", LLAMA, H100, *ONE_NODE, "--tp", "2", "--mbs", "2", "--zero", "1",
                "--memory-margin", "10", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = plan_from_json(done.stdout)
    assert plan.configuration is not None
    assert (plan.configuration.tp, plan.configuration.mbs, plan.configuration.zero) == (2, 2, 1)
    assert plan.memory_margin_gib == 10
    assert plan.predicted.peak_memory_gib <= plan.cluster.device_memory_gib - 10
    options = SolveOptions(pins=plan_pins(tp=2, mbs=2, zero=1), memory_margin_gib=10)
    expected = solve(load_model(REPO / LLAMA), load_cluster(REPO / H100, 1), options)
    assert _without_time(plan) == _without_time(expected)


def plan_pins(**pins: int) -> object:
    from planner.options import Pins

    return Pins(**pins)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--framework", "jax"), "--framework 'jax' is not a framework the planner knows; choose "
                                 "from megatron, mindspeed, deepspeed, colossalai, torchtitan, "
                                 "any"),
        (("--tp", "3"), "tp(3) x pp(1) x cp(1) = 3 does not divide the 8 devices (pinned: --tp 3)"),
    ],
)
def test_bad_frameworks_and_pins_are_one_line(args: tuple[str, ...], needle: str) -> None:
    """An unknown framework lists the known ones; a pin under which nothing divides or fits
    names the pin."""
    _assert_one_line_error(cli("solve", LLAMA, H100, *ONE_NODE, *args), needle)


def test_a_pin_the_plan_has_no_room_for_is_noted() -> None:
    """bf16 moments pinned where the fastest plan that fits runs ZeRO-2 (Mixtral on four
    nodes): the plan keeps fp32 moments, and a note on stderr says so and how to keep them;
    pinned with ZeRO 1 as well, the plan has them and nothing is noted."""
    mixtral = "instances/models/mixtral-8x7b.json"
    args = ("solve", mixtral, H100, "--nodes", "4", "--optimizer-moments", "bf16")
    free = cli(*args)
    assert free.returncode == 0, free.stderr
    assert "ZeRO-2" in free.stdout.splitlines()[0]
    assert "note: --optimizer-moments bf16: the plan's optimizer is ZeRO-2" in free.stderr
    assert "--zero 1 to keep them in bf16" in " ".join(free.stderr.split())
    kept = cli(*args, "--zero", "1")
    assert kept.returncode == 0, kept.stderr
    assert "Adam moments in bf16" in " ".join(kept.stdout.split())
    assert "note: --optimizer-moments" not in kept.stderr
