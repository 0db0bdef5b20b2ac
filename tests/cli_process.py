"""``planner ARGS`` in a process of its own, as a user runs it, without starting Python and
importing the CLI for each command.

Each command runs in a child forked from a server that imported :mod:`planner.cli` once
(multiprocessing's forkserver, one per test worker): the child has its own working
directory, environment, standard output and error (file descriptors 1 and 2, written to
files) and exit code, as ``python -m planner.cli ARGS`` has, and an exception it does not
catch prints its traceback there and exits 1 (``tests/test_cli_process.py`` holds it to a
fresh interpreter). Starting an interpreter and importing the CLI took ~1 s a command
(numpy, networkx, pydantic and the library's models), more than most commands themselves,
and the suite runs hundreds of them; a forked one starts in ~0.15 s.

What a child does not see afresh is what happens at import, before its command line and
environment are set: the CLI reads neither then (``COLUMNS`` and ``OMP_NUM_THREADS`` are
read when a console is made and when PyTorch is imported, both inside a command, which is
why PyTorch is not preloaded). The tests of import itself (the base install without
PyTorch, the plotting libraries left unloaded, the hash seed) start a fresh interpreter.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(["planner.cli", "tests.cli_process"])


def cli(*args: str | Path, columns: int | None = 200, cwd: Path = REPO,
        env: Mapping[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``planner ARGS`` from ``cwd`` in a terminal ``columns`` wide (``None``: the
    environment's ``COLUMNS``, if any), with ``env`` added to this process's environment.

    >>> done = cli("estimate", "nowhere.json", "nowhere.json")
    >>> done.returncode, done.stdout, done.stderr.startswith("error: ")
    (2, '', True)
    """
    argv = [str(a) for a in args]
    environ = {**os.environ, **(env or {})}
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    with tempfile.TemporaryDirectory() as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        child = _SERVER.Process(target=_command, args=(argv, str(cwd), environ, str(out),
                                                       str(err)))  # fmt: skip
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["planner", *argv], timeout)
        return subprocess.CompletedProcess(["planner", *argv], child.exitcode,
                                           out.read_text(), err.read_text())  # fmt: skip


def _command(argv: list[str], cwd: str, environ: dict[str, str], out: str, err: str) -> None:
    """The child: the command line, directory and environment set, its standard output and
    error pointed at ``out`` and ``err``, then the CLI's ``main`` with its exit code."""
    from planner.cli import main

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["planner", *argv]
    try:
        main()
    except Exception:  # as the interpreter ends on one: its traceback, exit code 1
        traceback.print_exc()
        sys.exit(1)
