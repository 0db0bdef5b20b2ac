"""The ``planner`` command line: parses, calls the library, prints. Nothing else.

Every :class:`~planner.errors.PlannerError` becomes one ``error:`` message on stderr, wrapped
at words to the terminal's width (its ways out as a list, :mod:`planner.cli.messages`), and
exit code 2.
"""

from __future__ import annotations

import sys
import traceback

from planner.cli import bench, explain, inputs, plans, profile, runs, sweeps
from planner.cli.app import app, stderr_console
from planner.cli.messages import format_message
from planner.errors import PlannerError

COMMANDS = (inputs, plans, sweeps, explain, runs, bench, profile)
"""The modules whose import registers the commands on :data:`app`."""


def main() -> None:
    """Entry point. A PlannerError is one ``error:`` message and exit code 2; so is a command
    line that does not parse (click's usage errors, recognised by their interface because
    typer may vendor its own click); a group named without its command, the group's help and
    exit code 2. ``--debug``, anywhere, shows the traceback instead, with the same code."""
    args = sys.argv[1:]
    debug = "--debug" in args
    try:
        # Without standalone mode click returns a command's typer.Exit code rather than
        # exiting with it (click/core.py, Command.main): a sweep's Ctrl-C exited 0.
        code = app(_spelled_as_commands([a for a in args if a != "--debug"]),
                   prog_name="planner", standalone_mode=False)
    except PlannerError as exc:
        if debug:
            _traceback_and_fail()
        _fail(str(exc))
    except Exception as exc:
        message = getattr(exc, "format_message", None)
        if message is None:
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help, laid out
            print(message(), file=sys.stderr)
            sys.exit(2)
        if debug:
            _traceback_and_fail()
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        # click lays some out on lines of their own ("Choose from:\n\tmodel,\n\tcluster")
        _fail(f"{where}{' '.join(message().split())}")
    else:
        if isinstance(code, int) and code:
            sys.exit(code)


def _spelled_as_commands(args: list[str]) -> list[str]:
    """``calibrate network ...`` as ``calibrate-network ...``: the two-word spelling reads as
    the command it names, but ``calibrate`` takes run files as its arguments, so a
    sub-command there would make ``calibrate runs.json`` ambiguous."""
    if args[:2] == ["calibrate", "network"]:
        return ["calibrate-network", *args[2:]]
    return args


def _traceback_and_fail() -> None:
    """``--debug``: the traceback of the error being handled, and the exit code the error
    has without it (2), so that a script sees the same status either way."""
    traceback.print_exc()
    sys.exit(2)


def _fail(message: str) -> None:
    """``error: message`` on stderr, laid out for the terminal, and exit code 2."""
    print(format_message("error:", message, width=stderr_console().width), file=sys.stderr)
    sys.exit(2)


__all__ = ["app", "main"]
