"""The package's layout follows the data flow of ARCHITECTURE.md: no import cycles, and no
module imports from a step later in the flow (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import planner

ROOT = Path(planner.__file__).parent
FLOW = ("vocabulary", "errors", "spec", "plan", "graph", "cost", "sharding", "placement", "ilp",
        "pipeline", "frameworks", "options", "uniform", "search", "baselines", "diagnose", "sweep",
        "simulate", "report", "cli")  # fmt: skip
"""The steps from first to last (ARCHITECTURE.md, "Layout"); the package itself is last."""


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Modules of the package and the package modules each imports, wherever the import is."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]  # fmt: skip
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def step(module: str) -> int:
    """The module's step in :data:`FLOW` (the package itself comes after every step)."""
    parts = module.split(".")
    return len(FLOW) if len(parts) == 1 else FLOW.index(parts[1])


def test_every_top_level_name_is_a_step() -> None:
    """Each module or package under planner/ is one of the steps (a new one is placed in the
    flow on purpose)."""
    names = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert names == set(FLOW)


def test_no_import_cycles() -> None:
    """No two modules import each other, directly or around a loop."""
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == []


def test_nothing_imports_from_a_later_step() -> None:
    """A step uses only itself and the steps before it."""
    upward = [(a, b) for a, b in import_graph().edges if step(b) > step(a)]
    assert upward == []


def test_the_graph_sees_function_level_imports() -> None:
    """The checks would catch an import hidden inside a function: the graph has the edge
    that the CLI's lazy import of the figures makes."""
    assert import_graph().has_edge("planner.cli.plans", "planner.report.figures")
