"""``planner profile``: run a model's real layers on this machine's accelerator and write a
layer profile that ``--profile`` prices plans with."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

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
from planner.cli.bench import DeviceOpt, PrecisionOpt
from planner.diagnose.bench_torch import backend_of, check_measured, import_torch
from planner.diagnose.profile_torch import (
    LayerCode,
    ProfileCase,
    profile_cases,
    run_profile,
)
from planner.errors import ConfigError, InputError
from planner.report.output import check_target, write_atomic
from planner.report.profile import profile_tables
from planner.sharding.profiled import with_profile
from planner.spec import ModelSpec
from planner.spec.profile import LayerProfile, layer_shape
from planner.spec.reading import check_stack, fill_training
from planner.vocabulary import Stack, with_switch

STACK_NAMES: dict[str, Stack] = {"eager": "hf-eager", "compile": "hf-compiled",
                                 "hf-eager": "hf-eager", "hf-compiled": "hf-compiled"}  # fmt: skip
"""``--stack``'s words: PyTorch eager, or each layer compiled."""


@app.command("profile", short_help="Time the model's real layers on this accelerator.")
def profile_cmd(
    cluster: ClusterArg,
    model: Annotated[Path, typer.Option(
        help="model.json or a Hugging Face config.json whose layers are run.")],
    stack: Annotated[Literal["eager", "compile", "hf-eager", "hf-compiled"], typer.Option(
        help="How the layers run: eager (PyTorch eager, AMP: the hf-eager stack) or compile "
        "(torch.compile of each layer: hf-compiled).")] = "eager",
    seq_len: Annotated[list[int] | None, typer.Option(
        help="Tokens per sequence (repeat the option: shorter ones measure the context- and "
        "sequence-parallel shards of a long one); default: the model's training block.")
    ] = None,
    precision: PrecisionOpt = None,
    tp: Annotated[list[int] | None, typer.Option(
        help="Tensor-parallel shards run (repeat the option); default: 1, 2, 4, ... up to a "
        "node's devices, those that divide the heads.")] = None,
    mbs: Annotated[list[int] | None, typer.Option(
        help="Microbatch sizes run (repeat the option); default: 1, 2 and 4.")] = None,
    framework: Annotated[str | None, typer.Option(
        help="Whose layer code runs: transformers (Hugging Face's own layers, built from the "
        "config.json given as --model), colossalai (the same cast to the compute precision, "
        "as Colossal-AI runs them: the colossalai-hf stack) or torchtitan (its Llama 3 block, "
        "eager: the torchtitan-eager stack; with --stack compile, torchtitan-compiled); "
        "default: the planner's faithful layer.")] = None,
    ep: Annotated[list[int] | None, typer.Option(
        help="Expert-parallel shards an MoE model's routed experts run at (repeat the "
        "option); default: 1, 2, 4, ... up to a node's devices, those that divide the "
        "experts.")] = None,
    device: DeviceOpt = "auto",
    repeats: Annotated[int, typer.Option(help="Timed batches per pass; the fastest counts.")] = 5,
    out: Annotated[Path | None, typer.Option(
        help="The profile to write; default: profile-<model>-<stack>.json here.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the model's decoder layers (an MoE layer and its routed experts apart), embedding
    and head with its loss on this machine's accelerator (needs PyTorch: the package's bench
    extra) at each shard and microbatch a search prices, and write their seconds and kept
    bytes as a layer profile."""
    for length in seq_len or ():
        check_options({"--seq-len": length})
    if not 1 <= repeats <= 1000:
        raise InputError(f"--repeats {repeats}: expected 1 to 1000 timed batches")
    model_spec, spec = load_inputs(model, cluster, nodes=None, names=("--model", "CLUSTER"))
    if model_spec.mtp_layers:
        # Its faithful head is the output layer and the loss: a factor over a head priced
        # with the modules would scale their work by what it never ran.
        raise InputError(f"{model_spec.name} trains {model_spec.mtp_layers} "
                         f"multi-token-prediction module(s), which planner profile does not "
                         f"run: price it without --profile, or profile it with mtp_layers 0 "
                         f"and price that model")  # fmt: skip
    hf_config = _layer_source(framework, model)
    profiled = _profiled_stack(framework, stack, model_spec)
    training = fill_training(model_spec, seq_length=seq_len[0] if seq_len else None,
                             precision=precision, global_batch_size=1)  # fmt: skip
    lengths = sorted(set(seq_len or [training.seq_length]), reverse=True)
    spec.device.peak_flops_per_s(training.precision)  # refuses a precision with no peak
    degrees = tp or [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= spec.devices_per_node]
    batches = mbs or [1, 2, 4]
    experts = model_spec.moe.num_experts if model_spec.moe is not None else 1
    expert_degrees = ep or [d for d in (1, 2, 4, 8, 16, 32, 64)
                            if d <= spec.devices_per_node and experts % d == 0]  # fmt: skip
    if min(degrees) < 1 or min(batches) < 1 or min(expert_degrees) < 1 or min(lengths) < 1:
        raise InputError("--tp, --mbs, --ep and --seq-len: expected positive integers")
    path = out or Path(f"profile-{_slug(model_spec.name)}-{profiled}.json")
    check_target(path, inputs=(model, cluster), option="--out")
    cases, skipped = [], []
    for length in lengths:
        more, left = profile_cases(model_spec, seq_length=length, tensor_parallel=degrees,
                                   micro_batches=batches,
                                   expert_parallel=expert_degrees)  # fmt: skip
        cases += more
        skipped += left
    torch = import_torch("planner profile" + (f" --framework {framework}" if framework else ""),
                         extra=FRAMEWORK_CODE.get(framework or "", "bench"))  # fmt: skip
    code = (transformers_code(model_spec, hf_config, framework or "") if hf_config is not None
            else torchtitan_code(model_spec) if framework == "torchtitan" else None)  # fmt: skip
    backend = backend_of(torch, device)
    check_measured(spec.device, backend, what="planner profile")  # the profile names the device
    if device == "auto" and backend == "cpu":
        note(f"no GPU or NPU is visible: running {len(cases)} layers on this machine's CPU "
             f"as {spec.device.name}'s (--device cpu says that is meant)")
    with Progress(TextColumn("running {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=progress_console(), transient=True,
                  disable=not progress_console().is_terminal) as bar:  # fmt: skip
        task = bar.add_task("", total=len(cases))

        def advance(i: int, case: ProfileCase) -> None:
            bar.update(task, completed=i, description=case.label)

        run = run_profile(model_spec, cases, torch=torch, backend=backend,
                          precision=training.precision, stack=profiled,
                          repeats=repeats, on_case=advance, code=code)  # fmt: skip
    profile = LayerProfile(
        device=spec.device.name, device_reported=run.device_name, model=model_spec.name,
        shape=layer_shape(model_spec), stack=profiled, precision=training.precision,
        layer_code=FAITHFUL if code is None else code.name,
        software=f"PyTorch {run.software}" + ("" if code is None else f", {code.name}"),
        measured=run.measured, optimizer=run.optimizer, skipped=(*skipped, *run.skipped),
        source=f"planner profile --device {backend}, {repeats} timed batches per pass")  # fmt: skip
    if not profile.measured:
        raise InputError("no layer ran: " + "; ".join(s.reason for s in profile.skipped[:3]))
    write_atomic(path, profile.model_dump_json(indent=2) + "\n", option="--out")
    factors = with_profile(spec, model_spec, profile).device.efficiency.profile
    if as_json:
        print_json(profile.model_dump(mode="json"))
        return
    render([*profile_tables(profile, factors), f"written to {path}; price plans with "
            f"--profile {path}"])


FAITHFUL = "planner faithful PyTorch layer (planner.diagnose.faithful_layers)"
"""The ``layer_code`` of a profile of the planner's own layers."""

FRAMEWORK_CODE = {"transformers": "transformers", "torchtitan": "torchtitan",
                  "colossalai": "transformers"}  # fmt: skip
"""``--framework``'s words and the package extra whose layers each runs (Colossal-AI runs
Hugging Face's)."""
FRAMEWORK_STACKS: dict[str, Stack] = {"torchtitan": "torchtitan-eager",
                                      "colossalai": "colossalai-hf"}  # fmt: skip
"""The stack a framework's own layers run as, eager in the compute precision."""


def _profiled_stack(framework: str | None, stack: str, model: ModelSpec) -> Stack:
    """The stack the layers run as: ``--stack``'s, or the framework's own
    (:data:`FRAMEWORK_STACKS`), compiled for torchtitan's with ``--stack compile``
    (``torchtitan-compiled``: its dense blocks only, as that stack prices them); one line
    otherwise."""
    if framework not in FRAMEWORK_STACKS:
        return STACK_NAMES[stack]
    own = FRAMEWORK_STACKS[framework]
    if STACK_NAMES[stack] == "hf-eager":
        return own
    compiled = with_switch(own, "compile", True)
    if compiled is None:
        raise InputError(f"--stack {stack} --framework {framework}: its layers run eager here "
                         f"(--stack eager, the {own} stack)")  # fmt: skip
    try:
        check_stack(compiled, model)
    except ConfigError as exc:  # one line, naming the options that asked for it
        raise InputError(f"--stack {stack} --framework {framework}: {exc}") from None
    return compiled


def _layer_source(framework: str | None, model: Path) -> dict[str, Any] | None:
    """The Hugging Face config ``--framework transformers`` (or ``colossalai``, which runs
    Hugging Face's layers) builds its layers from; None for torchtitan's and the faithful
    layer; one line for a framework whose layers are not run."""
    if framework is None:
        return None
    if framework not in FRAMEWORK_CODE:
        raise InputError(
            f"--framework {framework}: the layers profiled are transformers', colossalai's or "
            "torchtitan's or, without --framework, the planner's faithful layer (as --stack "
            "names); Megatron-Core's own layers are not run yet")  # fmt: skip
    if framework == "torchtitan":
        return None
    data = json.loads(model.read_text())
    if not isinstance(data, dict) or "model_type" not in data:
        raise InputError(f"--framework {framework}: transformers builds its layers from the "
                         f"model's Hugging Face config.json; {model} is not one (no model_type)")
    return data


def transformers_code(model: ModelSpec, config: dict[str, Any],
                      framework: str = "transformers") -> LayerCode:  # fmt: skip
    """``transformers``' layers of ``model``, or one line naming the package to install and
    that the faithful layer runs without ``--framework``."""
    try:
        from planner.diagnose.hf_layers import TransformersCode
    except ImportError:
        raise InputError(f"--framework {framework} needs the transformers package (5.0 or "
                         "newer): pip install 'planner[transformers]'; without --framework the "
                         "planner's faithful layer runs as --stack names") from None
    return TransformersCode(model, config)


def torchtitan_code(model: ModelSpec) -> LayerCode:
    """torchtitan's layers of ``model``, or one line naming the package to install (torchtitan
    imports triton, which a CPU machine installs beside it) and that the faithful layer runs
    without ``--framework``."""
    try:
        from planner.diagnose.titan_layers import TorchtitanCode
    except ImportError:
        raise InputError("--framework torchtitan needs torchtitan 0.2.2 (with triton, which it "
                         "imports): pip install 'planner[torchtitan]'; without --framework the "
                         "planner's faithful layer runs as --stack names") from None
    return TorchtitanCode(model)


def _slug(name: str) -> str:
    """A model's name as a file name's part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"

