"""Messages on stderr as a user reads them: wrapped at words to the terminal's width, the ways
out of an error that lists them as an indented list, a command to run on lines of its own.

The library says everything in one line (``str(exc)``); this module only lays it out. What it
relies on in the library's messages (:mod:`planner.uniform.remedies` and
:mod:`planner.uniform.failure`, pinned by ``tests/test_cli_width.py``):

- the clauses of a message are joined by ``"; "`` outside parentheses, and each way out of a
  search that found nothing starts a clause with one of :data:`WAY_OUT` (a clause that starts
  otherwise continues the one before it);
- ``planner estimate``'s remedies follow ``"; would fit: "`` and ``"; would not fit: "``, one
  remedy each, joined by ``", "`` outside parentheses;
- a command to run ends the message, after ``": "`` (``solve for it: planner solve ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from planner.report.width import INDENT, wrap

WAY_OUT = re.compile(
    r"a uniform configuration fits:|add nodes:|more nodes alone do not help|"
    r"optimizer offload to the CPU|a shorter sequence|the pin --\S+ \S+ prevents a fit:"
)
"""How each way out of :func:`planner.uniform.leanest.infeasible_message` (and each pin in
the way, :mod:`planner.uniform.failure`) starts its clause."""
HEADINGS = ("would fit", "would not fit")
"""The lists of :func:`planner.uniform.remedies.config_infeasible_message`."""
COMMAND = re.compile(r"^(?P<text>.*?): (?P<command>planner [a-z]+ \S.*)$")
"""A message that ends with the command that would do what it asks."""


@dataclass(slots=True, kw_only=True)
class _Section:
    """A list under an optional heading."""

    heading: str | None
    """``would fit:`` and the like, or None for the ways out of a search."""
    items: list[str] = field(default_factory=list)
    """One entry per line, printed with a dash."""


def format_message(prefix: str, message: str, *, width: int) -> str:
    """``prefix`` (``error:``, ``note:``) and ``message`` laid out for a terminal ``width``
    wide: the message's head wrapped at words, its ways out (if it lists them) one per line
    as an indented list, and a command that ends it on lines of its own."""
    command = None
    found = COMMAND.match(message)
    if found is not None:
        message, command = found["text"] + ":", found["command"]
    head, sections = split_ways_out(message)
    lines = wrap(head, width, first=f"{prefix} ")
    for section in sections:
        bullet = INDENT
        if section.heading is not None:
            lines.append(f"{INDENT}{section.heading}:")
            bullet = INDENT * 2
        for item in section.items:
            lines += wrap(item, width, first=f"{bullet}- ", indent=f"{bullet}  ")
    if command is not None:
        lines += command_lines(command, width, indent=INDENT * 2)
    return "\n".join(lines)


def split_ways_out(message: str) -> tuple[str, list[_Section]]:
    """The message's head and its lists of ways out (none when it lists none)."""
    clauses = _split_outside_parentheses(message, "; ")
    head = [clauses[0]]
    sections: list[_Section] = []
    for clause in clauses[1:]:
        heading = next((h for h in HEADINGS if clause.startswith(f"{h}: ")), None)
        if heading is not None:
            items = _split_outside_parentheses(clause.removeprefix(f"{heading}: "), ", ")
            sections.append(_Section(heading=heading, items=items))
        elif WAY_OUT.match(clause):
            if not sections or sections[-1].heading is not None:
                sections.append(_Section(heading=None))
            sections[-1].items.append(clause)
        elif sections and sections[-1].items:
            sections[-1].items[-1] += f"; {clause}"
        else:
            head.append(clause)
    return "; ".join(head), sections


def command_lines(command: str, width: int, *, indent: str) -> list[str]:
    """A shell command in lines of at most ``width`` cells, broken before an option (or
    between arguments) with a backslash, so that it still runs when pasted."""
    words = command.split(" ")
    # An option and its value stay together: "--nodes 1".
    groups: list[str] = []
    for word in words:
        if groups and groups[-1].startswith("--") and " " not in groups[-1] \
                and not word.startswith("--"):  # fmt: skip
            groups[-1] += f" {word}"
        else:
            groups.append(word)
    lines = [indent + groups[0]]
    for group in groups[1:]:
        if len(lines[-1]) + 1 + len(group) + 2 <= width:
            lines[-1] += f" {group}"
        else:
            lines[-1] += " \\"
            lines.append(indent + INDENT + group)
    return lines


def _split_outside_parentheses(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` where no parenthesis, bracket or brace is open."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        char = text[i]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    parts.append(text[start:])
    return parts
