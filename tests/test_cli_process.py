"""The tests' way of running a command (:func:`tests.cli_process.cli`) gives what a fresh
interpreter gives: the same standard output, standard error and exit code for a command that
succeeds, one the library refuses at the terminal's width, one that does not parse, and one
that fails with its traceback shown, from another working directory too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_process import cli
from tests.conftest import REPO

GPT3 = "instances/models/gpt3-175b.json"
A100 = "instances/clusters/dgx-a100-80gb.json"


def _fresh(*args: str, columns: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": str(columns)})  # fmt: skip


@pytest.mark.parametrize(("args", "columns"), [
    (("estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--json"), 200),
    (("estimate", GPT3, A100, "--tp", "8", "--pp", "8"), 60),  # wrapped at 60 columns
    (("solve", GPT3, A100, "--no-such-option"), 80),
], ids=["estimate", "refused", "usage"])
def test_a_command_prints_what_a_fresh_interpreter_prints(args: tuple[str, ...],
                                                          columns: int) -> None:  # fmt: skip
    forked, fresh = cli(*args, columns=columns), _fresh(*args, columns=columns, cwd=REPO)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout or forked.stderr.startswith("error: ")


def test_a_traceback_ends_as_a_fresh_interpreters(tmp_path: Path) -> None:
    """``--debug`` on a missing file from another directory: the exit code it has without
    (2: a script sees the same status) and the traceback (its frames apart) ending in the
    same exception."""
    args = ("--debug", "info", "nowhere.json")
    forked, fresh = cli(*args, cwd=tmp_path), _fresh(*args, columns=200, cwd=tmp_path)
    assert forked.returncode == fresh.returncode == 2 and forked.stdout == fresh.stdout == ""
    assert forked.stderr.startswith("Traceback (most recent call last):")
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    assert "nowhere.json" in forked.stderr.splitlines()[-1]


def test_a_bare_group_prints_its_help_laid_out() -> None:
    """``planner`` and ``planner runs`` without a command: the group's help, its lines as
    click lays them out (not one ``error:`` paragraph), on stderr with exit code 2; a usage
    error under ``--debug`` keeps its code."""
    for args in ((), ("runs",)):
        done = cli(*args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("Usage: planner") and "\nCommands:\n" in done.stderr
    assert cli("--debug", "solve", "--pp", "300", "m.json", "c.json").returncode == 2
