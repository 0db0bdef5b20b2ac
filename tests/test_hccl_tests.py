"""Fitting a network level to Ascend hccl_test output: tables written in hccl_test's own
layout (hicann/oam-tools@ea0ce91 src/hccl_test/common/src/hccl_opbase_rootinfo_base.cc:174,
:177-205) from known alpha-beta parameters, which the fit must give back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cost import CommGroup, collective_time_s
from planner.diagnose.hccl_tests import read_hccl_tests
from planner.diagnose.network_fit import fit_network, read_test_output
from planner.errors import InputError
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster
from planner.vocabulary import CollectiveKind
from tests.cli_process import cli
from tests.test_cli import _assert_one_line_error

ASCEND = Path(__file__).parents[1] / "instances" / "clusters" / "ascend-910b.json"
NCCL_SAMPLE = Path(__file__).parent / "data" / "nccl" / "all_reduce_perf_sample.txt"
SIZES = [8 * 4**k for k in range(14)]  # 8 B to 512 MiB, as -b 8 -e 512M -f 4 runs them
BINARY = {"all_reduce": "all_reduce_test", "all_gather": "all_gather_test",
          "reduce_scatter": "reduce_scatter_test", "all_to_all": "alltoall_test"}


def _fp32_buffer(kind: CollectiveKind, data_size: int, ranks: int) -> int:
    """The bytes hccl_test moves for ``data_size`` in fp32, by hand from its source
    (opbase_test/hccl_<op>_rootinfo_test.cc, init_malloc_Ksize_by_data and the bandwidth):
    all-reduce the data rounded up to elements; all-gather's output and reduce-scatter's input
    ``ranks`` per-rank shares of ``ceil(elements / ranks)``."""
    elements = -(-data_size // 4)
    if kind == "all_reduce":
        return 4 * elements
    assert kind in ("all_gather", "reduce_scatter")
    return 4 * ranks * -(-elements // ranks)


def _table(rows: list[tuple[int, float, float]], *, check: str = "success") -> str:
    """hccl_test's stdout for rows of (data_size, seconds, buffer bytes): the sizes line
    (common/src/hccl_test_common.cc:913), the header and the rows with the tool's widths and
    decimals, alg_bandwidth the buffer over the time in decimal GB/s."""
    lines = [f"the minbytes is {rows[0][0]}, maxbytes is {rows[-1][0]}, iters is 20, "
             f"warmup_iters is 10",
             f"{'data_size(Bytes):':<15s} | {'aveg_time(us):':<12s} | "
             f"{'alg_bandwidth(GB/s):':<18s} | check_result:"]
    for size, t, nbytes in rows:
        lines.append(f"{size:<17d} | {t * 1e6:<14.2f} | {nbytes / t / 1e9:<20.5f} | {check}")
    return "\n".join(lines) + "\n"


def _cluster_with(level: int, fraction: float, latency_us: float) -> ClusterSpec:
    """The Ascend 910B cluster with one level's fraction and latency changed: the truth the
    tables are priced on."""
    truth = load_cluster(ASCEND)
    old = truth.network[level]
    new = old.model_copy(update={
        "latency_us": latency_us,
        "efficiency": old.efficiency.model_copy(update={"bandwidth_fraction": fraction})})
    network = list(truth.network)
    network[level] = new
    return truth.model_copy(update={"network": tuple(network)})


def _priced(kind: CollectiveKind, truth: ClusterSpec, group: CommGroup) -> str:
    """A table of :data:`SIZES` timed by the cost model on ``truth``."""
    rows = []
    for size in SIZES:
        nbytes = _fp32_buffer(kind, size, group.size)
        rows.append((size, collective_time_s(truth, kind, nbytes, group), nbytes))
    return _table(rows)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_an_hccs_table_gives_back_its_alpha_and_beta(kind: CollectiveKind,
                                                     tmp_path: Path) -> None:
    """Eight NPUs of one node timed at HCCS 0.6 and 3 us: the fit, started from the file's
    0.77 and 1.9 us, finds them. All-gather's and reduce-scatter's data_size is the whole
    output or input: read as one NPU's share, the fraction would come out 8 times off."""
    results = tmp_path / f"{BINARY[kind]}_8p.log"
    results.write_text(_priced(kind, _cluster_with(0, 0.6, 3.0), CommGroup(size=8)))
    start = tmp_path / "ascend.json"
    start.write_text(ASCEND.read_text())
    fit = fit_network(start, [results], ranks=8)
    assert (fit.level, fit.level_name, fit.latency_fitted, fit.tools) == (
        0, "hccs", True, ("hccl_test",))
    assert fit.bandwidth_fraction == pytest.approx(0.6, abs=2e-4)
    assert fit.latency_us == pytest.approx(3.0, abs=0.02)


def test_nodes_put_the_run_on_the_outer_level(tmp_path: Path) -> None:
    """Eight ranks over two nodes (--nodes 2: four per node) cross RoCE, timed at 0.7 and
    6 us: the fit of level 1 finds them; without --nodes they would fill one node."""
    results = tmp_path / "all_reduce_test.log"
    results.write_text(_priced("all_reduce", _cluster_with(1, 0.7, 6.0),
                               CommGroup(size=8, stride=2)))
    fit = fit_network(ASCEND, [results], ranks=8, nodes=2)
    assert (fit.level, fit.level_name, fit.latency_fitted) == (1, "roce", True)
    assert fit.bandwidth_fraction == pytest.approx(0.7, abs=2e-4)
    assert fit.latency_us == pytest.approx(6.0, abs=0.05)
    assert fit_network(ASCEND, [results], ranks=8).level == 0


@pytest.mark.parametrize(("kind", "data_size", "nbytes"), [
    ("all_gather", 8, 32),  # 2 fp32 elements: one per rank, 8 ranks
    ("reduce_scatter", 1000, 1024),  # 250 elements: 32 per rank
    ("all_reduce", 1001, 1004),  # rounded up to whole fp32 elements
    ("all_reduce", 1001, 1002),  # an fp16 run: alg_bandwidth x aveg_time tells it apart
    ("all_to_all", 100, 128),  # 25 elements: a multiple of the 8 ranks
    ("all_to_all", 5000, 8192),  # 1250 elements: a multiple of 8 x 128
])  # fmt: skip
def test_data_size_becomes_the_buffer_the_tool_moved(kind: CollectiveKind, data_size: int,
                                                     nbytes: int, tmp_path: Path) -> None:
    """data_size padded as hccl_test pads it; the busbw nccl-tests' factor of alg_bandwidth."""
    results = tmp_path / f"{BINARY[kind]}.log"
    results.write_text(_table([(data_size, 10e-6, nbytes)]))
    run = read_hccl_tests(results, ranks=8)
    (row,) = run.rows
    assert (run.kind, run.ranks, run.tool, row.size_bytes) == (kind, 8, "hccl_test", nbytes)
    factor = 1.75 if kind == "all_reduce" else 0.875
    assert row.busbw_gb_s == pytest.approx(row.algbw_gb_s * factor)
    assert row.time_s == pytest.approx(10e-6)


GOOD = [(8192, 20e-6, 8192), (65536, 30e-6, 65536), (1 << 20, 60e-6, 1 << 20)]


@pytest.mark.parametrize(("text", "needle", "options"), [
    (_table(GOOD, check="failed"), "data_size 8192 has check_result failed", {"ranks": 8}),
    (_table(GOOD) + "local rank_id 3, check result failed, 65536 | 30.00 | 2.18 | failed\n",
     "rank 3's check of data_size 65536 failed", {"ranks": 8}),
    (_table(GOOD[::-1]), "increasing order", {"ranks": 8}),
    (_table(GOOD).splitlines()[1] + "\n", "expected an hccl_test result table", {"ranks": 8}),
    (_table(GOOD), "does not print its rank count; expected --ranks N", {}),
    (_table(GOOD), "expected at least 2 ranks", {"ranks": 1}),
    (_table(GOOD), "expected --nodes to divide --ranks 8", {"ranks": 8, "nodes": 3}),
])  # fmt: skip
def test_bad_tables_are_refused(text: str, needle: str, options: dict[str, int],
                                tmp_path: Path) -> None:
    """A failed check on any rank, sizes out of order, no table, no or odd rank counts: one
    InputError naming the file."""
    bad = tmp_path / "all_reduce_test.log"
    bad.write_text(text)
    with pytest.raises(InputError, match=needle) as info:
        read_test_output(bad, **options)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("hccl.log", _table(GOOD), "expected a file name holding the binary's"),
    ("all_reduce_test.log", "data_size 8192\n8192 20.0 0.4\n",
     "expected nccl-tests output .* or hccl_test output"),
    ("all_reduce_perf.log", NCCL_SAMPLE.read_text(), "nccl-tests ran 2 ranks; expected --ranks"),
])  # fmt: skip
def test_files_of_neither_tool_are_refused(name: str, text: str, needle: str,
                                           tmp_path: Path) -> None:
    """No binary in an hccl_test file's name, a file of neither layout, an nccl-tests file
    whose ranks contradict --ranks."""
    bad = tmp_path / name
    bad.write_text(text)
    with pytest.raises(InputError, match=needle) as info:
        fit_network(ASCEND, [bad], ranks=8)
    assert str(bad) in str(info.value)


def test_calibrate_network_writes_an_hccl_fit(tmp_path: Path) -> None:
    """The command on an hccl_test table: without --ranks, or on a failed table, exit 2 and
    the cluster file as it was; with --ranks 8 --write, level 0 written with its source."""
    cluster = tmp_path / "ascend.json"
    cluster.write_text(ASCEND.read_text())
    before = cluster.read_text()
    results = tmp_path / "all_gather_test.log"
    good = _priced("all_gather", _cluster_with(0, 0.6, 3.0), CommGroup(size=8))
    results.write_text(good.replace("success", "failed", 1))
    _assert_one_line_error(cli("calibrate-network", cluster, results, "--ranks", "8",
                                "--write"), str(results), "check_result failed")
    results.write_text(good)
    _assert_one_line_error(cli("calibrate-network", cluster, results, "--write"),
                           str(results), "expected --ranks N")
    assert cluster.read_text() == before
    done = cli("calibrate-network", cluster, results, "--ranks", "8", "--write")
    assert done.returncode == 0, done.stderr
    assert "hccs: hccl_test against the cost model" in done.stdout
    level = json.loads(cluster.read_text())["network"][0]
    assert level["efficiency"]["bandwidth_fraction"] == pytest.approx(0.6, abs=2e-4)
    assert level["latency_us"] == pytest.approx(3.0, abs=0.02)
    assert "hccl_test all_gather_test.log" in level["efficiency"]["source"]
