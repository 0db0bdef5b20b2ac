"""What every ``planner`` command shares: the typer app, consoles, argument types, reading
the inputs, printing."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console, RenderableType

from planner.cli.messages import format_message
from planner.cost import DEFAULT_MEMORY_MARGIN, MEMORY_MARGIN
from planner.errors import ConfigError, InputError
from planner.plan import files
from planner.sharding.profiled import with_profile
from planner.spec import ClusterSpec, ModelSpec
from planner.spec import limits as lim
from planner.spec.messages import short_repr
from planner.spec.physics import cluster_warnings
from planner.spec.reading import read_profile
from planner.vocabulary import Stack

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Plan how to train a transformer in parallel on a GPU/NPU cluster.",
)


def _print_version(asked: bool) -> None:
    """``--version``: the installed package's version, then exit."""
    if asked:
        from importlib.metadata import version

        print(f"planner {version('planner')}")
        raise typer.Exit()


@app.callback()
def options(
    debug: Annotated[bool, typer.Option(
        "--debug", help="On an error, show Python's traceback instead of the error: message "
        "(anywhere on the command line).")] = False,
    show_version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the planner's version and exit.")] = False,
) -> None:
    """Plan how to train a transformer in parallel on a GPU/NPU cluster."""
    # planner.cli.main takes --debug off the command line wherever it is; it is declared here
    # so that --help lists it.


def console() -> Console:
    """The console on stdout, made for each command: its width is the terminal's, else
    ``COLUMNS``, else 80, as they are when the command runs."""
    return Console()


def stderr_console() -> Console:
    """The console on stderr (the progress bars), made as :func:`console` is."""
    return Console(stderr=True)


ModelArg = Annotated[Path, typer.Argument(help="model.json or a Hugging Face config.json")]
ClusterArg = Annotated[Path, typer.Argument(help="cluster.json")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", help="Override num_nodes.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
def _margin_default() -> str:
    """``--memory-margin``'s default in words, read off the stacks' margins."""
    by_share: dict[float, list[str]] = {}
    for stack, share in MEMORY_MARGIN.items():
        if share != DEFAULT_MEMORY_MARGIN:
            by_share.setdefault(share, []).append(stack)
    own = ", ".join(f"{100 * share:g} % for {' and '.join(stacks)}"
                    for share, stacks in sorted(by_share.items()))  # fmt: skip
    return (f"default: the stack's margin, a share of the device's memory: {own}, "
            f"{100 * DEFAULT_MEMORY_MARGIN:g} % for the others")


MARGIN_DEFAULT = _margin_default()
"""What ``--memory-margin`` is when not given (:data:`planner.cost.memory.MEMORY_MARGIN`)."""


def print_json(data: Any) -> None:
    """``data`` as indented JSON with sorted keys on stdout."""
    print(json.dumps(data, indent=2, sort_keys=True))


def render(renderables: list[RenderableType]) -> None:
    """Rich renderables on stdout, one after another."""
    out = console()
    for renderable in renderables:
        out.print(renderable)


def note(message: str) -> None:
    """``note: message`` on stderr, wrapped at words to the terminal's width."""
    print(format_message("note:", message, width=stderr_console().width), file=sys.stderr)


def warning(message: str) -> None:
    """``warning: message`` on stderr, wrapped at words to the terminal's width."""
    print(format_message("warning:", message, width=stderr_console().width), file=sys.stderr)


ProfileOpt = Annotated[Path | None, typer.Option(
    "--profile", help="A layer profile of this model on the cluster's device (planner "
    "profile): its layers' measured compute and kept bytes price the plan.")]


def load_inputs(
    model: Path, cluster: Path, *, nodes: int | None, names: tuple[str, str] = ("MODEL", "CLUSTER"),
    profile: Path | None = None,
) -> tuple[ModelSpec, ClusterSpec]:
    """The model and the cluster (:func:`planner.plan.files.load_inputs`), with a warning on
    stderr for each figure of the cluster that is possible but unlikely
    (:func:`planner.spec.physics.cluster_warnings`); with ``profile``, the layer profile set
    beside the cluster (:func:`planner.sharding.profiled.with_profile`)."""
    model_spec, cluster_spec = files.load_inputs(model, cluster, nodes=nodes, names=names)
    for message in cluster_warnings(cluster_spec, source=str(cluster)):
        warning(message)
    if profile is not None:
        try:
            cluster_spec = with_profile(cluster_spec, model_spec, read_profile(profile))
        except InputError as exc:
            # the reader's messages start with the path already
            raise InputError(f"--profile {profile}: {str(exc).removeprefix(f'{profile}: ')}"
                             ) from None  # fmt: skip
    return model_spec, cluster_spec


def check_profile_stack(cluster: ClusterSpec, stack: Stack) -> None:
    """Refuse a layer profile measured on another stack than the one priced."""
    profile = cluster.device.efficiency.profile
    if profile is not None and profile.stack != stack:
        raise InputError(f"--profile: the layers were measured on {profile.stack}; this run is "
                         f"priced on {stack}, whose layers run other code: price with --stack "
                         f"{profile.stack}, or drop --profile")  # fmt: skip


OPTION_LIMITS: dict[str, tuple[int | float, str]] = {
    "--seq-len": (lim.MAX_SEQ_LENGTH, lim.reason("seq_len")),
    "--global-batch": (lim.MAX_GLOBAL_BATCH_SIZE, lim.reason("global_batch")),
    "--mbs": (lim.MAX_MICRO_BATCH_SIZE, lim.reason("mbs")),
    "--microbatches": (lim.MAX_GLOBAL_BATCH_SIZE, lim.reason("num_microbatches")),
    "--in-flight": (lim.MAX_GLOBAL_BATCH_SIZE, "in-flight microbatches are part of the batch"),
    "--budget-gib": (lim.MAX_DEVICE_MEMORY_GIB, lim.reason("memory_gib")),
    "--time-limit": (lim.MAX_TIME_LIMIT_S, lim.reason("time_limit")),
}
"""The numeric options the library takes without a spec to bound them, and their limits."""


def check_options(values: Mapping[str, int | float | None]) -> None:
    """Refuse an option (keyed as typed, ``--seq-len``) that is negative, NaN or past its
    limit in :data:`OPTION_LIMITS`; None means not given."""
    for option, value in values.items():
        if value is None:
            continue
        if isinstance(value, float) and math.isnan(value):
            raise InputError(f"{option} must be a number, got nan")
        if value < 0:
            raise InputError(f"{option} must not be negative, got {value}")
        limit, why = OPTION_LIMITS[option]
        message = lim.check_at_most(option, value, limit, why=why)
        if message is not None:
            raise InputError(message)


def option_error(exc: ValidationError) -> ConfigError:
    """A configuration built from options that pydantic refused, as one line naming the
    option as typed and, for a limit, the limit and its reason."""
    err = exc.errors()[0]
    if not err["loc"]:  # a rule between fields: its message names them
        return ConfigError(err["msg"].removeprefix("Value error, "))
    name = str(err["loc"][0])
    option = "--" + name.replace("_", "-")
    limit = err.get("ctx", {}).get("le")
    if err["type"] == "less_than_equal" and limit is not None:
        return ConfigError(lim.check_at_most(option, err["input"], limit) or err["msg"])
    # a field's own check says it in its words (pydantic's "Value error, " prefix dropped)
    said = err["msg"].removeprefix("Value error, ") if err["type"] == "value_error" else (
        err["msg"].lower())
    return ConfigError(f"{option} {short_repr(err['input'])}: {said}")
