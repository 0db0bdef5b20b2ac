"""RoPE on a share of each head (Hugging Face's ``partial_rotary_factor``, Megatron's
``--rotary-percent``): Phi-4-mini rotates 0.75 of its heads' dims, which the planner dropped,
exporting launches that rotate them all."""

from __future__ import annotations

import json

from planner.frameworks import colossalai, deepspeed, megatron, torchtitan
from planner.plan.inputs import _sha256, model_hashes
from planner.spec.hf import model_from_hf_config
from tests import test_framework_colossalai as tc
from tests import test_framework_deepspeed as td
from tests.conftest import HF, shared
from tests.framework_cases import configure
from tests.test_framework_megatron import read_flags


def _llama(**changes: object) -> dict[str, object]:
    return {**json.loads(shared(HF / "Meta-Llama-3.1-8B.config.json").read_text()), **changes}


def test_read_from_either_form_of_the_config() -> None:
    """transformers 4's top-level key, or transformers 5's inside ``rope_parameters``; 1
    where neither says it."""
    assert model_from_hf_config(_llama(), source="x").rotary_percent == 1.0
    partial = model_from_hf_config(_llama(partial_rotary_factor=0.75), source="x")
    assert partial.rotary_percent == 0.75
    v5 = _llama(rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                 "partial_rotary_factor": 0.5})  # fmt: skip
    v5.pop("rope_theta")
    v5.pop("rope_scaling")
    assert model_from_hf_config(v5, source="x").rotary_percent == 0.5


def test_every_launch_rotates_the_share_or_refuses() -> None:
    """Megatron-LM and MindSpeed (NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py,
    ``--rotary-percent``) and Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed@4efb479
    megatron/model/language_model.py:431-432) take the flag; Colossal-AI builds Hugging
    Face's model, whose RoPE reads the key off the config; torchtitan's registered Llama
    rotates whole heads, so the model is none of its flavors."""
    model = model_from_hf_config(_llama(partial_rotary_factor=0.75), source="x")
    knobs = dict(tp=2, sp=True, zero=1, global_batch=64, seq_len=4096)
    resolved = configure(model, 16, **knobs)
    flags = read_flags(megatron.PROFILE.launch(resolved, model).text)
    assert flags["--rotary-percent"] == "0.75"
    ds = configure(model, 16, **(knobs | {"sp": False, "stack": "megatron-deepspeed"}))
    ds_flags, _ = td.launched(ds, model)
    assert ds_flags["--rotary-percent"] == "0.75"
    cai = configure(model, 16, **(knobs | {"stack": "colossalai-hf"}))
    _, _, settings = tc.launched(cai, model)
    assert settings["HF_CONFIG"]["partial_rotary_factor"] == 0.75
    titan = configure(model, 16, **(knobs | {"stack": "torchtitan-eager"}))
    assert any("registered models" in r for r in torchtitan.PROFILE.refusals(titan, model))
    assert deepspeed.PROFILE.refusals(ds, model) == ()
    assert colossalai.PROFILE.refusals(cai, model) == ()


def test_plans_made_before_the_field_name_the_model() -> None:
    """A plan written before ``rotary_percent`` hashed the model without it, and names it
    whatever its value (it changes no price): Phi-4-mini's plan made before still exports."""
    for share in (1.0, 0.75):
        model = model_from_hf_config(_llama(partial_rotary_factor=share), source="x")
        before = _sha256(model.model_dump(mode="json", exclude={"rotary_percent"}))
        assert before in model_hashes(model)
