"""planner sweep: the points of a sweep file, each solved as ``solve`` solves it, locally or
on Ray with the same table; failures as rows; resuming from the journal; bad sweeps refused
in one line before any search."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planner.sweep.run as sweep_run
from planner.errors import InputError
from planner.options import Progress
from planner.search.targets import solve
from planner.sweep import journal_path, read_sweep, run_sweep, sweep_points
from tests.conftest import CLUSTERS, MODELS, REPO
from tests.test_cli_width import planner

TOKENS = 1e12
AXES = """\
"cluster.num_nodes" = [1, 2]
"cluster.device.memory_gib" = [80, 8]
"cluster.price_per_device_hour" = [2.0, 3.5]
"""
"""8 points, 4 searches (the price needs none of its own); 8 GiB devices fit nothing."""


def sweep_file(
    folder: Path, axes: str = AXES, *, global_batch: int = 64, search: str = ""
) -> Path:
    """Llama 3 8B on DGX H100 nodes for torchtitan (each search a fraction of a second)."""
    path = folder / "sweep.toml"
    path.write_text(f'model = "{MODELS / "llama3-8b.json"}"\n'
                    f'cluster = "{CLUSTERS / "dgx-h100-80gb.json"}"\n'
                    f"tokens = {TOKENS}\n"
                    f"[training]\nglobal_batch_size = {global_batch}\n"
                    f'[search]\nframework = "torchtitan"\n{search}'
                    f"[axes]\n{axes}")  # fmt: skip
    return path


def run(folder: Path, out: Path, **options: Any) -> sweep_run.SweepResult:
    """The sweep in ``folder`` run to ``out``."""
    sweep = read_sweep(sweep_file(folder))
    return run_sweep(sweep, sweep_points(sweep), out=out, **options)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> tuple[sweep_run.SweepResult, pa.Table]:
    """The sweep run in this process, uninterrupted: its result and its table."""
    folder = tmp_path_factory.mktemp("sweep")
    result = run(folder, folder / "local.parquet")
    return result, pq.read_table(folder / "local.parquet")


@dataclass
class Solves:
    """Calls of ``solve`` a sweep made."""

    count: int = 0


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> Solves:
    """Count the searches a sweep runs (in this process)."""
    seen = Solves()

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.count += 1
        return solve(*args, **kwargs)

    monkeypatch.setattr(sweep_run, "solve", counted)
    return seen


# --------------------------------------------------------------------------- the table


def test_rows_are_the_points_in_order(local: tuple[sweep_run.SweepResult, pa.Table]) -> None:
    """One row per point of the product, in the axes' order, its axis values as columns."""
    _, table = local
    assert table.column_names[:4] == ["point", "cluster.num_nodes", "cluster.device.memory_gib",
                                      "cluster.price_per_device_hour"]  # fmt: skip
    rows = table.to_pylist()
    assert [r["point"] for r in rows] == list(range(8))
    assert [(r["cluster.num_nodes"], r["cluster.device.memory_gib"],
             r["cluster.price_per_device_hour"]) for r in rows] == [
        (n, m, p) for n in (1, 2) for m in (80, 8) for p in (2.0, 3.5)]  # fmt: skip
    assert [r["devices"] for r in rows] == [8] * 4 + [16] * 4


def test_a_row_is_solve_on_its_point(local: tuple[sweep_run.SweepResult, pa.Table]) -> None:
    """Each row with a plan has the numbers of ``solve`` run directly on its point's specs;
    time to train and cost follow from the tokens and the price."""
    result, table = local
    sweep = read_sweep(result.out.parent / "sweep.toml")
    points = sweep_points(sweep)
    for point, row in zip(points, table.to_pylist(), strict=True):
        if row["cluster.device.memory_gib"] == 8:
            continue
        assert point.cluster.num_nodes == row["cluster.num_nodes"]
        plan = solve(point.model, point.cluster, point.options)
        assert row["step_time_s"] == plan.predicted.step_time_s
        assert row["summary"] == plan.summary()
        assert row["mfu"] == plan.predicted.mfu
        assert row["error_band"] == plan.predicted.error_band.text  # type: ignore[union-attr]
        hours = TOKENS / plan.predicted.tokens_per_s / 3600
        assert row["time_to_train_s"] == pytest.approx(hours * 3600, rel=1e-12)
        price = row["cluster.price_per_device_hour"]
        assert row["cost"] == pytest.approx(row["devices"] * price * hours, rel=1e-12)
        assert row["error"] is None


def test_a_point_that_fits_nothing_is_a_row_with_its_reason(
    local: tuple[sweep_run.SweepResult, pa.Table],
) -> None:
    """8 GiB devices: the point's row says why, and the sweep went on."""
    result, table = local
    failed = [r for r in table.to_pylist() if r["cluster.device.memory_gib"] == 8]
    assert len(failed) == 4 == result.failed
    for row in failed:
        assert row["error"].startswith("no uniform configuration fits llama3-8b")
        assert row["step_time_s"] is None and row["summary"] is None and row["cost"] is None
    assert result.best is not None and result.best.index == 4  # 2 nodes, the lower price


def test_ray_gives_the_same_table(
    local: tuple[sweep_run.SweepResult, pa.Table], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local Ray of 2 CPUs: the same rows, in the same order, every column equal. Local
    even when RAY_ADDRESS (or the last ``ray start`` on the machine) names a cluster: Ray
    would join it by default, and refuse the CPU count."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'planner[ray]')")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens there
    run(tmp_path, tmp_path / "ray.parquet", engine="ray", num_cpus=2)
    ray_table = pq.read_table(tmp_path / "ray.parquet")
    assert ray_table.equals(local[1], check_metadata=True)


# --------------------------------------------------------------------------- resuming


class Interrupted(Exception):
    """Raised from the progress hook, as Ctrl-C would stop the sweep."""


def stop_after(points: int) -> Callable[[Progress], None]:
    """A progress hook that stops the sweep once ``points`` points are done."""

    def hook(p: Progress) -> None:
        if p.done >= points:
            raise Interrupted

    return hook


def test_an_interrupted_sweep_resumes_to_the_same_table(
    local: tuple[sweep_run.SweepResult, pa.Table], tmp_path: Path, solves: Solves
) -> None:
    """Stopped after 4 points (2 searches), the journal keeps them and no table is written;
    the re-run solves only the other 2 searches and ends with the uninterrupted table."""
    out = tmp_path / "out.parquet"
    with pytest.raises(Interrupted):
        run(tmp_path, out, progress=stop_after(4))
    assert not out.exists()
    assert len(journal_path(out).read_text().splitlines()) == 1 + 4  # the settings, 4 rows
    assert solves.count == 2
    result = run(tmp_path, out)
    assert (result.skipped, solves.count) == (4, 4)
    assert pq.read_table(out).equals(local[1], check_metadata=True)
    assert not journal_path(out).exists()  # the table holds it all now
    again = run(tmp_path, out)
    assert (again.skipped, solves.count) == (8, 4)
    assert pq.read_table(out).equals(local[1], check_metadata=True)


def test_a_journal_of_other_settings_is_refused(tmp_path: Path, solves: Solves) -> None:
    """The sweep file's settings changed since the journal: one line, nothing solved."""
    out = tmp_path / "out.parquet"
    with pytest.raises(Interrupted):
        run(tmp_path, out, progress=stop_after(2))
    sweep = read_sweep(sweep_file(tmp_path, global_batch=128))
    with pytest.raises(InputError, match=r"journal.jsonl: was written under other settings"):
        run_sweep(sweep, sweep_points(sweep), out=out)
    assert solves.count == 1


# --------------------------------------------------------------------------- bad sweeps


def planner_cli(*args: str | Path) -> tuple[int, str, str]:
    """``planner ARGS`` in-process at 80 columns (tests/test_cli_width.py's runner): exit
    code, stdout, stderr."""
    done = planner(80, *args)
    return done.code, done.stdout, done.stderr


@pytest.mark.parametrize(("axes", "options", "message"), [
    ('"cluster.nodes" = [1, 2]\n', (),
     "axis 'cluster.nodes' names no field: cluster has no field 'nodes'"),
    ('"cluster.network.2.bandwidth_gb_s" = [50]\n', (),
     "cluster.network has 2 entries, numbered from 0, not '2'"),
    ('"cluster.device.memory_gib" = [80, 100000]\n', (),
     "axis cluster.device.memory_gib = 100000: 100000 is above the limit of 16384"),
    ('"training.global_batch_size" = [64, 0]\n', (),
     "axis training.global_batch_size = 0: Input should be greater than 0"),
    ('"search.framework" = ["megatron", "megatorch"]\n', (),
     "axis search.framework = 'megatorch' is not a framework the planner knows"),
    ('"search.memory_margin_gib" = [4, -5]\n', (),
     "search: memory margin -5.0 GiB: a margin is at least 0 GiB"),
    (AXES, ("--max-points", "7"), "2 x 2 x 2 = 8 points is above --max-points 7"),
    # a figure no hardware has, as a cluster file's is refused: 400 Gb/s written as GB/s
    ('"cluster.network.1.bandwidth_gb_s" = [50, 400]\n', (),
     "cluster.network.1.bandwidth_gb_s=400): cluster: network.1.bandwidth_gb_s: 400 GB/s is "
     "outside the range 0.1 to 250 GB/s"),
    ('"cluster.device.memory_gib" = [80, 800]\n', (),
     "device.memory_gib: 800 GiB is outside the range 1 to 640 GiB"),
])  # fmt: skip
def test_a_bad_sweep_is_one_line_before_any_search(
    axes: str, options: tuple[str, ...], message: str, tmp_path: Path, solves: Solves
) -> None:
    """An axis naming no field, a value past a field's limits, too many points: exit 2, one
    error naming the axis and the value, and no search started."""
    path = sweep_file(tmp_path, axes)
    code, stdout, stderr = planner_cli("sweep", path, "--out", tmp_path / "r.parquet", *options)
    assert (code, stdout, solves.count) == (2, "", 0)
    text = " ".join(line.strip() for line in stderr.splitlines())
    assert text.startswith(f"error: {path}: ") and message in text, text
    assert not (tmp_path / "r.parquet").exists()


@pytest.mark.parametrize(("search", "message"), [
    ('frameworks = ["megatron"]\n', "[search] frameworks: search has no field 'frameworks'"),
    ("pins.tq = 2\n", "[search] pins.tq: search.pins has no field 'tq'"),
    ("global_batch_size = 32\n", "[search] global_batch_size: the run's global_batch_size "
     "goes in [training]"),
])  # fmt: skip
def test_a_search_setting_that_names_no_field_is_refused(
    search: str, message: str, tmp_path: Path, solves: Solves
) -> None:
    """A misspelt setting would be ignored by the options' reader: refused, naming it."""
    sweep = read_sweep(sweep_file(tmp_path, search=search))
    with pytest.raises(InputError, match=re.escape(message)):
        sweep_points(sweep)
    assert solves.count == 0


def test_ray_engine_without_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                solves: Solves) -> None:  # fmt: skip
    """--engine ray with no Ray installed says how to install it."""
    monkeypatch.setitem(sys.modules, "ray", None)  # find_spec then finds no Ray
    code, _, stderr = planner_cli("sweep", sweep_file(tmp_path), "--out", tmp_path / "r.parquet",
                                  "--engine", "ray")  # fmt: skip
    assert (code, solves.count) == (2, 0)
    text = " ".join(line.strip() for line in stderr.splitlines())
    assert text == ("error: --engine ray needs Ray, which is not installed: pip install "
                    "'planner[ray]'")


def test_results_named_as_another_format_are_refused(tmp_path: Path, solves: Solves) -> None:
    """The table is Parquet: a ``.csv`` name would hold bytes no CSV reader takes, so it is
    refused before any point is solved."""
    code, _, stderr = planner_cli("sweep", sweep_file(tmp_path), "--out", tmp_path / "r.csv")
    assert (code, solves.count) == (2, 0)
    assert "the results table is Parquet; name it .parquet" in " ".join(stderr.split())
    assert not (tmp_path / "r.csv").exists()


def test_an_interrupted_sweep_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Ctrl-C keeps the journal and exits 130, as docs/sweep.md says; click, run without its
    standalone mode, returned the code instead of exiting with it, and the sweep exited 0
    (a script's ``planner sweep ... && analyse`` went on with half a table)."""
    import planner.cli.sweeps

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(planner.cli.sweeps, "run_sweep", interrupted)
    monkeypatch.setattr(sys, "argv", ["planner", "sweep", str(sweep_file(tmp_path)), "--out",
                                      str(tmp_path / "r.parquet")])  # fmt: skip
    from planner.cli import main

    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 130
    assert "interrupted: the points done are kept in" in capsys.readouterr().err


@pytest.mark.parametrize(("cause", "hint"), [
    ("RPC error: InvalidAuthToken: Authentication token is missing or incorrect",
     "it requires a token; set RAY_AUTH_MODE=token here (the token in ~/.ray/auth_token or "
     "RAY_AUTH_TOKEN_PATH), or give --address auto on one of its nodes"),
    ("Failed to connect to GCS", "is a Ray head running there (ray start --head)?"),
])  # fmt: skip
def test_a_ray_cluster_that_cannot_be_joined_is_one_line(
    cause: str, hint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, solves: Solves
) -> None:
    """--address of a cluster Ray cannot join (no head there, or one that wants a token the
    driver does not send): one error line with what Ray said and what to try, not Ray's
    traceback; no search."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'planner[ray]')")

    def refused(**kwargs: Any) -> None:
        assert kwargs["address"] == "10.0.0.1:6379"
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from (
            RuntimeError(cause))

    monkeypatch.setattr(ray, "init", refused)
    code, stdout, stderr = planner_cli("sweep", sweep_file(tmp_path), "--out",
                                       tmp_path / "r.parquet", "--engine", "ray",
                                       "--address", "10.0.0.1:6379")  # fmt: skip
    assert (code, stdout, solves.count) == (2, "", 0)
    text = " ".join(line.strip() for line in stderr.splitlines())
    assert text == ("error: --address 10.0.0.1:6379: cannot join the Ray cluster there "
                    f"(Failed to connect to Ray cluster at 10.0.0.1:6379): {hint}"), text
    assert not (tmp_path / "r.parquet").exists()


def test_the_command_prints_what_it_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary at 80 columns: points, failures, skips, then the table of every point,
    best first (by step time), each with its plan under its numbers. Run in the scratch
    folder with relative paths, so that no line's length depends on where the folder is (a
    pytest-xdist worker's is 10 characters deeper)."""
    sweep_file(tmp_path, '"cluster.num_nodes" = [1, 2]\n')
    monkeypatch.chdir(tmp_path)
    out = Path("r.parquet")
    code, stdout, _ = planner_cli("sweep", "sweep.toml", "--out", out)
    assert code == 0
    rows = pq.read_table(out).to_pylist()
    best, other = sorted(rows, key=lambda r: r["step_time_s"])
    lines = stdout.splitlines()
    assert lines[0] == f"wrote {out}: 2 points, 2 with a plan, 0 without, 0 already done"
    assert lines[1].split() == ["point", "num_nodes", "step", "s", "+/-", "MFU", "%", "GiB",
                                "days"]  # fmt: skip
    numbers = [line.split() for line in lines[2:] if not line.startswith(" " * 7)]
    assert numbers == [[str(r["point"]), str(r["cluster.num_nodes"]),
                        f"{r['step_time_s']:.3f}", *r["error_band"].removeprefix("+/- ").split(),
                        f"{100 * r['mfu']:.1f}",
                        f"{r['peak_memory_gib']:.1f}", f"{r['time_to_train_s'] / 86400:,.0f}"]
                       for r in (best, other)]  # fmt: skip
    plans = " ".join(line.strip() for line in lines[2:] if line.startswith(" " * 7))
    assert plans == f"{best['summary']} {other['summary']}"
    assert all(len(line) <= 80 for line in lines)


def test_the_bundled_sweep_reads() -> None:
    """instances/sweeps/llama3-70b-h100-nics.toml: 2 x 2 points over nodes and NICs."""
    sweep = read_sweep(REPO / "instances/sweeps/llama3-70b-h100-nics.toml")
    points = sweep_points(sweep)
    assert [(p.cluster.num_nodes, p.cluster.network[1].bandwidth_gb_s) for p in points] == [
        (16, 25), (16, 50), (32, 25), (32, 50)]  # fmt: skip
    assert {p.options.framework for p in points} == {"megatron"}
    assert {p.options.global_batch_size for p in points} == {1024}


def test_the_codesign_sweep_reads() -> None:
    """instances/sweeps/llama3.1-405b-codesign.toml: NVLink domains of 8 and 72 x NICs of 50
    and 100 GB/s x 2,048 to 16,384 GPUs, the same H100 and Meta's batch in every point."""
    sweep = read_sweep(REPO / "instances/sweeps/llama3.1-405b-codesign.toml")
    points = sweep_points(sweep)
    designs = {(p.cluster.scale_up_devices, p.cluster.network[1].bandwidth_gb_s)
               for p in points}  # fmt: skip
    assert designs == {(8, 50), (8, 100), (72, 50), (72, 100)}
    assert sorted({p.cluster.num_devices for p in points}) == [2048, 4096, 8192, 16384]
    assert {p.cluster.device.name for p in points} == {"H100-SXM5-80GB"}
    assert {(p.options.global_batch_size, p.options.seq_length) for p in points} == {(2048, 8192)}
    assert sweep.tokens == 1.56e13
