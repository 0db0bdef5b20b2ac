"""Colossal-AI's plugin for one configuration: the ``HybridParallelPlugin`` (or
``MoeHybridParallelPlugin``) keywords and the Python snippet that constructs it.

Split from :mod:`planner.frameworks.colossalai`, whose rules
(:mod:`planner.frameworks._colossalai_rules`) decide what Colossal-AI launches and whose
:func:`~planner.frameworks.colossalai.launch` puts these together; the keywords are
hpcaitech/ColossalAI@4f9953b's (``colossalai/booster/plugin/hybrid_parallel_plugin.py``).
"""

from __future__ import annotations

from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

Kwargs = dict[str, object]
"""Keyword arguments of the plugin, or settings of the script, by name."""


def sequence_kwargs(resolved: ResolvedConfig) -> Kwargs:
    """Ring attention (or, for Ulysses, the all-to-all mode) over ``sp_size`` ranks for cp;
    split_gather (ring, with TP overlap) for sp; nothing otherwise (plain tensor
    parallelism)."""
    c = resolved.config
    if c.cp > 1:
        mode = "all_to_all" if c.cp_algo == "ulysses" else "ring_attn"
        return {"sp_size": c.cp, "enable_sequence_parallelism": True,
                "sequence_parallelism_mode": mode}  # fmt: skip
    if resolved.sp:
        mode = "ring" if c.tp_comm_overlap else "split_gather"
        return {"enable_sequence_parallelism": True, "sequence_parallelism_mode": mode}
    return {}


def pipeline_kwargs(resolved: ResolvedConfig) -> Kwargs:
    """Microbatching, schedule and layer split (meaningless at pp_size 1)."""
    c = resolved.config
    if c.pp == 1:
        return {}
    kwargs: Kwargs = {"microbatch_size": c.mbs, "num_microbatches": resolved.num_microbatches,
                      "pp_style": "interleaved" if c.vpp > 1 else "1f1b",
                      "num_model_chunks": c.vpp}  # fmt: skip
    if c.vpp == 1:  # with interleaving a rule keeps the split even, Colossal-AI's default
        kwargs["num_layers_per_stage"] = list(resolved.stage_layers)
    return kwargs


def overlap_kwargs(resolved: ResolvedConfig, *, moe: bool) -> Kwargs:
    """ZeRO's overlaps, said explicitly (the dense plugin defaults overlap_communication on).
    Gradients overlap only without pipelines, where ZeRO reduces during the last backward."""
    c = resolved.config
    grad = c.overlap_grad_reduce and c.zero > 0 and c.pp == 1 and not moe
    gather = c.overlap_param_gather and c.zero > 0
    return {"overlap_communication": grad, "overlap_allgather": gather}


def hf_config_keys(model: ModelSpec, *, deepseek: bool) -> Kwargs:
    """The model's RoPE, norm, activation and routing in the Hugging Face config's keys:
    Shardformer keeps the modeling's RoPE, norms, activation and router, so the config the model
    is built from carries them."""
    keys: Kwargs = {}
    if model.position_embedding == "rope":
        scaling = model.rope_scaling
        if model.rotary_percent < 1:  # transformers' RoPE reads it off any config
            keys["partial_rotary_factor"] = model.rotary_percent
        keys |= {"rope_theta": model.rotary_base, "rms_norm_eps": model.norm_epsilon,
                 "rope_scaling": None if scaling is None else {
                     ("type" if scaling.rope_type == "yarn" else "rope_type"): scaling.rope_type,
                     **scaling.model_dump(exclude={"rope_type"}, exclude_none=True)}}
    else:
        keys["layer_norm_epsilon"] = model.norm_epsilon
    if model.activation == "gelu":
        # GPT2Config defaults to the tanh approximation written out (gelu_new); the model's is
        # PyTorch's one-kernel erf GeLU, as the colossalai-hf stack prices it.
        keys["activation_function"] = "gelu"
    moe = model.moe
    if deepseek and moe is not None:  # DeepSeek-V3's own modeling reads these
        keys |= {"scoring_func": moe.score_function, "norm_topk_prob": moe.router_topk_normalized,
                 "routed_scaling_factor": moe.router_topk_scaling_factor or 1.0,
                 "n_group": moe.router_num_groups or 1, "topk_group": moe.router_group_topk or 1,
                 "topk_method": "noaux_tc"}  # the only one its gate runs (see family)
    return keys


def checkpoint_config(resolved: ResolvedConfig) -> str | None:
    """Full recompute under pipelines as ``PipelineGradientCheckpointConfig``: every layer of
    every (virtual) stage, or each one's first ``recompute_layers`` (the forward checkpoints
    a chunk's first ones, ``modeling/llama.py:199``), in the order stage + chunk x pp. Without
    pipelines Colossal-AI's forward refuses a config (it reads the stage manager), and
    checkpoints every layer."""
    c = resolved.config
    if c.recompute != "full" or c.pp == 1:
        return None
    per_chunk = [resolved.stage_layers[k % c.pp] // c.vpp for k in range(c.pp * c.vpp)]
    if c.recompute_layers is not None:  # no more than a chunk holds (grad_ckpt_config.py:77)
        per_chunk = [min(n, c.recompute_layers) for n in per_chunk]
    return f"PipelineGradientCheckpointConfig(num_ckpt_layers_per_stage={per_chunk})"


_COMMENTS = {
    "HF_MODEL_CLASS": "the transformers class to build from the model's config",
    "HF_CONFIG": "keys of that config: the model's RoPE, norm epsilon (and router)",
    "ATTN_IMPLEMENTATION": "its attn_implementation",
    "GRADIENT_CHECKPOINTING": "call model.gradient_checkpointing_enable() before boost()",
    "BATCH_SIZE_PER_RANK": "samples per data-parallel rank per forward-backward",
    "ACCUMULATION_STEPS": "forward-backwards per optimizer step (1 under a pipeline, whose "
                          "schedule runs the microbatches)",
    "NO_SYNC_BEFORE_LAST": "run all but the last under booster.no_sync(model, optimizer)",
}


def render(plugin: str, kwargs: Kwargs, *, settings: Kwargs, checkpointing: str | None,
           source: str) -> str:
    """A Python snippet: the ``source`` it is for, imports, the script's settings, then one
    plugin keyword per line."""
    imports = [f"from colossalai.booster.plugin import {plugin}"]
    if checkpointing is not None:
        imports.append("from colossalai.shardformer import PipelineGradientCheckpointConfig")
    lines = [f"# {source}", *imports, ""]
    lines += [f"{k} = {v!r}  # {_COMMENTS[k]}" for k, v in settings.items()]
    lines += ["", f"plugin = {plugin}("]
    lines += [f"    {name}={value!r}," for name, value in kwargs.items()]
    if checkpointing is not None:
        lines.append(f"    gradient_checkpoint_config={checkpointing},")
    return "\n".join([*lines, ")"]) + "\n"
