"""`planner sweep --report`: the Pareto front against brute force, the heatmap's cells, and
the HTML page's points and hover texts."""

from __future__ import annotations

import html
import itertools
import random
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import planner.cli.sweeps as sweeps_cli
from planner.errors import InputError
from planner.report.sweep_figures import (
    check_heatmap_axes,
    pareto_figure,
    sweep_page,
    write_sweep_report,
)
from planner.report.sweep_reading import (
    COST_UNIT,
    MAX_LABELLED,
    cell_text,
    heatmap_cells,
    pareto_front,
    point_label,
    point_text,
)
from planner.report.sweep_table import ranked
from planner.spec.messages import short_repr
from planner.sweep import COLUMNS, SweepRow, read_sweep
from tests.conftest import REPO
from tests.headless import WINDOW, css_colour, laid_out, needs_chromium, screenshot
from tests.test_cli_width import Run, planner, unwrapped
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


def test_the_table_ranks_by_tokens_a_second() -> None:
    """With the batch an axis, a 13 s step of 128 sequences ranked above a 24 s step of 512
    (twice the tokens a second); ranked by tokens a second, the step time's order where the
    tokens a step are the same; points without a plan last."""
    small = _row(0, 1, 25, 13.0)  # 1e6 / 13 tokens a second
    large = replace(_row(1, 1, 50, 23.9), tokens_per_s=4 * 1e6 / 23.9)  # 4x the tokens a step
    none = _row(2, 2, 25, None)
    assert [r.index for r in ranked([small, none, large])] == [1, 0, 2]
    same = [_row(i, 1, 25, step) for i, step in enumerate((3.0, 1.0, 2.0))]
    assert [r.index for r in ranked(same)] == [1, 2, 0]


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


def _ticks(page: str, axis: str) -> list[float]:
    """The tick labels the page writes on ``axis`` (x or y), as numbers (``8.2M``: 8.2e6)."""
    texts = re.findall(rf'<text class="tick {axis}"[^>]*>([^<]*)</text>', page)
    return [float(t.rstrip("M").replace(",", "")) * (1e6 if t.endswith("M") else 1)
            for t in texts]  # fmt: skip


@pytest.mark.parametrize("priced", [False, True])
def test_page_axes_have_ticks_spanning_the_points_and_titles_with_units(priced: bool) -> None:
    """Evenly spaced ticks on both axes whose range holds every point, at the positions
    the points are scaled by; axis titles name the unit (days or seconds, devices or the
    cost's unit)."""
    price, tokens = (2.5, 1e12) if priced else (None, None)
    rows = [_row(i, n, 25, 40.0 / n + i, price=price, tokens=tokens)
            for i, n in enumerate((1, 2, 4, 16))]  # fmt: skip
    page = sweep_page(rows, AXES, title="t", heatmap_axes=None)
    xs = [r.cost if priced else r.devices for r in rows]
    ys = [r.time_to_train_s / 86400 if priced else r.step_time_s for r in rows]
    for axis, values in (("x", xs), ("y", ys)):
        ticks = _ticks(page, axis)
        assert len(ticks) >= 3, (axis, ticks)
        steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
        assert len(steps) == 1, (axis, ticks)  # evenly spaced, as labelled
        assert ticks[0] <= min(values) and max(values) <= ticks[-1], (axis, ticks, values)
    titles = re.findall(r'<text class="axis-title"[^>]*>([^<]*)</text>', page)
    assert titles == ([f"cost ({COST_UNIT})", "time to train (days)"] if priced
                      else ["devices", "step time (s)"])  # fmt: skip
    # Each circle sits where its value falls between the first and last tick.
    circles = re.findall(r'data-point="(\d+)" cx="([\d.]+)" cy="([\d.]+)"', page)
    lo, hi = _ticks(page, "x")[0], _ticks(page, "x")[-1]
    assert sorted(int(i) for i, _, _ in circles) == [r.index for r in rows]
    for index, cx, _ in circles:
        x = xs[int(index)]
        assert float(cx) == pytest.approx(90 + (x - lo) / (hi - lo) * 600, abs=0.06), index


def test_pareto_png_labels_its_points_and_names_the_cost_unit() -> None:
    """Every point labelled with its index and degrees while there are few, past MAX_LABELLED
    the front's so and the others by their index alone; the cost axis in its unit."""
    rows = [_row(i, n, b, 10.0 / n + b / 100, price=2.0, tokens=1e9)
            for i, (n, b) in enumerate((n, b) for n in (1, 2, 4) for b in (25, 50))]  # fmt: skip
    ax = pareto_figure(rows, AXES).axes[0]
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{r.index}: plan {r.index}"
                                                            for r in rows)  # fmt: skip
    assert ax.get_xlabel() == f"cost ({COST_UNIT})" and ax.get_ylabel() == "time to train (days)"
    many = [_row(i, 1 + i, 25, 100.0 / (1 + i) + i, price=2.0, tokens=1e9)
            for i in range(MAX_LABELLED + 5)]  # fmt: skip
    ax = pareto_figure(many, AXES).axes[0]
    front = pareto_front(many)
    others = [str(r.index) for r in many if r not in front]
    assert sorted(t.get_text() for t in ax.texts) == sorted(
        [point_label(r, AXES) for r in front] + others)  # fmt: skip
    assert len(ax.texts) == len(many) and len(front) < len(many)
    tied = [_row(0, 1, 25, 5.0), _row(1, 1, 50, 5.0), _row(2, 2, 25, 9.0)]  # 0 and 1 alike
    ax = pareto_figure(tied, AXES).axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["0, 1: plan 0 / plan 1", "2: plan 2"]


def test_report_writes_every_picture(tmp_path: Path) -> None:
    rows = [_row(i, n, b, 10.0 / n + b / 100) for i, (n, b) in
            enumerate((n, b) for n in (1, 2) for b in (25, 50))]  # fmt: skip
    written = write_sweep_report(rows, AXES, tmp_path / "r", title="t")
    assert sorted(p.name for p in written) == ["heatmap.png", "heatmap.svg", "index.html",
                                               "pareto.png", "pareto.svg"]
    assert all(p.stat().st_size > 0 for p in written)


@dataclass(frozen=True)
class Swept:
    """The small sweep run by the CLI with ``--report``: where it is and what it printed."""

    sweep: Path
    out: Path
    report: Path
    done: Run


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Swept:
    """tests/test_sweep.py's small sweep (8 points, 4 with a plan: the 8 GiB devices fit
    nothing) run once by ``planner sweep --report`` (about 4 s)."""
    folder = tmp_path_factory.mktemp("swept")
    sweep, out, report = sweep_file(folder), folder / "t.parquet", folder / "r"
    return Swept(sweep, out, report, planner(80, "sweep", sweep, "--out", out,
                                             "--report", report))  # fmt: skip


def _sweep_rows(swept: Swept) -> tuple[list[str], list[SweepRow]]:
    """The sweep's axes and its rows as the table holds them."""
    axes = list(read_sweep(swept.sweep).axes)
    return axes, [SweepRow(index=r["point"], values=tuple(r[a] for a in axes),
                           **{c: r[c] for c in COLUMNS})
                  for r in pq.read_table(swept.out).to_pylist()]  # fmt: skip


def test_sweep_report_from_the_cli(swept: Swept) -> None:
    """A circle with a hover text for each point with a plan, the failed ones in the
    heatmap."""
    assert swept.done.code == 0, swept.done.stderr
    page = (swept.report / "index.html").read_text()
    assert page.count('<circle class="point"') == 4
    assert page.count("cluster.device.memory_gib=80") >= 4
    assert "cluster.device.memory_gib=8," not in page.split('class="heatmap"')[0]


# What Chromium laid out: each point's circle (its namespace, box, hover text, fill, and
# whether it is what a pointer at its centre hits) and the heatmap's cells, row by row.
PROBE = """(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
  const hit = e => { const [x, y, w, h] = box(e);
                     return document.elementFromPoint(x + w / 2, y + h / 2) === e; };
  return {
    chart: box(document.querySelector("svg.pareto")),
    points: [...document.querySelectorAll("svg.pareto circle.point")].map(c => ({
      point: Number(c.dataset.point), ns: c.namespaceURI, box: box(c), hit: hit(c),
      title: c.querySelector("title").textContent, fill: getComputedStyle(c).fill})),
    ticks: [...document.querySelectorAll("svg.pareto text.tick")].map(t => ({
      text: t.textContent, box: box(t)})),
    heatmap: [...document.querySelectorAll("table.heatmap tr")].map(tr => [...tr.children].map(
      td => ({text: td.innerText, title: td.title, box: box(td)}))),
  };
})()"""


def _inside(box: list[float], outer: list[float]) -> bool:
    """A box (x, y, width, height) with an area, within ``outer``."""
    x, y, w, h = box
    ox, oy, ow, oh = outer
    return w > 0 and h > 0 and ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


def _overlap(a: list[float], b: list[float]) -> bool:
    """Whether two boxes (x, y, width, height) share an area."""
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@needs_chromium
def test_the_page_renders_in_chromium(swept: Swept) -> None:
    """index.html opened in headless Chromium: an SVG circle inside the chart for each row
    with a plan, its hover text that row's; the heatmap's rows and columns the sweep's
    values, each cell the best step there or "no plan"; and the points painted in their
    colours on a page that is not blank."""
    page = swept.report / "index.html"
    axes, rows = _sweep_rows(swept)
    shown = laid_out(page, PROBE)
    planned = {r.index: r for r in rows if r.step_time_s is not None}
    assert len(planned) == 4 and len(rows) == 8  # the sweep is the one described above
    assert sorted(p["point"] for p in shown["points"]) == sorted(planned)
    for point in shown["points"]:
        row = planned[point["point"]]
        assert point["ns"] == "http://www.w3.org/2000/svg", point
        assert point["title"] == point_text(row, axes)
        assert row.summary in point["title"] and f"step {row.step_time_s:.3f} s" in point["title"]
        assert _inside(point["box"], shown["chart"]), (point, shown["chart"])

    # Both axes carry tick labels, each laid out inside the chart, none on top of another.
    assert len(shown["ticks"]) >= 6 and all(_inside(t["box"], shown["chart"])
                                            for t in shown["ticks"])  # fmt: skip
    boxes = [t["box"] for t in shown["ticks"]]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])

    xs = list(dict.fromkeys(r.values[0] for r in rows))
    ys = list(dict.fromkeys(r.values[1] for r in rows))
    best = {(x, y): min((r.step_time_s for r in planned.values() if r.values[:2] == (x, y)),
                        default=None) for x in xs for y in ys}  # fmt: skip
    # the last value on top, as the picture's y axis runs
    expected = [["", *map(short_repr, xs)]] + [
        [short_repr(y), *("no plan" if best[x, y] is None else cell_text(best[x, y])
                          for x in xs)]
        for y in reversed(ys)]  # fmt: skip
    assert [[cell["text"] for cell in line] for line in shown["heatmap"]] == expected
    assert {"no plan", cell_text(min(r.step_time_s for r in planned.values()))} <= {
        cell["text"] for line in shown["heatmap"] for cell in line}  # fmt: skip
    window = [0, 0, *WINDOW]
    assert all(_inside(cell["box"], window) for line in shown["heatmap"] for cell in line)

    pixels = screenshot(page)
    # The small sweep's points do not overlap: each is what a pointer at its centre hits, so
    # its centre pixel is its own colour.
    for point in shown["points"]:
        x, y, w, h = point["box"]
        assert point["hit"], point
        assert tuple(pixels[int(y + h / 2), int(x + w / 2)]) == css_colour(point["fill"])
    inked = (pixels.min(axis=2) < 250).mean()
    assert inked > 0.005, f"only {inked:.2%} of the page is not white"


def test_a_report_folder_that_is_a_file_is_refused_before_the_sweep(tmp_path: Path) -> None:
    """No search runs when the pictures could not be written: one line, exit 2, no table."""
    sweep = REPO / "instances" / "sweeps" / "llama3-70b-h100-nics.toml"
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    done = planner(80, "sweep", sweep, "--out", tmp_path / "t.parquet", "--report", a_file)
    assert done.code == 2
    assert "--report" in done.stderr and "give a folder" in done.stderr
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("taken", ["pareto.png", "index.html"])
def test_a_report_file_that_cannot_be_written_is_refused_before_the_sweep(
    tmp_path: Path, taken: str
) -> None:
    """A folder named as one of the report's files: refused before any point is solved (it
    was refused after the whole sweep), as a report folder that is a file is."""
    sweep = REPO / "instances" / "sweeps" / "llama3-70b-h100-nics.toml"
    (tmp_path / "report" / taken).mkdir(parents=True)
    done = planner(80, "sweep", sweep, "--out", tmp_path / "t.parquet", "--report",
                   tmp_path / "report")  # fmt: skip
    assert done.code == 2 and f"{taken} is a folder; remove it or choose another folder" in (
        " ".join(done.stderr.split()))
    assert not (tmp_path / "t.parquet").exists()


# --------------------------------------------------------------------------- --heatmap X,Y

SMALL_AXES = ["cluster.num_nodes", "cluster.device.memory_gib", "cluster.price_per_device_hour"]


@pytest.mark.parametrize(("chosen", "message"), [
    (["cluster.nodes", "cluster.num_nodes"], "--heatmap cluster.nodes,cluster.num_nodes: "
     "'cluster.nodes' is not an axis of the sweep; its axes are " + ", ".join(SMALL_AXES)),
    (["cluster.num_nodes"], "--heatmap cluster.num_nodes: give two different axes of the "
     "sweep as X,Y"),
    (["cluster.num_nodes"] * 2, "--heatmap cluster.num_nodes,cluster.num_nodes: give two "
     "different axes"),
    (SMALL_AXES, f"--heatmap {','.join(SMALL_AXES)}: give two different axes"),
])  # fmt: skip
def test_heatmap_axes_are_two_axes_of_the_sweep(chosen: list[str], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        check_heatmap_axes(SMALL_AXES, chosen)


def test_heatmap_option_draws_the_axes_asked_for(swept: Swept, tmp_path: Path) -> None:
    """``--heatmap X,Y`` on the table of a finished sweep: nothing solved again, the heatmap
    of step time over price (columns) and nodes (rows), the best over memory."""
    out = tmp_path / "t.parquet"
    shutil.copy(swept.out, out)
    done = planner(80, "sweep", swept.sweep, "--out", out, "--report", tmp_path / "r",
                   "--heatmap", "cluster.price_per_device_hour, cluster.num_nodes")  # fmt: skip
    assert done.code == 0, done.stderr
    assert "8 already done" in unwrapped(done.stdout)
    page = (tmp_path / "r" / "index.html").read_text()
    assert "cluster.num_nodes by cluster.price_per_device_hour</caption>" in page
    assert "<tr><th></th><th>2.0</th><th>3.5</th></tr>" in page
    _, rows = _sweep_rows(swept)
    for nodes in (1, 2):
        step = min(r.step_time_s for r in rows if r.values[0] == nodes and r.step_time_s)
        assert re.search(rf"<tr><th>{nodes}</th>(<td [^>]*>{step:.3g}</td>){{2}}</tr>", page)
    assert all((tmp_path / "r" / f"heatmap{suffix}").stat().st_size > 0
               for suffix in (".png", ".svg"))  # fmt: skip


@pytest.mark.parametrize(("options", "message"), [
    (("--report", "{r}", "--heatmap", "cluster.nodes,cluster.num_nodes"),
     "--heatmap cluster.nodes,cluster.num_nodes: 'cluster.nodes' is not an axis of the sweep; "
     "its axes are " + ", ".join(SMALL_AXES)),
    (("--report", "{r}", "--heatmap", "cluster.num_nodes"),
     "--heatmap cluster.num_nodes: give two different axes of the sweep as X,Y; its axes are "
     + ", ".join(SMALL_AXES)),
    (("--report", "{r}", "--heatmap", "cluster.num_nodes,cluster.num_nodes"),
     "--heatmap cluster.num_nodes,cluster.num_nodes: give two different axes of the sweep as "
     "X,Y; its axes are " + ", ".join(SMALL_AXES)),
    (("--heatmap", "cluster.num_nodes,cluster.device.memory_gib"),
     "--heatmap cluster.num_nodes,cluster.device.memory_gib: only with --report"),
])  # fmt: skip
def test_a_bad_heatmap_is_one_line_before_any_work(
    options: tuple[str, ...], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An axis the sweep does not have, not two different axes, or no --report: exit 2, one
    error line, refused before the sweep's points are built; no table, no report."""

    def no_points(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the sweep's points were built before --heatmap was checked")

    monkeypatch.setattr(sweeps_cli, "sweep_points", no_points)
    args = [arg.replace("{r}", str(tmp_path / "r")) for arg in options]
    done = planner(80, "sweep", sweep_file(tmp_path), "--out", tmp_path / "t.parquet", *args)
    assert (done.code, done.stdout) == (2, "")
    assert unwrapped(done.stderr) == f"error: {message}", done.stderr
    assert all(line.startswith("  ") for line in done.stderr.splitlines()[1:]), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.toml"]


def test_text_values_are_shown_as_the_table_shows_them() -> None:
    """A sweep over frameworks: the heatmap's ticks, the page's table and a point's hover say
    ``megatron``, as the printed table does, not Python's ``'megatron'``."""
    from planner.report.sweep_figures import heatmap_figure
    from planner.report.sweep_reading import point_text

    axes = ["cluster.num_nodes", "search.framework"]
    from dataclasses import replace

    rows = [replace(_row(i, nodes, 0, 1.0 + i), values=(nodes, name))
            for i, (nodes, name) in enumerate(((4, "megatron"), (8, "torchtitan")))]
    figure = heatmap_figure(rows, axes, *axes)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["megatron", "torchtitan"]
    assert "search.framework=megatron" in point_text(rows[0], axes)
    assert "<th>torchtitan</th>" in sweep_page(rows, axes, title="t", heatmap_axes=axes)
