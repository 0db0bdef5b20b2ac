"""Measurements against the cost model, as tables: published runs (validation and
calibration), nccl-tests (calibrate-network) and kernels (bench)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from planner.diagnose.bench_fit import BenchFit
from planner.diagnose.calibration import Calibration, ValidationRow
from planner.diagnose.network_fit import NetworkFit
from planner.report.width import Clauses, FirstThatFits, Prose, keep_whole, light_table, title
from planner.vocabulary import counted


def validation_tables(
    rows: Sequence[ValidationRow], skipped: Sequence[str] = ()
) -> list[RenderableType]:
    """Predicted against measured step times (``OOM`` for a run that ran out of memory before
    one was measured), then, where records measured it, predicted against measured peak
    memory (:func:`memory_table`), then the error statistics per framework family: one table
    for the times, or two in a light box (what each run is; its times) when one is too wide
    for the console."""
    # published runs and a user's logs alike
    one = Table(title=title("runs: predicted vs measured step time"),
                title_justify="left")  # fmt: skip
    what = light_table("runs", collapse_padding=True)
    times = light_table("predicted vs measured step time", collapse_padding=True)
    for table in (one, what, times):
        table.add_column("run", no_wrap=True)
    for table in (one, what):
        table.add_column("GPUs", justify="right", no_wrap=True)
        table.add_column("configuration")  # wraps between its words
    for name in ("measured s", "predicted s", "error", "memory GiB"):
        one.add_column(name, justify="right", no_wrap=True)
        times.add_column(name.replace(" ", "\n"), justify="right", no_wrap=True)
    for r in rows:
        memory = f"{r.peak_memory_gib:.1f}" + _fit_mark(r)
        numbers = ("OOM" if r.measured_s is None else f"{r.measured_s:.2f}",
                   f"{r.predicted_s:.2f}", _percent(r.error, red_over=0.15), memory)
        one.add_row(r.id, str(r.num_devices), r.config, *numbers)
        what.add_row(r.id, str(r.num_devices), r.config)
        times.add_row(r.id, *numbers)
    split = Group(keep_whole(what), keep_whole(times))
    tables = ([FirstThatFits(keep_whole(one), split), *memory_table(rows), *error_summary(rows)]
              if rows else [])  # fmt: skip
    return [*tables, *skipped_lines(skipped)]


def memory_table(rows: Sequence[ValidationRow]) -> list[RenderableType]:
    """Predicted against measured peak memory of the runs that measured it (none: no table):
    allocated to tensors, reserved by the caching allocator, and whether the run was
    predicted to fit against whether it ran; one table, or two (allocated and the verdict;
    reserved) when one is too wide for the console."""
    mine = [r for r in rows if _measures_memory(r)]
    if not mine:
        return []
    heading = "peak memory (GiB) predicted vs measured, fits? predicted vs ran?"
    one = light_table(heading, collapse_padding=True)
    allocated = light_table(f"allocated {heading}", collapse_padding=True)
    reserved = light_table("reserved peak memory (GiB) predicted vs measured",
                           collapse_padding=True)  # fmt: skip
    columns = {one: ("allocated\npredicted", "\nmeasured", "\nerror", "reserved\npredicted",
                     "\nmeasured", "\nerror", "\nfits?", "\nran?"),
               allocated: ("predicted", "measured", "error", "fits?", "ran?"),
               reserved: ("predicted", "measured", "error")}  # fmt: skip
    for table, names in columns.items():
        table.add_column("\nrun" if "\n" in names[0] else "run", no_wrap=True)
        for name in names:
            table.add_column(name, justify="right", no_wrap=True)
    for r in mine:
        used = (f"{r.predicted_peak_memory_gib:.2f}", _gib(r.measured_peak_memory_gib),
                _percent(r.memory_error, red_over=0.08))
        held = (f"{r.predicted_reserved_memory_gib:.2f}", _gib(r.measured_reserved_memory_gib),
                _percent(r.reserved_error, red_over=0.10))
        verdict = ("yes" if r.predicted_fits else "no" if r.predicted_over else "margin",
                   Text("OOM" if r.measured_oom else "yes", style="red" if r.fit_missed else ""))
        one.add_row(r.id, *used, *held, *verdict)
        allocated.add_row(r.id, *used, *verdict)
        reserved.add_row(r.id, *held)
    return [FirstThatFits(keep_whole(one), Group(keep_whole(allocated), keep_whole(reserved)))]


def _fit_mark(row: ValidationRow) -> str:
    """`` !`` after a peak over the device's memory, `` ~`` after one within its margin."""
    return " !" if row.predicted_over else "" if row.predicted_fits else " ~"


def _measures_memory(row: ValidationRow) -> bool:
    """Whether the run's record measured its peak memory (a run out of memory that did not is
    an ``OOM`` in the times table and counted in the summary)."""
    return row.measured_peak_memory_gib is not None or row.measured_reserved_memory_gib is not None


def _gib(value: float | None) -> str:
    """GiB to two decimals, ``-`` where not measured."""
    return "-" if value is None else f"{value:.2f}"


def _percent(error: float | None, *, red_over: float) -> Text:
    """A relative error as ``+1.2 %``, red beyond ``red_over``; ``-`` where not measured."""
    if error is None:
        return Text("-")
    return Text(f"{100 * error:+.1f} %", style="red" if abs(error) > red_over else "")


def skipped_lines(skipped: Sequence[str]) -> list[RenderableType]:
    """One line per record left out, with why, under a count of them."""
    if not skipped:
        return []
    listing = Table.grid(padding=(0, 1))
    listing.add_column(no_wrap=True)
    listing.add_column()  # wraps under itself, so each record starts at its dash
    for line in skipped:
        listing.add_row("-", line)
    return [Text(f"{len(skipped)} record{'s' * (len(skipped) > 1)} left out:"), listing]


def error_summary(rows: Sequence[ValidationRow]) -> list[RenderableType]:
    """One line per framework family and device, then all: median and max |error| of the
    step time; of the runs that ran (a published run that does not say otherwise ran), those
    predicted over the device's memory (each a memory error) and those within the margin
    (the model's own uncertainty: no error, but the search would not choose them); where runs
    ran out of memory, how many were predicted to fit beside the margin; where runs measured
    their peak memory, its median and max |error|."""
    groups: dict[str, list[ValidationRow]] = {}
    for r in rows:
        groups.setdefault(f"{r.family} on {r.device} ({r.cluster})", []).append(r)
    if len(groups) > 1:
        groups["all"] = list(rows)
    lines: list[RenderableType] = []
    for name, mine in groups.items():
        errors = [abs(r.error) for r in mine if r.error is not None]
        timed = (f"median |error| {100 * statistics.median(errors):.1f} %, "
                 f"max {100 * max(errors):.1f} %" if errors else "no step time measured")
        if errors and len(errors) < len(mine):  # the others ran out of memory, or gave none
            timed += f" (of the {len(errors)} timed)"
        ran = [r for r in mine if not r.measured_oom]
        over = sum(r.predicted_over for r in ran)
        tight = sum(not r.predicted_fits and not r.predicted_over for r in ran)
        oom = [r for r in mine if r.measured_oom]
        missed = sum(r.predicted_fits for r in oom)
        line = (f"{name}: {counted(len(mine), 'run')}, {timed}"
                + (f"; {over} predicted over the device's memory (!)" if over else "")
                + (f"; {tight} within the margin (~)" if tight else "")
                + (f"; {len(oom)} ran out of memory, {missed} of them predicted to fit"
                   if oom else ""))  # fmt: skip
        lines.append(Prose(line))  # wrapped never between a number and its unit
        lines += _memory_summary(name, mine)
    return lines


def _memory_summary(name: str, rows: Sequence[ValidationRow]) -> list[RenderableType]:
    """The median and max |error| of the runs' allocated and reserved peaks and device memory
    in use, where measured, the largest saying whether it over- or under-predicts: a line
    broken only between its clauses."""
    parts = []
    for what, errors in (("allocated", [r.memory_error for r in rows]),
                         ("reserved", [r.reserved_error for r in rows]),
                         ("in use (nvidia-smi)", [r.device_memory_error for r in rows])):
        measured = [e for e in errors if e is not None]
        if measured:
            worst = max(measured, key=abs)
            parts.append(f"{what} median {100 * statistics.median(map(abs, measured)):.1f} "
                         f"%, max {100 * abs(worst):.1f} % ({'over' if worst > 0 else 'under'})")
    if not parts:
        return []
    runs = sum(r.memory_error is not None or r.reserved_error is not None
               or r.device_memory_error is not None for r in rows)  # fmt: skip
    clauses = [f"{name} memory, |error| of {counted(runs, 'run')}:", *[f"{p};" for p in parts[:-1]],
               parts[-1]]  # fmt: skip
    return [Clauses(clauses, sep=" ", tail="")]


def calibration_tables(fit: Calibration) -> list[RenderableType]:
    """The fitted knobs, the bands, and the runs after the fit."""
    values = [f"{name} {value:g}" for name, value in fit.fit.values.items()]
    where = (f"written to {', '.join(fit.written)}" if fit.written
             else "not written: --write")  # fmt: skip
    head = Group(
        Text(f"{fit.chip}: fitted on {counted(fit.fit.runs, 'run', 'runs')} "
             f"({', '.join(fit.fitted_on)}), RMS log "
             f"error {fit.fit.rms_log_error:.3f}; {where}", style="bold"),
        Clauses(values),
        Clauses([f"{b.parallelism}: +/- {100 * b.p80_abs_error:.1f} % over {b.runs} runs"
                 for b in fit.bands]),
    )  # fmt: skip
    by_family: dict[str, list[float]] = {}
    for r in fit.before:
        if r.error is not None:
            by_family.setdefault(r.family, []).append(abs(r.error))
    before = Text("before the fit, median |error|: " + ", ".join(
        f"{family} {100 * statistics.median(errors):.1f} %"
        for family, errors in sorted(by_family.items())))  # fmt: skip
    # a knob on its bound is the bound's value, not the runs': five one-GPU runs fitted two
    # at their lower bounds in silence
    bounded = [Prose(f"note: {name} is at its bound, {bound:g}: the runs do not pin it "
                     "(runs that vary what it prices would)")
               for name, bound in fit.fit.at_bounds.items()]  # fmt: skip
    few = [Prose(f"note: {fit.fit.in_sample}")] if fit.fit.in_sample else []
    return [head, before, *bounded, *few, *validation_tables(fit.after, fit.skipped)]


def network_fit_tables(fit: NetworkFit) -> list[RenderableType]:
    """Per message size: measured time, predicted before and after the fit, measured and
    fitted bus bandwidth; then the fitted level."""
    table = Table(title=title(f"{fit.level_name}: {' and '.join(fit.tools)} against the cost "
                              f"model"), title_justify="left")  # fmt: skip
    for name in ("test", "size", "meas us", "before", "after", "busbw", "fit bw"):
        table.add_column(name, justify="left" if name == "test" else "right", no_wrap=True)
    for r in fit.rows:
        table.add_row(f"{r.kind} x{r.ranks}", _size(r.size_bytes), _us(r.measured_s),
                      _us(r.before_s), _us(r.after_s),
                      f"{r.busbw_gb_s:.1f}", f"{r.busbw_after_gb_s:.1f}")  # fmt: skip
    latency = (f"latency {fit.latency_us_before:g} -> {fit.latency_us:g} us" if fit.latency_fitted
               else f"latency kept at {fit.latency_us:g} us (messages too large to see it)")
    head = Clauses([f"level {fit.level} ({fit.level_name})",
                    f"bandwidth_fraction {fit.bandwidth_fraction_before:g} -> "
                    f"{fit.bandwidth_fraction:g}", latency])  # fmt: skip
    return [table, head, Text("times in us; bus bandwidth in GB/s as nccl-tests defines it")]


def _us(seconds: float) -> str:
    """Microseconds to five significant digits, never in exponent form (``100690``, not
    ``1.0069e+05``).

    >>> _us(0.10069), _us(1.2345e-5)
    ('100690', '12.345')
    """
    us = seconds * 1e6
    return f"{us:.0f}" if us >= 1e4 else f"{us:.5g}"


def _size(nbytes: int) -> str:
    """A message size in binary units, as nccl-tests' -b/-e options take them."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


BENCH_PARTS = (("gemm", "GEMMs"), ("grouped_gemm", "grouped GEMMs"), ("fp8_gemm", "FP8 GEMMs"),
               ("attention", "attention"), ("memory", "adds"), ("elementwise", "norm, act."),
               ("optimizer", "Adam step"))  # fmt: skip
"""The bench's kinds of kernel in the order fitted, as its summary names them."""


def bench_tables(fit: BenchFit) -> list[RenderableType]:
    """Per kind of kernel: how many ran and the median error of the cost model before and
    after the fit (the last two kinds are checks, not fitted); then the block's values before
    and after, what was kept, and what did not run."""
    summary = Table(title=title(f"{fit.device}: kernels timed on {fit.timings.device_name}"),
                    title_justify="left")  # fmt: skip
    for name in ("kernels", "ran", "error before", "after", ""):
        summary.add_column(name, justify="left" if name in ("kernels", "") else "right",
                           no_wrap=name != "")  # fmt: skip
    for kind, name in BENCH_PARTS:
        ran = sum(r.kind == kind for r in fit.rows)
        if not ran:
            continue
        checked = kind in ("elementwise", "optimizer")
        summary.add_row(name, str(ran), f"{100 * fit.median_error(kind, fitted=False):.0f} %",
                        f"{100 * fit.median_error(kind, fitted=True):.0f} %",
                        "check, not fitted" if checked else "")  # fmt: skip
    before, after = fit.before, fit.after
    values = [("gemm.max_fraction", before.gemm.max_fraction, after.gemm.max_fraction),
              ("gemm.half_saturation_gflop", before.gemm.half_saturation_gflop,
               after.gemm.half_saturation_gflop),
              ("memory_bound_fraction", before.memory_bound_fraction,
               after.memory_bound_fraction),
              ("kernel_launch_us", before.kernel_launch_us, after.kernel_launch_us)]
    if after.grouped_gemm is not None:
        old_grouped = before.grouped_gemm
        for field in ("max_fraction", "half_saturation_tokens", "half_saturation_k", "call_us"):
            values.append((f"grouped_gemm.{field}",
                           getattr(old_grouped, field) if old_grouped else None,
                           getattr(after.grouped_gemm, field)))  # fmt: skip
    if after.fp8 is not None:
        values.append(("fp8.gemm_speedup", before.fp8.gemm_speedup if before.fp8 else None,
                       after.fp8.gemm_speedup))  # fmt: skip
    if after.attention is not None:
        old = before.attention
        # every field --write writes (the backward's rate and the fixed costs a call were
        # written unseen)
        for field in ("max_fraction", "half_saturation_tokens", "half_saturation_head_dim",
                      "backward_fraction", "forward_call_us", "backward_call_us"):
            values.append((f"attention.{field}", getattr(old, field) if old else None,
                           getattr(after.attention, field)))  # fmt: skip
    block = light_table("efficiency", collapse_padding=True)
    for name in ("field", "before", "after"):
        block.add_column(name, justify="left" if name == "field" else "right", no_wrap=True)
    for name, old_value, new_value in values:
        block.add_row(name, "-" if old_value is None else f"{old_value:g}", f"{new_value:g}")
    out: list[RenderableType] = [
        summary, Text(f"error: median |predicted / measured - 1|; {fit.timings.backend}, torch "
                      f"{fit.timings.torch_version}, {fit.timings.precision}"), block]
    out += [Text(f"note: {n}") for n in fit.notes]
    out += [Text(f"not run: {s}") for s in fit.timings.skipped]
    return out


def bench_json(fit: BenchFit, *, written: bool) -> dict[str, Any]:
    """The bench as JSON: what ran where, the block before and after (as the cluster file
    spells it), every kernel's times, the notes."""
    return {
        "cluster": fit.cluster, "device": fit.device, "written": written,
        "timings": {f: getattr(fit.timings, f) for f in ("device_name", "backend",
                                                         "torch_version", "precision",
                                                         "skipped")},
        "before": fit.before.model_dump(mode="json"),
        "after": fit.after.model_dump(mode="json"),
        "rows": [asdict(r) for r in fit.rows], "notes": list(fit.notes), "source": fit.source,
    }  # fmt: skip
