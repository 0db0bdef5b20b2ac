"""The code base stays ruff-clean, and its records say what each field is: lint and these
checks run with the tests so CI enforces them."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: install the test extra, pip install -e '.[test]'")
    return [found]


def test_ruff_clean() -> None:
    """`ruff check` finds nothing in the package, tests and benchmarks."""
    result = subprocess.run(
        [*_ruff(), "check", "planner", "tests", "benchmarks"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


POSITIONAL_VALUES = {"Tensor", "LogicalMesh"}
"""Small values built positionally, as tuples are (their docstrings say so)."""


def _dataclasses() -> list[tuple[str, ast.ClassDef, str]]:
    """Every dataclass of the package: its file, its class and its decorator's source."""
    found = []
    for path in sorted((REPO / "planner").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for decorator in node.decorator_list:
                    source = ast.unparse(decorator)
                    if source.startswith("dataclass"):
                        found.append((str(path.relative_to(REPO)), node, source))
    return found


def test_records_are_keyword_only() -> None:
    """Every dataclass but the positional values is built with named fields (``kw_only``), so
    code that composes records cannot swap two of them."""
    loose = [f"{f}:{c.name}" for f, c, source in _dataclasses()
             if "kw_only=True" not in source and c.name not in POSITIONAL_VALUES]  # fmt: skip
    assert len(_dataclasses()) > 50
    assert loose == []


def test_every_field_has_a_docstring() -> None:
    """Every dataclass field is followed by its docstring (what it is, in which unit)."""
    bare = []
    for f, cls, _ in _dataclasses():
        for i, statement in enumerate(cls.body):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                after = cls.body[i + 1] if i + 1 < len(cls.body) else None
                documented = (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                              and isinstance(after.value.value, str))  # fmt: skip
                if not documented:
                    bare.append(f"{f}:{cls.name}.{statement.target.id}")
    assert bare == []

