"""The commands that make and read plans: solve, compare, simulate, export."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from planner import report, search
from planner.cli.app import (
    ClusterArg,
    JsonOpt,
    ModelArg,
    NodesOpt,
    app,
    console,
    print_json,
    render,
    stderr,
)
from planner.compare import METHODS, Method, compare
from planner.compare import to_json as compare_json
from planner.config import ParallelConfig
from planner.errors import InputError
from planner.estimate import estimate
from planner.export import FORMATS, Export, Format, Price, export
from planner.ilp.backends import Backend
from planner.output import check_folder, check_target, write_atomic
from planner.pipeline.simulate import simulate_plan
from planner.plan import Plan
from planner.reading import load_cluster, load_model, read_text
from planner.search import ProgressFn, SolveOptions
from planner.spec import ClusterSpec, ModelSpec

DEFAULTS = SolveOptions()


GlobalBatchOpt = Annotated[int | None, typer.Option(min=1, help="Global batch size.")]
SeqLenOpt = Annotated[int | None, typer.Option(min=1, help="Sequence length.")]
PrecisionOpt = Annotated[
    Literal["bf16", "fp16", "fp32"] | None, typer.Option(help="Compute precision.")
]
BackendOpt = Annotated[Backend, typer.Option(help="ILP solver (ilp only).")]
TimeLimitOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="Seconds the whole search may take (per method); past it the best plan so far "
        "is returned with status time_limit and its gap.",
    ),
]
IlpTimeLimitOpt = Annotated[
    float, typer.Option(min=0.001, help="Seconds each layer ILP may take (ilp only).")
]
SEARCH_TIME_LIMIT_S = 600.0
"""The default bound on a search from the command line: no bundled instance takes a fifth of
it, and a user who forgot a huge cluster gets a plan and its gap rather than a hang."""


def _problem(
    model: Path,
    cluster: Path,
    nodes: int | None,
    global_batch: int | None,
    seq_len: int | None,
    precision: str | None,
    backend: Backend,
    time_limit: float | None,
    ilp_time_limit: float,
) -> tuple[ModelSpec, ClusterSpec, SolveOptions]:
    """The inputs and options that ``solve`` and ``compare`` share, with the same meaning."""
    options = SolveOptions(global_batch_size=global_batch, seq_length=seq_len,
                           precision=precision, backend=backend,  # type: ignore[arg-type]
                           time_limit_s=time_limit, ilp_time_limit_s=ilp_time_limit)  # fmt: skip
    return load_model(model), load_cluster(cluster, nodes), options


@app.command("solve")
def solve_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    precision: PrecisionOpt = None,
    method: Annotated[
        Method,
        typer.Option(
            help="ilp: the ILP + dynamic-program search; heuristic: Megatron's rule of thumb; "
            "grid: every uniform configuration."
        ),
    ] = "ilp",
    backend: BackendOpt = DEFAULTS.backend,
    time_limit: TimeLimitOpt = SEARCH_TIME_LIMIT_S,
    ilp_time_limit: IlpTimeLimitOpt = DEFAULTS.ilp_time_limit_s,
    out: Annotated[Path | None, typer.Option(help="Also write the plan (JSON).")] = None,
    export_fmt: Annotated[
        Format | None,
        typer.Option("--export", help="Also print the plan as this framework's launch flags."),
    ] = None,
    report_dir: Annotated[
        Path | None,
        typer.Option("--report", help="Write the plan's pictures (PNG and SVG) here."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Find the fastest parallel plan that fits: stages, sharding, memory and time."""
    if as_json and export_fmt is not None:
        raise InputError("--export and --json do not mix (stdout holds one plan JSON); write "
                         "the plan with --out and run `planner export` on it")  # fmt: skip
    model_spec, cluster_spec, options = _problem(
        model, cluster, nodes, global_batch, seq_len, precision, backend, time_limit,
        ilp_time_limit,
    )
    if out is not None:
        check_target(out, inputs=(model, cluster))
    if report_dir is not None:
        check_folder(report_dir, option="--report")
    if as_json:
        plan = METHODS[method](model_spec, cluster_spec, options)
    else:
        with _search_bar() as bar:
            plan = METHODS[method](model_spec, cluster_spec, options, progress=bar(method))
    if out is not None:
        write_atomic(out, plan.to_json(), inputs=(model, cluster))
    if report_dir is not None:
        from planner.report import figures  # matplotlib loads only when pictures are asked

        _wrote(figures.write_report(plan, report_dir))
    if as_json:
        print(plan.to_json(), end="")
        return
    render(report.plan_tables(plan))
    if export_fmt is not None:
        result = export(plan, export_fmt, price=_pricer(model_spec, cluster_spec))
        console.rule(f"{export_fmt} launch configuration", align="left")
        print(result.text, end="" if result.text.endswith("\n") else "\n")
        _print_changes(plan, result)


@app.command("compare")
def compare_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    precision: PrecisionOpt = None,
    methods: Annotated[
        str, typer.Option(help=f"Comma-separated methods among {', '.join(METHODS)}.")
    ] = "ilp,heuristic,grid",
    backend: BackendOpt = DEFAULTS.backend,
    time_limit: TimeLimitOpt = SEARCH_TIME_LIMIT_S,
    ilp_time_limit: IlpTimeLimitOpt = DEFAULTS.ilp_time_limit_s,
    plot: Annotated[
        Path | None, typer.Option(help="Also draw the methods as a bar chart (.png or .svg).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan the same problem with several methods and show them side by side."""
    model_spec, cluster_spec, options = _problem(
        model, cluster, nodes, global_batch, seq_len, precision, backend, time_limit,
        ilp_time_limit,
    )
    names = [m.strip() for m in methods.split(",") if m.strip()]
    if plot is not None:
        from planner.report import figures

        figures.check_picture(plot, inputs=(model, cluster), option="--plot")
    if as_json:
        results = compare(model_spec, cluster_spec, options, names)
    else:
        with _search_bar() as bar:
            results = compare(model_spec, cluster_spec, options, names, progress=bar)
    if plot is not None:
        devices = cluster_spec.num_devices
        title = f"{model_spec.name} on {devices:,} x {cluster_spec.device.name}"
        _wrote([figures.save(figures.compare_figure(results, title), plot, option="--plot")])
    if as_json:
        print_json(compare_json(results))
    else:
        render(report.compare_tables(results))


@app.command("simulate")
def simulate_cmd(
    plan_file: Annotated[Path, typer.Argument(help="plan.json")],
    gantt: Annotated[
        Path | None, typer.Option(help="Draw the schedule's Gantt chart (.png or .svg).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Simulate a plan's step op by op and set it against the plan's closed-form prediction."""
    if gantt is not None:
        from planner.report import figures

        figures.check_picture(gantt, inputs=(plan_file,), option="--gantt")
    plan = Plan.from_json(read_text(plan_file), source=str(plan_file))
    simulation = simulate_plan(plan)
    if gantt is not None:
        from planner.report.gantt import draw_gantt

        draw_gantt(simulation, gantt)
        _wrote([gantt])
    if as_json:
        print_json(report.simulation_json(plan, simulation))
    else:
        render(report.simulation_tables(plan, simulation))


def _wrote(paths: Sequence[Path]) -> None:
    """Say on stderr which pictures were written."""
    folders = sorted({str(p.parent) for p in paths})
    names = ", ".join(p.name for p in paths)
    print(f"wrote {names} in {', '.join(folders)}", file=sys.stderr)


@contextmanager
def _search_bar() -> Iterator[Callable[[str], ProgressFn]]:
    """Transient progress bars on stderr, one per method searched, each fed by its search's
    progress callback."""
    bar = Progress(TextColumn("searching ({task.description})"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[best]}"),
                   TextColumn("{task.fields[searching]}"), console=stderr, transient=True,
                   # Not on a terminal (a log, a pipe) a bar only leaves a blank line behind.
                   disable=not stderr.is_terminal)  # fmt: skip
    with bar:

        def start(method: str) -> ProgressFn:
            task = bar.add_task(method, total=None, best="", searching="")

            def update(p: search.Progress) -> None:
                best = f"best {p.best_step_s:.3f} s" if p.best_step_s is not None else ""
                bar.update(task, completed=p.done, total=p.total, best=best,
                           searching=p.searching)  # fmt: skip

            return update

        yield start


def _pricer(model: ModelSpec, cluster: ClusterSpec) -> Price:
    """The step time of an exported plan's closest expressible configuration."""

    def price(config: ParallelConfig) -> float:
        return estimate(model, cluster, config).step_time_s

    return price


def _print_changes(plan: Plan, result: Export) -> None:
    """What an export could not express, and its price, on stderr."""
    for change in result.changes:
        print(f"note: {change}", file=sys.stderr)
    if result.changes and result.changed_step_time_s is not None:
        print(f"note: the exported configuration is predicted at "
              f"{result.changed_step_time_s:.3f} s per step (the plan: "
              f"{plan.predicted.step_time_s:.3f} s)", file=sys.stderr)  # fmt: skip


@app.command("export")
def export_cmd(
    plan_file: Annotated[Path, typer.Argument(help="plan.json")],
    fmt: Annotated[str, typer.Option("--format", help=f"One of {', '.join(FORMATS)}.")],
    out: Annotated[Path | None, typer.Option(help="Write to this file.")] = None,
    model: Annotated[
        Path | None, typer.Option(help="The plan's model, to price any change.")
    ] = None,
    cluster: Annotated[Path | None, typer.Option(help="The plan's cluster, likewise.")] = None,
) -> None:
    """The plan as a framework's launch configuration; what it cannot express goes to stderr."""
    if out is not None:
        check_target(out, inputs=(plan_file, model, cluster))
    plan = Plan.from_json(read_text(plan_file), source=str(plan_file))
    price = None
    if model is not None and cluster is not None:
        price = _pricer(load_model(model), load_cluster(cluster, plan.cluster.num_nodes))
    result = export(plan, fmt, price=price)
    if out is None:
        print(result.text, end="" if result.text.endswith("\n") else "\n")
    else:
        write_atomic(out, result.text, inputs=(plan_file, model, cluster))
    _print_changes(plan, result)
