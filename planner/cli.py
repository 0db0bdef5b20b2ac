"""The ``planner`` command line: parses, calls the library, prints. Nothing else.

Every :class:`~planner.errors.PlannerError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import ValidationError
from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from planner import report, search
from planner.baselines import grid_plan, heuristic_plan
from planner.calibration import calibrate_file, validate
from planner.config import ParallelConfig
from planner.errors import ConfigError, InfeasibleError, InputError, PlannerError
from planner.estimate import estimate
from planner.export import FORMATS, Export, Format, Price, export
from planner.ilp import SolverOptions, build_layer_milp, layer_problem, layer_query, solve_layer
from planner.ilp.backends import Backend
from planner.info import model_info
from planner.output import write_atomic
from planner.plan import Plan
from planner.search import ProgressFn, SolveOptions, solve
from planner.spec import ClusterSpec, ModelSpec, json_schema, load_cluster, load_model, read_text
from planner.uniform import uniform_plan

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


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _render(renderables: list[RenderableType]) -> None:
    for renderable in renderables:
        console.print(renderable)


Method = Literal["ilp", "heuristic", "grid"]
SOLVERS: dict[str, Callable[..., Plan]] = {
    "ilp": solve,
    "heuristic": heuristic_plan,
    "grid": grid_plan,
}
"""Each ``--method``: a function ``(model, cluster, options, *, progress) -> Plan``."""
DEFAULTS = SolveOptions()


@app.command("solve")
def solve_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    global_batch: Annotated[int | None, typer.Option(min=1, help="Global batch size.")] = None,
    seq_len: Annotated[int | None, typer.Option(min=1, help="Sequence length.")] = None,
    precision: Annotated[
        Literal["bf16", "fp16", "fp32"] | None, typer.Option(help="Compute precision.")
    ] = None,
    method: Annotated[
        Method,
        typer.Option(
            help="ilp: the ILP + dynamic-program search; heuristic: Megatron's rule of thumb; "
            "grid: every uniform configuration."
        ),
    ] = "ilp",
    backend: Annotated[Backend, typer.Option(help="ILP solver (ilp only).")] = DEFAULTS.backend,
    time_limit: Annotated[
        float, typer.Option(min=0.0, help="Time limit per layer ILP, seconds (ilp only).")
    ] = DEFAULTS.time_limit_s,
    out: Annotated[Path | None, typer.Option(help="Also write the plan (JSON).")] = None,
    export_fmt: Annotated[
        Format | None,
        typer.Option("--export", help="Also print the plan as this framework's launch flags."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Find the fastest parallel plan that fits: stages, sharding, memory and time."""
    if as_json and export_fmt is not None:
        raise InputError("--export and --json do not mix (stdout holds one plan JSON); write "
                         "the plan with --out and run `planner export` on it")  # fmt: skip
    model_spec = load_model(model)
    cluster_spec = load_cluster(cluster, nodes)
    options = SolveOptions(global_batch_size=global_batch, seq_length=seq_len,
                           precision=precision, backend=backend,
                           time_limit_s=time_limit)  # fmt: skip
    if as_json:
        plan = SOLVERS[method](model_spec, cluster_spec, options)
    else:
        with _search_bar(method) as progress:
            plan = SOLVERS[method](model_spec, cluster_spec, options, progress=progress)
    if out is not None:
        write_atomic(out, plan.to_json(), inputs=(model, cluster))
    if as_json:
        print(plan.to_json(), end="")
        return
    _render(report.plan_tables(plan))
    if export_fmt is not None:
        result = export(plan, export_fmt, price=_pricer(model_spec, cluster_spec))
        console.rule(f"{export_fmt} launch configuration", align="left")
        print(result.text, end="" if result.text.endswith("\n") else "\n")
        _print_changes(plan, result)


@contextmanager
def _search_bar(method: str) -> Iterator[ProgressFn]:
    """A transient progress bar on stderr, fed by the search's progress callback."""
    bar = Progress(TextColumn(f"searching ({method})"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[best]}"), console=stderr,
                   transient=True)  # fmt: skip
    with bar:
        task = bar.add_task("search", total=None, best="")

        def update(p: search.Progress) -> None:
            best = f"best {p.best_step_s:.3f} s" if p.best_step_s is not None else ""
            bar.update(task, completed=p.done, total=p.total, best=best)

        yield update


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


@app.command("estimate")
def estimate_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree.")] = 1,
    dp: Annotated[
        int | None, typer.Option(help="Data-parallel degree; default: the rest.")
    ] = None,
    cp: Annotated[int, typer.Option(help="Context-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option(help="Expert-parallel degree.")] = 1,
    vpp: Annotated[
        int, typer.Option(help="Virtual stages per device (interleaved 1F1B).")
    ] = 1,
    first_stage_layers: Annotated[
        int | None, typer.Option(help="Layers on the first stage if it differs.")
    ] = None,
    last_stage_layers: Annotated[
        int | None, typer.Option(help="Layers on the last stage if it differs.")
    ] = None,
    sp: Annotated[bool, typer.Option("--sp/--no-sp", help="Sequence parallelism.")] = False,
    mbs: Annotated[int, typer.Option(help="Microbatch size.")] = 1,
    global_batch: Annotated[int | None, typer.Option(help="Global batch size.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length.")] = None,
    recompute: Annotated[
        Literal["none", "selective", "full"], typer.Option(help="Activation recomputation.")
    ] = "none",
    zero: Annotated[int, typer.Option(help="ZeRO stage 0-3 (1 = distributed optimizer).")] = 0,
    precision: Annotated[
        Literal["bf16", "fp16", "fp32"] | None, typer.Option(help="Compute precision.")
    ] = None,
    schedule: Annotated[
        Literal["1f1b", "gpipe"], typer.Option(help="Pipeline schedule.")
    ] = "1f1b",
    flash_attention: Annotated[bool, typer.Option(help="Fused attention kernel.")] = True,
    overlap_grad_reduce: Annotated[bool, typer.Option(help="Overlap DP reduction.")] = False,
    overlap_param_gather: Annotated[bool, typer.Option(help="Overlap ZeRO gathers.")] = False,
    tp_comm_overlap: Annotated[bool, typer.Option(help="Overlap TP comm with GEMMs.")] = False,
    rank_order: Annotated[
        str, typer.Option(help="Rank numbering, fastest first (Megatron's order).")
    ] = "tp-cp-ep-dp-pp",
    out: Annotated[
        Path | None, typer.Option(help="Also write the configuration as a plan (JSON).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Price one uniform (Megatron-style) configuration: time, memory, throughput."""
    model_spec = load_model(model)
    cluster_spec = load_cluster(cluster, nodes)
    try:
        config = ParallelConfig(
            tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, sp=sp, mbs=mbs,
            first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
            global_batch=global_batch, seq_len=seq_len, recompute=recompute, zero=zero,
            precision=precision, schedule=schedule, flash_attention=flash_attention,
            overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather,
            tp_comm_overlap=tp_comm_overlap, rank_order=rank_order,
        )  # fmt: skip
    except ValidationError as exc:
        err = exc.errors()[0]
        option = "--" + str(err["loc"][0]).replace("_", "-")
        raise ConfigError(f"{option} {err['input']!r}: {err['msg'].lower()}") from None
    result = estimate(model_spec, cluster_spec, config)
    if out is not None:
        plan = uniform_plan(model_spec, cluster_spec, config)
        write_atomic(out, plan.to_json(), inputs=(model, cluster))
    if as_json:
        _print_json(result.to_dict())
    else:
        _render(report.estimate_tables(model_spec, cluster_spec, config, result))


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
    plan = Plan.from_json(read_text(plan_file), source=str(plan_file))
    price = None
    if model is not None and cluster is not None:
        price = _pricer(load_model(model), load_cluster(cluster, plan.cluster.num_nodes))
    result = export(plan, fmt, price=price)
    if out is None:
        print(result.text, end="" if result.text.endswith("\n") else "\n")
    else:
        write_atomic(out, result.text, inputs=[p for p in (plan_file, model, cluster) if p])
    _print_changes(plan, result)


@app.command("info")
def info_cmd(
    model: ModelArg,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length for FLOPs.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """What the planner understood of a model: shape, parameters, FLOPs, operator graph."""
    info = model_info(load_model(model), seq_len=seq_len)
    if as_json:
        _print_json(info)
    else:
        _render(report.info_tables(info))


@app.command("schema")
def schema_cmd(
    kind: Annotated[Literal["model", "cluster"], typer.Argument(help="model or cluster")],
) -> None:
    """Print the JSON Schema of model.json or cluster.json."""
    _print_json(json_schema(kind))


@app.command("layer")
def layer_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    kind: Annotated[str, typer.Option(help="Layer kind: dense, moe, embedding or head.")] = "dense",
    mesh: Annotated[str, typer.Option(help="Logical mesh d0xd1 (axis 1 inside a node).")] = "1x8",
    mbs: Annotated[int, typer.Option(help="Microbatch size.")] = 1,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length.")] = None,
    precision: Annotated[
        Literal["bf16", "fp16", "fp32"] | None, typer.Option(help="Compute precision.")
    ] = None,
    budget_gib: Annotated[float | None, typer.Option(help="Memory for this layer.")] = None,
    in_flight: Annotated[int, typer.Option(help="Microbatches held at the peak.")] = 1,
    microbatches: Annotated[int, typer.Option(help="Microbatches per step.")] = 1,
    flash_attention: Annotated[bool, typer.Option(help="Fused attention kernel.")] = True,
    backend: Annotated[
        Literal["ortools", "pulp", "cpsat"], typer.Option(help="ILP solver.")
    ] = "ortools",
    time_limit: Annotated[float, typer.Option(help="Solver time limit, seconds.")] = 10.0,
    dump_model: Annotated[Path | None, typer.Option(help="Write the ILP (LP format).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Solve the sharding ILP of one layer on a logical mesh: a strategy per operator."""
    model_spec = load_model(model)
    cluster_spec = load_cluster(cluster, nodes)
    query = layer_query(model_spec, kind=kind, mesh=mesh, mbs=mbs, seq_len=seq_len,
                        precision=precision, budget_gib=budget_gib, in_flight=in_flight,
                        microbatches=microbatches, flash_attention=flash_attention)  # fmt: skip
    if dump_model is not None:
        problem, _, _ = layer_problem(model_spec, cluster_spec, query)
        dump_model.write_text(build_layer_milp(problem).to_lp())
    options = SolverOptions(backend=backend, time_limit_s=time_limit)
    solution = solve_layer(model_spec, cluster_spec, query, options=options)
    if solution.report.status == "infeasible":
        least = solution.min_memory_bytes or 0.0
        raise InfeasibleError(
            f"no sharding of the {kind} layer on {mesh} fits {budget_gib:g} GiB; the least "
            f"memory any choice needs is {least / 2**30:.2f} GiB (more devices, a smaller "
            f"microbatch, or fewer in-flight microbatches)"
        )
    if as_json:
        _print_json(asdict(solution))
    else:
        _render(report.layer_tables(solution))


@app.command("validate")
def validate_cmd(
    runs: Annotated[Path, typer.Argument(help="calibration_runs.json")],
    clusters: Annotated[Path, typer.Option(help="Folder of the bundled clusters.")] = Path(
        "instances/clusters"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Predicted against measured step time for every published run."""
    rows = validate(runs, clusters)
    if as_json:
        _print_json([row.to_dict() for row in rows])
    else:
        _render(report.validation_tables(rows))


@app.command("calibrate")
def calibrate_cmd(
    runs: Annotated[Path, typer.Argument(help="calibration_runs.json")],
    cluster: ClusterArg,
    gpu: Annotated[str, typer.Option(help="Which runs to fit: A100 or H100.")],
    write: Annotated[bool, typer.Option(help="Write the fit into CLUSTER.")] = False,
) -> None:
    """Fit the device's GEMM efficiency to the published runs of that GPU."""
    fit = calibrate_file(runs, cluster, gpu=gpu, write=write)
    _render(report.calibration_tables(fit, written=write))


def main() -> None:
    """Entry point. A PlannerError is one line and exit code 2; so is a command line that
    does not parse (click's usage errors, recognised by their interface because typer may
    vendor its own click)."""
    args = sys.argv[1:]
    debug = "--debug" in args
    try:
        app([a for a in args if a != "--debug"], prog_name="planner", standalone_mode=False)
    except PlannerError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:
        message = getattr(exc, "format_message", None)
        if message is None or debug:
            raise
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        print(f"error: {where}{message()}", file=sys.stderr)
        sys.exit(2)


__all__ = ["app", "main"]
