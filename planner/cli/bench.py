"""``planner bench``: time the kernels a model's training runs on this machine's accelerator
and fit the cluster file's device efficiency block to them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from planner import report
from planner.cli.app import (
    ClusterArg,
    JsonOpt,
    app,
    check_options,
    load_inputs,
    note,
    print_json,
    render,
)
from planner.cli.app import stderr_console as progress_console
from planner.diagnose.bench_cases import BenchCase, bench_cases
from planner.diagnose.bench_fit import fit_bench
from planner.diagnose.bench_torch import (
    DeviceChoice,
    check_measured,
    choose_backend,
    run_cases,
)
from planner.errors import InputError
from planner.report.output import check_target, write_atomic
from planner.spec.reading import fill_training
from planner.vocabulary import Precision

MAX_REPEATS = 1000
"""More timed batches than this only make the bench longer: the fastest has long settled."""
MAX_BATCH_MS = 60_000.0
"""A timed batch longer than a minute would make the bench run for hours."""


SeqLenOpt = Annotated[int | None, typer.Option(
    help="Tokens per sample; default: the model's training block.")]
PrecisionOpt = Annotated[Precision | None, typer.Option(
    help="Compute type; default: the model's training block, else bf16.")]
DeviceOpt = Annotated[DeviceChoice, typer.Option(
    help="Where to run: an Ascend NPU, else a CUDA GPU, else the CPU (auto), or the one named.")]
"""The options ``bench`` and ``profile`` share: what they run, and where."""


@app.command("bench", short_help="Time this machine's kernels; fit the device's efficiency.")
def bench_cmd(
    cluster: ClusterArg,
    model: Annotated[Path, typer.Option(
        help="model.json or a Hugging Face config.json whose layer shapes are timed.")],
    seq_len: SeqLenOpt = None,
    precision: PrecisionOpt = None,
    tp: Annotated[list[int] | None, typer.Option(
        help="Tensor-parallel degrees whose GEMM shards are timed (repeat the option); "
        "default: 1, 2, 4, ... up to a node's devices.")] = None,
    micro_batch: Annotated[list[int] | None, typer.Option(
        help="Microbatch sizes timed (repeat the option); default: 1 and 2.")] = None,
    device: DeviceOpt = "auto",
    repeats: Annotated[int, typer.Option(
        help="Timed batches per kernel; the fastest counts.")] = 5,
    min_time_ms: Annotated[float, typer.Option(
        help="Length of each timed batch, in ms.")] = 20.0,
    fp8: Annotated[bool, typer.Option(
        help="Time each decoder GEMM's forward on FP8 operands too (torch._scaled_mm: a GPU "
        "with FP8 tensor cores) and fit the device's FP8 speedup, which the megatron-te-fp8 "
        "stack needs.")] = False,
    write: Annotated[bool, typer.Option(
        help="Write the fitted efficiency block into the cluster file.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Time a model's GEMMs, fused attention and memory-bound kernels on this machine's
    accelerator (needs PyTorch: the package's bench extra) and fit the device's efficiency."""
    check_options({"--seq-len": seq_len})
    if not (1 <= repeats <= MAX_REPEATS and 0 < min_time_ms <= MAX_BATCH_MS):
        raise InputError(f"--repeats {repeats}, --min-time-ms {min_time_ms:g}: expected 1 to "
                         f"{MAX_REPEATS} batches of more than 0 and at most {MAX_BATCH_MS:g} ms")
    if write:
        check_target(cluster, option="--write")
    model_spec, spec = load_inputs(model, cluster, nodes=None, names=("--model", "CLUSTER"))
    block = model_spec.training
    training = fill_training(
        model_spec, seq_length=seq_len, precision=precision,
        global_batch_size=1 if block is None else block.global_batch_size)  # fmt: skip
    spec.device.peak_flops_per_s(training.precision)  # refuses a precision with no peak
    degrees = tp or [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= spec.devices_per_node]
    batches = micro_batch or [1, 2]
    if min(degrees) < 1 or min(batches) < 1:
        raise InputError("--tp and --micro-batch: expected positive integers")
    cases = bench_cases(model_spec, training, tensor_parallel=degrees, micro_batches=batches,
                        fp8=fp8)  # fmt: skip
    if not any(c.kind == "gemm" for c in cases):  # said after a dozen seconds of timing
        raise InputError(f"--tp {' '.join(map(str, degrees))}: splits none of "
                         f"{model_spec.name}'s GEMMs (its heads, experts and widths); a "
                         "degree that divides them, or 1")  # fmt: skip
    backend = choose_backend(device)
    if write:  # before the timing: minutes of it, then refused
        check_measured(spec.device, backend, what="--write")
    if device == "auto" and backend == "cpu":
        note(f"no GPU or NPU is visible: timing {len(cases)} kernels on this machine's CPU "
             f"as {spec.device.name}'s (--device cpu says that is meant)")
    with Progress(TextColumn("timing {task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=progress_console(), transient=True,
                  disable=not progress_console().is_terminal) as bar:  # fmt: skip
        task = bar.add_task("", total=len(cases))

        def advance(i: int, case: BenchCase) -> None:
            bar.update(task, completed=i, description=case.label)

        timings = run_cases(cases, precision=training.precision, device=backend,
                            repeats=repeats, min_time_s=min_time_ms / 1e3, on_case=advance)
    fit = fit_bench(cluster, cases, timings, model_name=model_spec.name,
                    seq_length=training.seq_length)  # fmt: skip
    if write:
        write_atomic(cluster, fit.updated_json, option="--write")
    if as_json:
        print_json(report.bench_json(fit, written=write))
        return
    render([*report.bench_tables(fit),
            f"written to {cluster}" if write else "not written: --write"])
