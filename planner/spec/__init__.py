"""Inputs of the planner: the model and the training run (:mod:`planner.spec.model`) and the
cluster (:mod:`planner.spec.cluster`), re-exported here.

Field names follow Megatron-LM's arguments (which users already know) and carry their unit at
this JSON boundary (``memory_gib``, ``bandwidth_gb_s``). Inside the planner every quantity is in
SI units; the ``*_bytes`` / ``*_flops_per_s`` properties do the conversion once, at the spec.

Files and options are read into these specs by :mod:`planner.spec.reading` (Hugging Face
``config.json`` files through :mod:`planner.spec.hf`); the fields' bounds are
:mod:`planner.spec.limits`, their types :mod:`planner.spec.fields`, and a model's experts,
latent attention and RoPE scaling :mod:`planner.spec.layers`.
"""

from __future__ import annotations

from planner.spec.cluster import (
    AttentionEfficiency,
    ClusterSpec,
    DeviceEfficiency,
    DeviceSpec,
    Fp8Efficiency,
    GemmEfficiency,
    GroupedGemmEfficiency,
    HostSpec,
    LinkEfficiency,
    NetworkLevel,
    ValidationBand,
)
from planner.spec.evidence import Regime, ValidatedRun
from planner.spec.fields import Float, Int, Name
from planner.spec.layers import MLASpec, MoESpec, RopeScaling
from planner.spec.model import (
    Activation,
    ModelSpec,
    Normalization,
    PositionEmbedding,
    TrainingSpec,
)

__all__ = [
    "Activation", "AttentionEfficiency", "ClusterSpec", "DeviceEfficiency", "DeviceSpec",
    "Float", "Fp8Efficiency", "GemmEfficiency", "GroupedGemmEfficiency", "HostSpec", "Int",
    "LinkEfficiency",
    "MLASpec", "MoESpec", "ModelSpec", "Name", "NetworkLevel", "Normalization",
    "PositionEmbedding", "Regime", "RopeScaling", "TrainingSpec", "ValidatedRun",
    "ValidationBand",
]  # fmt: skip
