"""DeepSpeed (Megatron-DeepSpeed): what it launches, and the flags and ``ds_config.json`` that
launch it.

Megatron-DeepSpeed's ``pretrain_gpt.py`` takes the degrees, the batch, the model and the
recomputation on its command line and hands DeepSpeed a ``ds_config.json`` for the batch
arithmetic, the precision and ZeRO. With a pipeline the model is a DeepSpeed ``PipelineModule``
run by DeepSpeed's pipeline engine; without one, ``--no-pipeline-parallel`` builds the plain
Megatron model under DeepSpeed's ordinary engine, the only one that takes ZeRO-2 and ZeRO-3.

The rules cite deepspeedai/DeepSpeed at edaa722 (v0.19.5+) and deepspeedai/Megatron-DeepSpeed
at 4efb479. DeepSpeed's context parallelism is Ulysses (``--ds-sequence-parallel-size``:
all-to-alls from sequence to head shards around the attention core), which the planner prices
as ``cp_algo="ulysses"``; ring attention is refused.
"""

from __future__ import annotations

from planner.frameworks._deepspeed_flags import (  # the launcher, re-exported with its marks
    DS,
    DS_CONFIG_FILE,
    DS_CONFIG_MARK,
    MDS,
    launch,
)
from planner.frameworks._deepspeed_partition import (
    PARTITION_METHODS,
    partition_method,
    stage_partition,
)
from planner.frameworks.base import (
    Profile,
    Rule,
    bf16_moments_not_written,
    data_parallel_sync,
    deepep_not_run,
    moe_comm_in_line,
    ranks_in_order,
    recompute_modules_unnamed,
    unsupported_layers,
)
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

_ARGS = f"{MDS} megatron/arguments.py"
_ENGINE = f"{DS} deepspeed/runtime/engine.py"
_PIPE = f"{DS} deepspeed/runtime/pipe/engine.py"
_TRANSFORMER = f"{MDS} megatron/model/transformer.py"



# --- checks: why a configuration cannot be launched, or None --------------------------------


def zero_with_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The pipeline engine asserts ZeRO stage < 2."""
    c = resolved.config
    if c.pp == 1 or c.zero < 2:
        return None
    return (f"ZeRO-{c.zero} with pp({c.pp}): DeepSpeed's pipeline engine takes ZeRO-0 or "
            f"ZeRO-1 only")  # fmt: skip


def bf16_without_zero(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Without ZeRO, bf16 gradients accumulate in bf16 (fp32 accumulation is refused)."""
    if resolved.training.precision != "bf16" or resolved.config.zero > 0:
        return None
    return ("bf16 with zero(0): DeepSpeed accumulates bf16 gradients in bf16 without ZeRO "
            "(fp32 accumulation is an 'unsupported mix'), and its pipeline engine shards the "
            "optimizer anyway (BF16_Optimizer); the planner prices fp32 gradients: use zero >= 1")


def pipeline_schedule(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The pipeline engine trains with one schedule, synchronous 1F1B."""
    c = resolved.config
    if c.pp == 1 or (c.vpp == 1 and c.schedule == "1f1b"):
        return None
    names = {"gpipe": "GPipe", "zb-h1": "ZB-H1", "zb-v": "ZB-V"}
    planned = names.get(c.schedule, f"interleaved 1F1B (vpp={c.vpp})")
    return (f"{planned} with pp({c.pp}): DeepSpeed's pipeline engine runs one schedule, "
            f"1F1B without virtual stages")  # fmt: skip


def uneven_split(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """GPTModelPipe takes no per-stage counts: DeepSpeed's partition of its specs decides the
    stages, by Megatron-DeepSpeed's ``type:transformer`` (``gpt_model.py:463``; BLOOM's fork's
    ``type:transformer|embedding`` needs a source edit in the pinned target, so it is not
    offered)."""
    if partition_method(resolved, model) is not None:
        return None
    pp = resolved.config.pp
    splits = ", ".join(f"{list(layers)} ({method!r})" for method in PARTITION_METHODS
                       if (layers := stage_partition(model, pp=pp, method=method)) is not None)
    return (f"stages with {list(resolved.stage_layers)} layers: DeepSpeed partitions "
            f"GPTModelPipe's {model.num_layers} layers over pp({pp}) itself, as "
            f"{splits or 'nothing: fewer layers than stages'}")  # fmt: skip


def context_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """DeepSpeed's sequence parallelism is Ulysses, not ring attention nor PyTorch's."""
    c = resolved.config
    if c.cp == 1 or c.cp_algo == "ulysses":
        return None
    how = "ring attention" if c.cp_algo == "ring" else "keys and values all-gathered"
    return (f"cp({c.cp}) as {how}: DeepSpeed's context parallelism "
            f"(--ds-sequence-parallel-size) is Ulysses all-to-all attention (cp_algo ulysses)")


def megatron_sequence_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Under ``--deepspeed`` Megatron-DeepSpeed skips ``reduce_model_grads``, the only caller of
    ``allreduce_layernorm_grads``, and DeepSpeed's engines reduce over the data-parallel ranks
    only: with Megatron's sequence parallelism each tensor-parallel rank's norms see their own
    part of the sequence, and their weights drift apart without an error."""
    if not resolved.sp:
        return None
    return (f"sp with tp({resolved.config.tp}): under DeepSpeed, Megatron-DeepSpeed never "
            f"all-reduces the sequence-parallel norms' gradients over the tensor-parallel "
            f"ranks, so their weights drift apart (tensor parallelism runs without it)")


def ulysses_alone(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-DeepSpeed's ``initialize_model_parallel`` asserts that DeepSpeed's sequence
    parallelism runs without tensor or pipeline parallelism."""
    c = resolved.config
    if c.cp == 1 or (c.tp == 1 and c.pp == 1):
        return None
    return (f"cp({c.cp}) with tp({c.tp}) x pp({c.pp}): DeepSpeed's sequence parallelism does not "
            f"work with tensor or pipeline parallelism")


def selective_with_flash(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Core-attention recomputation exists only on the unfused attention path."""
    c = resolved.config
    if c.recompute != "selective" or not c.flash_attention:
        return None
    return ("selective recompute with flash attention: Megatron-DeepSpeed recomputes core "
            "attention only on its unfused path, so nothing would be recomputed")


def partial_recompute(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """DeepSpeed's checkpointing reruns every layer; its pipeline has no block method."""
    n = resolved.config.recompute_layers
    if n is None:
        return None
    return (f"recompute_layers({n}): Megatron-DeepSpeed's DeepSpeed checkpointing recomputes "
            f"every layer (in runs of --checkpoint-num-layers) and its pipeline takes no "
            f"block method")


def tp_comm_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """No flag overlaps TP collectives with GEMMs; DeepSpeed even turns the async all-reduce
    off."""
    c = resolved.config
    if not c.tp_comm_overlap or c.tp == 1:
        return None
    return (f"tp_comm_overlap with tp({c.tp}): Megatron-DeepSpeed has no tensor-parallel "
            f"communication overlap (it turns the asynchronous TP all-reduce off under DeepSpeed)")


def grad_overlap_with_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The pipeline engine reduces gradients after its schedule, never during backward (nor
    copies ZeRO-Offload's gradients to the host, which ride with the reduction)."""
    c = resolved.config
    copies = c.offload == "zero-offload"
    if c.pp == 1 or not c.overlap_grad_reduce or not (data_parallel_sync(resolved) or copies):
        return None
    return (f"overlap_grad_reduce with pp({c.pp}): DeepSpeed's pipeline engine disables "
            f"overlap_comm and reduces gradients after the last microbatch's backward"
            f"{' (and copies them to the host)' if copies else ''}")


def grad_overlap_without_zero(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Without ZeRO the engine all-reduces after the boundary backward has finished."""
    c = resolved.config
    if c.zero > 0 or not c.overlap_grad_reduce or not data_parallel_sync(resolved):
        return None
    return ("overlap_grad_reduce with zero(0): without ZeRO, DeepSpeed all-reduces the "
            "gradients after the last backward, not during it")


def grad_overlap_bf16_optimizer(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """bf16 ZeRO-1 with fp32 gradients is BF16_Optimizer, which reduces after backward;
    with ZeRO-Offload the engine builds the ZeRO optimizer instead."""
    c = resolved.config
    if (c.zero != 1 or resolved.training.precision != "bf16" or not c.overlap_grad_reduce
            or c.offload == "zero-offload" or not data_parallel_sync(resolved)):  # fmt: skip
        return None
    return ("overlap_grad_reduce with bf16 ZeRO-1: DeepSpeed runs it as BF16_Optimizer (fp32 "
            "gradients), which all-reduces after the last backward, not during it")


def param_gather_after_step(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """ZeRO-1/2 all-gather the updated weights inside the optimizer step."""
    c = resolved.config
    if c.zero not in (1, 2) or not c.overlap_param_gather or not data_parallel_sync(resolved):
        return None
    return (f"overlap_param_gather with ZeRO-{c.zero}: DeepSpeed all-gathers the updated "
            f"weights inside the optimizer step, before the next forward")


def zero3_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """ZeRO-3 hides its gathers by prefetching, its reduce-scatters by overlap_comm: the
    planner's grad-only overlap (gathers exposed, reductions hidden) has no setting."""
    c = resolved.config
    if c.zero != 3 or c.overlap_param_gather or not c.overlap_grad_reduce:
        return None
    return ("ZeRO-3 with overlap_grad_reduce but not overlap_param_gather: DeepSpeed's "
            "overlap_comm hides the reduce-scatters but not the unprefetched all-gathers, "
            "which the planner prices as hidden behind backward too")


def moe_with_zero3(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """DeepSpeed's native MoE layer refuses ZeRO-3."""
    if model.moe is None or resolved.config.zero != 3:
        return None
    return f"ZeRO-3 with {model.name}'s experts: DeepSpeed's MoE layers refuse ZeRO stage 3"


def moe_tensor_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """DeepSpeed's MoE drops tensor-parallel duplicate tokens before its all-to-all."""
    tp = resolved.config.tp
    if model.moe is None or tp == 1:
        return None
    return (f"{model.name}'s experts with tp({tp}): DeepSpeed's MoE layer drops the "
            f"tensor-parallel duplicate tokens before its all-to-all and gathers them after, "
            f"an exchange the planner does not price")


def moe_layout(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-DeepSpeed's MoE as the launch writes it: one ``--num-experts`` for every
    expert_interval-th layer (the flag takes a list per MoE slot, an entry of 1 keeping that
    layer dense, which the launch does not write), expert width = dense width, no shared
    experts, no router bias."""
    moe = model.moe
    if moe is None:
        return None
    if moe.first_dense_layers != moe.layer_freq - 1:
        return (f"MoE layers from layer {moe.first_dense_layers} every {moe.layer_freq}: the "
                f"launch gives every expert_interval-th layer experts (first_dense_layers = "
                f"layer_freq - 1 = {moe.layer_freq - 1}); --num-experts' per-layer list, "
                f"which could keep leading layers dense, is not written")
    if moe.ffn_hidden_size != model.ffn:
        return (f"expert ffn_hidden_size({moe.ffn_hidden_size}) != ffn_hidden_size({model.ffn}):"
                f" Megatron-DeepSpeed's experts are copies of the dense MLP")
    if moe.shared_experts or moe.router_expert_bias:
        return ("shared experts or a router expert bias: Megatron-DeepSpeed's MoE has "
                "neither")
    return None


def architecture(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """What GPTModel cannot build: MLA (self-attention is one fused QKV projection of the
    hidden state, ``megatron/model/transformer.py:578-586``, and no flag of
    ``megatron/arguments.py`` adds latent attention), query/key norms, a QKV bias apart from
    the others, Gemma's and Phi-3's layer features
    (:func:`~planner.frameworks.base.layer_features`)."""
    if model.mla is not None:
        return (f"{model.name} uses multi-head latent attention (low-rank compressed queries, "
                f"keys and values), which Megatron-DeepSpeed's attention lacks")
    if model.qk_layernorm:
        return f"{model.name} normalizes queries and keys, which Megatron-DeepSpeed cannot"
    if model.has_qkv_bias != model.bias:
        which = ("a QKV bias without the other linear biases" if model.has_qkv_bias else
                 "linear biases but none on QKV")  # fmt: skip
        return f"{model.name} has {which}: Megatron-DeepSpeed has one switch for all"
    # Its model arguments have no sliding window, soft-cap, post-norm or GeGLU.
    return unsupported_layers(model, framework="Megatron-DeepSpeed")


def rank_order(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """DeepSpeed's pipe/data/model topology numbers ranks tp fastest, then dp, then pp;
    Megatron-DeepSpeed's sequence-parallel groups are consecutive ranks, its data-parallel
    groups strided by them (tp 1 with Ulysses): tp, cp, dp, pp."""
    c = resolved.config
    if ranks_in_order(resolved, ("tp", "cp", "dp", "pp")):
        return None
    return f"rank_order {c.rank_order!r}: DeepSpeed numbers ranks tp, then cp, dp, pp"



def megatron_offload(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """ZeRO-Offload copies the gradients to the host as the backward reduces them, and in
    ``step`` runs the CPU's Adam and then copies each group back: not Megatron-LM's pipelined
    step after the backward (``offload optimizer``); ``offload zero-offload`` prices it."""
    if resolved.config.offload != "optimizer":
        return None
    return ("offload optimizer (Megatron-LM's, copies pipelined with the CPU step after the "
            "backward): DeepSpeed's ZeRO-Offload copies the gradients as they are reduced, "
            "then steps on the CPU and copies back: use offload zero-offload")


def zero_offload_stage(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The offload runs inside the ZeRO optimizer: ZeRO-0 has none (the config's
    ``offload_optimizer`` goes unused); ZeRO-3's optimizer steps its own sub-groups and can
    offload the parameters too, which is not the step priced."""
    c = resolved.config
    if c.offload != "zero-offload" or c.zero in (1, 2):
        return None
    if c.zero == 0:
        return ("offload zero-offload with zero(0): DeepSpeed offloads the optimizer inside "
                "its ZeRO optimizer, which ZeRO-0 does not build: use zero 1 or 2")
    return ("offload zero-offload with ZeRO-3: its optimizer steps sub-group by sub-group "
            "(parameters possibly offloaded too), which is not priced; ZeRO-1/2's is")


def zero_offload_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """bf16 ZeRO-1 under ZeRO-Offload accumulates its gradients in fp32 (the export's
    ``grad_accum_dtype``) only in the engine's backward epilogue (``fill_grad_accum_attribute``),
    which the pipeline engine skips on every stage but the last (it runs their backward with
    ``_running_engine_backward`` set, so the post-backward hook does nothing): those stages'
    gradients are never filled in, and the ZeRO-1 reduction passes them by."""
    c = resolved.config
    if (c.offload != "zero-offload" or c.zero != 1 or c.pp == 1
            or resolved.training.precision != "bf16"):  # fmt: skip
        return None
    return (f"offload zero-offload with zero(1), pp({c.pp}) and bf16: DeepSpeed's ZeRO-1 "
            f"optimizer accumulates the gradients in fp32 only in the engine's backward "
            f"epilogue, which its pipeline engine skips on all stages but the last, whose "
            f"gradients would then not be reduced: use zero 2 without a pipeline, or pp 1")


RULES: tuple[Rule, ...] = (
    Rule(name="partial-recompute", check=partial_recompute,
         source=f"{MDS} megatron/model/gpt_model.py:446-451; "
                f"megatron/model/transformer.py:1910-1921"),
    Rule(name="zero-2-3-with-pipeline", check=zero_with_pipeline,
         source=f"{_PIPE}:76-77; {MDS} pretrain_gpt.py:51"),
    Rule(name="bf16-without-zero", check=bf16_without_zero,
         source=f"{_ENGINE}:1994-1996; {_ENGINE}:2011-2021"),
    Rule(name="pipeline-schedule", check=pipeline_schedule,
         source=f"{_PIPE}:389; {DS} deepspeed/runtime/pipe/schedule.py:189-244"),
    Rule(name="uneven-split", check=uneven_split,
         source=f"{MDS} megatron/model/gpt_model.py:349-463; "
                f"{DS} deepspeed/runtime/pipe/module.py:322-341, 396-447; "
                f"{DS} deepspeed/runtime/utils.py:606-665"),
    Rule(name="ulysses-alone", check=ulysses_alone,
         source=f"{MDS} megatron/core/parallel_state.py:144-147"),
    Rule(name="context-parallel", check=context_parallel,
         source=f"{_ARGS}:974; {_TRANSFORMER}:614-621"),
    Rule(name="selective-with-flash", check=selective_with_flash,
         source=f"{_TRANSFORMER}:606-629"),
    Rule(name="recompute-modules", check=recompute_modules_unnamed,
         source=f"{_TRANSFORMER}:606-629"),
    Rule(name="tp-comm-overlap", check=tp_comm_overlap, source=f"{_ARGS}:396-399"),
    Rule(name="grad-overlap-with-pipeline", reads_overlaps=True, check=grad_overlap_with_pipeline,
         source=f"{_ENGINE}:2390-2393; {DS} deepspeed/runtime/pipe/schedule.py:238-241"),
    Rule(name="grad-overlap-without-zero", reads_overlaps=True, check=grad_overlap_without_zero,
         source=f"{_ENGINE}:2980-2982"),
    Rule(name="grad-overlap-bf16-optimizer", reads_overlaps=True, check=grad_overlap_bf16_optimizer,
         source=f"{_ENGINE}:1994-1996; {_ENGINE}:2905-2913"),
    Rule(name="param-gather-after-step", reads_overlaps=True, check=param_gather_after_step,
         source=f"{DS} deepspeed/runtime/zero/stage_1_and_2.py:2393-2398; "
                f"{DS} deepspeed/runtime/bf16_optimizer.py:454-460"),
    Rule(name="zero-3-overlap", reads_overlaps=True, check=zero3_overlap,
         source=f"{DS} deepspeed/runtime/zero/partitioned_param_coordinator.py:452; "
                f"{DS} deepspeed/runtime/zero/config.py:215"),
    Rule(name="architecture", check=architecture,
         source=f"{_TRANSFORMER}:578-586; {_ARGS}:598-690; {_ARGS}:937"),
    Rule(name="moe-with-zero-3", check=moe_with_zero3, source=f"{_ENGINE}:1889-1891"),
    Rule(name="moe-comm-overlap", check=moe_comm_in_line,
         source=f"{DS} deepspeed/moe/sharded_moe.py (MOELayer.forward)"),
    Rule(name="bf16-moments", check=bf16_moments_not_written,
         source=f"{DS} deepspeed/runtime/bf16_optimizer.py (its optimizer over fp32 partitions)"),
    Rule(name="deepep", check=deepep_not_run,
         source=f"{DS} deepspeed/moe/sharded_moe.py (_AllToAll)"),
    Rule(name="moe-with-tp", check=moe_tensor_parallel,
         source=f"{DS} deepspeed/moe/sharded_moe.py:706-732"),
    Rule(name="moe-layout", check=moe_layout,
         source=f"{_TRANSFORMER}:1650-1660; {_TRANSFORMER}:1069-1072"),
    Rule(name="megatron-sequence-parallel", check=megatron_sequence_parallel,
         source=f"{MDS} megatron/training.py:731-732; "
                f"{MDS} megatron/optimizer/optimizer.py:257-277"),
    Rule(name="rank-order", check=rank_order,
         source=f"{DS} deepspeed/runtime/pipe/topology.py:244-248; "
                f"{MDS} megatron/core/parallel_state.py:185-215"),
    Rule(name="megatron-offload", check=megatron_offload,
         source=f"{DS} deepspeed/runtime/zero/stage_1_and_2.py:1719-1762, 2320-2343"),
    Rule(name="zero-offload-stage", check=zero_offload_stage,
         source=f"{_ENGINE}:1986-1997, 2382-2415; "
                f"{DS} deepspeed/runtime/zero/stage3.py:2628-2644"),
    Rule(name="zero-offload-pipeline", check=zero_offload_pipeline,
         source=f"{_PIPE}:862-880; {_ENGINE}:2970-2987, 3004-3031; "
                f"{DS} deepspeed/runtime/zero/stage_1_and_2.py:356-364, 861-879, 2518-2521"),
)  # fmt: skip
"""Everything DeepSpeed refuses, or cannot run as the planner prices it."""


__all__ = ["DS_CONFIG_FILE", "DS_CONFIG_MARK", "PROFILE", "RULES", "launch"]

PROFILE = Profile(name="deepspeed", title="DeepSpeed", rules=RULES, launch=launch,
                  stacks=("megatron-deepspeed",), context_parallelism=("ulysses",),
                  sequence_parallel=lambda model: False)
"""DeepSpeed (Megatron-DeepSpeed) as a framework target."""
