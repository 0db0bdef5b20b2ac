"""What the framework tests share: bundled models by name, H100 clusters by size, resolved
configurations (and ones forced past ``resolve``'s checks), and a rule's verdict by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import planner
from planner.frameworks.base import Rule
from planner.plan.config import ParallelConfig, ResolvedConfig, resolve
from planner.spec import ClusterSpec, ModelSpec
from tests.conftest import CLUSTERS, HF, MODELS, shared

H100 = CLUSTERS / "dgx-h100-80gb.json"


def load(name: str) -> ModelSpec:
    """A bundled model by file stem (instances/models, then the Hugging Face configs)."""
    path = MODELS / f"{name}.json"
    return planner.load_model(path if path.exists() else shared(HF / f"{name}.config.json"))


def without_mtp(name: str) -> ModelSpec:
    """:func:`load` without the model's multi-token-prediction modules, as a framework that
    builds none trains it (a Hugging Face config's ``num_nextn_predict_layers`` set to 0)."""
    return load(name).model_copy(update={"mtp_layers": 0})


def nodes(devices: int) -> ClusterSpec:
    """DGX H100 nodes for ``devices`` GPUs."""
    return planner.load_cluster(H100, nodes=devices // 8)


def configure(model: ModelSpec, devices: int, **knobs: Any) -> ResolvedConfig:
    """``knobs`` resolved on ``devices`` H100s."""
    return resolve(model, nodes(devices), ParallelConfig(**knobs))


def forced(resolved: ResolvedConfig, **changes: Any) -> ResolvedConfig:
    """``resolved`` with configuration fields changed past ``resolve``'s checks (a search that
    builds configurations itself must still be refused by the profile)."""
    return replace(resolved, config=resolved.config.model_copy(update=changes))


def verdict(rules: Sequence[Rule], name: str, resolved: ResolvedConfig,
            model: ModelSpec) -> str | None:  # fmt: skip
    """What the rule called ``name`` among ``rules`` says about ``resolved``."""
    (rule,) = [r for r in rules if r.name == name]
    return rule.check(resolved, model)
