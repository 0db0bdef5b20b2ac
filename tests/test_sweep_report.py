"""`planner sweep --report`: the Pareto front against brute force, the heatmap's cells, and
the HTML page's points and hover texts."""

from __future__ import annotations

import html
import random
import re
from pathlib import Path

import pytest

from planner.report.sweep_figures import (
    heatmap_cells,
    pareto_front,
    point_text,
    sweep_page,
    write_sweep_report,
)
from planner.sweep import SweepRow
from tests.conftest import REPO
from tests.test_cli_width import planner
from tests.test_sweep import sweep_file

AXES = ["cluster.num_nodes", "cluster.network.1.bandwidth_gb_s"]


def _row(index: int, nodes: int, nic: int, step: float | None, *, price: float | None = None,
         tokens: float | None = None) -> SweepRow:  # fmt: skip
    devices = 8 * nodes
    train = tokens / (1e6 / step) if tokens is not None and step is not None else None
    return SweepRow(
        index=index, values=(nodes, nic), summary=None if step is None else f"plan {index}",
        devices=devices, step_time_s=step, tokens_per_s=None if step is None else 1e6 / step,
        mfu=None if step is None else 0.5, peak_memory_gib=None if step is None else 60.0,
        error_band=None if step is None else "+/- 10 %", time_to_train_s=train,
        cost=devices * price * train / 3600 if price is not None and train else None,
        error="nothing fits" if step is None else None,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(10))
def test_pareto_front_is_what_nothing_beats(seed: int) -> None:
    """A row is on the front iff no other row is at most as costly and strictly faster, or
    strictly cheaper and at most as slow (brute force over random rows)."""
    rng = random.Random(seed)
    rows = [_row(i, rng.choice([1, 2, 4, 8]), 25, rng.choice([None, *range(1, 20)]))
            for i in range(30)]  # fmt: skip
    solved = [r for r in rows if r.step_time_s is not None]

    def beaten(r: SweepRow) -> bool:
        return any((o.devices <= r.devices and o.step_time_s < r.step_time_s)
                   or (o.devices < r.devices and o.step_time_s <= r.step_time_s)
                   for o in solved)  # fmt: skip

    front = pareto_front(rows)
    by_value = {(r.devices, r.step_time_s) for r in solved if not beaten(r)}
    assert {(r.devices, r.step_time_s) for r in front} == by_value
    assert len(front) == len(by_value)  # one row per undominated (devices, step) pair


def test_heatmap_cell_is_the_best_over_the_other_axes() -> None:
    rows = [_row(0, 1, 25, 9.0), _row(1, 1, 50, 7.0), _row(2, 2, 25, 5.0), _row(3, 2, 50, None),
            _row(4, 2, 25, 4.0)]  # fmt: skip
    xs, ys, grid = heatmap_cells(rows, AXES, AXES[0], AXES[1])
    assert (xs, ys) == ([1, 2], [25, 50])
    assert grid == [[9.0, 4.0], [7.0, None]]


def test_page_has_a_point_per_plan_with_its_plan_and_inputs_on_hover() -> None:
    rows = [_row(0, 1, 25, 9.0, price=2.0, tokens=1e9), _row(1, 2, 25, 5.0, price=2.0,
            tokens=1e9), _row(2, 2, 50, None)]  # fmt: skip
    page = sweep_page(rows, AXES, title="t", heatmap_axes=(AXES[0], AXES[1]))
    titles = re.findall(r'<circle class="point" data-point="(\d+)"[^>]*><title>(.*?)</title>',
                        page, flags=re.S)  # fmt: skip
    assert [int(i) for i, _ in titles] == [0, 1]
    for (_, text), row in zip(titles, rows, strict=False):
        assert html.unescape(text) == point_text(row, AXES)
        assert f"plan {row.index}" in text and f"cluster.num_nodes={row.values[0]}" in text
    assert page.count('class="cell"') == 4 and "no plan" in page
    assert "<script" not in page and "http" not in page.replace('xmlns="http://www.w3.org', "")


def test_report_writes_every_picture(tmp_path: Path) -> None:
    rows = [_row(i, n, b, 10.0 / n + b / 100) for i, (n, b) in
            enumerate((n, b) for n in (1, 2) for b in (25, 50))]  # fmt: skip
    written = write_sweep_report(rows, AXES, tmp_path / "r", title="t")
    assert sorted(p.name for p in written) == ["heatmap.png", "heatmap.svg", "index.html",
                                               "pareto.png", "pareto.svg"]
    assert all(p.stat().st_size > 0 for p in written)


def test_sweep_report_from_the_cli(tmp_path: Path) -> None:
    """tests/test_sweep.py's small sweep with --report: a circle with a hover text for each
    point with a plan (the 8 GiB devices fit nothing), the failed ones in the heatmap."""
    sweep = sweep_file(tmp_path)
    done = planner(80, "sweep", sweep, "--out", tmp_path / "t.parquet", "--report",
                   tmp_path / "r")  # fmt: skip
    assert done.code == 0, done.stderr
    page = (tmp_path / "r" / "index.html").read_text()
    assert page.count('<circle class="point"') == 4
    assert page.count("cluster.device.memory_gib=80") >= 4
    assert "cluster.device.memory_gib=8," not in page.split('class="heatmap"')[0]


def test_a_report_folder_that_is_a_file_is_refused_before_the_sweep(tmp_path: Path) -> None:
    """No search runs when the pictures could not be written: one line, exit 2, no table."""
    sweep = REPO / "instances" / "sweeps" / "llama3-70b-h100-nics.toml"
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    done = planner(80, "sweep", sweep, "--out", tmp_path / "t.parquet", "--report", a_file)
    assert done.code == 2
    assert "--report" in done.stderr and "give a folder" in done.stderr
    assert not (tmp_path / "t.parquet").exists()
