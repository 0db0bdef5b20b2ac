"""torchtitan v0.2.2's registered models in the planner's words: which flavor a model is, and
what the flavor builds otherwise than the model in what no cost depends on (RoPE, the norms'
epsilon, the router), which the job TOML cannot set.

Split from :mod:`planner.frameworks.torchtitan`, whose rules and launch use these; the flavors
are pytorch/torchtitan@73a0e69's (``torchtitan/models/*/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.spec import MLASpec, ModelSpec, MoESpec, RopeScaling

VERSION = "v0.2.2"
"""The torchtitan release the TOML is for."""
REPO = "pytorch/torchtitan@73a0e69"
"""torchtitan v0.2.2, where the keys and rules were checked."""


_LLAMA3_ROPE = RopeScaling(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                           high_freq_factor=4.0, original_max_position_embeddings=8192)
"""Every Llama 3 flavor scales RoPE so (``torchtitan/models/llama3/model/args.py:19-24``,
applied unconditionally by ``model.py:501``)."""


def _llama3(flavor: str, *, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    """A Llama 3 flavor; its FFN is multiple_of x ceil(multiplier x int(8 dim / 3) / multiple_of)
    (``torchtitan/models/llama3/model/model.py:332-336``), written out here; RoPE base 500000,
    norm epsilon 1e-5 (``args.py:36``)."""
    return ModelSpec(name=f"llama3 {flavor}", num_layers=layers, hidden_size=hidden,
                     num_attention_heads=heads, num_query_groups=8, ffn_hidden_size=ffn,
                     vocab_size=128256, max_position_embeddings=131072, activation="swiglu",
                     normalization="rmsnorm", position_embedding="rope",
                     tie_word_embeddings=False, bias=False, rotary_base=500000.0,
                     rope_scaling=_LLAMA3_ROPE, norm_epsilon=1e-5)  # fmt: skip


def _qwen3_moe(flavor: str, *, layers: int, hidden: int, heads: int, ffn: int,
               expert_ffn: int, rope_theta: float) -> ModelSpec:  # fmt: skip
    """A Qwen3 MoE flavor: 128 experts, top 8 renormalized, on every layer; 4 KV heads of 128
    dims; norm epsilon 1e-6 (``torchtitan/models/qwen3/model/args.py:33``)."""
    return ModelSpec(name=f"qwen3 {flavor}", num_layers=layers, hidden_size=hidden,
                     num_attention_heads=heads, num_query_groups=4, kv_channels=128,
                     ffn_hidden_size=ffn, vocab_size=151936, max_position_embeddings=262144,
                     activation="swiglu", normalization="rmsnorm", position_embedding="rope",
                     tie_word_embeddings=False, bias=False, qk_layernorm=True,
                     rotary_base=rope_theta, norm_epsilon=1e-6,
                     moe=MoESpec(num_experts=128, top_k=8, ffn_hidden_size=expert_ffn))  # fmt: skip


def _qwen3(flavor: str, *, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    """A dense Qwen3 flavor: 8 KV heads of 128 dims, query/key norms, untied from 8B up, RoPE
    base 1e6 and norm epsilon 1e-6 (``torchtitan/models/qwen3/model/args.py:33``)."""
    return ModelSpec(name=f"qwen3 {flavor}", num_layers=layers, hidden_size=hidden,
                     num_attention_heads=heads, num_query_groups=8, kv_channels=128,
                     ffn_hidden_size=ffn, vocab_size=151936, max_position_embeddings=40960,
                     activation="swiglu", normalization="rmsnorm", position_embedding="rope",
                     tie_word_embeddings=False, bias=False, qk_layernorm=True,
                     rotary_base=1e6, norm_epsilon=1e-6)  # fmt: skip


def _deepseek(flavor: str, *, layers: int, hidden: int, heads: int, ffn: int, vocab: int,
              q_lora_rank: int | None, moe: MoESpec, mscale: float = 1.0) -> ModelSpec:
    """A DeepSeek flavor of ``torchtitan/models/deepseek_v3``: MLA of 128 + 64 query/key and 128
    value dims over a 512 latent, a dense prefix then routed experts with shared ones of
    ``num_shared_experts`` x the routed width in one MLP (``torchtitan/models/moe/
    moe.py:446``); YaRN at the defaults of ``model/args.py:79-85`` (base 10000, factor 40 over
    4096 positions, betas 32 and 1) and norm epsilon 1e-5 (``args.py:62``). Every flavor keeps
    MoEArgs' ``load_balance_coeff`` 1e-3 (``moe.py:38``): an aux-loss-free expert bias."""
    yarn = RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                       beta_fast=32.0, beta_slow=1.0, mscale=mscale)
    return ModelSpec(name=f"deepseek_v3 {flavor}", num_layers=layers, hidden_size=hidden,
                     num_attention_heads=heads, ffn_hidden_size=ffn, vocab_size=vocab,
                     max_position_embeddings=163840, activation="swiglu",
                     normalization="rmsnorm", position_embedding="rope",
                     tie_word_embeddings=False, bias=False, rotary_base=10000.0,
                     rope_scaling=yarn, norm_epsilon=1e-5,
                     mla=MLASpec(q_lora_rank=q_lora_rank, kv_lora_rank=512, qk_nope_head_dim=128,
                                 qk_rope_head_dim=64, v_head_dim=128),
                     moe=moe)  # fmt: skip


def _deepseek_v2_experts(*, experts: int, width: int, scale: float | None = None,
                         groups: int | None = None, group_topk: int | None = None) -> MoESpec:
    """The DeepSeek-V2-shaped flavors' experts: top 6 of softmax scores, not renormalized, two
    shared experts, one dense layer first (``torchtitan/models/deepseek_v3/__init__.py:78-129``)."""
    return MoESpec(num_experts=experts, top_k=6, ffn_hidden_size=width, shared_experts=2,
                   shared_ffn_hidden_size=2 * width, first_dense_layers=1,
                   router_expert_bias=True, router_score_function="softmax",
                   router_topk_normalized=False, router_topk_scaling_factor=scale,
                   router_num_groups=groups, router_group_topk=group_topk)  # fmt: skip


def _deepseek_v3_671b() -> ModelSpec:
    """DeepSeek-V3 671B (``torchtitan/models/deepseek_v3/__init__.py:130-156``): 3 dense layers
    then 256 routed experts (top 8 of 4 of 8 groups, sigmoid scores renormalized and scaled by
    2.5) and one shared expert of the routed width."""
    return _deepseek("671B", layers=61, hidden=7168, heads=128, ffn=18432, vocab=129280,
                     q_lora_rank=1536,
                     moe=MoESpec(num_experts=256, top_k=8, ffn_hidden_size=2048,
                                 shared_experts=1, shared_ffn_hidden_size=2048,
                                 first_dense_layers=3, router_expert_bias=True,
                                 router_score_function="sigmoid", router_topk_scaling_factor=2.5,
                                 router_num_groups=8, router_group_topk=4))  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Flavor:
    """A model torchtitan registers, in the planner's words."""

    name: str
    """``[model] name``."""
    flavor: str
    """``[model] flavor``."""
    spec: ModelSpec
    """Its architecture (max_position_embeddings aside, which torchtitan sets to seq_len)."""
    pipeline: bool
    """Whether its train spec has a pipelining function."""
    source: str
    """Where it is registered."""
    flex_attention: bool = False
    """Whether it attends with FlexAttention, block-causally within each document (``attn_type
    "flex"``, ``attn_mask_type "block_causal"``), rather than SDPA over the whole sequence."""


_LLAMA3 = f"{REPO} torchtitan/models/llama3/__init__.py"
_QWEN3 = f"{REPO} torchtitan/models/qwen3/__init__.py"
_DEEPSEEK_V3 = f"{REPO} torchtitan/models/deepseek_v3/__init__.py"
FLAVORS: tuple[Flavor, ...] = (
    Flavor(name="llama3", flavor="8B", pipeline=True, source=f"{_LLAMA3}:51-59",
           spec=_llama3("8B", layers=32, hidden=4096, heads=32, ffn=14336)),
    Flavor(name="llama3", flavor="70B", pipeline=True, source=f"{_LLAMA3}:82-90",
           spec=_llama3("70B", layers=80, hidden=8192, heads=64, ffn=28672)),
    Flavor(name="llama3", flavor="405B", pipeline=True, source=f"{_LLAMA3}:91-99",
           spec=_llama3("405B", layers=126, hidden=16384, heads=128, ffn=53248)),
    Flavor(name="qwen3", flavor="8B", pipeline=False, source=f"{_QWEN3}:85-96",
           spec=_qwen3("8B", layers=36, hidden=4096, heads=32, ffn=12288)),
    Flavor(name="qwen3", flavor="14B", pipeline=False, source=f"{_QWEN3}:97-108",
           spec=_qwen3("14B", layers=40, hidden=5120, heads=40, ffn=17408)),
    Flavor(name="qwen3", flavor="32B", pipeline=False, source=f"{_QWEN3}:109-120",
           spec=_qwen3("32B", layers=64, hidden=5120, heads=64, ffn=25600)),
    Flavor(name="qwen3", flavor="30B-A3B", pipeline=False, source=f"{_QWEN3}:145-167",
           spec=_qwen3_moe("30B-A3B", layers=48, hidden=2048, heads=32, ffn=6144,
                           expert_ffn=768, rope_theta=1e6)),
    Flavor(name="qwen3", flavor="235B-A22B", pipeline=False, source=f"{_QWEN3}:168-190",
           spec=_qwen3_moe("235B-A22B", layers=94, hidden=4096, heads=64, ffn=12288,
                           expert_ffn=1536, rope_theta=5e6)),
    # DeepSeek-V2-Lite's and DeepSeek-V2's shapes, registered under deepseek_v3.
    Flavor(name="deepseek_v3", flavor="16B", pipeline=True, flex_attention=True,
           source=f"{_DEEPSEEK_V3}:78-102",
           spec=_deepseek("16B", layers=27, hidden=2048, heads=16, ffn=10944, vocab=102400,
                          q_lora_rank=None, mscale=0.70,
                          moe=_deepseek_v2_experts(experts=64, width=1408))),
    Flavor(name="deepseek_v3", flavor="236B", pipeline=True, flex_attention=True,
           source=f"{_DEEPSEEK_V3}:103-129",
           spec=_deepseek("236B", layers=60, hidden=5120, heads=128, ffn=12288, vocab=102400,
                          q_lora_rank=1536,
                          moe=_deepseek_v2_experts(experts=160, width=1536, scale=16.0,
                                                   groups=8, group_topk=3))),
    Flavor(name="deepseek_v3", flavor="671B", pipeline=True, flex_attention=True,
           source=f"{_DEEPSEEK_V3}:130-156", spec=_deepseek_v3_671b()),
)  # fmt: skip
"""The registered models the planner's models can be (the debug flavors aside). The DeepSeek
flavors attend block-causally with FlexAttention: the planner prices causal attention over the
whole sequence, which that is when a sample is one document and bounds from above otherwise
(the launch's notes say so)."""


_UNPRICED = ("rotary_base", "rope_scaling", "norm_epsilon")
"""Model fields that change no cost: a flavor matches whatever they are."""
_UNPRICED_ROUTER = frozenset(k for k in MoESpec.model_fields if k.startswith("router_"))
"""The router's settings (its expert bias is a few parameters the search does not tell apart)."""


@lru_cache(maxsize=256)
def _signature(model: ModelSpec) -> tuple[object, ...]:
    """What a model's cost depends on: its architecture without name, positions or training."""
    fields = model.model_dump(exclude={"name", "max_position_embeddings", "training",
                                       "num_query_groups", "kv_channels", "ffn_hidden_size",
                                       "qkv_bias", "moe", *_UNPRICED})  # fmt: skip
    # The router's settings are not priced (the launch's notes say where they differ from the
    # flavor's); the dense width only where a layer is dense.
    moe = model.moe.model_dump(exclude=set(_UNPRICED_ROUTER)) if model.moe else {}
    dense = model.moe is None or any(not model.is_moe_layer(i) for i in range(model.num_layers))
    return (tuple(sorted(fields.items())), model.query_groups, model.head_dim,
            model.has_qkv_bias, model.ffn if dense else None,
            tuple(sorted(moe.items())))  # fmt: skip


@lru_cache(maxsize=256)
def flavor(model: ModelSpec) -> Flavor | None:
    """The registered model ``model`` is, or None (remembered: the search asks for every
    configuration it considers)."""
    return next((f for f in FLAVORS if _signature(f.spec) == _signature(model)), None)


def flavor_differences(found: Flavor, model: ModelSpec) -> tuple[str, ...]:
    """What the registered flavor builds otherwise than ``model`` says, in what the cost does
    not depend on (RoPE, the norms' epsilon, the router), which the TOML cannot change."""
    theirs, ours = found.spec, model
    pairs = [("RoPE base", theirs.rotary_base, ours.rotary_base),
             ("norm epsilon", theirs.norm_epsilon, ours.norm_epsilon),
             ("RoPE scaling", _scaling(theirs), _scaling(ours))]  # fmt: skip
    if theirs.moe is not None and ours.moe is not None:
        pairs += [("routing", _router(theirs.moe), _router(ours.moe))]
    differ = [f"{what} {_text(mine)} (the flavor's {_text(its)})"
              for what, its, mine in pairs if its != mine]  # fmt: skip
    if not differ:
        return ()
    return (f"{found.name} {found.flavor} differs from {model.name} in what the TOML cannot "
            f"set: " + "; ".join(differ),)


def _text(value: float | str) -> str:
    return f"{value:g}" if isinstance(value, float) else value


def _scaling(model: ModelSpec) -> str:
    scaling = model.rope_scaling
    if scaling is None:
        return "none"
    mscale = scaling.mscale
    return (f"{scaling.rope_type} x{scaling.factor:g}"
            + (f" mscale {mscale:g}" if mscale not in (None, 1.0) else ""))


def _router(moe: MoESpec) -> str:
    groups = (f", top {moe.router_group_topk} of {moe.router_num_groups} groups"
              if moe.router_num_groups else "")  # fmt: skip
    factor = moe.router_topk_scaling_factor
    scale = f", x{factor:g}" if factor not in (None, 1.0) else ""  # None scales by 1
    norm = "renormalized" if moe.router_topk_normalized else "not renormalized"
    bias = ", expert bias" if moe.router_expert_bias else ""
    return f"{moe.score_function} {norm}{scale}{groups}{bias}"
