"""Saved ``planner bench --json`` outputs read back: their attention kernels as cases to fit
(the shared H100 benches are such files), and the block they fitted to their own kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from planner.cost import CAUSAL_FRACTION
from planner.diagnose.bench_cases import BenchCase
from planner.diagnose.bench_fit import fit_attention, with_efficiency
from planner.errors import InputError
from planner.spec import AttentionEfficiency, DeviceEfficiency, DeviceSpec
from planner.spec.reading import read_json
from planner.vocabulary import AttentionKernel, Precision


def saved_attention_cases(path: str | Path) -> tuple[list[BenchCase], np.ndarray, Precision]:
    """The attention kernels of a saved ``planner bench --json`` output as the cases that timed
    them (:func:`~planner.diagnose.bench_cases.attention_cases`), their measured seconds, and
    the precision they ran in."""
    saved = read_json(Path(path))
    cases, seconds = [], []
    for row in saved["rows"]:
        if row["kind"] != "attention":
            continue
        _, _, seq, head_dim = row["shape"]
        backward = row["label"].endswith("bwd")
        cases.append(BenchCase(
            kind="attention", kernel="attention_backward" if backward else "attention_forward",
            label=row["label"], shape=tuple(row["shape"]), flops=float(row["flops"]),
            bytes_moved=float(row["bytes_moved"]), keys_per_query=CAUSAL_FRACTION * seq,
            head_dim=float(head_dim), calls=2 if backward else 1))  # fmt: skip
        seconds.append(float(row["measured_s"]))
    return cases, np.array(seconds), saved["timings"]["precision"]


def fit_saved_attention(paths: Sequence[str | Path], device: DeviceSpec, *,
                        kernel: AttentionKernel = "torch-sdpa") -> AttentionEfficiency:
    """``device``'s attention curve fitted to the attention kernels of saved ``planner bench
    --json`` outputs at ``paths`` together (each run's shapes, one fit), as ``planner bench``
    fits its own."""
    cases: list[BenchCase] = []
    seconds: list[np.ndarray] = []
    precisions = set()
    for path in paths:
        mine, measured, precision = saved_attention_cases(path)
        cases += mine
        seconds.append(measured)
        precisions.add(precision)
    if len(precisions) != 1:
        raise InputError(f"the saved benches ran in {', '.join(sorted(precisions))}: expected "
                         f"one precision to fit one curve")  # fmt: skip
    return fit_attention(device.name, cases, np.concatenate(seconds), device,
                         precisions.pop(), [], kernel)


def with_saved_kernels(device: DeviceSpec, path: str | Path) -> DeviceSpec:
    """``device`` with the GEMM curve, memory-bound fraction and launch cost that a saved
    ``planner bench --json`` output at ``path`` fitted to its own kernels (its ``after``
    block; the attention curve and the rest kept): the device as its kernels alone price it.
    """
    saved = read_json(Path(path))
    fitted = DeviceEfficiency.model_validate(saved["after"])
    source = (f"fitted by `planner bench` to its own kernels ({Path(path).name}, "
              f"{saved['timings']['device_name']})")
    return with_efficiency(device, gemm=fitted.gemm.model_copy(update={"source": source}),
                           memory_bound_fraction=fitted.memory_bound_fraction,
                           kernel_launch_us=fitted.kernel_launch_us)  # fmt: skip
