"""Megatron-LM reads the planner's launch text back, and builds what the planner priced.

For every bundled model (``instances/models`` and ``shared/reference/hf``) and a handful of
configurations, the Megatron-LM launch text of :mod:`planner.frameworks.megatron` (plus
``--mock-data``) goes through Megatron-LM's own ``parse_args`` and ``validate_args``, then
``core_transformer_config_from_args``, ``get_num_layers_to_build`` for every pipeline stage and
the tokenizer's padded vocabulary: in one process, on the CPU, with ``WORLD_SIZE`` and ``RANK``
set for the configuration and the launch's environment applied. What Megatron read is compared
with what the planner priced (degrees, split, batch, recomputation, ZeRO, overlaps, precision,
attention and the model's shape); a row passes when Megatron accepts the text and reads back
every value.

The planner and Megatron-LM need different Pythons (Megatron-LM asks for 3.12 and torch), so
this script builds the cases with the planner and hands them to a worker (this same file, run
by ``--python``), which imports only Megatron-LM. There is no GPU: the worker tells Megatron
the device is ``--device-arch`` (9, Hopper: the architecture before Blackwell, where
``validate_args`` asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1``). With a Megatron-LM worktree at
/tmp/megatron and a venv for it, from the repository root:

    python3.12 -m venv /tmp/mvenv
    /tmp/mvenv/bin/pip install torch==2.13.0 numpy packaging triton six regex einops pyyaml
    python benchmarks/check_megatron_args.py --megatron /tmp/megatron \\
        --python /tmp/mvenv/bin/python

``--flavor mindspeed`` checks MindSpeed's launch text (:mod:`planner.frameworks.mindspeed`)
the same way against a Megatron-LM ``core_v0.12.1`` checkout, the version MindSpeed runs on,
with the MindSpeed flags it uses (``--context-parallel-algo``, ``--use-cp-send-recv-overlap``,
``--use-fused-rotary-pos-emb``) registered as MindSpeed registers them and its fused-RoPE
feature's bypass of Megatron's RoPE fusion check, and its Ulysses feature's checks
(:func:`mindspeed_validate`); MindSpeed's other checks need ``torch_npu`` and are not run.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL_FILES = sorted((REPO / "instances" / "models").glob("*.json")) + sorted(
    (REPO.parent / "shared" / "reference" / "hf").glob("*.json")
)
CLUSTER_FILE = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"
DEVICES_PER_NODE = 8
MICROBATCHES_PER_STAGE = 4
"""Microbatches per pipeline stage in every case (a multiple of pp, as interleaving needs)."""
HF_SEQ_LENGTH = 4096
"""Sequence length for models without a training block (the Hugging Face configs), or their
position table's length when shorter."""

_OVERLAP = dict(overlap_grad_reduce=True, overlap_param_gather=True)
TEMPLATES: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = (
    ("TP+SP, ZeRO-1, selective", tuple(
        dict(tp=tp, dp=16 // tp, sp=True, zero=1, recompute="selective", **_OVERLAP)
        for tp in (8, 4, 2))),
    ("PP, interleaved, full", tuple(
        dict(tp=2, pp=pp, vpp=vpp, dp=8 // pp, sp=True, zero=1, recompute="full",
             tp_comm_overlap=overlap)
        for overlap in (True, False) for pp in (4, 2) for vpp in (3, 2))),
    ("PP4, uneven first/last", ()),  # the uneven splits are per model: uneven_candidates
    ("PP4, uneven, interleaved", ()),
    ("PP2, uneven", ()),
    ("CP ring, ZeRO-0", tuple(
        dict(tp=tp, cp=2, dp=16 // (2 * tp), sp=True, overlap_grad_reduce=True)
        for tp in (4, 2))),
    ("CP all-to-all (Ulysses)", tuple(
        dict(tp=tp, cp=2, cp_algo="ulysses", dp=16 // (2 * tp), sp=True, zero=1, **_OVERLAP)
        for tp in (4, 2, 1))),
    ("ZeRO-1, Adam moments in bf16", tuple(
        dict(tp=tp, dp=16 // tp, sp=tp > 1, zero=1, optimizer_moments="bf16", **_OVERLAP)
        for tp in (2, 1))),
    ("ZeRO-3 (Megatron-FSDP)", tuple(
        dict(tp=tp, dp=16 // tp, sp=True, zero=3, **_OVERLAP) for tp in (2, 1))),
    ("ZeRO-2, fp32, unfused", (dict(tp=2, dp=8, sp=True, zero=2, precision="fp32",
                                   flash_attention=False, overlap_grad_reduce=True),)),
    ("FP8 (TE hybrid, delayed)", tuple(
        dict(tp=tp, dp=16 // tp, sp=tp > 1, zero=1, stack="megatron-te-fp8", **_OVERLAP)
        for tp in (2, 1))),
    ("loss fused (native)", tuple(
        dict(tp=tp, dp=16 // tp, sp=tp > 1, zero=1, stack=stack, **_OVERLAP)
        for tp in (2, 1) for stack in ("megatron-te-fused-loss", "megatron-te-fp8-fused-loss"))),
    ("experts: EP", tuple(
        dict(tp=2, pp=pp, dp=dp, ep=ep, sp=True, zero=1, **_OVERLAP)
        for pp in (2, 1) for dp, ep in ((8, 8), (4, 4), (4, 2)))),
    ("experts: EP on DeepEP", tuple(
        dict(tp=2, pp=pp, dp=dp, ep=ep, sp=True, zero=1, moe_dispatcher="deepep", **_OVERLAP)
        for pp in (2, 1) for dp, ep in ((8, 8), (4, 4), (4, 2)))),
)  # fmt: skip
"""Each case's candidates, tried in order: the first the model resolves and Megatron-LM's
profile accepts is checked."""


# --- the planner's side: cases and what Megatron must read back ---------------------------------


def uneven_candidates(label: str, num_layers: int) -> tuple[dict[str, Any], ...]:
    """Uneven splits: four stages with a lighter first and last stage around two equal middle
    ones (interleaved: all four even, when the layer count is), or two stages."""
    if label.startswith("PP2"):
        first = num_layers // 2 - 1
        return (dict(tp=2, pp=2, dp=4, sp=True, zero=1, first_stage_layers=first,
                     last_stage_layers=num_layers - first),)  # fmt: skip
    first = max(2, (num_layers // 4 - 1) // 2 * 2)
    last = first + (num_layers - 2 * first) % 4
    vpp = 2 if label.endswith("interleaved") else 1
    if (first % vpp, last % vpp) != (0, 0):
        return ()
    return (dict(tp=2, pp=4, vpp=vpp, dp=2, sp=True, zero=1, first_stage_layers=first,
                 last_stage_layers=last),)  # fmt: skip


def build_cases(flavor: str) -> list[dict[str, Any]]:
    """Every (model, configuration) the flavor's profile launches, with its expectations."""
    import planner
    from planner.errors import ConfigError, PlannerError
    from planner.frameworks import megatron, mindspeed
    from planner.plan.config import ParallelConfig, resolve

    profile = {"megatron": megatron.PROFILE, "mindspeed": mindspeed.PROFILE}[flavor]
    cases = []
    for path in MODEL_FILES:
        try:
            model = planner.load_model(path)
        except PlannerError as exc:  # a model the planner cannot read has no launch to check
            print(f"skipped {path.name}: {exc}")
            continue
        seq = (model.training.seq_length if model.training
               else min(HF_SEQ_LENGTH, model.max_position_embeddings))  # fmt: skip
        for label, candidates in TEMPLATES:
            if label.startswith("experts") and model.moe is None:
                continue
            options = candidates or uneven_candidates(label, model.num_layers)
            for option in options:
                pp, dp, mbs = option.get("pp", 1), option["dp"], option.get("mbs", 1)
                config = ParallelConfig(**option, seq_len=seq,
                                        global_batch=dp * mbs * pp * MICROBATCHES_PER_STAGE)
                world = option["tp"] * pp * option.get("cp", 1) * dp
                cluster = planner.load_cluster(CLUSTER_FILE, nodes=world // DEVICES_PER_NODE)
                try:
                    resolved = resolve(model, cluster, config)
                except ConfigError:
                    continue
                if not profile.launches(resolved, model):
                    continue
                launch = profile.launch(resolved, model)
                cases.append(dict(flavor=flavor, model=path.stem.removesuffix(".config"),
                                  label=label,
                                  world_size=world, words=shell_words(launch.text),
                                  environment=launch.environment,
                                  expected=expected(resolved, model)))  # fmt: skip
                break
    return cases


def shell_words(text: str) -> list[str]:
    """The launch text as the shell splits it (line continuations joined)."""
    return shlex.split(text.replace("\\\n", " "))


def recompute_priced(c: Any) -> str:
    """A configuration's recomputation as :func:`recompute_name` names Megatron's flags."""
    if c.recompute_layers is not None:
        return f"full, first {c.recompute_layers} per chunk"
    return c.recompute


def expected(resolved: Any, model: Any) -> dict[str, Any]:
    """What Megatron must read back: the priced configuration and the model's shape."""
    from planner.frameworks._megatron_model_flags import max_positions
    from planner.frameworks._megatron_vocab import padded_vocab
    from planner.vocabulary import FP8_STACKS, FUSED_LOSS_STACKS

    c, t = resolved.config, resolved.training
    moe, mla = model.moe, model.mla
    return dict(
        tp=c.tp, pp=c.pp, cp=c.cp, ep=c.ep, etp=c.tp, dp=resolved.dp, vpp=c.vpp, sp=resolved.sp,
        cp_comm=("a2a" if c.cp_algo == "ulysses" else "p2p") if c.cp > 1 else None,
        stage_layers=list(resolved.stage_layers), mbs=c.mbs, gbs=t.global_batch_size,
        seq=t.seq_length, microbatches=resolved.num_microbatches, recompute=recompute_priced(c),
        zero=c.zero, moments=c.optimizer_moments, overlap_grad_reduce=c.overlap_grad_reduce,
        overlap_param_gather=c.overlap_param_gather,
        tp_comm_overlap=c.tp_comm_overlap and c.tp > 1, precision=t.precision,
        fp8="hybrid/delayed" if t.stack in FP8_STACKS else None,
        loss="fused/native" if t.stack in FUSED_LOSS_STACKS else "eager",
        attention="fused" if c.flash_attention else "unfused",
        layers=model.num_layers, hidden=model.hidden_size, ffn=model.ffn,
        heads=model.num_attention_heads, groups=None if mla else model.query_groups,
        kv_channels=None if mla else model.head_dim,
        vocab_rows=padded_vocab(model.vocab_size, c.tp),
        max_positions=max_positions(model, t.seq_length),
        positions=model.position_embedding, norm=model.normalization,
        swiglu=model.activation == "swiglu", untied=not model.tie_word_embeddings,
        bias=model.bias, qkv_bias=model.has_qkv_bias, qk_layernorm=model.qk_layernorm,
        hidden_dropout=model.hidden_dropout, attention_dropout=model.attention_dropout,
        experts=moe and moe.num_experts, topk=moe and moe.top_k,
        dispatcher=moe and ("flex/deepep" if c.moe_dispatcher == "deepep" else "alltoall"),
        moe_ffn=moe and moe.ffn_hidden_size, shared_ffn=moe and (moe.shared_ffn or None),
        moe_layers=moe and [int(model.is_moe_layer(i)) for i in range(model.num_layers)],
        expert_bias=bool(moe and moe.router_expert_bias),
        mla=mla and [mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim,
                     mla.qk_rope_head_dim, mla.v_head_dim],
        norm_epsilon=model.norm_epsilon, **rope_expected(model), **router_expected(model, t),
    )  # fmt: skip


def rope_expected(model: Any) -> dict[str, Any]:
    """RoPE's base and the scaling Megatron builds: llama3's factor, or YaRN's under MLA."""
    if model.position_embedding != "rope":
        return dict(rotary_base=None, rope_scaling=None)
    scaling = model.rope_scaling
    built = None
    if scaling is not None and scaling.rope_type == "llama3":
        built = ["llama3", scaling.factor]
    elif scaling is not None and scaling.rope_type == "yarn" and model.mla is not None:
        built = ["yarn", scaling.factor, scaling.mscale or 1.0, scaling.mscale_all_dim or 0.0]
    elif model.mla is not None:
        built = ["yarn", "default"]  # MLA's own YaRN (a note says so)
    return dict(rotary_base=round(model.rotary_base), rope_scaling=built)


def router_expected(model: Any, training: Any) -> dict[str, Any]:
    """The router's knobs and whether a rank's experts run as one grouped GEMM."""
    moe = model.moe
    if moe is None:
        return dict(router=None, grouped_gemm=False)
    pre = moe.score_function == "softmax" and (moe.top_k == 1 or not moe.router_topk_normalized)
    return dict(router=[moe.score_function, pre, moe.router_topk_scaling_factor,
                        moe.router_num_groups, moe.router_group_topk,
                        moe.router_aux_loss_coeff or 0.0],
                grouped_gemm=training.precision == "bf16")  # fmt: skip


def run_worker(cases: list[dict[str, Any]], *, python: str, megatron: Path,
               device_arch: int) -> list[dict[str, Any]]:  # fmt: skip
    """Hand the cases to a worker process that imports Megatron-LM; its results, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = Path(tmp) / "cases.json", Path(tmp) / "results.json"
        cases_path.write_text(json.dumps(cases))
        command = [python, __file__, "--worker", "--megatron", str(megatron), "--cases",
                   str(cases_path), "--out", str(out_path), "--device-arch", str(device_arch)]
        subprocess.run(command, check=True)  # fmt: skip
        return json.loads(out_path.read_text())


def report(cases: list[dict[str, Any]], results: list[dict[str, Any]]) -> int:
    """Print the table; the number of failing rows."""
    failures = 0
    print(f"{'model':<28} {'configuration':<26} {'world':>5}  result")
    for case, result in zip(cases, results, strict=True):
        problem = result.get("error") or differences(case["expected"], result["read"])
        failures += bool(problem)
        print(f"{case['model']:<28} {case['label']:<26} {case['world_size']:>5}  "
              f"{'FAIL: ' + problem if problem else 'pass'}")  # fmt: skip
    print(f"\n{len(cases) - failures} of {len(cases)} pass")
    return failures


def differences(want: dict[str, Any], got: dict[str, Any]) -> str:
    """``key: Megatron read X, planner priced Y`` for every value that differs."""
    wrong = [f"{key}: Megatron read {got.get(key)!r}, planner priced {value!r}"
             for key, value in want.items() if got.get(key) != value]  # fmt: skip
    return "; ".join(wrong)


# --- the worker's side: Megatron-LM only ------------------------------------------------------


def check_all(cases: list[dict[str, Any]], *, device_arch: int) -> list[dict[str, Any]]:
    """Run every case through Megatron-LM in this process."""
    # Megatron's import-time warnings and INFO logs would bury the table.
    warnings.simplefilter("ignore")
    logging.disable(logging.INFO)
    pretend_gpu_node(device_arch)
    return [check_one(case) for case in cases]


def pretend_gpu_node(device_arch: int) -> None:
    """Answer the questions Megatron asks of the GPU node rather than of the arguments: the
    device's architecture (``validate_args``), whether Transformer Engine's fused RoPE kernel
    is installed (``TransformerConfig`` refuses the default ``apply_rope_fusion`` otherwise),
    and whether the installed Transformer Engine is recent enough for a feature (MoE in FP8
    needs 1.7; the node is taken to run the one Megatron-LM's container ships, where the CPU
    worker has none)."""
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.transformer.transformer_config as transformer_config
    import megatron.training.arguments as arguments

    transformer_config.is_te_min_version = lambda *_, **__: True

    arguments.get_device_arch_version = lambda: device_arch
    # --moe-grouped-gemm asks torch for the device's capability (arguments.py:1378-1380)
    arguments.torch.cuda.get_device_capability = lambda *_: (device_arch, 0)
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = "Transformer Engine's fused RoPE (absent on CPU)"


@contextlib.contextmanager
def mindspeed_rope(enabled: bool) -> Iterator[None]:
    """What MindSpeed's ``--use-fused-rotary-pos-emb`` feature does to the configuration
    check while ``enabled``: the NPU's RoPE kernel replaces Transformer Engine's, so Megatron's
    RoPE fusion check is skipped (``mindspeed/core/fusions/fused_rope.py:77-88``)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check = TransformerConfig.__post_init__

    def without_rope_check(config: Any) -> None:
        fusion, config.apply_rope_fusion = config.apply_rope_fusion, False
        check(config)
        config.apply_rope_fusion = fusion

    if enabled:
        TransformerConfig.__post_init__ = without_rope_check
    try:
        yield
    finally:
        TransformerConfig.__post_init__ = check


def mindspeed_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The MindSpeed flags the launch text uses, as MindSpeed's features register them
    (``context_parallel_feature.py:21-30``, the choice ``ulysses_context_parallel.py:15-19``
    adds, ``fused_rope.py:14-21``)."""
    group = parser.add_argument_group(title="mindspeed")
    group.add_argument("--context-parallel-algo", default="megatron_cp_algo",
                       choices=["megatron_cp_algo", "hybrid_cp_algo", "hybrid_adaptive_cp_algo",
                                "kvallgather_cp_algo", "ulysses_cp_algo"])  # fmt: skip
    group.add_argument("--use-cp-send-recv-overlap", action="store_true")
    group.add_argument("--use-fused-rotary-pos-emb", action="store_true")
    return parser


def mindspeed_validate(args: Any) -> Any:
    """The checks of MindSpeed's Ulysses feature on top of Megatron's
    (``ulysses_context_parallel.py:24-34``): the sequence over ``cp``, the heads over
    ``cp x tp``, fused attention switched on."""
    if args.context_parallel_size > 1 and args.context_parallel_algo == "ulysses_cp_algo":
        if args.seq_length % args.context_parallel_size != 0:
            raise AssertionError("sequence length must be divisible by context_parallel_size")
        ways = args.context_parallel_size * args.tensor_model_parallel_size
        if args.num_attention_heads < ways or args.num_attention_heads % ways != 0:
            raise AssertionError("num_attention_heads must be divisible by "
                                 "context_parallel_size * tensor_model_parallel_size")
        args.use_flash_attn = True
    return args


def check_one(case: dict[str, Any]) -> dict[str, Any]:
    """One case: parse, validate, build the config; what Megatron read, or why it refused."""
    from megatron.training.arguments import parse_args, validate_args

    extra = mindspeed_flags if case["flavor"] == "mindspeed" else None
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(case["environment"], WORLD_SIZE=str(case["world_size"]), RANK="0")
    sys.argv = ["pretrain_gpt.py", *case["words"], "--mock-data"]
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            args = validate_args(parse_args(extra))
            if case["flavor"] == "mindspeed":
                args = mindspeed_validate(args)
            return {"read": read_back(args, flavor=case["flavor"])}
    except SystemExit:  # argparse refused a flag: its message is the last "error:" line
        lines = [line for line in captured.getvalue().splitlines() if "error:" in line]
        return {"error": lines[-1] if lines else "parse_args exited"}
    except Exception as exc:  # any refusal is a row of the table
        return {"error": traceback.format_exception_only(exc)[-1].strip()}


def cp_comm_type(args: Any) -> str | None:
    """The context-parallel communication Megatron runs every layer with (None without CP);
    under MindSpeed, its ``--context-parallel-algo`` in Megatron's words."""
    if args.context_parallel_size == 1:
        return None
    algo = getattr(args, "context_parallel_algo", None)
    if algo is not None:
        return {"megatron_cp_algo": "p2p", "ulysses_cp_algo": "a2a"}.get(algo, algo)
    kinds = getattr(args, "cp_comm_type", None) or ["p2p"]
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return kinds[0] if len(set(kinds)) == 1 else "mixed"


def read_back(args: Any, *, flavor: str) -> dict[str, Any]:
    """What Megatron built from the arguments, in the planner's words."""
    from megatron.training.arguments import core_transformer_config_from_args

    with mindspeed_rope(getattr(args, "use_fused_rotary_pos_emb", False)):
        config = core_transformer_config_from_args(args)
    padded_vocab(args)
    mla = getattr(config, "multi_latent_attention", False)
    # MindSpeed maps --use-flash-attn to the NPU's fused attention on the local layers.
    flash = args.use_flash_attn if flavor == "mindspeed" else None
    return dict(
        tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
        cp=args.context_parallel_size, ep=args.expert_model_parallel_size,
        cp_comm=cp_comm_type(args),
        etp=args.expert_tensor_parallel_size, dp=args.data_parallel_size,
        vpp=args.virtual_pipeline_model_parallel_size or 1, sp=args.sequence_parallel,
        stage_layers=stage_layer_counts(config, args), mbs=args.micro_batch_size,
        gbs=args.global_batch_size, seq=args.seq_length,
        microbatches=args.global_batch_size // (args.micro_batch_size * args.data_parallel_size),
        recompute=recompute_name(args), zero=zero_stage(args),
        moments="bf16" if args.use_precision_aware_optimizer and {
            str(args.exp_avg_dtype), str(args.exp_avg_sq_dtype)} == {"torch.bfloat16"}
        else "fp32",
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather, tp_comm_overlap=args.tp_comm_overlap,
        precision="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        fp8=f"{args.fp8}/{getattr(args, 'fp8_recipe', None)}" if getattr(args, "fp8", None)
        else None,
        loss=f"fused/{config.cross_entropy_fusion_impl}" if config.cross_entropy_loss_fusion
        else "eager",
        attention=config.attention_backend.name if flash is None else
        ("fused" if flash else "unfused"),
        layers=config.num_layers, hidden=config.hidden_size, ffn=config.ffn_hidden_size,
        heads=config.num_attention_heads, groups=None if mla else config.num_query_groups,
        kv_channels=None if mla else config.kv_channels, vocab_rows=args.padded_vocab_size,
        max_positions=args.max_position_embeddings,
        positions={"learned_absolute": "learned"}.get(args.position_embedding_type,
                                                        args.position_embedding_type),
        norm=config.normalization.lower(), swiglu=config.gated_linear_unit,
        untied=args.untie_embeddings_and_output_weights, bias=config.add_bias_linear,
        qkv_bias=config.add_qkv_bias, qk_layernorm=config.qk_layernorm,
        hidden_dropout=config.hidden_dropout, attention_dropout=config.attention_dropout,
        **moe_read_back(config), expert_bias=config.moe_router_enable_expert_bias,
        mla=[config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim,
             config.qk_pos_emb_head_dim, config.v_head_dim] if mla else None,
        norm_epsilon=config.layernorm_epsilon, **rope_read_back(config, args),
        **router_read_back(config),
    )  # fmt: skip


def rope_read_back(config: Any, args: Any) -> dict[str, Any]:
    """The base and scaling the rotary embedding is built with (``gpt_config_from_args``
    hands the llama3 ones to ``GPTModel``; MLA's YaRN reads its config)."""
    if args.position_embedding_type != "rope":
        return dict(rotary_base=None, rope_scaling=None)
    scaling = None
    if args.use_rope_scaling:
        scaling = ["llama3", args.rope_scaling_factor]
    elif getattr(config, "multi_latent_attention", False) and config.rope_type == "yarn":
        said = "--rotary-scaling-factor" in sys.argv
        scaling = (["yarn", config.rotary_scaling_factor, config.mscale, config.mscale_all_dim]
                   if said else ["yarn", "default"])  # fmt: skip
    base = config.rotary_base if getattr(config, "multi_latent_attention", False) else None
    return dict(rotary_base=base if base is not None else args.rotary_base, rope_scaling=scaling)


def router_read_back(config: Any) -> dict[str, Any]:
    """The router the MoE layers are built with."""
    if config.num_moe_experts is None:
        return dict(router=None, grouped_gemm=False)
    coeff = config.moe_aux_loss_coeff  # a list of one at d98e8a6 (nargs='+')
    return dict(router=[config.moe_router_score_function, config.moe_router_pre_softmax,
                        config.moe_router_topk_scaling_factor, config.moe_router_num_groups,
                        config.moe_router_group_topk,
                        coeff[0] if isinstance(coeff, list) else coeff],
                grouped_gemm=config.moe_grouped_gemm)  # fmt: skip


def padded_vocab(args: Any) -> None:
    """Build the tokenizer, which sets ``args.padded_vocab_size`` (main moved it to core)."""
    try:
        from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    except ImportError:  # core_v0.12.1
        from megatron.training.tokenizer import build_tokenizer
    build_tokenizer(args)


def stage_layer_counts(config: Any, args: Any) -> list[int]:
    """Decoder layers on each pipeline rank, as the model builder counts them."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, vpp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    if "pp_rank" in inspect.signature(get_num_layers_to_build).parameters:
        return [sum(get_num_layers_to_build(config, vp_stage=v if vpp else None, pp_rank=rank)
                    for v in range(vpp or 1)) for rank in range(pp)]  # fmt: skip
    # core_v0.12.1 reads the ranks from parallel_state; the first (last) chunk of the first
    # (last) rank builds one layer less where the embedding (loss) takes a layer's slot
    # (transformer_block.py:152-158), so every chunk is counted.
    from megatron.core import parallel_state

    parallel_state.set_pipeline_model_parallel_world_size(pp)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp)
    counts = []
    for rank in range(pp):
        parallel_state.set_pipeline_model_parallel_rank(rank)
        layers = 0
        for chunk in range(vpp or 1):
            parallel_state.set_virtual_pipeline_model_parallel_rank(chunk if vpp else None)
            layers += get_num_layers_to_build(config)
        counts.append(layers)
    return counts


def recompute_name(args: Any) -> str:
    """Megatron's recompute flags as the planner's granularity."""
    if args.recompute_granularity == "full":
        if args.recompute_method == "block":
            return f"full, first {args.recompute_num_layers} per chunk"
        full = args.recompute_method == "uniform" and args.recompute_num_layers == 1
        return "full" if full else "full (other)"
    return args.recompute_granularity or "none"


def zero_stage(args: Any) -> int:
    """Megatron's optimizer sharding as a ZeRO stage (Megatron-FSDP was custom FSDP in
    core_v0.12.1)."""
    if getattr(args, "use_megatron_fsdp", False) or getattr(args, "use_custom_fsdp", False):
        return {"optim_grads": 2, "optim_grads_params": 3}.get(
            args.data_parallel_sharding_strategy, -1
        )
    return int(args.use_distributed_optimizer)


def moe_read_back(config: Any) -> dict[str, Any]:
    """The experts Megatron builds, layer by layer."""
    experts = config.num_moe_experts
    if experts is None:
        return dict(experts=None, topk=None, moe_ffn=None, shared_ffn=None, moe_layers=None,
                    dispatcher=None)
    dispatcher = config.moe_token_dispatcher_type
    if dispatcher == "flex":
        dispatcher += f"/{config.moe_flex_dispatcher_backend}"
    freq = config.moe_layer_freq
    layers = freq if isinstance(freq, list) else [int(i % freq == 0)
                                                  for i in range(config.num_layers)]  # fmt: skip
    return dict(experts=experts, topk=config.moe_router_topk, moe_ffn=config.moe_ffn_hidden_size,
                shared_ffn=config.moe_shared_expert_intermediate_size, moe_layers=layers,
                dispatcher=dispatcher)


# --- entry point --------------------------------------------------------------------------------


def main() -> None:
    """Build the cases, check them in a Megatron-LM worker, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron", type=Path, required=True, help="A Megatron-LM checkout.")
    parser.add_argument("--flavor", choices=("megatron", "mindspeed"), default="megatron",
                        help="Whose launch text (mindspeed: check against core_v0.12.1).")
    parser.add_argument("--python", default=sys.executable,
                        help="A Python that imports Megatron-LM (default: this one).")
    parser.add_argument("--device-arch", type=int, default=9,
                        help="GPU architecture Megatron is told it runs on (9: Hopper).")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        sys.path.insert(0, str(options.megatron))
        cases = json.loads(options.cases.read_text())
        options.out.write_text(json.dumps(check_all(cases, device_arch=options.device_arch)))
        return
    cases = build_cases(options.flavor)
    results = run_worker(cases, python=options.python, megatron=options.megatron,
                         device_arch=options.device_arch)  # fmt: skip
    sys.exit(1 if report(cases, results) else 0)


if __name__ == "__main__":
    main()
