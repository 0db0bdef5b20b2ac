"""``planner runs from-log``: a user's training log as a run record for validate and
calibrate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import ValidationError

from planner.cli.app import NodesOpt, app, load_inputs, note, option_error
from planner.diagnose.fit import sized_to
from planner.diagnose.log_config import config_fields
from planner.diagnose.log_models import titan_flavor_model
from planner.diagnose.logs import (
    DEFAULT_SKIP,
    check_device,
    model_of_run,
    priced_nearby,
    read_log,
    run_record,
)
from planner.diagnose.runs import bundled_device
from planner.errors import InputError
from planner.plan.config import ParallelConfig
from planner.report.output import check_target, write_atomic
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster, read_text

runs_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                       help="Run records for validate and calibrate.")
app.add_typer(runs_app, name="runs")


@runs_app.command("from-log", short_help="A training log as a run record for validate.")
def from_log_cmd(
    log: Annotated[Path, typer.Argument(help="Megatron-LM or torchtitan training log.")],
    cluster: Annotated[Path, typer.Option(help="cluster.json of the GPUs that ran it.")],
    model: Annotated[Path | None, typer.Option(
        help="model.json or a Hugging Face config.json (default for a torchtitan log: the "
        "registered flavor it built).")] = None,
    nodes: NodesOpt = None,
    tp: Annotated[int | None, typer.Option(help="Tensor-parallel degree.")] = None,
    pp: Annotated[int | None, typer.Option(help="Pipeline-parallel degree.")] = None,
    dp: Annotated[int | None, typer.Option(help="Data-parallel degree.")] = None,
    cp: Annotated[int | None, typer.Option(help="Context-parallel degree.")] = None,
    vpp: Annotated[int | None, typer.Option(help="Virtual stages per device.")] = None,
    sp: Annotated[bool | None, typer.Option("--sp/--no-sp", help="Sequence parallelism.")] = None,
    mbs: Annotated[int | None, typer.Option(help="Microbatch size.")] = None,
    global_batch: Annotated[int | None, typer.Option(help="Global batch size.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length.")] = None,
    recompute: Annotated[
        Literal["none", "selective", "full"] | None,
        typer.Option(metavar="<mode>", help="Recomputation: none, selective or full."),
    ] = None,
    recompute_modules: Annotated[str | None, typer.Option(
        help="What selective recomputation reran (op: torchtitan's per-operator policy).")] = None,
    zero: Annotated[
        int | None, typer.Option(help="ZeRO stage (1 = distributed optimizer).")
    ] = None,
    precision: Annotated[
        Literal["bf16", "fp16", "fp32"] | None,
        typer.Option(metavar="<name>", help="Compute precision: bf16, fp16 or fp32."),
    ] = None,
    flash_attention: Annotated[
        bool | None, typer.Option("--flash/--no-flash", help="Fused attention kernel.")
    ] = None,
    skip: Annotated[int, typer.Option(min=0, metavar="<int>",
                                      help="Warm-up step lines left out.")] = DEFAULT_SKIP,
    run_id: Annotated[str | None, typer.Option("--id", help="The record's id.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the records here (JSON).")] = None,
) -> None:
    """A training log as a run record (JSON list) that validate and calibrate read."""
    # The options give the configuration; a Megatron-LM log's arguments dump (or torchtitan's
    # mesh and model args) gives what it states, and an option that contradicts it is refused
    # rather than silently overridden. The record carries the model (model.spec), checked
    # against the log's own account of it.
    if out is not None:
        check_target(out, inputs=(log, model, cluster))
    where = str(log)
    if model is None:
        cluster_spec = load_cluster(cluster, nodes)
        measured = read_log(read_text(log), where=where, skip=skip)
        if measured.format == "megatron":
            raise InputError(f"{where}: a Megatron-LM log does not name its model (its "
                             f"arguments have no vocabulary); pass --model")  # fmt: skip
        model_spec = titan_flavor_model(measured.titan_model, where=where)
    else:
        model_spec, cluster_spec = load_inputs(model, cluster, nodes=nodes)
        measured = read_log(read_text(log), where=where, skip=skip)
    model_spec = model_of_run(measured, model_spec, where=where)
    check_device(measured, cluster_spec.device.name, where=where)
    given: dict[str, Any] = dict(tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, sp=sp, mbs=mbs,
                                 global_batch=global_batch, seq_len=seq_len, recompute=recompute,
                                 recompute_modules=recompute_modules, zero=zero,
                                 precision=precision, flash_attention=flash_attention)  # fmt: skip
    fields = {k: v for k, v in given.items() if v is not None}
    if measured.titan_checkpointing == "selective" and recompute is None:
        raise InputError(f"{where}: torchtitan ran selective activation checkpointing, per "
                         f"operator or every n-th layer, which its log does not say; pass "
                         f"--recompute selective --recompute-modules op for its per-operator "
                         f"policy (selective_ac_option = \"op\"), else --recompute to say how "
                         f"to price it")  # fmt: skip
    for name, value in config_fields(measured).items():
        if fields.get(name, value) != value:
            option = "--" + name.replace("_", "-")
            raise InputError(f"{where}: the log says {name} {value!r}; {option} "
                             f"{fields[name]!r} contradicts it")  # fmt: skip
        fields[name] = value
    try:
        config = ParallelConfig(**fields)
    except ValidationError as exc:
        raise option_error(exc) from None
    if config.dp is not None:
        cluster_spec = _sized(cluster_spec, config, nodes=nodes, where=where)
    record = run_record(measured, model_spec, cluster_spec, config,
                        run_id=run_id or log.stem, source=f"training log {log.name}")
    for sentence in (*measured.left_out, *priced_nearby(measured)):
        note(sentence)
    if bundled_device(cluster_spec.device.name) is None:
        # Without --cluster, validate prices a run on its device's bundled cluster file.
        note(f"{cluster_spec.device.name} is not a bundled device: price this record with "
             f"`planner validate RUNS --cluster {cluster}` (and fit it with `planner calibrate "
             f"RUNS --cluster {cluster}`)")  # fmt: skip
    text = json.dumps([record], indent=2) + "\n"
    if out is None:
        print(text, end="")
    else:
        write_atomic(out, text, inputs=(log, model, cluster))


def _sized(cluster: ClusterSpec, config: ParallelConfig, *, nodes: int | None,
           where: str) -> ClusterSpec:
    """The cluster of the run's ranks, TP x PP x CP x DP: ``cluster`` sized to them (a bundled
    file is 1,024 GPUs), as validate resizes a record's cluster to its GPUs, or as ``--nodes``
    sized it, which must hold as many."""
    world = config.tp * config.pp * config.cp * config.dp
    ranks = f"tp({config.tp}) x pp({config.pp}) x cp({config.cp}) x dp({config.dp}) = {world}"
    if nodes is None:
        try:
            return sized_to(cluster, world)
        except ValueError as exc:
            raise InputError(f"{where}: the log ran {ranks} ranks, and {exc}; expected "
                             f"the cluster file of the nodes that ran it") from None  # fmt: skip
    if world != cluster.num_devices:
        raise InputError(f"{where}: the log ran {ranks} ranks, --nodes {nodes} gives "
                         f"{cluster.num_devices} devices ({nodes} x {cluster.devices_per_node}); "
                         f"--nodes must match the log's ranks, or leave it out to size the "
                         f"cluster to them")  # fmt: skip
    return cluster
