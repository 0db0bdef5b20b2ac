"""Every command read at 80 and at 120 columns: no line longer than the terminal, no value cut
(no ``…``), every number and word whole; the search's progress bar with its best step and its
eta; errors wrapped at words with their ways out as a list; swapped inputs and files that are
not plans named as such.

The commands run in-process through typer's ``CliRunner`` (its isolation: stdout and stderr
captured, ``COLUMNS`` set) and :func:`planner.cli.main` (which turns errors into messages).
JSON output (``--json``, ``schema``) and a framework's launch text are data to save or paste,
printed verbatim at any width.
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow.parquet as pq
import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from planner.cli import main
from planner.cli.messages import format_message, split_ways_out
from planner.cli.progress import SearchBars
from planner.errors import InputError
from planner.options import Pins, SolveOptions, training_of
from planner.plan.config import ParallelConfig
from planner.plan.files import plan_from_json
from planner.plan.schema import Plan
from planner.report.bands import with_band
from planner.spec.reading import load_cluster, load_model
from planner.uniform import leanest, remedies
from tests.conftest import CALIBRATION_RUNS, REPO, needs_shared

WIDTHS = (80, 120)
LLAMA = "instances/models/llama3-8b.json"
LLAMA_70B = "instances/models/llama3-70b.json"
MIXTRAL = "instances/models/mixtral-8x7b.json"
GPT3 = "instances/models/gpt3-175b.json"
H100 = "instances/clusters/dgx-h100-80gb.json"
A100 = "instances/clusters/dgx-a100-80gb.json"
FRAMEWORKS = ("megatron", "mindspeed", "deepspeed", "colossalai", "torchtitan")
# Pinned to an interleaved pipeline with context parallelism: a summary with CP2 and
# "interleaved 1F1B (v=2)", and one framework (DeepSpeed) without a plan.
INTERLEAVED = ("--nodes", "1", "--pp", "2", "--vpp", "2")


@dataclass(frozen=True)
class Run:
    """One command's exit code and what it printed."""

    code: int
    stdout: str
    stderr: str


def planner(width: int, *args: str | Path) -> Run:
    """``planner ARGS`` in a terminal ``width`` columns wide, from the repository root."""
    runner = CliRunner()
    argv = ["planner", *map(str, args)]
    with runner.isolation(env={"COLUMNS": str(width)}) as (out, err, _), \
            mock.patch.object(sys, "argv", argv):  # fmt: skip
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        sys.stdout.flush()
        sys.stderr.flush()
        return Run(code, out.getvalue().decode(), err.getvalue().decode())


@pytest.fixture(autouse=True)
def _from_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def assert_fits(text: str, width: int) -> None:
    """No line wider than the terminal and nothing cut with an ellipsis."""
    for line in text.splitlines():
        assert cell_len(line) <= width, f"{cell_len(line)} > {width}: {line!r}\n{text}"
    assert "…" not in text, text


def assert_whole(text: str, *values: str) -> None:
    """Each value on one line of ``text``, unbroken."""
    lines = text.splitlines()
    for value in values:
        assert any(value in line for line in lines), f"{value!r} not whole in\n{text}"


def unwrapped(text: str) -> str:
    """The lines of a message joined into one (to find what a wrap broke between lines)."""
    return " ".join(line.strip().removesuffix(" \\") for line in text.splitlines())


def plan_values(plan: Plan) -> list[str]:
    """What a plan's tables must show whole: the summary's clauses (the degrees, the
    schedule), the step time, each stage's degrees and memory."""
    values = [*plan.summary().split(", "), f"step {plan.predicted.step_time_s:.3f} s"]
    for stage in plan.stages:
        q = stage.parallel
        dp = q.dp * plan.data_parallel_replicas  # the stage's data-parallel ways over replicas
        values += [f"{q.tp}/{dp}/{q.cp}/{q.ep}", f"{stage.memory.total_gib:.1f}"]
    return values


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A plan with tensor, context and expert parallelism on an interleaved pipeline."""
    out = tmp_path_factory.mktemp("width") / "plan.json"
    done = planner(200, "estimate", MIXTRAL, H100, "--nodes", "2", "--tp", "2", "--cp", "2",
                   "--ep", "2", "--pp", "2", "--vpp", "2", "--sp", "--zero", "1",
                   "--recompute", "full", "--global-batch", "64", "--memory-margin", "3",
                   "--out", out)  # fmt: skip
    assert done.code == 0, done.stderr
    yield out


# --------------------------------------------------------------------------- tables


@pytest.mark.parametrize("width", WIDTHS)
def test_solve(width: int, tmp_path: Path) -> None:
    """The plan's summary, its step, each stage's degrees; the Megatron launch after it."""
    out = tmp_path / "plan.json"
    # Expert parallelism pinned: the EP column and flag must render (unpinned, ZeRO-3 over
    # 16 ranks without EP is 1 % faster on this cluster).
    done = planner(width, "solve", MIXTRAL, H100, "--nodes", "2", "--ep", "4", "--out", out,
                   "--export", "megatron")  # fmt: skip
    assert done.code == 0, done.stderr
    plan = plan_from_json(out.read_text())
    assert " x EP4" in plan.summary()
    assert_fits(done.stdout + done.stderr, width)
    assert_whole(done.stdout, *plan_values(plan), "TP/DP/CP/EP", "--expert-model-parallel-size 4")
    p = plan.predicted
    assert_whole(unwrapped(done.stderr), f"predicted {with_band(p.step_time_s, p.error_band)} per "
                 "step")


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_methods(width: int) -> None:
    """Each method's name, plan and step, ``interleaved 1F1B`` unbroken."""
    done = planner(width, "compare", LLAMA, H100, *INTERLEAVED)
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, "ilp", "heuristic", "grid", "TP1 x PP2 x DP2 x CP2",
                 "distributed optimizer", "interleaved 1F1B (v=2)", "x best")  # fmt: skip


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_frameworks(width: int) -> None:
    """Each framework's name and plan, and the reason of the one without a plan."""
    done = planner(width, "compare", LLAMA, H100, *INTERLEAVED, "--frameworks",
                   ",".join(FRAMEWORKS))  # fmt: skip
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, *FRAMEWORKS, "TP1 x PP2 x DP2 x CP2", "CP2 (K/V all-gathered)",
                 "interleaved 1F1B (v=2)", "distributed optimizer",
                 "no plan: DeepSpeed launches no configuration")
    printed = json.loads(planner(200, "compare", LLAMA, H100, *INTERLEAVED, "--frameworks",
                                 ",".join(FRAMEWORKS), "--json").stdout)  # fmt: skip
    assert_whole(done.stdout, *(f"{row['step_time_s']:.3f}" for row in printed if row["plan"]))


@pytest.mark.parametrize("width", WIDTHS)
def test_estimate(width: int) -> None:
    """The configuration, the step, every part of the time it has and of the memory."""
    done = planner(width, "estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--recompute",
                   "full", "--no-flash-attention", "--precision", "fp16")  # fmt: skip
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    result = json.loads(planner(200, "estimate", GPT3, A100, "--tp", "8", "--pp", "16",
                                "--recompute", "full", "--no-flash-attention", "--precision",
                                "fp16", "--json").stdout)  # fmt: skip
    assert_whole(done.stdout, "TP8 PP16 DP8 mbs1 full-recompute",
                 f"step {result['step_time_s']:.3f} s", f"MFU {100 * result['mfu']:.1f} %",
                 "memory per device (most loaded stage)", "data parallel comm exposed",
                 *(f"{s:.3f}" for s in result["time"].values() if s > 0),
                 f"{result['peak_memory_gib']:.2f} / 76.00 usable (fits)")  # fmt: skip
    # the parts the step has, to its three decimals, as solve prints a plan's
    assert result["time"]["context_parallel_comm_s"] == 0
    assert "context parallel comm" not in done.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_simulate(width: int, plan_file: Path) -> None:
    """The plan's summary (TP, CP, EP, the interleaving), the simulated and predicted step."""
    done = planner(width, "simulate", plan_file)
    assert done.code == 0, done.stderr
    plan = plan_from_json(plan_file.read_text())
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, *plan.summary().split(", "), "CP2", "EP2",
                 f"predicted {plan.predicted.step_time_s:.3f} s", "in flight (closed form)")


@pytest.mark.parametrize("width", WIDTHS)
def test_explain(width: int, plan_file: Path) -> None:
    """What binds, the one-notch table with its numbered reasons, the hardware and a why-not;
    every change and verdict whole."""
    done = planner(width, "explain", plan_file, "--model", MIXTRAL, "--cluster", H100,
                   "--why-not", "tp=4,cp=1")  # fmt: skip
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, "why this plan:", "tp 2 -> 4 (dp 2 -> 1)", "mbs 1 -> 2",
                 "2x HBM (79.65 -> 159.3 GiB)", "why not tp=4, cp=1", "[1] ")


@pytest.mark.parametrize("width", WIDTHS)
def test_sweep(width: int, tmp_path: Path) -> None:
    """What the sweep did and its table, best point first, wrapped at words; the best step
    (under ``step s``) and cost whole."""
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f'model = "{REPO / LLAMA}"\ncluster = "{REPO / H100}"\n'
                     'tokens = 1e12\nprice_per_device_hour = 2.5\n'
                     '[training]\nglobal_batch_size = 64\n[search]\nframework = "torchtitan"\n'
                     '[axes]\n"cluster.num_nodes" = [1, 2]\n'
                     '"cluster.device.memory_gib" = [80, 8]\n')  # 8 GiB fits nothing
    done = planner(width, "sweep", sweep, "--out", tmp_path / "r.parquet")
    assert done.code == 0, done.stderr
    assert_fits(done.stdout + done.stderr, width)
    best = min((r for r in pq.read_table(tmp_path / "r.parquet").to_pylist() if r["summary"]),
               key=lambda r: r["step_time_s"])  # fmt: skip
    assert_whole(done.stdout, f"{best['step_time_s']:.3f}", f"{best['cost']:,.0f}")
    assert "4 points, 2 with a plan, 2 without, 0 already done" in unwrapped(done.stdout)
    assert best["summary"] in unwrapped(done.stdout)


@pytest.mark.parametrize("width", WIDTHS)
def test_export(width: int, plan_file: Path) -> None:
    """Megatron's flags on stdout as they are; the notes on stderr wrapped at words."""
    done = planner(width, "export", plan_file, "--format", "megatron", "--model", MIXTRAL,
                   "--cluster", H100)  # fmt: skip
    assert done.code == 0, done.stderr
    plan = plan_from_json(plan_file.read_text())
    assert_fits(done.stdout + done.stderr, width)
    assert_whole(done.stdout, "--context-parallel-size 2", "--expert-model-parallel-size 2",
                 "--num-virtual-stages-per-pipeline-rank 2")  # fmt: skip
    assert all(line.startswith(("note: ", "  ")) for line in done.stderr.splitlines())
    assert_whole(unwrapped(done.stderr), f"predicted {plan.predicted.step_time_s:.3f} s")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("model", [GPT3, MIXTRAL])
def test_info(width: int, model: str) -> None:
    """Every field and count; a block (the experts) split between its fields only."""
    done = planner(width, "info", model)
    assert done.code == 0, done.stderr
    info = json.loads(planner(200, "info", model, "--json").stdout)
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, f"{info['params_total']:,}", "training_flops_per_token",
                 *(f"{k}={v}" for k, v in (info["architecture"].get("moe") or {}).items()))


@pytest.mark.parametrize("width", WIDTHS)
def test_layer(width: int) -> None:
    """Each operator and each resharding's collectives, whole."""
    done = planner(width, "layer", GPT3, A100, "--mesh", "1x8")
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, "layer1.post_attention_norm", "reduce_scatter@axis1",
                 "all_gather@axis1", "16.125 ms per microbatch (forward + backward)")


@needs_shared(CALIBRATION_RUNS)
@pytest.mark.parametrize("width", WIDTHS)
def test_validate(width: int) -> None:
    """Every run's id, configuration and times."""
    done = planner(width, "validate", str(CALIBRATION_RUNS))
    assert done.code == 0, done.stderr
    rows = json.loads(planner(200, "validate", str(CALIBRATION_RUNS), "--json").stdout)["runs"]
    assert_fits(done.stdout, width)
    for row in rows:
        assert_whole(done.stdout, row["id"], f"{row['measured_s']:.2f}",
                     f"{row['predicted_s']:.2f}", f"{100 * row['error']:+.1f} %")  # fmt: skip
        assert_whole(done.stdout, *row["config"].split())


@pytest.fixture(scope="module")
def fit_once() -> Iterator[None]:
    """``calibrate``'s fit computed once for both widths."""
    from planner.cli import inputs

    original, memo = inputs.calibrate, {}

    def cached(runs: list[Path], clusters: Path, **options: Any) -> Any:
        key = (tuple(runs), clusters, repr(sorted(options.items())))
        if key not in memo:
            memo[key] = original(runs, clusters, **options)
        return memo[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inputs, "calibrate", cached)
        yield


@needs_shared(CALIBRATION_RUNS)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.usefixtures("fit_once")
def test_calibrate(width: int) -> None:
    """The fitted parameters and the runs' table (not written): the H100 runs, the fastest
    fit."""
    done = planner(width, "calibrate", str(CALIBRATION_RUNS), "--gpu", "H100")
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, "not written: --write", "megatron_h100_weak_462B",
                 "gemm.max_fraction")


@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_network(width: int) -> None:
    """The nccl-tests sample against the cost model, size by size, and the fitted level."""
    data = REPO / "tests" / "data" / "nccl"
    done = planner(width, "calibrate-network", str(data / "h100-pcie-nvlink-pair.json"),
                   str(data / "all_reduce_perf_sample.txt"))
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, "not written: --write", "bandwidth_fraction 1 -> 0.3856",
                 "115.4", "115.9", "9306.7", "18535")


@pytest.mark.parametrize("width", WIDTHS)
def test_help(width: int) -> None:
    """The commands and ``--debug`` in the top-level help."""
    done = planner(width, "--help")
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, "--debug", "traceback", *("solve", "compare", "export"))


@pytest.mark.parametrize("width", WIDTHS)
def test_runs_from_log_help(width: int) -> None:
    """The options of ``runs from-log``, whose output is JSON."""
    done = planner(width, "runs", "from-log", "--help")
    assert done.code == 0, done.stderr
    assert_fits(done.stdout, width)
    assert_whole(done.stdout, "--global-batch", "--skip", "--out")


def test_schema_is_json_at_any_width() -> None:
    """The schema is data: the same JSON at any width."""
    narrow, wide = planner(80, "schema", "model"), planner(120, "schema", "model")
    assert narrow.stdout == wide.stdout
    assert json.loads(narrow.stdout)["title"] == "ModelSpec"


# --------------------------------------------------------------------------- progress


def test_progress_shows_the_best_step_and_the_eta() -> None:
    """At 80 columns the bar keeps the method, done of total, elapsed, eta and best step whole
    on one line, and the candidate it is searching under it."""
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    bars = SearchBars(console)
    clock = iter(float(t) for t in range(1000))  # a second a reading: a pace, hence an eta
    bars.get_time = lambda: next(clock)  # type: ignore[method-assign]
    searching = "PP16 of 1x8 meshes, 8 pipeline replicas, microbatch of 1 sequence, v=3"
    task = bars.add_task("colossalai", total=None, best="", searching="")
    for done in (100, 200, 300):
        bars.update(task, completed=done, total=642, best="best 123.456 s", searching=searching)
    with console.capture() as captured:
        console.print(bars.get_renderable())
    text = captured.get()
    assert_fits(text, 80)
    first, second = text.splitlines()
    assert first.startswith("searching (colossalai) ")
    assert re.search(r" 300/642 0:00:\d\d eta 0:00:\d\d best 123\.456 s$", first), first
    assert second.strip() == searching


def test_progress_before_a_best_and_a_pace() -> None:
    """Before the first candidate: an unknown eta and no best step yet."""
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    bars = SearchBars(console)
    bars.add_task("ilp", total=None, best="best -", searching="")
    with console.capture() as captured:
        console.print(bars.get_renderable())
    assert captured.get().rstrip().endswith("eta ? best -")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("width", WIDTHS)
def test_infeasible_solve_lists_the_ways_out(width: int) -> None:
    """Nothing fits: the head wrapped at words, each way out an item of the list (for
    Colossal-AI, which does not launch the offload that fits Megatron-LM's and DeepSpeed's
    plans)."""
    done = planner(width, "solve", LLAMA_70B, A100, "--nodes", "1", "--framework", "colossalai")
    assert done.code == 2 and done.stdout == ""
    assert_fits(done.stderr, width)
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: no uniform configuration fits llama3-70b")
    items = [line for line in lines if line.startswith("  - ")]
    assert len(items) == 3
    for item, start in zip(items, ("add nodes: on 4 nodes", "optimizer offload to the CPU",
                                   "a shorter sequence"), strict=True):  # fmt: skip
        assert item.startswith(f"  - {start}"), item
    assert all(line.startswith("    ") for line in lines[lines.index(items[0]) + 1 :]
               if not line.startswith("  - "))  # fmt: skip


@pytest.mark.parametrize("width", WIDTHS)
def test_estimate_that_does_not_fit_lists_the_remedies(width: int) -> None:
    """A configuration over memory: what would fit and what would not, a remedy a line."""
    done = planner(width, "estimate", LLAMA_70B, H100, "--nodes", "4", "--tp", "8", "--pp",
                   "2", "--sp", "--mbs", "2", "--global-batch", "256")  # fmt: skip
    assert done.code == 2
    assert_fits(done.stderr, width)
    lines = done.stderr.splitlines()
    assert "  would fit:" in lines and "  would not fit:" in lines
    fits = lines[lines.index("  would fit:") + 1 : lines.index("  would not fit:")]
    assert [line for line in fits if line.startswith("    - ")] == [
        next(line for line in fits if line.startswith("    - --mbs 1 --recompute full --zero 1")),
        next(line for line in fits if line.startswith("    - --offload optimizer (74.0 GiB; step")),
    ]
    assert "    - --recompute full (85.3 GiB)" in lines


@pytest.mark.parametrize("width", WIDTHS)
def test_a_command_in_an_error_is_pasteable(width: int, plan_file: Path) -> None:
    """The command that solves for a framework: on lines of its own, continued with a
    backslash, each option with its value."""
    done = planner(width, "export", plan_file, "--format", "deepspeed", "--model", MIXTRAL,
                   "--cluster", H100)  # fmt: skip
    assert done.code == 2
    assert_fits(done.stderr, width)
    lines = done.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("planner solve"))
    command = " ".join(line.strip().removesuffix(" \\") for line in lines[start:])
    assert command == (f"planner solve {MIXTRAL} {H100} --nodes 2 --global-batch 64 --seq-len "
                       "4096 --precision bf16 --framework deepspeed")  # fmt: skip
    assert all(line.endswith(" \\") for line in lines[start:-1])


@pytest.mark.parametrize("command", ["solve", "compare", "estimate", "layer"])
def test_swapped_model_and_cluster(command: str) -> None:
    """CLUSTER MODEL instead of MODEL CLUSTER: one error that says they look swapped."""
    done = planner(200, command, H100, LLAMA, "--nodes", "1")
    assert done.code == 2
    assert done.stderr == (f"error: MODEL and CLUSTER look swapped: {H100} is a cluster file and "
                           f"{LLAMA} a model file\n")  # fmt: skip


def test_swapped_export_options(plan_file: Path) -> None:
    done = planner(200, "export", plan_file, "--format", "megatron", "--model", H100,
                   "--cluster", MIXTRAL)  # fmt: skip
    assert done.code == 2
    assert done.stderr.startswith("error: --model and --cluster look swapped: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("solve", H100, H100), f"{H100}: a cluster file, not a model file"),
        (("estimate", LLAMA, LLAMA), f"{LLAMA}: a model file, not a cluster file"),
        (("info", H100), f"{H100}: a cluster file, not a model file"),
    ],
)
def test_a_file_of_another_kind(args: tuple[str, ...], message: str) -> None:
    done = planner(200, *args)
    assert (done.code, done.stderr) == (2, f"error: {message}\n")


@pytest.mark.parametrize("command", ["simulate", "export"])
@pytest.mark.parametrize(
    ("path", "kind"),
    [(LLAMA, "it looks like a model file"), (H100, "it looks like a cluster file"),
     ("{other}", "no schema_version, stages or predicted")],
)  # fmt: skip
def test_not_a_plan_file(command: str, path: str, kind: str, tmp_path: Path) -> None:
    """A model, a cluster or any other JSON object where a plan belongs."""
    other = tmp_path / "other.json"
    other.write_text('{"runs": []}')
    path = path.replace("{other}", str(other))
    extra = ("--format", "megatron", "--model", LLAMA, "--cluster", H100) * (command == "export")
    done = planner(200, command, path, *extra)
    assert done.code == 2
    expected = (f"error: {path}: not a plan file ({kind}; `planner solve --out` and `planner "
                "estimate --out` write plans)")  # fmt: skip
    assert unwrapped(done.stderr) == expected


def test_plan_from_json_names_what_the_file_is() -> None:
    """The library's reader says what a file that is not a plan looks like."""
    with pytest.raises(InputError, match=r"^m\.json: not a plan file \(it looks like a model"):
        plan_from_json((REPO / LLAMA).read_text(), source="m.json")
    with pytest.raises(InputError, match=r"^c\.json: not a plan file \(it looks like a cluster"):
        plan_from_json((REPO / H100).read_text(), source="c.json")


# ------------------------------------------------- what the CLI relies on in the messages


def test_the_ways_out_of_a_search_are_the_clauses_remedies_yields() -> None:
    """:mod:`planner.cli.messages` lists exactly the clauses of
    :func:`~planner.uniform.leanest.infeasible_message` after its head (each starts with one
    of ``WAY_OUT``): a new kind of clause in remedies fails here, not in the user's terminal."""
    model, cluster = load_model(REPO / GPT3), load_cluster(REPO / A100, 1)
    options = SolveOptions()
    training = training_of(model, options)
    message = leanest.infeasible_message(model, cluster, training, options,
                                          searched="no plan", least_gib=371.1,
                                          leanest="the leanest")  # fmt: skip
    clauses = list(leanest._ways_out(model, cluster, training, options, 371.1))
    head, sections = split_ways_out(message)
    assert [s.heading for s in sections] == [None]
    assert sections[0].items == clauses and len(clauses) == 3
    assert message == "; ".join([head, *clauses])


def test_the_pins_in_the_way_are_listed() -> None:
    """:mod:`planner.uniform.failure`'s clause per pin is a way out of its own."""
    model, cluster = load_model(REPO / LLAMA), load_cluster(REPO / H100, 1)
    options = SolveOptions(pins=Pins(tp=1, pp=1, mbs=4, zero=0, recompute="none"))
    from planner.uniform.failure import _pins_in_the_way

    pins = _pins_in_the_way(model, cluster, training_of(model, options), options)
    assert pins and all(split_ways_out(f"head; {p}")[1][0].items == [p] for p in pins)


def test_the_remedies_of_a_configuration_are_listed() -> None:
    """Each :func:`~planner.uniform.remedies.config_remedies` is one item, under ``would
    fit`` or ``would not fit`` as it fits, in its order."""
    model, cluster = load_model(REPO / LLAMA_70B), load_cluster(REPO / H100, 4)
    config = ParallelConfig(tp=8, pp=2, sp=True, mbs=2, global_batch=256)
    message = remedies.config_infeasible_message(model, cluster, config)
    _, sections = split_ways_out(message)
    found = remedies.config_remedies(model, cluster, config)
    for section, fits in zip(sections, (True, False), strict=True):
        changes = [r.change for r in found if r.fits == fits]
        assert section.heading == ("would fit" if fits else "would not fit")
        assert len(section.items) == len(changes)
        assert all(i.startswith(f"{c} (") for i, c in zip(section.items, changes, strict=True))


def test_format_message_loses_no_word() -> None:
    """Laid out at any width, the message's words are all there, in order."""
    message = ("tp 8 needs 119.8 GiB per device; would fit: --mbs 1 (54.8 GiB; every knob), "
               'DeepSpeed "offload_optimizer": {"device": "cpu"} (70.5 GiB); would not fit: '
               "--pp 4 (83.9 GiB); solve for it: planner solve a.json b.json --nodes 2")
    for width in (20, 40, 80):
        text = format_message("error:", message, width=width)
        words = [w.rstrip(",;:") for w in unwrapped(text).split() if w not in ("-", "error:")]
        assert words == [w.rstrip(",;:") for w in message.split()]


SPLIT_UNIT = re.compile(r"\d\n\s*(?:%|s\b|GiB\b|GB\b|ms\b)")
"""A number at a line's end whose unit starts the next line."""


@pytest.mark.parametrize("width", (60, 80))
def test_prose_keeps_numbers_with_their_units(width: int, tmp_path: Path) -> None:
    """The band, the memory band and explain's sentences wrap at words but never between a
    number and its unit, and leave no space at a line's end (Rich's own wrapping printed
    "widened 1⏎% for", "+0.309⏎s" and a trailing space on each wrapped line)."""
    plan = tmp_path / "plan.json"
    solved = planner(width, "solve", GPT3, A100, "--out", str(plan))
    assert solved.code == 0, solved.stderr
    explained = planner(width, "explain", str(plan), "--model", GPT3, "--cluster", A100,
                        "--why-not", "tp=8,pp=16")  # fmt: skip
    assert explained.code == 0, explained.stderr
    for out in (solved.stdout, explained.stdout):
        assert SPLIT_UNIT.search(out) is None, SPLIT_UNIT.search(out)
        prose = [line for line in out.splitlines() if not line.startswith((" ", "─", "┏"))]
        assert [line for line in prose if line.endswith(" ")] == []


def test_help_states_each_default_once() -> None:
    """A search's pin says the search chooses, not also the configuration's own default
    (``--recompute-modules``: not "default: core_attn. Default: searched."); the memory
    margin's default names every share :data:`~planner.cost.memory.MEMORY_MARGIN` holds."""
    from planner.cli.app import MARGIN_DEFAULT
    from planner.cost.memory import MEMORY_MARGIN

    text = " ".join(planner(200, "solve", "--help").stdout.split())
    assert "default: core_attn" not in text and text.count("Default: searched") > 5
    for stack, share in MEMORY_MARGIN.items():
        assert f"{100 * share:.0f} %" in MARGIN_DEFAULT
        if share != 0.05:  # the others' share, said once
            assert f"{100 * share:.0f} % for" in MARGIN_DEFAULT and stack in MARGIN_DEFAULT
    assert MARGIN_DEFAULT in text.replace("- ", "-")  # click wraps at hyphens
