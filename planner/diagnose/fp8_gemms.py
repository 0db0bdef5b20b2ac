"""FP8 GEMMs against 16-bit ones, measured: the device's FP8 speedup.

``../shared/validation/h100/gemms_fp8_vs_bf16.jsonl`` times Llama-3.1-8B's and 70B-at-TP8's
projections at 2,048-16,384 tokens on one H100 SXM, each as a bf16 GEMM (``x @ w.T``) and as
``torch._scaled_mm`` on E4M3 copies with per-tensor scales (the quantization not timed), best
of 3 batches of 20 calls (``scripts/real_fp8.py``). :func:`fit_fp8` takes the median of the
speedups as the device's (:class:`~planner.spec.Fp8Efficiency`): the pricing applies one
speedup to every GEMM of an FP8 linear, the input and weight gradients' included, whose
operand layouts the file does not time. ``planner bench --fp8`` times such pairs on your
device and fits the speedup through the cost model's price, launch cost included
(``planner.diagnose.bench_fit``).

>>> gemms = [Fp8Gemm(shape="up", m=2048, k=4096, n=s, bf16_s=1.0, fp8_s=t)
...          for s, t in ((1024, 0.5), (4096, 0.55), (8192, 0.6))]
>>> fit = fit_fp8(gemms)
>>> fit.speedup, fit.lowest, fit.highest, round(fit.max_error, 3)
(1.818, 1.667, 2.0, 0.1)
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from planner.errors import InputError
from planner.spec import Fp8Efficiency


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8Gemm:
    """One GEMM ``[m, k] x [k, n]`` timed in bf16 and in FP8."""

    shape: str
    """What it is (model and projection)."""
    m: int
    """Rows (tokens)."""
    k: int
    """Reduction dim."""
    n: int
    """Columns."""
    bf16_s: float
    """Seconds in bf16."""
    fp8_s: float
    """Seconds in FP8."""

    @property
    def speedup(self) -> float:
        """bf16's time over FP8's."""
        return self.bf16_s / self.fp8_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8Fit:
    """The device's FP8 speedup and how the measurements spread around it."""

    speedup: float
    """The median speedup, rounded to three decimals."""
    shapes: int
    """GEMMs it rests on."""
    lowest: float
    """The smallest speedup measured."""
    highest: float
    """The largest."""
    median_error: float
    """Median of |measured / fitted - 1|."""
    max_error: float
    """Largest |measured / fitted - 1|."""

    def efficiency(self, source: str) -> Fp8Efficiency:
        """As a cluster file's ``device.efficiency.fp8``, saying it came from ``source``."""
        return Fp8Efficiency(gemm_speedup=self.speedup, source=(
            f"median bf16/FP8 time of {self.shapes} GEMMs in {source} (torch._scaled_mm, E4M3, "
            f"per-tensor scales, against x @ w.T in bf16; {self.lowest:.2f}-{self.highest:.2f}, "
            f"median |error| {self.median_error:.1%}, max {self.max_error:.1%}): "
            "planner.diagnose.fp8_gemms.fit_fp8"))  # fmt: skip


def load_fp8_gemms(path: str | Path) -> list[Fp8Gemm]:
    """The timed GEMMs of a ``gemm_fp8_vs_bf16`` JSON-lines file (rows that failed in FP8
    left out)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    rows = [json.loads(line) for line in lines if line.strip()]
    return [Fp8Gemm(shape=r["shape"], m=r["m"], k=r["k"], n=r["n"], bf16_s=r["bf16_s"],
                    fp8_s=r["fp8_s"])
            for r in rows if r.get("kind") == "gemm_fp8_vs_bf16" and "fp8_s" in r]  # fmt: skip


def fit_fp8(gemms: list[Fp8Gemm]) -> Fp8Fit:
    """The median speedup of ``gemms`` and their spread around it."""
    if not gemms:
        raise InputError("no GEMM timed in both bf16 and FP8")
    speedups = [g.speedup for g in gemms]
    fitted = round(statistics.median(speedups), 3)
    errors = [abs(s / fitted - 1) for s in speedups]
    return Fp8Fit(speedup=fitted, shapes=len(gemms), lowest=round(min(speedups), 3),
                  highest=round(max(speedups), 3), median_error=statistics.median(errors),
                  max_error=max(errors))  # fmt: skip

