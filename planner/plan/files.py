"""Reading a plan file back: its schema version, its fields, the limits and the invariants.

Kept apart from :mod:`planner.plan.schema` so that the value type does not read its own
files (the invariants import the value type).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from planner.errors import InputError, InvalidPlanError
from planner.plan.invariants import check_plan
from planner.plan.schema import READABLE_VERSIONS, SCHEMA_VERSION, Plan
from planner.spec import ClusterSpec, ModelSpec
from planner.spec import limits as lim
from planner.spec.messages import describe_validation_error, short_repr
from planner.spec.reading import load_cluster, load_model, parse_json, read_json

_KINDS = {
    kind: {name for name, f in spec.model_fields.items() if f.is_required()} - {"name"}
    for kind, spec in (("plan", Plan), ("model", ModelSpec), ("cluster", ClusterSpec))
}
"""The fields each kind of file must have (besides a name)."""


def file_kind(data: object) -> str | None:
    """What a JSON document looks like: a ``"plan"`` (it has a ``schema_version``), a
    ``"model"`` (a Hugging Face config has a ``model_type``) or a ``"cluster"``, else the kind
    whose required fields it has the largest share of, at least half; None when none.

    >>> file_kind({"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32})
    'model'
    >>> file_kind({"devices_per_node": 8, "device": {}, "num_nodes": 2})
    'cluster'
    """
    if not isinstance(data, dict):
        return None
    if "schema_version" in data:
        return "plan"
    if "model_type" in data:
        return "model"
    share = {kind: len(fields & data.keys()) / len(fields) for kind, fields in _KINDS.items()}
    kind = max(share, key=share.__getitem__)
    return kind if share[kind] >= 0.5 else None


def load_inputs(
    model: Path, cluster: Path, *, nodes: int | None, names: tuple[str, str] = ("MODEL", "CLUSTER")
) -> tuple[ModelSpec, ClusterSpec]:
    """The model and the cluster; when either does not read, an error that says so if the two
    files look swapped or either is another kind of file (``names`` are the arguments as the
    command line names them)."""
    try:
        return load_model(model), load_cluster(cluster, nodes)
    except InputError:
        kinds = _kind(model), _kind(cluster)
        if kinds == ("cluster", "model"):
            raise InputError(f"{names[0]} and {names[1]} look swapped: {model} is a cluster "
                             f"file and {cluster} a model file") from None  # fmt: skip
        for path, kind, expected in ((model, kinds[0], "model"), (cluster, kinds[1], "cluster")):
            if kind is not None and kind != expected:
                raise InputError(f"{path}: a {kind} file, not a {expected} file") from None
        raise


def load_model_file(model: Path) -> ModelSpec:
    """The model; when it does not read, an error that says so if it is another kind of file."""
    try:
        return load_model(model)
    except InputError:
        kind = _kind(model)
        if kind is not None and kind != "model":
            raise InputError(f"{model}: a {kind} file, not a model file") from None
        raise


def _kind(path: Path) -> str | None:
    """What the file looks like (:func:`~planner.plan.files.file_kind`); None if unreadable."""
    try:
        return file_kind(read_json(path))
    except InputError:
        return None


def plan_from_json(text: str, *, source: str = "<plan>") -> Plan:
    """Read a plan back; a file that is not a plan, a wrong schema version or a malformed plan
    is an InputError."""
    data = parse_json(text, source=source)
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object, got {type(data).__name__}")
    kind = file_kind(data)
    if kind != "plan":
        what = f"it looks like a {kind} file" if kind else "no schema_version, stages or predicted"
        raise InputError(f"{source}: not a plan file ({what}; `planner solve --out` and "
                         f"`planner estimate --out` write plans)")  # fmt: skip
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise InputError(f"{source}: schema_version {short_repr(version)} is not "
                         f"supported; this planner reads "
                         f"{', '.join(map(str, READABLE_VERSIONS[:-1]))} and "
                         f"{READABLE_VERSIONS[-1]}")  # fmt: skip
    data = _flags_of_configuration({**_upgraded(data), "schema_version": SCHEMA_VERSION})
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc)) from None
    _check_limits(plan, source)
    try:
        # Structure only: `planner estimate --out` may write a configuration over memory.
        return check_plan(plan, memory=False)
    except InvalidPlanError as exc:
        raise InputError(f"{source}: damaged or hand-edited plan: {exc}") from None


def _check_limits(plan: Plan, source: str) -> None:
    """Refuse a plan read from a file whose sizes are past :mod:`planner.spec.limits` (before
    anything walks its layers, ranks or microbatches)."""

    devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    checks = (
        ("num_layers", max(s.layers[1] for s in plan.stages), lim.MAX_LAYERS, None),
        ("stages", len(plan.stages), lim.MAX_LAYERS, "a stage holds at least one layer"),
        ("schedule.virtual_stages", plan.schedule.virtual_stages, lim.MAX_LAYERS,
         "a virtual stage holds at least one layer"),
        ("num_devices", devices, lim.MAX_DEVICES, None),
        ("data_parallel_replicas", plan.data_parallel_replicas, lim.MAX_DEVICES,
         lim.reason("num_devices")),
        ("global_batch_size", plan.global_batch_size, lim.MAX_GLOBAL_BATCH_SIZE, None),
        ("num_microbatches", plan.num_microbatches, lim.MAX_GLOBAL_BATCH_SIZE, None),
        ("micro_batch_size", plan.micro_batch_size, lim.MAX_MICRO_BATCH_SIZE,
         lim.reason("mbs")),
        ("seq_length", plan.seq_length, lim.MAX_SEQ_LENGTH, None),
    )  # fmt: skip
    for name, value, limit, why in checks:
        message = lim.check_at_most(name, value, limit, why=why)
        if message is not None:
            raise InputError(f"{source}: {message}")


def _flags_of_configuration(data: dict) -> dict:
    """A plan whose flags predate ``moe_dispatcher`` and ``optimizer_moments`` (schema 6
    files written before the per-operator search kept them) takes them from its
    configuration, which had them: a DeepEP plan still reads as one."""
    flags, config = data.get("flags"), data.get("configuration")
    if not isinstance(flags, dict) or not isinstance(config, dict):
        return data
    missing = {k: config[k] for k in ("moe_dispatcher", "optimizer_moments")
               if k not in flags and k in config}  # fmt: skip
    return {**data, "flags": {**flags, **missing}} if missing else data


def _suffixed(part: object, unit: str) -> object:
    """A breakdown's keys with their unit (``weights`` -> ``weights_gib``); anything else as
    given, for the validation to name."""
    if not isinstance(part, dict):
        return part
    return {f"{key}_{unit}": value for key, value in part.items()}


def _upgraded(data: dict) -> dict:
    """A plan of schema 2-5 in schema 6's terms: the breakdowns carry their units in their
    keys (``memory``/``weights_gib``, ``time``/``compute_s``, since 4), the ZeRO stage is
    ``zero`` (since 4) and the bubble is its share of the step (since 6). Version 2 lacks only
    fields that have defaults; versions 2-4 lack the error band, whose default (None) reads as
    not recorded: unknown, not uncalibrated."""
    if data.get("schema_version") == SCHEMA_VERSION:
        return data
    data = dict(data)
    stages = data.get("stages")
    if isinstance(stages, list):
        upgraded = []
        for stage in stages:
            if isinstance(stage, dict):
                stage = dict(stage)
                if "memory_gib" in stage:
                    stage["memory"] = _suffixed(stage.pop("memory_gib"), "gib")
                if "time_s" in stage:
                    stage["time"] = _suffixed(stage.pop("time_s"), "s")
                parallel = stage.get("parallel")
                if isinstance(parallel, dict) and "zero_stage" in parallel:
                    parallel = dict(parallel)
                    parallel["zero"] = parallel.pop("zero_stage")
                    stage["parallel"] = parallel
            upgraded.append(stage)
        data["stages"] = upgraded
    predicted = data.get("predicted")
    if isinstance(predicted, dict):
        predicted = dict(predicted)
        if "time_s" in predicted:
            predicted["time"] = _suffixed(predicted.pop("time_s"), "s")
        share = _bubble_share(predicted)
        if share is not None:
            predicted["bubble_fraction"] = share
        data["predicted"] = predicted
    return data


def _bubble_share(predicted: dict) -> float | None:
    """The bubble's share of the step from a schema 2-5 plan's own numbers (it stored the
    bubble over the busy time, which passes 100 % with fewer microbatches than stages); None
    when they are not there (the validation names what is missing). The share is
    :func:`planner.cost.bubble_share`'s, which plan/ cannot import (it comes first)."""
    time, step_s = predicted.get("time"), predicted.get("step_time_s")
    bubble_s = time.get("pipeline_bubble_s") if isinstance(time, dict) else None
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool)
                  for x in (bubble_s, step_s))  # fmt: skip
    if not numbers:
        return None
    return bubble_s / step_s if step_s > 0 else 0.0  # type: ignore[operator]
