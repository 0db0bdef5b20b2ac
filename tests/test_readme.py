"""The headline examples of the README and its pages under docs/, re-run: each command is read
out of README.md or a docs/*.md page, run as a user runs it, and what it prints must be what
the page shows.

A block that is not found fails the test (it is never skipped), so that the documentation and
the planner cannot drift apart unnoticed. What a page elides is a line ``...`` (one or more
lines); the wall times a command prints (solver and solve seconds) vary between runs and are
the only text compared loosely. The examples that read ../shared skip without it.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_process import cli
from tests.conftest import CALIBRATION_RUNS, FSDP_RUNS, HF, REPO, needs_shared

PAGES = {path.relative_to(REPO).as_posix(): path.read_text()
         for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}  # fmt: skip
"""README.md, then every page of docs/ by name: the text the examples are read from."""
DOCS = "\n".join(PAGES.values())
WIDE = 200
"""Terminal width of the examples the pages show without one: tables do not wrap."""


# --------------------------------------------------------------------------- reading the pages


def _blocks(text: str) -> list[tuple[int, str]]:
    """Every fenced block of a page: where its body starts, and the body."""
    return [(m.start(1), m.group(1)) for m in re.finditer(r"^```[^\n]*\n(.*?)^```", text,
                                                           flags=re.M | re.S)]  # fmt: skip


def _block_after(marker: str) -> str:
    """The first fenced block after the first ``marker`` of the first page that has it (the
    block in that page)."""
    for name, text in PAGES.items():
        if (at := text.find(marker)) >= 0:
            body = next((body for start, body in _blocks(text) if start > at), None)
            assert body is not None, f"{name} has no block after {marker!r}"
            return body
    pytest.fail(f"README.md and docs/ no longer have {marker!r}", pytrace=False)


def _block_starting(first: str) -> str:
    """The fenced block, of all the pages, whose first line starts with ``first``."""
    found = [body for text in PAGES.values() for _, body in _blocks(text) if body.startswith(first)]
    assert len(found) == 1, f"README.md and docs/ have {len(found)} blocks starting {first!r}"
    return found[0]


def _inline(pattern: str) -> re.Match[str]:
    """``pattern`` in the prose of the first page that has it (an inline command may wrap over
    lines); the match's ``string`` is that page."""
    for text in PAGES.values():
        if found := re.search(pattern, text, flags=re.S):
            return found
    pytest.fail(f"README.md and docs/ no longer match {pattern!r}", pytrace=False)


def _shell_command(lines: list[str]) -> tuple[list[str], list[str]]:
    """A ``$ planner ...`` command at the head of ``lines`` (continued by trailing
    backslashes): its arguments after ``planner``, and the lines after it."""
    assert lines[0].startswith("$ planner "), lines[0]
    text, rest = lines[0], lines[1:]
    while text.endswith("\\"):
        text, rest = text[:-1] + rest[0], rest[1:]
    return shlex.split(text.removeprefix("$ planner ")), rest


# --------------------------------------------------------------------------- comparing output


def _shown(readme: list[str], printed: list[str], *, masks: tuple[str, ...] = ()) -> None:
    """``printed`` is what the page shows, line for line (trailing blanks aside), where a
    page's line ``...`` stands for one or more lines and each regex of ``masks`` marks a run
    time: its first group is replaced by ``<s>`` on both sides. Where a line has a masked
    run time, runs of blanks and of rules count as one: a run time one digit wider widens
    its table's column."""

    def masked(line: str) -> str:
        line = line.rstrip()
        for mask in masks:
            if found := re.search(mask, line):
                line = line[: found.start(1)] + "<s>" + line[found.end(1) :]
        if masks:
            line = re.sub("─+", "─", re.sub(" +", " ", line))
        return line

    pattern = "\n".join(r"[^\n]*(?:\n[^\n]*)*" if line == "..." else re.escape(masked(line))
                        for line in readme)  # fmt: skip
    text = "\n".join(masked(line) for line in printed)
    diff = difflib.unified_diff([masked(line) for line in readme], text.split("\n"),
                                "documented", "printed", lineterm="")  # fmt: skip
    if not re.fullmatch(pattern, text):
        pytest.fail("\n".join(diff), pytrace=False)


def _printed(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n").split("\n")


# --------------------------------------------------------------------------- the quick start


@pytest.fixture(scope="module")
def quickstart() -> tuple[subprocess.CompletedProcess[str], str, str]:
    """The quick start's ``planner solve`` (about 2 s) run once, with the README's blocks of
    its stdout and stderr."""
    install = _block_after("## Quickstart")
    line = next((line for line in install.splitlines() if ".venv/bin/planner solve" in line), "")
    assert line, "README.md's quick start no longer runs planner solve"
    args = shlex.split(line.split(".venv/bin/planner ", 1)[1])
    columns = int(_inline(r"The first searches for.*?\(`COLUMNS=(\d+)`").group(1))
    stdout = _block_after("The first searches for")
    stderr = _block_after("and on stderr what the launch needs")
    return cli(*args, columns=columns), stdout, stderr


def test_quickstart_solve_prints_the_readme_plan(
    quickstart: tuple[subprocess.CompletedProcess[str], str, str],
) -> None:
    """The plan, its prediction, time and stage tables, groups and the launch flags."""
    done, stdout, _ = quickstart
    _shown(stdout.splitlines(), _printed(done), masks=(r"^solver: .*?, (\d+\.\d+) s,",))


def test_quickstart_solve_notes_are_the_readme_notes(
    quickstart: tuple[subprocess.CompletedProcess[str], str, str],
) -> None:
    """The launch notes on stderr, each wrapped at words with its continuation indented, as
    the README shows them."""
    done, _, stderr = quickstart
    _shown(stderr.splitlines(), done.stderr.rstrip("\n").split("\n"))


def test_ci_runs_the_quickstart_tests() -> None:
    """.ci/run runs the quick start's second step as it is written: the Chromium set-up line
    and the test command."""
    step = _block_after("## Quickstart").split("\n# 2.", 1)[1].split("\n", 1)[1]
    commands = [line for line in step.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands
    ci = (REPO / ".ci" / "run").read_text()
    for command in commands:
        # Whole: a line, or a group's body (CI silences the install's output).
        whole = rf"(^|{{ ){re.escape(command)}(;|$)"
        assert re.search(whole, ci, flags=re.M), f".ci/run no longer runs the README's {command!r}"


# --------------------------------------------------------------------------- explain


def test_explain_is_the_readme_explanation(tmp_path: Path) -> None:
    """The quick start's plan solved to plan.json and explained with a why-not, at the
    width docs/explain.md shows: what binds, every notch, the hardware and the comparison."""
    found = _inline(r"\(`planner (solve [^`]*--out plan\.json)`\), at `COLUMNS=(\d+)`")
    plan = tmp_path / "plan.json"
    solve = [str(plan) if a == "plan.json" else a for a in found.group(1).split()]
    assert cli(*solve).returncode == 0
    args, shown = _shell_command(_block_starting("$ planner explain").splitlines())
    args = [str(plan) if a == "plan.json" else a for a in args]
    _shown(shown, _printed(cli(*args, columns=int(found.group(2)))))


# --------------------------------------------------------------------------- estimate


def test_estimate_json_is_the_readme_object() -> None:
    """``estimate --json`` on Llama 3 70B: every key and number docs/estimate.md shows, to the
    last digit (the page leaves out the per-stage list and the configuration, whose degrees
    are the command's)."""
    args, rest = _shell_command(_block_after("`--json` prints one object").splitlines())
    shown = json.loads("\n".join(rest))
    printed = json.loads("\n".join(_printed(cli(*args))))
    assert "stages" in printed and "stages" not in shown
    priced = printed["configuration"]
    assert (priced["tp"], priced["pp"], priced["dp"], priced["zero"]) == (8, 4, 2, 1)
    assert (priced["global_batch"], priced["seq_len"], priced["precision"],
            priced["stack"]) == (128, 8192, "bf16", "megatron-te")  # fmt: skip
    assert {key: value for key, value in printed.items()
            if key not in ("stages", "configuration")} == shown  # fmt: skip


def test_estimate_tables_are_the_readme_tables() -> None:
    """GPT-3 175B as Megatron-LM trained it: the summary, the step's parts and the memory."""
    found = _inline(r"`planner (estimate [^`]*)` prints")
    shown = _block_after(found.group(0))
    _shown(shown.splitlines(), _printed(cli(*found.group(1).split(), columns=WIDE)))


def test_zero_bubble_estimate_is_the_readme_block() -> None:
    """The same Llama 3 70B configuration under ZB-V: its summary, bubble and activations."""
    block = _block_starting("$ planner estimate instances/models/llama3-70b.json "
                            "instances/clusters/dgx-h100-80gb.json --nodes 8 \\\n"
                            "    --tp 8 --pp 4 --vpp 2")  # fmt: skip
    args, shown = _shell_command(block.splitlines())
    _shown(shown, _printed(cli(*args, columns=WIDE)))


# --------------------------------------------------------------------------- compare, layer, info


def test_compare_frameworks_is_the_readme_table() -> None:
    """The frameworks compared on GPT-3 175B: every plan, step, throughput, MFU, peak memory
    and ratio (the solve seconds are the run's)."""
    found = _inline(r"`COLUMNS=(\d+) planner (compare [^`]*)`:")
    shown = _block_after(found.group(0))
    done = cli(*found.group(2).split(), columns=int(found.group(1)))
    _shown(shown.splitlines(), _printed(done), masks=(r" (\d+\.\d\d) +(?:\d\.\d{3}|-)$",))


def test_layer_is_the_readme_layer() -> None:
    """The layer ILP's GPT-3 layer on a 1x8 mesh: time, memory, model size, every operator's
    split and every resharding."""
    args, shown = _shell_command(_block_starting("$ planner layer").splitlines())
    done = cli(*args, columns=WIDE)
    _shown(shown, _printed(done), masks=(r"^solver .*, (\d+\.\d+) s,",))


@needs_shared(HF / "DeepSeek-V3.config.json")
def test_info_is_the_readme_counts() -> None:
    """DeepSeek-V3's parameter counts, layer kinds and graph size, as docs/info.md abridges
    them (each ``"key": value`` it shows)."""
    block = _block_starting("$ planner info").splitlines()
    args = shlex.split(block[0].removeprefix("$ planner ").split("   (abridged)")[0])
    shown = dict(re.findall(r'"(\w+)": (\{[^}]*\}|\d+)', "\n".join(block[1:])))
    assert len(shown) == 4, shown
    printed = json.loads(cli(*args).stdout)
    assert {key: printed[key] for key in shown} == {k: json.loads(v) for k, v in shown.items()}


def test_from_log_is_the_readme_record(tmp_path: Path) -> None:
    """docs/runs.md's log becomes a record that ``validate`` prices as the page shows."""
    block = _block_starting("$ planner runs from-log").splitlines()
    args, rest = _shell_command(block)
    out = tmp_path / "mine.json"
    done = cli(*[str(out) if arg == "mine.json" else arg for arg in args])
    assert done.returncode == 0, done.stderr
    validate, shown = _shell_command(rest)
    assert validate == ["validate", "mine.json"]
    _shown(shown, _printed(cli("validate", out, columns=80)))


@needs_shared(REPO.parent / "shared" / "validation" / "h100" / "runs_one_gpu.json")
def test_validate_memory_is_the_docs_table() -> None:
    """docs/validate.md's one-GPU H100 runs at 80 columns: times, peaks and the verdict."""
    block = _block_starting("$ planner validate ../shared/validation/h100/").splitlines()
    args, shown = _shell_command(block)
    _shown(shown, _printed(cli(*args, columns=80)))


@needs_shared(CALIBRATION_RUNS)
def test_validate_is_the_readme_table() -> None:
    """Predicted against measured: every published run's row, and the median and max."""
    found = _inline(r"#+ Predicted against measured \(`planner ([^`]*)`\)")
    rows = json.loads("\n".join(_printed(cli(*found.group(1).split(), "--json"))))["runs"]
    table = found.string[found.end() :].split("\n\n")[1].splitlines()[2:]
    printed = [f"| {r['id']} | {r['num_devices']} | {r['config']} | {r['measured_s']:.2f} "
               f"| {r['predicted_s']:.2f} | {100 * r['error']:+.1f} % |" for r in rows]  # fmt: skip
    assert [line.replace("**", "") for line in table] == printed
    errors = [abs(r["error"]) for r in rows]
    median, most = 100 * statistics.median(errors), 100 * max(errors)
    summary = f"median |error| {median:.1f} %, max {most:.1f} %"
    assert f"In-sample: {summary}" in found.string


@needs_shared(FSDP_RUNS)
def test_mpt_errors_are_the_readme_errors() -> None:
    """The MPT section's median and max |error| are what validating fsdp_runs.json gives."""
    found = _inline(r"#+ MPT's FSDP runs \(`planner ([^`]*)`\)")
    rows = json.loads("\n".join(_printed(cli(*found.group(1).split(), "--json"))))["runs"]
    errors = [abs(r["error"]) for r in rows]
    median, most = 100 * statistics.median(errors), 100 * max(errors)
    assert f"median |error| {median:.1f} %, max {most:.1f} %" in " ".join(found.string.split())


def test_sweep_is_the_readme_sweep(tmp_path: Path) -> None:
    """The bundled sweep's summary at 80 columns: every point, the best one, its plan, step
    and cost (run in a scratch folder, where it writes its table)."""
    found = _inline(r"`COLUMNS=(\d+) planner (sweep\s+\S+\s+--out\s+\S+)` \(\d+ s\):")
    shown = _block_after(found.group(0)).rstrip("\n").split("\n")
    args = found.group(2).split()
    args[1] = str(REPO / args[1])
    done = cli(*args, cwd=tmp_path, columns=int(found.group(1)), timeout=300)
    _shown(shown, _printed(done))
    assert (tmp_path / args[3]).exists()


@pytest.mark.parametrize("domain", [8, 72])
def test_codesign_rows_are_the_sweep(domain: int) -> None:
    """The co-design table's 16,384-GPU rows at 400 Gb/s (the headline comparison, about 3 s
    each): each re-solved from the bundled sweep file, its plan, step, MFU, days and cost as
    docs/codesign.md shows them (the whole sweep, 16 points, takes a minute and is not re-run)."""
    from planner.sweep import read_sweep, sweep_points
    from planner.sweep.run import solve_point

    found = _inline(r"`planner sweep (instances/sweeps/llama3\.1-\S+) --out")
    sweep = read_sweep(REPO / found.group(1))
    point = next(p for p in sweep_points(sweep) if p.cluster.num_devices == 16384
                 and p.cluster.scale_up_devices == domain
                 and p.cluster.network[1].bandwidth_gb_s == 50)  # fmt: skip
    row = solve_point(point, sweep.tokens)
    rows = [line.split(" | ") for line in DOCS.splitlines()
            if line.startswith(f"| 16,384 | {domain} | 400 Gb/s |")]  # fmt: skip
    assert len(rows) == 1
    _, _, _, plan, step, band, _, mfu, days, cost = rows[0]
    assert all(word in row.summary for word in plan.replace(",", "").split())
    assert (step, band, mfu) == (f"{row.step_time_s:.2f}", row.error_band.removeprefix("+/- "),
                                 f"{100 * row.mfu:.1f} %")  # fmt: skip
    assert days == f"{row.time_to_train_s / 86400:.0f}"
    assert cost == f"${row.cost / 1e6:.1f}M |"


def test_calibrate_network_is_the_readme_fit() -> None:
    """The nccl-tests sample's fit of the NVLink bridge, as docs/calibrate-network.md shows it
    at 80 columns."""
    args, shown = _shell_command(_block_starting("$ planner calibrate-network").splitlines())
    _shown(shown, _printed(cli(*args, columns=80)))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="planner bench and profile need PyTorch (the test extra has it)")
def test_the_readme_workflow_runs_on_the_cpu(tmp_path: Path) -> None:
    """The README's workflow on this machine's CPU, as written (in a folder of its own, the
    repository's tests/ beside it): bench, profile, then a solve that says it priced the
    layers from the profile."""
    block = _block_after("**2b. Profile the layers**")
    (tmp_path / "tests").symlink_to(REPO / "tests")
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True,
        text=True, timeout=600, check=False,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "COLUMNS": "80",
             "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tiny.profile.json").exists()
    said = " ".join(done.stdout.split())
    # every layer kind read from the profile (measured, or held past the measured
    # microbatches), none left to the model's own price
    assert "profile: embedding: " in said and "optimizer: measured" in said
    assert "dense: measured (tp1" in said or "dense: from the profile (tp1" in said
    assert "priced by the model" not in said
