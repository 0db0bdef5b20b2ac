"""The sweep's table as ``planner sweep`` prints it: one entry per point, best first, within
the width, the rest counted."""

from __future__ import annotations

import random

import pytest

from planner.report.sweep_table import INDENT, axis_headers, ranked, sweep_table_lines
from planner.sweep import SweepRow

SUMMARY = ("TP1 x PP1 x DP128 x CP2, mbs 1, 1F1B, full recompute of 20 layers per chunk, "
           "ZeRO-3")  # fmt: skip


def row(index: int, values: tuple, step: float | None) -> SweepRow:
    """A point with a plan of ``step`` seconds of a million tokens, or without one (``step``
    None)."""
    solved = step is not None
    return SweepRow(index=index, values=values, summary=SUMMARY if solved else None,
                    devices=8, step_time_s=step, tokens_per_s=1e6 / step if solved else None,
                    mfu=0.5 if solved else None, peak_memory_gib=60.0 if solved else None,
                    error_band="+/- 10 %" if solved else None,
                    time_to_train_s=86400.0 * 10 * step if solved else None,
                    cost=1234567.0 * step if solved else None,
                    error=None if solved else "nothing fits; the leanest needs 90 GiB")  # fmt: skip


def entries(lines: list[str]) -> list[list[str]]:
    """The numbers line of each point (the lines not indented under one), split."""
    return [line.split() for line in lines[1:] if not line.startswith(INDENT)
            and not line.startswith("...")]  # fmt: skip


def sweep_rows(n: int, seed: int) -> list[SweepRow]:
    """``n`` points over two axes, every fifth without a plan, in random step order."""
    rng = random.Random(seed)
    return [row(i, (i, f"fw{i % 3}"), None if i % 5 == 4 else rng.uniform(1, 100))
            for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_every_point_is_a_row_best_first_then_those_without_a_plan(seed: int) -> None:
    rows = sweep_rows(23, seed)
    lines = sweep_table_lines(rows, ["cluster.num_nodes", "search.framework"], width=80,
                              out="r.parquet")  # fmt: skip
    shown = entries(lines)
    assert sorted(int(e[0]) for e in shown) == list(range(23))
    steps = [float(e[3]) for e in shown if e[3] != "-"]
    assert steps == sorted(steps) and len(steps) == sum(r.step_time_s is not None for r in rows)
    unsolved = [int(e[0]) for e in shown if e[3] == "-"]
    assert unsolved == [r.index for r in rows if r.step_time_s is None]
    assert shown[-len(unsolved):] == [e for e in shown if e[3] == "-"]  # after the solved ones
    assert lines[0].split() == ["point", "num_nodes", "framework", "step", "s", "+/-", "MFU",
                                "%", "GiB", "days", "cost"]  # fmt: skip
    assert all(len(line) <= 80 for line in lines)
    assert not any(line.startswith("...") for line in lines)


def test_a_long_sweep_shows_the_best_and_counts_the_rest() -> None:
    rows = sweep_rows(100, 0)
    lines = sweep_table_lines(rows, ["a.x", "b.y"], width=80, out="big.parquet", max_rows=40)
    shown = entries(lines)
    assert len(shown) == 40
    best = sorted(r.step_time_s for r in rows if r.step_time_s is not None)[:40]
    assert [float(e[3]) for e in shown] == [float(f"{s:.3f}") for s in best]
    assert lines[-1] == "... 60 more in big.parquet"


def test_a_point_reads_its_numbers_and_plan() -> None:
    """Point 3's numbers in its columns, its plan broken between clauses under them, and a
    point without a plan with the first clause of why."""
    lines = sweep_table_lines([row(3, (32, 50), 25.46), row(4, (16, 25), None)],
                              ["cluster.num_nodes", "cluster.network.1.bandwidth_gb_s"],
                              width=80, out="r.parquet")  # fmt: skip
    assert lines == [
        "point  num_nodes  bandwidth_gb_s  step s   +/-  MFU %   GiB  days        cost",
        "    3         32              50  25.460  10 %   50.0  60.0   255  31,432,076",
        "       TP1 x PP1 x DP128 x CP2, mbs 1, 1F1B,",
        "       full recompute of 20 layers per chunk, ZeRO-3",
        "    4         16              25       -     -      -     -     -           -",
        "       no plan: nothing fits",
    ]


def test_axes_too_many_for_columns_go_under_the_numbers() -> None:
    axes = [f"cluster.level{k}.bandwidth_gb_s" for k in range(6)]
    lines = sweep_table_lines([row(0, tuple(range(6)), 2.0)], axes, width=60, out="r.parquet")
    assert lines[0].split() == ["point", "step", "s", "+/-", "MFU", "%", "GiB", "days", "cost"]
    under = " ".join(line.strip() for line in lines[2:])
    assert under.startswith("level0.bandwidth_gb_s=0, level1.bandwidth_gb_s=1,")
    assert all(len(line) <= 60 for line in lines)


def test_axis_headers_are_the_shortest_distinct_tails() -> None:
    assert axis_headers(["search.pins.tp", "model.num_layers"]) == ["tp", "num_layers"]
    assert axis_headers(["a.tp", "b.tp"]) == ["a.tp", "b.tp"]
    assert [r.index for r in ranked([row(0, (), None), row(1, (), 2.0), row(2, (), 1.0)])] == [
        2, 1, 0]  # fmt: skip
