"""What every ``planner`` command shares: the typer app, consoles, argument types, printing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Plan how to train a transformer in parallel on a GPU/NPU cluster.",
)
console = Console()
stderr = Console(stderr=True)

ModelArg = Annotated[Path, typer.Argument(help="model.json or a Hugging Face config.json")]
ClusterArg = Annotated[Path, typer.Argument(help="cluster.json")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", help="Override num_nodes.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def print_json(data: Any) -> None:
    """``data`` as indented JSON with sorted keys on stdout."""
    print(json.dumps(data, indent=2, sort_keys=True))


def render(renderables: list[RenderableType]) -> None:
    """Rich renderables on stdout, one after another."""
    for renderable in renderables:
        console.print(renderable)
