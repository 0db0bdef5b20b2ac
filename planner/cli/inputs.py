"""The commands about inputs and single configurations: estimate, info, schema, layer,
validate, calibrate, calibrate-network."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import ValidationError

from planner import report
from planner.cli.app import (
    MARGIN_DEFAULT,
    ClusterArg,
    JsonOpt,
    ModelArg,
    NodesOpt,
    ProfileOpt,
    app,
    check_options,
    check_profile_stack,
    load_inputs,
    note,
    option_error,
    print_json,
    render,
)
from planner.cli.knobs import with_knobs
from planner.diagnose.calibration import calibrate, validate
from planner.diagnose.info import model_info
from planner.diagnose.network_fit import fit_network
from planner.errors import InfeasibleError, InputError
from planner.frameworks import check_framework, check_platform, profile
from planner.ilp import IlpOptions, build_layer_milp, layer_problem, layer_query, solve_layer
from planner.options import check_memory_margin
from planner.plan.config import ParallelConfig, ResolvedConfig, resolve
from planner.plan.files import load_model_file
from planner.report.output import check_target, write_atomic
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import json_schema
from planner.uniform.defaults import FRAMEWORK_DEFAULTS, SEARCH_SWITCHES, framework_defaults
from planner.uniform.estimate import estimate
from planner.uniform.plan import uniform_plan
from planner.uniform.remedies import config_infeasible_message, plan_margin_gib

CONFIG_KNOBS = tuple(ParallelConfig.model_fields)
"""Every knob of a uniform configuration, as ``planner estimate`` offers them."""


@app.command("estimate", short_help="Price one uniform configuration: time and memory.")
@with_knobs(CONFIG_KNOBS, unset={
    **dict.fromkeys(SEARCH_SWITCHES, "off; with --framework, as solve sets it"),
    "cp_algo": "ring; with --framework, as that framework attends (torchtitan: allgather; "
               "DeepSpeed: ulysses)"})
def estimate_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    knobs: dict[str, Any] | None = None,
    memory_margin: Annotated[
        float | None, typer.Option("--memory-margin", min=0.0, help="GiB of device memory a "
                                   f"configuration must leave free to fit ({MARGIN_DEFAULT}).")
    ] = None,
    framework: Annotated[
        str | None, typer.Option(help="The framework that launches it: the switches solve "
                                 "sets for it (sequence parallelism, the overlaps it "
                                 "launches) where not given, and the plan written by --out "
                                 "is for it (default: megatron, the switches as given).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Also write the configuration as a plan (JSON).")
    ] = None,
    layer_profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Price one uniform (Megatron-style) configuration: time, memory, throughput."""
    assert knobs is not None  # given by with_knobs
    if framework is not None:
        check_framework(framework, allow_any=False)
    given = {name: knobs[name] for name in FRAMEWORK_DEFAULTS if knobs[name] is not None}
    model_spec, cluster_spec = load_inputs(model, cluster, nodes=nodes, profile=layer_profile)
    check_memory_margin(memory_margin, cluster_spec.device)
    if framework is not None:
        check_platform(framework, cluster_spec.device)
    try:
        config = ParallelConfig(**{name: value for name, value in knobs.items()
                                   if name not in FRAMEWORK_DEFAULTS or value is not None})
    except ValidationError as exc:
        raise option_error(exc) from None
    if framework is not None:
        config = framework_defaults(config, model_spec, cluster=cluster_spec,
                                    framework=framework, given=given)  # fmt: skip
    if out is not None:
        check_target(out, inputs=(model, cluster))
    resolved = resolve(model_spec, cluster_spec, config)
    _check_recompute_layers(resolved)
    if layer_profile is not None:
        check_profile_stack(cluster_spec, resolved.training.stack)
    result = estimate(model_spec, cluster_spec, config, memory_margin_gib=memory_margin)
    if out is not None:
        # Written even when it does not fit: it records what was priced (and `simulate` can
        # still draw it); the exit code says it does not fit.
        margin = plan_margin_gib(model_spec, cluster_spec, config, memory_margin)
        plan = uniform_plan(model_spec, cluster_spec, config, framework=framework or "megatron",
                            memory_margin_gib=margin)  # fmt: skip
        write_atomic(out, plan.to_json(), inputs=(model, cluster))
    if as_json:
        # the configuration priced, the run's batch, sequence, precision and stack and the
        # data-parallel degree filled in, for scripts to read back
        training = resolved.training
        priced = config.model_copy(update={
            "dp": result.dp, "global_batch": training.global_batch_size,
            "seq_len": training.seq_length, "precision": training.precision,
            "stack": training.stack}).model_dump(mode="json")  # fmt: skip
        print_json(result.to_dict() | {"configuration": priced})
    else:
        render(report.estimate_tables(model_spec, cluster_spec, config, result, memory_margin))
    if framework is not None or out is not None:
        _framework_notes(model_spec, cluster_spec, config, framework=framework, given=given,
                         out=out)  # fmt: skip
    if not result.fits:
        raise InfeasibleError(config_infeasible_message(model_spec, cluster_spec, config,
                                                        memory_margin_gib=memory_margin,
                                                        framework=framework,
                                                        given=given))  # fmt: skip


def _check_recompute_layers(resolved: ResolvedConfig) -> None:
    """Refuse ``--recompute-layers`` above a model chunk's decoder layers: it would print as
    that many recomputed where the chunk recomputes all it has."""
    c = resolved.config
    if c.recompute_layers is None or not resolved.stage_layers:
        return
    chunk = max(-(-n // c.vpp) for n in resolved.stage_layers)
    if c.recompute_layers > chunk:
        raise InputError(f"--recompute-layers {c.recompute_layers}: a model chunk holds at most "
                         f"{chunk} decoder layers (pp {c.pp}, vpp {c.vpp}); leave it out to "
                         f"recompute them all")  # fmt: skip


def _framework_notes(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, *, framework: str | None,
    given: Collection[str], out: Path | None,
) -> None:  # fmt: skip
    """``estimate``'s notes on the framework: which switches ``--framework`` set, and what
    keeps the framework (``--out``'s, megatron by default) from launching the configuration
    (``planner export`` would refuse the plan written)."""
    target = profile(framework or "megatron")
    refused = target.refusals(resolve(model, cluster, config), model)
    if framework is not None:
        note(defaults_note(config, target.title, given=given, launched=not refused))
    if refused:  # priced (and written), but the framework cannot launch it: say so now
        who = f"{out} is for {target.title}, which" if out is not None else target.title
        export = "; planner export will refuse it" if out is not None else ""
        note(f"{who} cannot launch it: {'; '.join(refused)}{export}")


def defaults_note(
    config: ParallelConfig, title: str, *, given: Collection[str], launched: bool
) -> str:
    """Which switches ``estimate --framework`` set as solve sets them
    (:func:`planner.uniform.defaults.framework_defaults`), as the flags that give them; the
    overlaps stay as given (off) where the framework cannot launch the configuration.

    >>> defaults_note(ParallelConfig(tp=8, sp=True, overlap_grad_reduce=True), "Megatron-LM",
    ...               given=("overlap_param_gather",), launched=True)[:69]
    "Megatron-LM's switches as solve sets them: --sp --overlap-grad-reduce"
    """
    left = [name for name in SEARCH_SWITCHES if name not in given
            and (name != "sp" or config.tp > 1)  # without TP, SP means nothing
            and (name == "sp" or launched)]  # fmt: skip
    flags = [f"--{'' if getattr(config, name) else 'no-'}{name.replace('_', '-')}"
             for name in left]  # fmt: skip
    if "cp_algo" not in given and config.cp > 1 and config.cp_algo != "ring":
        flags.append(f"--cp-algo {config.cp_algo}")  # how the framework attends
    unset = "" if launched or set(SEARCH_SWITCHES[1:]) <= set(given) else (
        "launches no setting of the overlaps here: those not given stay off")
    if not flags:
        return f"{title} {unset}" if unset else f"{title}: every switch solve sets was given"
    return (f"{title}'s switches as solve sets them: {' '.join(flags)} (give one to override "
            f"it)" + f"; it {unset}" * bool(unset))


@app.command("info", short_help="What the planner read of a model: shape, FLOPs, graph.")
def info_cmd(
    model: ModelArg,
    seq_len: Annotated[int | None, typer.Option(
        help="Sequence length the FLOPs are counted at (default: the model's training length, "
        "else its max_position_embeddings).")] = None,
    write_model: Annotated[Path | None, typer.Option(
        "--write-model", help="Also write the model as the planner read it, a model.json to "
        "edit: for what a Hugging Face config has no key for (moe.expert_load_cv, "
        "moe.capacity_factor, the training run).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """What the planner understood of a model: shape, parameters, FLOPs, operator graph."""
    check_options({"--seq-len": seq_len})
    spec = load_model_file(model)
    info = model_info(spec, seq_len=seq_len)
    if write_model is not None:
        write_atomic(write_model, json.dumps(spec.model_dump(mode="json"), indent=2) + "\n",
                     inputs=(model,), option="--write-model")
        note(f"wrote {write_model}: {spec.name} as a model.json")
    if as_json:
        print_json(info)
    else:
        render(report.info_tables(info))


@app.command("schema", short_help="The JSON Schema of model.json or cluster.json.")
def schema_cmd(
    kind: Annotated[Literal["model", "cluster"], typer.Argument(help="model or cluster")],
) -> None:
    """Print the JSON Schema of model.json or cluster.json."""
    print_json(json_schema(kind))


@app.command("layer", short_help="The sharding ILP of one layer on a logical mesh.")
def layer_cmd(
    model: ModelArg,
    cluster: ClusterArg,
    nodes: NodesOpt = None,
    kind: Annotated[str, typer.Option(
        help="Layer kind: dense, local (sliding-window), moe, embedding or head.")] = "dense",
    mesh: Annotated[str, typer.Option(help="Logical mesh d0xd1 (axis 1 the consecutive "
                                      "ranks, inside a node where it fits one).")] = "1x8",
    mbs: Annotated[int, typer.Option(help="Microbatch size.")] = 1,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length.")] = None,
    precision: Annotated[
        Literal["bf16", "fp16", "fp32"] | None, typer.Option(help="Compute precision.")
    ] = None,
    budget_gib: Annotated[float | None, typer.Option(help="Memory for this layer.")] = None,
    in_flight: Annotated[int, typer.Option(help="Microbatches held at the peak.")] = 1,
    microbatches: Annotated[int, typer.Option(help="Microbatches per step.")] = 1,
    flash_attention: Annotated[bool, typer.Option(help="Fused attention kernel.")] = True,
    moe_dispatcher: Annotated[Literal["alltoall", "deepep"], typer.Option(
        help="How the experts' tokens are exchanged: NCCL's all-to-all, or DeepEP (no "
        "sharding then spreads the experts over ranks DeepEP refuses).")] = "alltoall",
    backend: Annotated[
        Literal["ortools", "pulp", "cpsat"], typer.Option(help="ILP solver.")
    ] = "ortools",
    time_limit: Annotated[float, typer.Option(help="Solver time limit, seconds.")] = 10.0,
    dump_model: Annotated[Path | None, typer.Option(help="Write the ILP (LP format).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Solve the sharding ILP of one layer on a logical mesh: a strategy per operator."""
    check_options({"--mbs": mbs, "--seq-len": seq_len, "--budget-gib": budget_gib,
                   "--in-flight": in_flight, "--microbatches": microbatches,
                   "--time-limit": time_limit})  # fmt: skip
    model_spec, cluster_spec = load_inputs(model, cluster, nodes=nodes)
    query = layer_query(model_spec, kind=kind, mesh=mesh, mbs=mbs, seq_len=seq_len,
                        precision=precision, budget_gib=budget_gib, in_flight=in_flight,
                        microbatches=microbatches, flash_attention=flash_attention,
                        moe_dispatcher=moe_dispatcher)  # fmt: skip
    devices = query.mesh[0] * query.mesh[1]
    if devices > cluster_spec.num_devices:
        raise InputError(f"--mesh {mesh} spans {devices:,} devices; the cluster has "
                         f"{cluster_spec.num_devices:,} (--nodes sets how many nodes)")
    if dump_model is not None:
        problem, _ = layer_problem(model_spec, cluster_spec, query)
        text = build_layer_milp(problem).to_lp()
        write_atomic(dump_model, text, inputs=(model, cluster), option="--dump-model")
    options = IlpOptions(backend=backend, time_limit_s=time_limit)
    solution = solve_layer(model_spec, cluster_spec, query, options=options)
    if solution.report.status == "infeasible":
        least = solution.min_memory_bytes or 0.0
        # Without --budget-gib the budget is what the device has after its reserve.
        budget = "the device's memory" if budget_gib is None else f"{budget_gib:g} GiB"
        raise InfeasibleError(
            f"no sharding of the {kind} layer on {mesh} fits {budget}; the least "
            f"memory any choice needs is {least / 2**30:.2f} GiB (more devices, a smaller "
            f"microbatch, or fewer in-flight microbatches)"
        )
    if as_json:
        print_json(asdict(solution))
    else:
        render(report.layer_tables(solution))


BUNDLED_CLUSTERS = Path(__file__).resolve().parents[2] / "instances" / "clusters"
"""The checkout's cluster files, wherever the command runs (a path relative to the working
folder made validate and calibrate work from the repository's root only)."""
ClustersOpt = Annotated[Path, typer.Option(
    help="Folder of the bundled clusters.",
    show_default="the checkout's instances/clusters")]
RunsArg = Annotated[list[Path], typer.Argument(
    help="Runs files: calibration_runs.json, fsdp_runs.json, or your own of that layout.")]


OwnClusterOpt = Annotated[Path | None, typer.Option(
    "--cluster", help="Price every run on this cluster file (your own cluster), whatever GPU "
    "its record names.")]


@app.command("validate", short_help="Predicted against measured steps of published runs.")
def validate_cmd(
    runs: RunsArg,
    clusters: ClustersOpt = BUNDLED_CLUSTERS,
    cluster: OwnClusterOpt = None,
    as_json: JsonOpt = False,
    write: Annotated[bool, typer.Option(
        help="Keep the runs priced, with their errors, in the cluster files of their chip "
        "(with --cluster: in that file): what the error bands rest on.")] = False,
) -> None:
    """Predicted against measured step time for every published run; a record that cannot
    be priced is listed with why (exit 2 only when none can)."""
    if write and cluster is not None:
        check_target(cluster, option="--write")
    result = validate(runs, clusters, cluster=cluster, write=write)
    if as_json:
        print_json({"runs": [row.to_dict() for row in result.rows], "skipped": result.skipped,
                    "written": list(result.written)})
    else:
        render(report.validation_tables(result.rows, result.skipped))
        if write:
            render([f"evidence written to {', '.join(result.written) or 'no file'}"])
    if not result.rows:
        raise InputError(f"no record of {', '.join(str(r) for r in runs)} could be priced "
                         f"({len(result.skipped)} left out, each with why above)")  # fmt: skip


@app.command("calibrate", short_help="Fit a chip's efficiencies to runs.")
def calibrate_cmd(
    runs: RunsArg,
    gpu: Annotated[str | None, typer.Option(
        help="Which chip's runs to fit: A100 or H100 (its bundled cluster files).")] = None,
    clusters: ClustersOpt = BUNDLED_CLUSTERS,
    cluster: Annotated[Path | None, typer.Option(
        "--cluster", help="Fit this cluster file's device on every run of the files, instead "
        "of --gpu.")] = None,
    exclude_family: Annotated[list[str] | None, typer.Option(
        help="Leave a framework family's runs out of the fit (megatron, fsdp, deepspeed, "
        "pytorch; repeated or comma-separated) and predict them: validation out of "
        "family.")] = None,
    write: Annotated[bool, typer.Option(
        help="Write the fit and the error bands into the chip's cluster files (with "
        "--cluster: into that file only).")] = False,
) -> None:
    """Fit a chip's efficiencies (or your cluster file's) to runs (a few minutes)."""
    if write and cluster is not None and gpu is None:
        check_target(cluster, option="--write")  # before the fit, not after its minutes
    # one option per family or a comma list, as --frameworks and --methods take them
    excluded = tuple(f.strip() for given in exclude_family or () for f in given.split(",")
                     if f.strip())  # fmt: skip
    fit = calibrate(runs, clusters, chip=gpu, cluster=cluster, exclude_families=excluded,
                    write=write)  # fmt: skip
    render(report.calibration_tables(fit))


@app.command("calibrate-network", short_help="Fit a network level to nccl-tests output.")
def calibrate_network_cmd(
    cluster: ClusterArg,
    results: Annotated[list[Path], typer.Argument(
        help="Outputs of one network level's runs: nccl-tests (all_reduce_perf, "
        "all_gather_perf, reduce_scatter_perf, alltoall_perf) or Ascend hccl_test "
        "(all_reduce_test, all_gather_test, reduce_scatter_test, alltoall_test; the file "
        "named after the binary).")],
    level: Annotated[int | None, typer.Option(
        help="The network level the runs exercised (0: innermost); by default the innermost "
        "level holding their ranks, or the nodes of their hosts.")] = None,
    ranks: Annotated[int | None, typer.Option(
        help="Ranks of the hccl_test runs (mpirun -n), which hccl_test does not print; "
        "nccl-tests prints its own.")] = None,
    nodes: Annotated[int | None, typer.Option(
        help="Nodes the hccl_test ranks ran on (default: the ranks fill whole nodes).")] = None,
    write: Annotated[bool, typer.Option(
        help="Write the fitted bandwidth fraction and latency into the cluster file.")] = False,
) -> None:
    """Fit a network level's bandwidth fraction and latency to nccl-tests or hccl_test
    measurements."""
    if write:
        check_target(cluster, option="--write")
    fit = fit_network(cluster, results, level=level, ranks=ranks, nodes=nodes)
    if write:
        write_atomic(cluster, fit.updated_json, option="--write")
    where = f"written to {cluster}" if write else "not written: --write"
    render([*report.network_fit_tables(fit), *fit.notes, where])
