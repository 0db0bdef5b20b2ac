"""Outputs: written atomically with the usual permissions, never over an input, and a bad
target refused before the search that would fill it."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.report.output import check_folder, write_atomic
from tests.cli_process import cli
from tests.test_cli import _assert_one_line_error


def test_write_atomic_leaves_no_temporary_file_and_usual_permissions(tmp_path: Path) -> None:
    """The rename leaves only the file, readable by others as the umask allows (mkstemp's
    private 0600 would not be), and replacing a file keeps no trace of the old one."""
    target = tmp_path / "plan.json"
    target.write_text("old, and longer than the new text")
    write_atomic(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    write_atomic(tmp_path / "picture.png", b"\x89PNG")
    assert (tmp_path / "picture.png").read_bytes() == b"\x89PNG"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_folder_is_refused(tmp_path: Path) -> None:
    """A folder without write permission: refused with the folder named."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(InputError, match="is not writable"):
            write_atomic(locked / "plan.json", "x")
    finally:
        locked.chmod(0o700)


def test_report_folder_must_not_be_a_file(tmp_path: Path) -> None:
    """``--report`` names a folder: an existing file is refused, a missing one is fine."""
    existing = tmp_path / "file"
    existing.write_text("x")
    with pytest.raises(InputError, match=r"--report .*: is a file; give a folder"):
        check_folder(existing, option="--report")
    check_folder(tmp_path / "new" / "deeper", option="--report")


DEEPSEEK = "instances/models/deepseek-v3.json"
H100 = "instances/clusters/dgx-h100-80gb.json"
"""Its search takes a minute and a half: a refusal well under that came before the search."""


@pytest.mark.parametrize(
    ("option", "target", "needle"),
    [
        ("--out", "nowhere/plan.json", "does not exist"),
        ("--out", ".", "is a directory"),
        ("--out", DEEPSEEK, "is one of the inputs"),
        ("--report", "README.md", "is a file"),
    ],
)
def test_solve_refuses_a_bad_target_before_searching(option: str, target: str, needle: str) -> None:
    """A target the search's plan could not be written to is refused at once, not after the
    search, and the input is untouched."""
    before = Path(DEEPSEEK).read_bytes()
    started = time.perf_counter()
    done = cli("solve", DEEPSEEK, H100, option, target, "--json")
    _assert_one_line_error(done, option, needle)
    assert time.perf_counter() - started < 30.0
    assert Path(DEEPSEEK).read_bytes() == before
