"""The pictures: what they draw adds up to the plan's numbers, and the commands that write
them (``solve --report``, ``simulate --gantt``) write PNG and SVG where asked and nowhere
else."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from planner.plan.files import plan_from_json
from planner.plan.schema import Plan
from planner.report.figures import MEMORY_PARTS, memory_figure, time_figure
from tests.cli_process import cli
from tests.test_cli import A100, GPT3, _assert_one_line_error

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path, Path]:
    """``planner solve --method grid --out --report`` on GPT-3 175B, 1,024 A100 (the grid's
    interleaved pipeline of 8 stages, found in about a second)."""
    root = tmp_path_factory.mktemp("pictures")
    out, report = root / "plan.json", root / "report"
    done = cli("solve", GPT3, A100, "--out", out, "--report", report, "--method", "grid")
    assert done.returncode == 0, done.stderr
    return plan_from_json(out.read_text()), out, report


def test_report_writes_every_picture_in_both_formats(solved: tuple[Plan, Path, Path]) -> None:
    """Gantt chart, memory per stage and time breakdown, each as PNG and SVG."""
    _, _, report = solved
    names = sorted(p.name for p in report.iterdir())
    assert names == sorted(f"{n}.{s}" for n in ("gantt", "memory", "time") for s in ("png", "svg"))
    for path in report.iterdir():
        head = path.read_bytes()[:64]
        assert head.startswith(PNG) if path.suffix == ".png" else b"<svg" in path.read_bytes()


def test_memory_bars_stack_to_each_stages_memory(solved: tuple[Plan, Path, Path]) -> None:
    """Per stage, the stacked parts reach the stage's predicted memory, and the headroom
    reaches the device's capacity; a part no stage holds has no bar and no legend entry."""
    plan, _, _ = solved
    ax = memory_figure(plan).axes[0]
    containers = ax.containers
    held = [label for field, label, _ in MEMORY_PARTS
            if any(getattr(s.memory, field) for s in plan.stages)]  # fmt: skip
    assert len(held) < len(MEMORY_PARTS)  # the plan keeps no ZeRO-3 gathers, say
    assert len(containers) == len(held) + 1  # the parts held, then the headroom
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [*held, "headroom"]
    for i, stage in enumerate(plan.stages):
        parts = sum(c.patches[i].get_height() for c in containers[:-1])
        assert parts == pytest.approx(stage.memory.total_gib)
        top = containers[-1].patches[i]
        assert top.get_y() + top.get_height() == pytest.approx(plan.cluster.device_memory_gib)


def test_time_bar_adds_up_to_the_step(solved: tuple[Plan, Path, Path]) -> None:
    """The breakdown's segments cover the predicted step exactly, in the plan's parts."""
    plan, _, _ = solved
    ax = time_figure(plan).axes[0]
    widths = [c.patches[0].get_width() for c in ax.containers]
    assert sum(widths) == pytest.approx(plan.predicted.step_time_s)
    parts = [v for v in plan.predicted.time.model_dump().values() if v > 0]
    assert sorted(widths) == pytest.approx(sorted(parts))


def test_simulate_agrees_with_the_plan(solved: tuple[Plan, Path, Path], tmp_path: Path) -> None:
    """``planner simulate --json``: the simulated step within 1 % of the closed form, the
    peak in-flight activations exactly the closed form's; ``--gantt`` writes the chart."""
    plan, out, _ = solved
    gantt = tmp_path / "gantt.svg"
    done = cli("simulate", out, "--json", "--gantt", gantt)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["predicted_step_s"] == plan.predicted.step_time_s
    assert data["simulated_step_s"] == pytest.approx(plan.predicted.step_time_s, rel=0.01)
    assert len(data["stages"]) == len(plan.stages) > 1
    for row in data["stages"]:
        assert row["peak_in_flight"] == row["closed_form_in_flight"]
    assert b"<svg" in gantt.read_bytes()


def test_pictures_are_refused_where_they_cannot_go(solved: tuple[Plan, Path, Path]) -> None:
    """A format other than PNG or SVG, a missing folder, or an input's path: one line, exit 2,
    and the input untouched."""
    _, out, _ = solved
    before = out.read_bytes()
    bad: list[tuple[subprocess.CompletedProcess[str], str]] = [
        (cli("simulate", out, "--gantt", out.with_suffix(".pdf")), "use one of .png, .svg"),
        (cli("simulate", out, "--gantt", out.parent / "nowhere" / "g.png"), "does not exist"),
        (cli("simulate", out, "--gantt", out), "is one of the inputs"),
        (cli("simulate", out, "--gantt", out.parent), "is a directory"),
    ]
    for done, needle in bad:
        _assert_one_line_error(done, needle)
    assert out.read_bytes() == before


def test_a_report_folder_holding_a_folder_of_a_pictures_name_is_refused_first(
    tmp_path: Path,
) -> None:
    """``solve --report`` into a folder where ``gantt.png`` is a folder: one line naming it,
    before the search (the plan file is not written)."""
    (tmp_path / "report" / "gantt.png").mkdir(parents=True)
    out = tmp_path / "plan.json"
    done = cli("solve", GPT3, A100, "--out", out, "--report", tmp_path / "report",
               "--method", "grid")  # fmt: skip
    _assert_one_line_error(done, "gantt.png is a folder; remove it or choose another folder")
    assert not out.exists()


def test_simulate_a_gpipe_plan(tmp_path: Path) -> None:
    """A GPipe plan (from ``estimate --schedule gpipe --out``) is set against GPipe's closed
    form: every stage holds all microbatches."""
    out = tmp_path / "gpipe.json"
    llama, h100 = "instances/models/llama3-8b.json", "instances/clusters/dgx-h100-80gb.json"
    done = cli("estimate", llama, h100, "--nodes", "1", "--tp", "2", "--pp", "4",
                "--schedule", "gpipe", "--recompute", "full", "--global-batch", "16",
                "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(cli("simulate", out, "--json").stdout)
    assert [r["closed_form_in_flight"] for r in data["stages"]] == [16] * 4
    assert [r["peak_in_flight"] for r in data["stages"]] == [16] * 4


def test_a_name_with_dollars_is_drawn_as_written(solved: tuple[Plan, Path, Path]) -> None:
    """matplotlib reads ``$...$`` as maths: a model named so was drawn in italics, or, with
    a command maths does not know, failed after the whole search. Every picture's text is
    literal, and a sub-second step's time is drawn in milliseconds, as its Gantt chart."""
    import io

    plan, _, _ = solved
    named = plan.model_copy(update={"model": plan.model.model_copy(
        update={"name": "a $\\q$ b"})})  # fmt: skip
    for figure in (memory_figure(named), time_figure(named)):
        figure.savefig(io.BytesIO(), format="png")  # raised ParseFatalException: \q
        title = figure.axes[0].title
        assert "a $\\q$ b" in title.get_text() and not title.get_parse_math()
    fast = plan.model_copy(update={"predicted": plan.predicted.model_copy(update={
        "step_time_s": 0.005, "time": plan.predicted.time.model_copy(update={
            k: v * 0.005 / plan.predicted.step_time_s
            for k, v in plan.predicted.time.model_dump().items()})})})  # fmt: skip
    ax = time_figure(fast).axes[0]
    assert ax.get_xlabel() == "milliseconds per step"
    assert sum(c.patches[0].get_width() for c in ax.containers) == pytest.approx(5.0)
