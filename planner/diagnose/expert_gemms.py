"""The routed experts' GEMMs as one grouped kernel, measured and priced.

``../shared/validation/h100/expert_gemms.jsonl`` times a rank's 8 local experts of Qwen3-235B's
and DeepSeek-V3's shapes (64-4,096 tokens each) as ``torch._grouped_mm`` (the grouped kernel
torchtitan runs, as Megatron-Core's ``TEGroupedMLP`` runs Transformer Engine's) and as
``torch.bmm`` (equal tokens per expert, a batched GEMM). :func:`fit_grouped_gemm` fits a
device's grouped-GEMM curve (:class:`~planner.spec.GroupedGemmEfficiency`) to the grouped
kernel's times through the cost model's own pricing of an expert GEMM
(:func:`planner.cost.compute.op_time`), and :func:`priced_s` is that price, for the benchmark
and the tests to set against the measurements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.cost.compute import op_time
from planner.errors import InputError
from planner.graph.ops import Op, Tensor
from planner.spec import DeviceSpec, GroupedGemmEfficiency

BF16_BYTES = 2.0
"""Bytes of a bf16 element: the measurements ran in bf16."""
FIT_MIN_TOKENS = 128
"""The fit uses the experts of at least this many tokens: the range plans run in (a rank's
experts get thousands of tokens at Qwen3-235B's and DeepSeek-V3's recipes) and the issue's
target; below it each expert's tile rows run part empty, which the curve's token term
prices only roughly."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertGemm:
    """One measured set of a rank's expert GEMMs: ``experts`` GEMMs of ``[tokens, k] x [k,
    n]``."""

    label: str
    """The shape's name in the file (``qwen3-235b up``)."""
    experts: int
    """Local experts: GEMMs in the group."""
    tokens_per_expert: int
    """Rows of each expert's GEMM."""
    k: int
    """The reduction dim."""
    n: int
    """The output dim."""
    grouped_s: float
    """Seconds of one ``torch._grouped_mm`` over them."""
    bmm_s: float
    """Seconds of one ``torch.bmm`` over them."""

    @property
    def flops(self) -> float:
        """FLOPs of the whole group."""
        return 2.0 * self.experts * self.tokens_per_expert * self.k * self.n

    def op(self) -> Op:
        """The group as the operator graph has a rank's share of an expert projection."""
        tokens = Tensor((("experts", self.experts), ("capacity", self.tokens_per_expert),
                         ("hidden", self.k)), BF16_BYTES)  # fmt: skip
        out = Tensor((("experts", self.experts), ("capacity", self.tokens_per_expert),
                      ("ffn", self.n)), BF16_BYTES)  # fmt: skip
        weight = Tensor((("experts", self.experts), ("hidden", self.k), ("ffn", self.n)),
                        BF16_BYTES)  # fmt: skip
        return Op(name=self.label, kind="expert_linear", layer=1, layer_kind="moe",
                  inputs=(tokens,), output=out, weight=weight, flops=self.flops,
                  gemm_calls=self.experts)  # fmt: skip


def read_expert_gemms(path: str | Path) -> list[ExpertGemm]:
    """The ``expert_gemm`` records of ``path`` (JSON lines), in order."""
    gemms = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("kind") != "expert_gemm":
            continue
        try:
            gemms.append(ExpertGemm(
                label=record["shape"], experts=int(record["experts"]),
                tokens_per_expert=int(record["tokens_per_expert"]), k=int(record["k"]),
                n=int(record["n"]), grouped_s=float(record["grouped_mm_s"]),
                bmm_s=float(record["bmm_s"])))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path}:{number}: an expert_gemm record needs shape, experts, "
                             f"tokens_per_expert, k, n, grouped_mm_s and bmm_s ({exc})") from None
    return gemms


def priced_s(gemm: ExpertGemm, device: DeviceSpec, *, grouped: bool = True) -> float:
    """The cost model's seconds for ``gemm``'s forward: one grouped kernel, or (``grouped``
    false) one GEMM per expert in turn as the sequential stacks run them."""
    return op_time(gemm.op(), device, "bf16", activation_degrees={}, weight_degrees={},
                   compute_degree=1, gemm_calls=gemm.experts,
                   grouped_experts=grouped).forward_s  # fmt: skip


def fit_grouped_gemm(
    gemms: Sequence[ExpertGemm], device: DeviceSpec, *, source: str,
    min_tokens: int = FIT_MIN_TOKENS,
) -> GroupedGemmEfficiency:  # fmt: skip
    """``device``'s grouped-GEMM curve fitted to the grouped kernel's times of ``gemms`` of at
    least ``min_tokens`` tokens per expert: least squares of log(priced / measured) through
    :func:`priced_s` (the launch cost and the roofline's memory term included), the curve's
    three parameters and its fixed cost per call."""
    from scipy.optimize import least_squares  # scipy loads only when a fit runs

    used = [g for g in gemms if g.tokens_per_expert >= min_tokens]
    if len(used) < 4:
        raise InputError(f"{len(used)} expert GEMMs of {min_tokens}+ tokens per expert: "
                         f"expected at least 4 to fit the four parameters of the curve")
    measured = np.log([g.grouped_s for g in used])

    def curve(x: np.ndarray) -> GroupedGemmEfficiency:
        return GroupedGemmEfficiency(
            max_fraction=float(x[0]), half_saturation_tokens=float(x[1]),
            half_saturation_k=float(x[2]), call_us=float(x[3]))  # fmt: skip

    def residuals(x: np.ndarray) -> np.ndarray:
        fitted = _with_curve(device, curve(x))
        return np.log([priced_s(g, fitted) for g in used]) - measured

    x = least_squares(residuals, np.array([0.8, 100.0, 300.0, 5.0]),
                      bounds=([1e-3, 0.0, 0.0, 0.0], [1.0, 1e5, 1e5, 1e3]),
                      x_scale=[0.1, 100.0, 100.0, 5.0]).x  # fmt: skip
    return GroupedGemmEfficiency(max_fraction=round(float(x[0]), 4),
                                 half_saturation_tokens=round(float(x[1]), 1),
                                 half_saturation_k=round(float(x[2]), 1),
                                 call_us=round(float(x[3]), 2), source=source)  # fmt: skip


def _with_curve(device: DeviceSpec, curve: GroupedGemmEfficiency) -> DeviceSpec:
    """``device`` with ``curve`` as its grouped-GEMM curve."""
    efficiency = device.efficiency.model_copy(update={"grouped_gemm": curve})
    return device.model_copy(update={"efficiency": efficiency})

