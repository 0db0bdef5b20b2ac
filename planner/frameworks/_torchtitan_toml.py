"""torchtitan's job TOML: the tables of one configuration and their text.

Split from :mod:`planner.frameworks.torchtitan`, whose rules
(:mod:`planner.frameworks._torchtitan_rules`) decide what it launches and whose
:func:`~planner.frameworks.torchtitan.launch` composes these tables with the model's flavor;
the keys are torchtitan v0.2.2's (pytorch/torchtitan@73a0e69
``torchtitan/config/job_config.py``).
"""

from __future__ import annotations

from planner.plan.chunks import chunk_sizes, virtual_stages
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

Table = dict[str, object]

_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def training_table(resolved: ResolvedConfig) -> Table:
    """Batch, sequence and precision. With a pipeline the local batch holds all of a step's
    microbatches; without one torchtitan accumulates global / (local x dp) of them."""
    c, t = resolved.config, resolved.training
    local = c.mbs * (resolved.num_microbatches if c.pp > 1 else 1)
    return {"local_batch_size": local, "global_batch_size": t.global_batch_size,
            "seq_len": t.seq_length, "dtype": "float32",
            "mixed_precision_param": _DTYPES[t.precision],
            "mixed_precision_reduce": "float32"}  # fmt: skip


def data_parallel_table(resolved: ResolvedConfig) -> Table:
    """DDP (replicate) for ZeRO-0, FSDP2 (shard) otherwise; resharding after forward only for
    ZeRO-3 (ZeRO-1 under pipelines and ZeRO-2 keep the gathered weights)."""
    dp, zero = resolved.dp, resolved.config.zero
    if zero == 0 or dp == 1:
        return {"data_parallel_replicate_degree": dp, "data_parallel_shard_degree": 1}
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": dp,
            "fsdp_reshard_after_forward": "always" if zero == 3 else "never"}  # fmt: skip


def model_parallel_table(resolved: ResolvedConfig, model: ModelSpec) -> Table:
    """Tensor (always with sequence-sharded norms and the vocab-parallel loss), context and
    expert parallelism; experts are tensor-parallel like the rest (etp = tp) or folded over
    the tensor-parallel ranks (etp = 1), the two values torchtitan takes
    (``torchtitan/distributed/parallel_dims.py``)."""
    c = resolved.config
    table: Table = {"tensor_parallel_degree": c.tp, "disable_loss_parallel": False,
                    "enable_async_tensor_parallel": False,
                    "context_parallel_degree": c.cp}  # fmt: skip
    if model.moe is not None:
        table |= {"expert_parallel_degree": c.ep,
                  "expert_tensor_parallel_degree": (resolved.etp or c.tp) if c.ep > 1
                  else 1}  # fmt: skip
    if c.moe_dispatcher == "deepep":  # torchtitan/config/job_config.py:474-483
        table["expert_parallel_comm_backend"] = "deepep"
    return table


def pipeline_table(resolved: ResolvedConfig) -> Table:
    """Pipeline degree, schedule, microbatch and the modules of every (virtual) stage."""
    c = resolved.config
    if c.pp == 1:
        return {"pipeline_parallel_degree": 1}
    # ZB-H1 is the interleaved zero-bubble schedule with one stage per rank (the TOML's parts
    # set the stages per rank); ZB-V places its two parts per rank in a V.
    names = {"gpipe": "GPipe", "1f1b": "Interleaved1F1B" if c.vpp > 1 else "1F1B",
             "zb-h1": "InterleavedZeroBubble", "zb-v": "ZBVZeroBubble"}  # fmt: skip
    parts = model_parts(resolved.stage_layers, c.vpp, v_shape=c.schedule == "zb-v")
    return {"pipeline_parallel_degree": c.pp,
            "pipeline_parallel_schedule": names[c.schedule],
            "pipeline_parallel_microbatch_size": c.mbs,
            "module_fqns_per_model_part": parts}  # fmt: skip


def model_parts(layers: tuple[int, ...], vpp: int, *, v_shape: bool = False) -> list[list[str]]:
    """torchtitan's module names for each (virtual) stage, in model order. A looped schedule
    runs part ``k`` on pipeline rank ``k % pp``, so each rank's layers are cut into ``vpp``
    chunks (:func:`~planner.plan.chunks.chunk_sizes`) that take turns with the other
    ranks'; a V schedule (``v_shape``, two parts
    per rank) runs part ``k`` on rank ``k`` and part ``2 pp - 1 - k`` on rank ``k`` too.

    >>> model_parts((2, 1), 1)
    [['tok_embeddings', 'layers.0', 'layers.1'], ['layers.2', 'norm', 'output']]
    >>> parts = model_parts((3, 3), 2)  # the embedding and the loss take a layer's slot each
    >>> [sum(name.startswith("layers.") for name in part) for part in parts]
    [1, 2, 2, 1]
    """
    # a looped schedule's chunks as Megatron-Core cuts them, the ends' slots short; a V's halves
    chunks = ([(n // vpp,) * vpp for n in layers] if v_shape else chunk_sizes(layers, vpp))
    sizes = [chunks[s][c] for s, c in virtual_stages(len(layers), vpp, v_shape=v_shape)]
    parts, first = [], 0
    for size in sizes:
        parts.append([f"layers.{i}" for i in range(first, first + size)])
        first += size
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def compile_table(resolved: ResolvedConfig) -> Table:
    """``[compile]`` as the plan's stack runs: on ``torchtitan-compiled`` each block
    (``apply_compile``, ``torchtitan/models/llama3/infra/parallelize.py:256-269``) and the loss
    (``torchtitan/components/loss.py:33-35``) compiled, the default ``components``
    (``torchtitan/config/job_config.py:721-727``) written out; off on ``torchtitan-eager``."""
    if resolved.training.stack != "torchtitan-compiled":
        return {"enable": False}
    return {"enable": True, "components": ["model", "loss"]}


def render(tables: dict[str, Table]) -> str:
    """TOML: one table after another, a list of lists one inner list per line."""
    lines: list[str] = []
    for name, table in tables.items():
        lines += [*([""] * bool(lines)), f"[{name}]"]
        for key, value in table.items():
            if isinstance(value, list) and value and isinstance(value[0], list):
                lines += [f"{key} = [", *(f"  {_value(v)}," for v in value), "]"]
            else:
                lines.append(f"{key} = {_value(value)}")
    return "\n".join(lines) + "\n"


def _value(value: object) -> str:
    """A TOML value: strings, integers, booleans and lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)
