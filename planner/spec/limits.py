"""The largest inputs the planner accepts, each with the reason for its value.

A limit exists for two reasons: past it the search's time or memory explodes, or the number
means nonsense (a typo, a unit mistake, an overflow). Each value leaves headroom of 2-8x over
the largest published model or cluster, so no real input is refused. The spec models
(:mod:`planner.spec`) enforce them as field bounds, so a Hugging Face ``config.json`` gets
them too, and the error names the file, the field, the value and the limit (with the reason
from :data:`REASONS`).

Sizes of real models and clusters the values are set against:

- layers: GPT-1T 128 (Narayanan et al., SC'21, Table 1), Llama 3.1 405B 126, PaLM 540B 118,
  GPT-3 96.
- hidden size: GPT-1T 25,600; PaLM 18,432; Llama 3.1 405B 16,384. FFN: GPT-1T 102,400;
  PaLM 73,728; Llama 3.1 405B 53,248.
- attention heads: GPT-1T 160, Llama 3.1 405B 128; per-head dims 64-256 (Gemma 256);
  DeepSeek-V3's MLA ranks 512 (keys/values) and 1,536 (queries).
- vocabulary: Gemma 256,000, Gemma 3 262,144.
- positions: Llama 3.1 131,072; Llama 4 Scout 10,485,760 (``max_position_embeddings``).
- global batch: GPT-3 1,536 sequences, Llama 3 405B 2,048 (16M tokens), DeepSeek-V3 15,360;
  LAMB trained BERT at 65,536 sequences of 128 tokens.
- experts: DeepSeek-V3 256 routed, Kimi K2 384.
- devices: Llama 3 405B trained on 16,384 H100; xAI's Colossus holds 100,000-200,000 GPUs.
  Devices per node (the fastest network domain): DGX 8, GB200 NVL72 72.

The layer limit is the one the search feels most. The pipeline dynamic program builds
``(stages, layers + 1, layers + 1)`` arrays per candidate and its cost grows with the cube of
the layers. Measured on the project's 2-core machine with a synthetic GPT 1,024 wide
(``planner solve``, default options, wall time and peak RSS):

============  ==================  ==================  ==================
devices       128 layers          256 layers          512 layers
============  ==================  ==================  ==================
64 A100       11 s, 141 MiB       43 s, 255 MiB       891 s, 916 MiB
1,024 A100                        178 s, 545 MiB
============  ==================  ==================  ==================

``split_layers`` alone on 64 stages takes 7.5 s at 512 layers and 51 s at 1,024 (one call; the
search makes one per candidate). With as many stages as layers, the stage table alone is
``16 p (L + 1)^2`` bytes: 258 MiB at 256 layers, 2.0 GiB at 512, 16 GiB at 1,024. Hence 256,
twice GPT-1T: past it a search takes a quarter of an hour and gigabytes.

Devices per node set the layer ILP's meshes: ``planner solve`` of GPT 1.7B on one node of
1,024 devices took 81 s (103 MiB). Over devices the search is mild: on 2^20 devices (131,072
DGX nodes) GPT-3 175B is refused in 67 s (its global batch of 1,536 cannot use them all).
"""

from __future__ import annotations

MAX_LAYERS = 256
"""Decoder layers: 2x GPT-1T's 128; the search's cost grows with the cube of the layers."""

MAX_MTP_LAYERS = 8
"""Multi-token-prediction depths: DeepSeek-V3 trains 1."""

MAX_HIDDEN_SIZE = 131_072
"""Model width (also bounds MLA ranks): ~5x GPT-1T's 25,600."""

MAX_FFN_HIDDEN_SIZE = 524_288
"""FFN width (dense or one expert's): ~5x GPT-1T's 102,400."""

MAX_ATTENTION_HEADS = 1_024
"""Attention heads (and key/value groups): 6.4x GPT-1T's 160."""

MAX_HEAD_DIM = 4_096
"""Per-head dims (``kv_channels``, MLA head dims): 16x Gemma's 256."""

MAX_VOCAB_SIZE = 1_048_576
"""Vocabulary: 4x Gemma 3's 262,144."""

MAX_SEQ_LENGTH = 33_554_432
"""Positions and training sequence length (2^25): 3.2x Llama 4 Scout's 10,485,760."""

MAX_GLOBAL_BATCH_SIZE = 131_072
"""Sequences per step: 2x LAMB's 65,536, 8.5x DeepSeek-V3's 15,360. The schedule simulator
walks every microbatch of every stage: ``planner simulate`` of 131,072 microbatches on 8 stages
took 10 s and 1 GB (65,536 on 4 stages: 2.6 s, 305 MiB)."""

MAX_MICRO_BATCH_SIZE = MAX_GLOBAL_BATCH_SIZE
"""Sequences per microbatch: a microbatch is part of the global batch. No tighter bound holds
for every plan: a stage mesh's microbatch is the per-rank one (published runs use 1-16) times
the data-parallel ways inside the mesh, which may span nodes."""

MAX_EXPERTS = 2_048
"""Routed (or shared) experts per MoE layer: 5.3x Kimi K2's 384, 8x DeepSeek-V3's 256."""

MAX_ROTARY_BASE = 1e10
"""RoPE's base period: 1,000x Qwen3-235B's 10^6 and Llama 4's 5 x 10^5 (Megatron reads an
integer)."""

MAX_ROPE_FACTOR = 1_024.0
"""RoPE's context stretch: 25x DeepSeek-V3's yarn 40, 128x Llama 3.1's 8."""

MAX_ROUTER_SCALING = 1_000.0
"""A factor on the routing weights: 400x DeepSeek-V3's 2.5 (DeepSeek-V2's 16)."""

MAX_CAPACITY_FACTOR = 64.0
"""An expert's capacity over its balanced share of tokens: up to every token of 64 experts'
shares on one expert (Switch Transformer trained at 1.0-2.0)."""

MAX_EXPERT_LOAD_CV = 8.0
"""The spread of a layer's tokens per expert, standard deviation over mean: 8 is a router
sending nearly everything to one of 64 experts (an untrained router early in training)."""

MAX_DEVICES = 1_048_576
"""Devices in a cluster (nodes x devices per node, and any network domain): 2^20, ~5x the
200,000 GPUs of the largest cluster announced (xAI Colossus)."""

MAX_DEVICES_PER_NODE = 1_024
"""Devices in the innermost (node) network domain: 14x GB200 NVL72, 1.8x the announced
NVL576."""

MAX_DEVICE_MEMORY_GIB = 16_384.0
"""Memory of one device: 16 TiB, ~57x the 288 GB of an MI355X or B300."""

MAX_HOST_MEMORY_GIB = 1_048_576.0
"""Host memory of one node: 1 PiB, ~35x the 30 TB of CPU memory of an 8-socket server."""

MAX_COMPUTE_UNITS = 16_384
"""Streaming multiprocessors or compute units of one device: ~110x the 148 of a B200."""

MAX_PEAK_TFLOPS = 1e6
"""Dense peak of one device, TFLOP/s (1 EFLOP/s): ~220x a B200's 4,500 dense FP8."""

MAX_BANDWIDTH_GB_S = 1e6
"""Memory or link bandwidth of one device, GB/s (1 PB/s): 125x a B200's 8 TB/s of HBM3e."""

MAX_LATENCY_US = 1e6
"""A link's latency or a kernel launch, microseconds: one second."""

MAX_OVERSUBSCRIPTION = 64.0
"""A network level's oversubscription ratio: fabrics are built 1:1 to about 8:1; 64 leaves
room for a study without admitting a typo of a thousand."""

MAX_HALF_SATURATION_GFLOP = 1e6
"""GEMM size at half the achievable FLOP/s: fitted values are tens of GFLOP (A100: 43)."""

MAX_FP8_SPEEDUP = 16.0
"""FP8 over 16-bit GEMM speed: data sheets double the peak (H100: 1,979 against 989 TFLOP/s
dense), measured kernels run 1.5-2x."""

MAX_TIME_LIMIT_S = 1e6
"""A solver time limit, seconds (11.6 days): OR-Tools takes it as whole milliseconds in a 64-bit
integer, and overflows (a crash, not an error) long before infinity."""

MAX_INPUT_BYTES = 64 * 1024**2
"""Size of any input file: a plan for ``MAX_DEVICES`` devices, one rank a line, is ~25 MB;
a model, cluster or config.json is a few KB."""

_LAYERS = "2x GPT-1T's 128 layers; the search's cost grows with the cube of the layers"
_WIDTH = "about 5x GPT-1T's 25,600"
_FFN = "about 5x GPT-1T's 102,400"
_HEADS = "6.4x GPT-1T's 160 heads"
_HEAD_DIM = "16x Gemma's 256 dims per head"
_RANK = "a rank is at most the model width"
_POSITIONS = "3.2x Llama 4 Scout's 10,485,760 positions"
_BATCH = "2x LAMB's 65,536 sequences; the simulator walks every microbatch"
_EXPERTS = "5.3x Kimi K2's 384 experts"
_DEVICES = "2^20 devices in all, ~5x the 200,000 GPUs of the largest cluster announced"
_MEMORY = "16 TiB, ~57x the largest accelerator memory (288 GB)"
_BANDWIDTH = "1 PB/s, 125x a B200's HBM"
_DEGREE = "a degree splits at most the 2^20 devices of the largest cluster accepted"

REASONS: dict[str, str] = {
    "num_layers": _LAYERS,
    "first_stage_layers": _LAYERS,
    "last_stage_layers": _LAYERS,
    "first_dense_layers": _LAYERS,
    "layer_freq": _LAYERS,
    "hidden_size": _WIDTH,
    "q_lora_rank": _RANK,
    "kv_lora_rank": _RANK,
    "ffn_hidden_size": _FFN,
    "shared_ffn_hidden_size": _FFN,
    "num_attention_heads": _HEADS,
    "num_query_groups": _HEADS,
    "kv_channels": _HEAD_DIM,
    "qk_nope_head_dim": _HEAD_DIM,
    "qk_rope_head_dim": _HEAD_DIM,
    "v_head_dim": _HEAD_DIM,
    "vocab_size": "4x Gemma 3's 262,144",
    "max_position_embeddings": _POSITIONS,
    "seq_length": _POSITIONS,
    "seq_len": _POSITIONS,
    "global_batch_size": _BATCH,
    "global_batch": _BATCH,
    "num_microbatches": _BATCH,
    "mbs": "a microbatch is part of the global batch, at most 131,072 sequences",
    "num_experts": _EXPERTS,
    "router_num_groups": _EXPERTS,
    "router_group_topk": _EXPERTS,
    "rotary_base": "1,000x Qwen3's 10^6",
    "factor": "25x DeepSeek-V3's yarn factor 40",
    "router_topk_scaling_factor": "400x DeepSeek-V3's 2.5",
    "shared_experts": _EXPERTS,
    "top_k": _EXPERTS,
    "num_nodes": _DEVICES,
    "nodes": _DEVICES,
    "num_devices": _DEVICES,
    "domain_devices": _DEVICES,
    "devices_per_node": "14x the 72 GPUs of a GB200 NVL72 domain",
    "memory_gib": _MEMORY,
    "reserved_memory_gib": _MEMORY,
    "peak_tflops": "1 EFLOP/s, ~220x a B200",
    "compute_units": "~110x the 148 SMs of a B200",
    "memory_bandwidth_gb_s": _BANDWIDTH,
    "bandwidth_gb_s": _BANDWIDTH,
    "latency_us": "one second",
    "kernel_launch_us": "one second",
    "half_saturation_gflop": "fitted values are tens of GFLOP",
    "time_limit": "11.6 days; solvers take the limit in whole milliseconds",
    "tp": _DEGREE,
    "dp": _DEGREE,
    "cp": _DEGREE,
    "ep": _DEGREE,
    "etp": _DEGREE,
    "mtp_layers": "8x the one DeepSeek-V3 trains",
    "pp": "a stage holds at least one of at most 256 layers",
    "vpp": "a virtual stage holds at least one of at most 256 layers",
}
"""Why each bounded field has its limit, by field name (as in the JSON files and options)."""


def reason(field: str) -> str:
    """Why ``field`` (a JSON field or option name, with or without ``--``) has its limit;
    empty when it has none of its own."""
    return REASONS.get(field.removeprefix("--").replace("-", "_"), "")


def check_at_most(
    name: str, value: int | float, limit: int | float, *, why: str | None = None
) -> str | None:
    """The message for ``value`` above ``limit`` (``name`` as the user wrote it; ``why``
    defaults to :func:`reason`), else None.

    >>> print(check_at_most("--seq-len", 2**30, MAX_SEQ_LENGTH))
    --seq-len 1073741824 is above the limit of 33554432 (3.2x Llama 4 Scout's 10,485,760 positions)
    >>> check_at_most("--seq-len", 2048, MAX_SEQ_LENGTH) is None
    True
    """
    if value <= limit:
        return None
    why = reason(name) if why is None else why
    return f"{name} {value} is above the limit of {limit}" + (f" ({why})" if why else "")
