"""The commands that make and read plans: solve, compare, simulate, export."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from planner import frameworks, report
from planner.cli.app import (
    MARGIN_DEFAULT,
    ClusterArg,
    JsonOpt,
    ModelArg,
    NodesOpt,
    ProfileOpt,
    app,
    check_profile_stack,
    console,
    load_inputs,
    note,
    print_json,
    render,
    stderr_console,
)
from planner.cli.knobs import knob_parameters, parsed, with_parameters
from planner.cli.launches import check_fits, made_for, print_launch, print_notes
from planner.cli.progress import search_bars
from planner.cost.risk import parse_objective
from planner.diagnose.compare import METHODS, Method, compare, compare_frameworks
from planner.diagnose.compare import to_json as compare_json
from planner.errors import InputError
from planner.frameworks import FRAMEWORKS, TARGETS, Framework
from planner.ilp.backends import Backend
from planner.options import (
    DEFAULT_OPTIONS,
    SEARCH_TIME_LIMIT_S,
    Pins,
    SolveOptions,
    check_memory_margin,
    training_of,
)
from planner.plan.files import plan_from_json
from planner.plan.inputs import check_inputs
from planner.plan.schema import Plan
from planner.report.output import PLAN_REPORT, check_folder, check_target, write_atomic
from planner.report.width import wrap
from planner.search.targets import pins_left_unused
from planner.simulate.events import simulate_plan
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import read_text

BackendOpt = Annotated[Backend, typer.Option(help="ILP solver (ilp only).")]
TimeLimitOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="Seconds the whole search may take (per method); past it the best plan so far "
        "is returned with status time_limit (and its gap, where the search bounds it).",
    ),
]
IlpTimeLimitOpt = Annotated[
    float, typer.Option(min=0.001, help="Seconds each layer ILP may take (ilp only).")
]
FrameworkOpt = Annotated[
    str,
    typer.Option(help=f"The framework that will launch the plan: {', '.join(TARGETS)} (any: "
                 "per-operator shardings no framework launches, the yardstick)."),
]
MarginOpt = Annotated[
    float | None,
    typer.Option("--memory-margin", min=0.0, help="GiB of device memory plans leave free "
                 f"({MARGIN_DEFAULT})."),
]
MeshNodesOpt = Annotated[
    int | None,
    typer.Option("--max-mesh-nodes", min=1, help="Nodes one stage's mesh may span (any: "
                 "default 1, 2 for mixtures of experts)."),
]
ObjectiveOpt = Annotated[
    str,
    typer.Option(help="Rank plans by their predicted step (expected) or by the slow end of its "
                 "error band at the 80th or 95th percentile (p80, p95): a plan the validated "
                 "runs vouch for over a faster one they do not."),
]
TpCommOpt = Annotated[
    bool,
    typer.Option("--tp-comm-overlap/--no-tp-comm-overlap",
                 help="Let the search overlap tensor-parallel collectives with their GEMMs "
                 "where the framework launches it (Megatron-LM's --tp-comm-overlap with "
                 "sequence parallelism, which needs Transformer Engine's userbuffers; "
                 "Colossal-AI's 'ring' sequence parallelism for Llama and Qwen). Default: "
                 "off, as Megatron-LM's."),
]
DEFAULT_METHODS = "ilp,heuristic,grid"
"""What ``compare`` compares when given neither ``--methods`` nor ``--frameworks``."""
PIN_KNOBS = tuple(f.name for f in fields(Pins))
"""The knobs a search may be given fixed (``--tp 8``), as ``planner estimate`` spells them."""


def _option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=default)  # fmt: skip


SEARCH_OPTIONS = (
    _option("framework", FrameworkOpt, "megatron"),
    _option("memory_margin", MarginOpt, None),
    _option("max_mesh_nodes", MeshNodesOpt, None),
    _option("backend", BackendOpt, DEFAULT_OPTIONS.backend),
    _option("time_limit", TimeLimitOpt, SEARCH_TIME_LIMIT_S),
    _option("ilp_time_limit", IlpTimeLimitOpt, DEFAULT_OPTIONS.ilp_time_limit_s),
    _option("objective", ObjectiveOpt, DEFAULT_OPTIONS.objective),
    _option("tp_comm_overlap", TpCommOpt, DEFAULT_OPTIONS.tp_comm_overlap),
)
"""How ``solve`` and ``compare`` search, beside the run's settings and the pins."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """What ``solve`` and ``compare`` share, with the same meaning, as given on the command
    line (:func:`with_problem`)."""

    global_batch: int | None
    """``--global-batch``, sequences per step."""
    seq_len: int | None
    """``--seq-len``, tokens per sequence."""
    precision: str | None
    """``--precision``."""
    stack: str | None
    """``--stack``: the software that runs each layer."""
    pins: Pins
    """The knobs pinned on the command line."""
    framework: str
    """``--framework``: the framework that launches the plan, or ``any``."""
    memory_margin: float | None
    """``--memory-margin``, GiB left free per device."""
    max_mesh_nodes: int | None
    """``--max-mesh-nodes``: the widest stage mesh, in nodes."""
    backend: Backend
    """``--backend``: the layer ILP's solver."""
    time_limit: float | None
    """``--time-limit``, seconds for the whole search."""
    ilp_time_limit: float
    """``--ilp-time-limit``, seconds per layer ILP."""
    objective: str
    """``--objective``: what plans are ranked by."""
    tp_comm_overlap: bool
    """``--tp-comm-overlap``: whether the search may overlap TP traffic with its GEMMs."""

    @classmethod
    def of(cls, values: dict[str, Any]) -> Problem:
        """From the options' values by name (the pins among them)."""
        pins = Pins(**{name: values.pop(name) for name in PIN_KNOBS})
        return cls(pins=pins, **values)

    def load(
        self, model: Path, cluster: Path, nodes: int | None, profile: Path | None = None, *,
        one_stack: bool = True,
    ) -> tuple[ModelSpec, ClusterSpec, SolveOptions]:  # fmt: skip
        """The inputs (the cluster with ``profile``'s layers when given, refused when
        ``one_stack`` is priced and they were measured on another) and the search's
        options."""
        options = SolveOptions(
            global_batch_size=self.global_batch, seq_length=self.seq_len,
            precision=self.precision, stack=self.stack,  # type: ignore[arg-type]
            backend=self.backend,  # type: ignore[arg-type]
            time_limit_s=self.time_limit, ilp_time_limit_s=self.ilp_time_limit,
            framework=frameworks.check_framework(self.framework),
            memory_margin_gib=self.memory_margin, max_mesh_nodes=self.max_mesh_nodes,
            pins=self.pins, objective=parse_objective(self.objective),
            tp_comm_overlap=self.tp_comm_overlap,
        )  # fmt: skip
        model_spec, cluster_spec = load_inputs(model, cluster, nodes=nodes, profile=profile)
        check_memory_margin(self.memory_margin, cluster_spec.device)
        if profile is not None and one_stack:
            check_profile_stack(cluster_spec, training_of(model_spec, options).stack)
        return model_spec, cluster_spec, options


with_problem = with_parameters(
    [*knob_parameters(("global_batch", "seq_len", "precision", "stack", *PIN_KNOBS),
                      pinned=PIN_KNOBS),
     *SEARCH_OPTIONS], into="problem", build=lambda values: Problem.of(parsed(values)),
)  # fmt: skip
"""Give ``solve`` or ``compare`` the options of a :class:`Problem`, declared once."""


@app.command("solve", short_help="The fastest parallel plan that fits.")
@with_problem
def solve_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    problem: Problem | None = None,
    method: Annotated[
        Method,
        typer.Option(
            help="ilp: the planner's search (every configuration the framework launches; the "
            "layer ILP and stage DP for any); heuristic: Megatron's rule of thumb; grid: "
            "every uniform configuration."
        ),
    ] = "ilp",
    out: Annotated[Path | None, typer.Option(help="Also write the plan (JSON).")] = None,
    layer_profile: ProfileOpt = None,
    export_fmt: Annotated[
        Framework | None,
        typer.Option("--export", help="Also print the plan's launch configuration for this "
                     "framework."),
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
    assert problem is not None  # given by with_problem
    model_spec, cluster_spec, options = problem.load(model, cluster, nodes, layer_profile)
    if out is not None:
        check_target(out, inputs=(model, cluster))
    if report_dir is not None:
        check_folder(report_dir, option="--report", files=PLAN_REPORT)
    if as_json:
        plan = METHODS[method](model_spec, cluster_spec, options)
    else:
        with search_bars(stderr_console()) as bar:
            plan = METHODS[method](model_spec, cluster_spec, options, progress=bar(method))
    if out is not None:
        write_atomic(out, plan.to_json(), inputs=(model, cluster))
    if report_dir is not None:
        from planner.report import figures  # matplotlib loads only when pictures are asked

        _wrote(figures.write_report(plan, report_dir))
    if as_json:
        print(plan.to_json(), end="")
    else:
        render(report.plan_tables(plan, mtp_layers=model_spec.mtp_layers))
    # on stderr, so JSON's reader hears them too without parsing them
    for line in pins_left_unused(plan, options.pins):
        note(line)
    if plan.solver.status == "time_limit":
        note(time_limit_note(plan))
    if export_fmt is not None:
        result = frameworks.launch(plan, export_fmt, model=model_spec, cluster=cluster_spec,
                                   paths=(str(model), str(cluster)))  # fmt: skip
        console().rule(f"{frameworks.profile(export_fmt).title} launch configuration",
                       align="left")  # fmt: skip
        print_launch(plan, result)


def time_limit_note(plan: Plan) -> str:
    """What a search stopped at ``--time-limit`` left unsaid in its table: that configurations
    went unpriced, and how much they could still save where the search knows (its ``gap``).

    >>> from types import SimpleNamespace
    >>> time_limit_note(SimpleNamespace(solver=SimpleNamespace(time_s=20.6, gap=None)))[:58]
    'the search stopped at its time limit after 20.6 s, before '
    """
    gap = plan.solver.gap
    could = "" if gap is None else f" (up to {100 * gap:.1f} % faster)"
    return (f"the search stopped at its time limit after {plan.solver.time_s:.1f} s, before "
            f"pricing every configuration: this is the fastest found so far, and one not "
            f"priced may be faster{could}; give --time-limit more seconds to search them all")


@app.command("compare", short_help="Methods or frameworks on one problem, side by side.")
@with_problem
def compare_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    problem: Problem | None = None,
    frameworks_opt: Annotated[
        str | None,
        typer.Option("--frameworks", help="Compare the best plan of each of these frameworks "
                     f"(comma-separated, among {', '.join(TARGETS)}) instead of methods."),
    ] = None,
    methods: Annotated[
        str | None, typer.Option(help=f"Comma-separated methods among {', '.join(METHODS)} "
                                 f"(default: {DEFAULT_METHODS}).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Also draw the methods as a bar chart (.png or .svg).")
    ] = None,
    layer_profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan the same problem with several methods (or frameworks) and show them side by side."""
    assert problem is not None  # given by with_problem
    model_spec, cluster_spec, options = problem.load(model, cluster, nodes, layer_profile,
                                                     one_stack=frameworks_opt is None)
    if plot is not None:
        from planner.report import figures, pictures

        pictures.check_picture(plot, inputs=(model, cluster), option="--plot")
    if frameworks_opt is not None and methods is not None:
        raise InputError("--frameworks compares each framework's best plan, --methods the "
                         "methods on one target: give one of them")  # fmt: skip
    if frameworks_opt is not None:
        names = [f.strip() for f in frameworks_opt.split(",") if f.strip()]
        targets = [frameworks.check_framework(f, option="--frameworks") for f in names]
        run = partial(compare_frameworks, model_spec, cluster_spec, options, targets)
    else:
        names = [m.strip() for m in (methods or DEFAULT_METHODS).split(",") if m.strip()]
        run = partial(compare, model_spec, cluster_spec, options, names)
    if as_json:
        results = run()
    else:
        with search_bars(stderr_console()) as bar:
            results = run(progress=bar)
    if plot is not None:
        devices = cluster_spec.num_devices
        title = f"{model_spec.name} on {devices:,} x {cluster_spec.device.name}"
        _wrote([pictures.save(figures.compare_figure(results, title), plot, option="--plot")])
    if as_json:
        print_json(compare_json(results))
    else:
        render(report.compare_tables(results))


@app.command("simulate", short_help="A plan's step op by op against its closed form.")
def simulate_cmd(
    plan_file: Annotated[Path, typer.Argument(help="plan.json")],
    gantt: Annotated[
        Path | None, typer.Option(help="Draw the schedule's Gantt chart (.png or .svg).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Simulate a plan's step op by op and set it against the plan's closed-form prediction."""
    if gantt is not None:
        from planner.report import pictures

        pictures.check_picture(gantt, inputs=(plan_file,), option="--gantt")
    plan = plan_from_json(read_text(plan_file), source=str(plan_file))
    simulation = simulate_plan(plan)
    if gantt is not None:
        from planner.report.comm_lanes import stage_comm
        from planner.report.figures import plan_title
        from planner.report.gantt import draw_gantt

        # titled as solve --report's chart is: pasted alone, it says what plan it shows
        draw_gantt(simulation, gantt, title=plan_title(plan), comm=stage_comm(plan))
        _wrote([gantt])
    if as_json:
        print_json(report.simulation_json(plan, simulation))
    else:
        render(report.simulation_tables(plan, simulation))


def _wrote(paths: Sequence[Path]) -> None:
    """Say on stderr which pictures were written."""
    folders = sorted({str(p.parent) for p in paths})
    names = ", ".join(p.name for p in paths)
    text = f"{names} in {', '.join(folders)}"
    print("\n".join(wrap(text, stderr_console().width, first="wrote ")), file=sys.stderr)


@app.command("export", short_help="A plan as a framework's launch configuration.")
def export_cmd(
    plan_file: Annotated[Path, typer.Argument(help="plan.json")],
    model: Annotated[Path, typer.Option(help="The plan's model (its flags are part of the "
                                        "launch).")],
    cluster: Annotated[Path, typer.Option(help="The plan's cluster.")],
    fmt: Annotated[str | None, typer.Option(
        "--format", help=f"One of {', '.join(FRAMEWORKS)}; by default the framework the plan "
        "was made for.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write to this file.")] = None,
) -> None:
    """The plan as a framework's launch configuration, exactly as it was priced.

    A plan the framework cannot launch is refused with the command that solves for it."""
    if fmt is not None:
        frameworks.check_framework(fmt, option="--format", allow_any=False)
    if out is not None:
        check_target(out, inputs=(plan_file, model, cluster))
    plan = plan_from_json(read_text(plan_file), source=str(plan_file))
    target = fmt if fmt is not None else made_for(plan)
    model_spec, cluster_spec = load_inputs(model, cluster, nodes=plan.cluster.num_nodes,
                                           names=("--model", "--cluster"))  # fmt: skip
    check_inputs(plan, model_spec, cluster_spec, model_label=str(model),
                 cluster_label=str(cluster))
    check_fits(plan, cluster_spec.device, target, model=model, cluster=cluster)
    result = frameworks.launch(plan, target, model=model_spec, cluster=cluster_spec,
                               paths=(str(model), str(cluster)))  # fmt: skip
    if out is None:
        print_launch(plan, result)
        return
    write_atomic(out, result.text, inputs=(plan_file, model, cluster))
    print_notes(plan, result)


