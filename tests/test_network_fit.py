"""Fitting a network level to nccl-tests output: the shared sample, and tables written in
nccl-tests' own layout from known alpha-beta parameters, which the fit must recover."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from planner.cost import CommGroup, collective_time_s
from planner.diagnose.nccl_tests import bus_factor, read_nccl_tests
from planner.diagnose.network_fit import fit_network
from planner.errors import InputError
from planner.spec.reading import load_cluster
from planner.vocabulary import CollectiveKind

DATA = Path(__file__).parent / "data" / "nccl"
SAMPLE = DATA / "all_reduce_perf_sample.txt"
PAIR = DATA / "h100-pcie-nvlink-pair.json"
H100 = Path(__file__).parents[1] / "instances" / "clusters" / "dgx-h100-80gb.json"
SIZES = [2**k for k in range(3, 31, 3)]  # 8 B to 1 GiB, as -b 8 -e 1G -f 8 runs them


def _float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr (NVIDIA/nccl-tests@a0b82b2 src/util.cu:487): two decimals,
    then fewer, then none, then an exponent, whichever fits the width."""
    for text in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def _table(kind: CollectiveKind, ranks: int, times_s: list[float], *,
           hosts: tuple[str, ...] = ("node0",), wrong: int = 0) -> str:
    """An nccl-tests stdout of ``times_s`` per size of :data:`SIZES`: the nThread line
    (src/util.cu:625), one rank line per rank (src/util.cu:687), the header
    (src/util.cu:756-760) and result lines (src/util.cu:457, 508), the redop ``sum`` for the
    tests that reduce and ``none`` for the others (src/all_gather.cu:87, src/alltoall.cu:393)."""
    binary = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
              "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf"}[kind]
    per_host = ranks // len(hosts)
    lines = [f"# Collective test starting: {binary}",
             f"# nThread 1 nGpus 1 minBytes 8 maxBytes {SIZES[-1]} step: 8(factor) warmup "
             f"iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0", "#"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {hosts[r // per_host]:>10s} "
              f"device {r % per_host:2d} [0000:{r:02x}:00] NVIDIA H100 80GB HBM3"
              for r in range(ranks)]  # fmt: skip
    lines += ["#", "# " + " " * 10 + "  size  count  type  redop  root  time  algbw  busbw "
              "#wrong  time  algbw  busbw #wrong"]
    for size, t in zip(SIZES, times_s, strict=True):
        algbw = size / 1e9 / t
        body = (f"  {_float(t * 1e6, 7)}  {_float(algbw, 6)}  "
                f"{_float(algbw * bus_factor(kind, ranks), 6)}  {wrong:6g}")
        redop = "sum" if kind in ("all_reduce", "reduce_scatter") else "none"
        lines.append(f"{size:12d}  {size // 4:12d}  {'float':>8s}  {redop:>6s}  {-1:6d}"
                     + body * 2)
    lines += ["# Out of bounds values : 0 OK", f"# Collective test concluded: {binary}"]
    return "\n".join(lines) + "\n"


def test_the_sample_calibrates_the_nvlink_bridge(tmp_path: Path) -> None:
    """Two H100 PCIe on an NVLink bridge (300 GB/s each way): level 0, and the fitted level
    gives back the table's bus bandwidth; two sizes of 1 and 2 GiB cannot see a latency."""
    fit = fit_network(PAIR, [SAMPLE])
    assert (fit.level, fit.level_name, fit.latency_fitted) == (0, "nvlink-bridge", False)
    assert fit.latency_us == fit.latency_us_before == 3.0
    for row in fit.rows:
        assert row.busbw_after_gb_s == pytest.approx(row.busbw_gb_s, rel=0.005)
    # Two ranks: busbw = algbw (2(n-1)/n = 1), all about 115.6 GB/s of 300.
    assert fit.bandwidth_fraction == pytest.approx(115.6 / 300, rel=0.003)


def test_the_sample_is_read_out_of_place() -> None:
    """The out-of-place columns, two ranks from busbw / algbw, sizes in bytes."""
    run = read_nccl_tests(SAMPLE)
    assert (run.kind, run.ranks, run.hosts) == ("all_reduce", 2, ())
    assert [r.size_bytes for r in run.rows] == [2**30, 2**31]
    assert [r.time_s for r in run.rows] == pytest.approx([9306.7e-6, 18535e-6])


@pytest.mark.parametrize("kind", ["all_reduce", "all_to_all", "all_gather", "reduce_scatter"])
def test_a_ring_table_gives_back_its_alpha_and_beta(kind: CollectiveKind, tmp_path: Path) -> None:
    """Eight ranks of one node, times from the ring formula by hand (all-reduce: 2(n-1)/n S/B
    + 2 log2(n) alpha; the others (n-1)/n S/B + log2(n) alpha), printed as nccl-tests prints
    them: the fit recovers B = 450 GB/s x 0.7 and alpha = 4 us."""
    n, bandwidth, alpha = 8, 450e9 * 0.7, 4e-6
    rounds = 2 if kind == "all_reduce" else 1
    times = [rounds * ((n - 1) / n * s / bandwidth + math.log2(n) * alpha) for s in SIZES]
    results = tmp_path / "out.txt"
    results.write_text(_table(kind, n, times))
    start = tmp_path / "start.json"
    start.write_text(H100.read_text())
    fit = fit_network(start, [results])
    assert (fit.level, fit.latency_fitted) == (0, True)
    assert fit.bandwidth_fraction == pytest.approx(0.7, abs=2e-4)
    assert fit.latency_us == pytest.approx(4.0, abs=0.02)


def test_an_all_gather_across_nodes_fits_the_outer_level(tmp_path: Path) -> None:
    """Sixteen ranks on two hosts cross the inter-node level: times priced by the cost model
    with that level at 0.6 and 7 us; the fit starts from the file's values and finds them."""
    truth = load_cluster(H100)
    outer = truth.network[1]
    changed = outer.model_copy(update={
        "latency_us": 7.0,
        "efficiency": outer.efficiency.model_copy(update={"bandwidth_fraction": 0.6})})
    truth = truth.model_copy(update={"network": (truth.network[0], changed,
                                                 *truth.network[2:])})
    times = [collective_time_s(truth, "all_gather", s, CommGroup(size=16)) for s in SIZES]
    results = tmp_path / "ag.txt"
    results.write_text(_table("all_gather", 16, times, hosts=("node0", "node1")))
    start = tmp_path / "start.json"
    start.write_text(H100.read_text())
    fit = fit_network(start, [results])
    assert (fit.level, fit.latency_fitted) == (1, True)
    assert fit.bandwidth_fraction == pytest.approx(0.6, abs=2e-4)
    assert fit.latency_us == pytest.approx(7.0, abs=0.05)
    assert read_nccl_tests(results).hosts == ("node0", "node1")


def test_two_dgx_h100_nodes_at_the_published_bus_bandwidth(tmp_path: Path) -> None:
    """An all_reduce_perf table of 16 ranks on 2 DGX H100 at the bus bandwidth NVIDIA's
    maintainers expect there (46 GB/s per NIC, eight a node: 368 GB/s; NVIDIA/nccl-tests#290),
    with 30 us of latency: NCCL's rings cross at every NIC at once, so the fit finds the
    NIC at 0.92 of its 50 GB/s. Priced as phases in turn, the table was refused as 2.75 times
    faster than the level allows."""
    busbw, latency = 368e9, 30e-6
    times = [latency + s * bus_factor("all_reduce", 16) / busbw for s in SIZES]
    results = tmp_path / "ar16.txt"
    results.write_text(_table("all_reduce", 16, times, hosts=("node0", "node1")))
    start = tmp_path / "start.json"
    start.write_text(H100.read_text())
    fit = fit_network(start, [results])
    assert fit.level_name == "infiniband"
    assert fit.bandwidth_fraction == pytest.approx(0.92, abs=0.005)
    assert fit.rows[-1].busbw_after_gb_s == pytest.approx(368, rel=0.01)


def test_a_table_bound_by_nvlink_gives_the_slowest_nic_that_fits(tmp_path: Path) -> None:
    """At 390 GB/s of bus bandwidth the 2-node all-reduce is bound by NVLink (369 GB/s in the
    file), not by the NICs: any NIC fast enough prices the same, so the fit writes the
    slowest that reproduces the table (8 NICs of 50 GB/s at 0.92 carry 369) and says why."""
    times = [30e-6 + s * bus_factor("all_reduce", 16) / 390e9 for s in SIZES]
    results = tmp_path / "ar16.txt"
    results.write_text(_table("all_reduce", 16, times, hosts=("node0", "node1")))
    start = tmp_path / "start.json"
    start.write_text(H100.read_text())
    fit = fit_network(start, [results])
    nvlink = load_cluster(H100).network[0]
    assert fit.bandwidth_fraction == pytest.approx(
        nvlink.bandwidth_gb_s * nvlink.efficiency.bandwidth_fraction / (8 * 50), abs=0.002)
    assert "another level bounds these runs" in fit.source


def test_the_written_file_changes_only_the_level(tmp_path: Path) -> None:
    """The fit goes into the level's efficiency with its source; every other key and its
    order stay."""
    fit = fit_network(PAIR, [SAMPLE])
    old, new = json.loads(PAIR.read_text()), json.loads(fit.updated_json)
    assert list(new) == list(old) and new["device"] == old["device"]
    level = new["network"][0]
    assert level["efficiency"]["bandwidth_fraction"] == fit.bandwidth_fraction
    assert "all_reduce_perf_sample.txt" in level["efficiency"]["source"]
    assert level["latency_us"] == old["network"][0]["latency_us"]


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t: t.replace("     0  ", "     3  ", 1), "#wrong 3"),  # out of place
    (lambda t: "\n".join(t.splitlines()[:-5] + t.splitlines()[-3:-2] + t.splitlines()[-5:-3]),
     "increasing order"),
    (lambda t: "# Collective test starting: all_reduce_perf\nhello\n", "result table"),
])  # fmt: skip
def test_bad_tables_are_refused(edit: Callable[[str], str], needle: str, tmp_path: Path) -> None:
    """A wrong result, sizes out of order, no table: one InputError naming the file."""
    bad = tmp_path / "all_reduce_perf.txt"
    bad.write_text(edit(_table("all_reduce", 8, [1e-5 * (i + 1) for i in range(len(SIZES))])))
    with pytest.raises(InputError, match=needle) as info:
        read_nccl_tests(bad)
    assert str(bad) in str(info.value)


def test_a_level_the_cluster_lacks_is_refused() -> None:
    """--level beyond the cluster's levels names the file and the levels it has."""
    with pytest.raises(InputError, match="levels 0 to 0"):
        fit_network(PAIR, [SAMPLE], level=3)


def test_a_level_the_runs_do_not_cross_is_refused() -> None:
    """Two ranks on one host never touch a DGX H100's InfiniBand: --level 1 is refused."""
    with pytest.raises(InputError, match=r"all_reduce_perf_sample.txt: the runs do not cross "
                       r"level 1 \(infiniband\)"):
        fit_network(H100, [SAMPLE], level=1)


def _unnamed(kind: CollectiveKind, ranks: int, times_s: list[float], **hosts: tuple[str, ...]
             ) -> str:
    """:func:`_table` without its '# Collective test starting' line: the file's name says
    which test wrote it."""
    return _table(kind, ranks, times_s, **hosts).split("\n", 1)[1]


def _ring_times(kind: CollectiveKind, n: int = 8) -> list[float]:
    """Ring times by hand on 8 ranks of one H100 node at 0.7 of NVLink's 450 GB/s, 4 us."""
    rounds = 2 if kind == "all_reduce" else 1
    return [rounds * ((n - 1) / n * s / (450e9 * 0.7) + math.log2(n) * 4e-6) for s in SIZES]


@pytest.mark.parametrize(("table", "named", "said"), [
    ("all_reduce", "all_gather_perf", "busbw/algbw 1.75 and redop sum say all_reduce_perf of 8 "
                                      "ranks"),
    ("all_gather", "all_reduce_perf", "busbw/algbw 0.875 and redop none say all_gather_perf, "
                                      "alltoall_perf, gather_perf or scatter_perf of 8 ranks"),
    ("reduce_scatter", "all_gather_perf", "redop sum say reduce_scatter_perf of 8 ranks"),
    ("all_to_all", "reduce_scatter_perf", "redop none say all_gather_perf, alltoall_perf"),
], ids=["all_reduce-as-all_gather", "all_gather-as-all_reduce", "reduce_scatter-as-all_gather",
        "all_to_all-as-reduce_scatter"])  # fmt: skip
def test_a_table_of_another_test_than_its_file_is_refused(
        table: CollectiveKind, named: str, said: str, tmp_path: Path) -> None:
    """nccl-tests prints busbw = algbw x the test's factor (2(n-1)/n all-reduce, (n-1)/n
    all-gather, reduce-scatter, all-to-all: src/all_reduce.cu:63, all_gather.cu:42,
    reduce_scatter.cu:41, alltoall.cu:52) and the redop (a reduction's name, or ``none`` for
    all-gather and all-to-all: all_gather.cu:87, alltoall.cu:393): an all-reduce table saved
    as all_gather_perf fitted half the true fraction (0.3667 for 0.7333), and an all-gather
    table as all_reduce_perf was refused as faster than NVLink allows. Both are refused for
    what they are, before any fit."""
    results = tmp_path / f"{named}_8.txt"
    results.write_text(_unnamed(table, 8, _ring_times(table)))
    with pytest.raises(InputError, match=rf"{named}_8.txt: read as {named}, but its .*{said}"):
        fit_network(H100, [results])


@pytest.mark.parametrize("gpus_per_process", [1, 8])
def test_an_mpi_run_without_rank_lines_counts_its_ranks_by_busbw(
        gpus_per_process: int, tmp_path: Path) -> None:
    """16 ranks launched by MPI, their '#  Rank' lines cut: '# nThread 1 nGpus G' counts one
    process's ranks (nccl-tests' nranks is nProcs x nThreads x nGpus, src/common.cu:796), so
    it was refused as 1 rank (G = 1) or read as 8 (G = 8); busbw/algbw 1.875 is all-reduce's
    2(n-1)/n of 16, which fits the level between the nodes."""
    times = [30e-6 + s * bus_factor("all_reduce", 16) / 300e9 for s in SIZES]
    text = _table("all_reduce", 16, times, hosts=("node0", "node1"))
    lines = [line.replace("nGpus 1", f"nGpus {gpus_per_process}") for line in text.splitlines()
             if not line.startswith("#  Rank")]  # fmt: skip
    results = tmp_path / "all_reduce_perf_mpi.txt"
    results.write_text("\n".join(lines) + "\n")
    run = read_nccl_tests(results)
    assert (run.ranks, run.hosts) == (16, ())
    assert fit_network(H100, [results]).level_name == "infiniband"


def test_rank_lines_missing_where_busbw_cannot_count_the_ranks_are_named(tmp_path: Path) -> None:
    """Times so long that algbw prints 0.00 to 0.01: busbw/algbw fits any rank count, so the
    refusal says the rank lines are missing (it said 'expected at least 2 ranks, got 1')."""
    text = _table("all_reduce", 16, [100.0] * len(SIZES), hosts=("node0", "node1"))
    results = tmp_path / "all_reduce_perf.txt"
    results.write_text("".join(line for line in text.splitlines(keepends=True)
                               if not line.startswith("#  Rank")))  # fmt: skip
    with pytest.raises(InputError, match=r"the '#  Rank \.\.\. device' lines are missing .* "
                                         r"fits all_reduce_perf of 2 or more ranks"):
        read_nccl_tests(results)


def test_sizes_out_of_order_name_the_pair_and_two_runs_say_so(tmp_path: Path) -> None:
    """Two sizes swapped: the refusal names the pair, not all the sizes over many lines; two
    runs' output in one file (two '# nThread' lines) says it holds two."""
    table = _table("all_reduce", 8, _ring_times("all_reduce"))
    lines = table.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("           8 "))
    lines[first + 1], lines[first + 2] = lines[first + 2], lines[first + 1]
    swapped, twice = tmp_path / "all_reduce_perf.txt", tmp_path / "all_reduce_perf_2.txt"
    swapped.write_text("".join(lines))
    twice.write_text(table * 2)
    with pytest.raises(InputError, match=r"all_reduce_perf.txt: size 64 follows size 512; "
                                         r"expected sizes in increasing order, one table per "
                                         r"file$"):
        read_nccl_tests(swapped)
    with pytest.raises(InputError, match=r"holds 2 runs \(2 '# nThread' lines\): size 8 follows "
                                         r"size 1073741824; .* one table per file$"):
        read_nccl_tests(twice)


def _priced(kind: CollectiveKind, fraction: float) -> list[float]:
    """Times of 16 ranks on two DGX H100 as the cost model prices them with InfiniBand at
    ``fraction`` and 7 us."""
    truth = load_cluster(H100)
    outer = truth.network[1]
    changed = outer.model_copy(update={
        "latency_us": 7.0,
        "efficiency": outer.efficiency.model_copy(update={"bandwidth_fraction": fraction})})
    truth = truth.model_copy(update={"network": (truth.network[0], changed,
                                                 *truth.network[2:])})
    return [collective_time_s(truth, kind, s, CommGroup(size=16)) for s in SIZES]


def test_collectives_that_disagree_say_each_error_and_warn(tmp_path: Path) -> None:
    """All-reduce, all-gather and all-to-all across two nodes whose tables alone fit 0.76,
    0.75 and 0.43: the level has one fraction (LinkEfficiency.bandwidth_fraction), so the
    joint fit prices all-reduce slow and all-to-all fast, and said nothing. Each run's error
    and fraction alone are said, and a warning names the spread; two that agree do not
    warn."""
    files = []
    for kind, fraction in (("all_reduce", 0.76), ("all_gather", 0.75), ("all_to_all", 0.43)):
        files.append(tmp_path / f"{kind}.txt")
        files[-1].write_text(_table(kind, 16, _priced(kind, fraction),
                                    hosts=("node0", "node1")))  # fmt: skip
    fit = fit_network(H100, files)
    alone = [run.bandwidth_fraction_alone for run in fit.runs]
    assert alone == pytest.approx([0.76, 0.75, 0.43], abs=2e-4)
    assert fit.bandwidth_fraction == pytest.approx(0.6618, abs=2e-4)
    # at the joint 0.6618 a table of 0.76 prices 0.76 / 0.6618 - 1 slow, one of 0.43 fast
    assert [run.error for run in fit.runs] == pytest.approx([0.1472, 0.1322, -0.3499], abs=5e-4)
    assert fit.notes[0].startswith("all_reduce x16 (all_reduce.txt): priced 1")
    assert fit.notes[-1].startswith("warning: the tables alone fit bandwidth_fraction 0.43 "
                                    "to 0.76")
    assert "alone they fit 0.43 to 0.76" in fit.source
    agree = fit_network(H100, files[:2])
    assert len(agree.notes) == 2 and not any("warning" in note for note in agree.notes)


def test_a_cross_node_all_to_all_too_fast_names_the_bandwidth_it_needs(tmp_path: Path) -> None:
    """An all-to-all of 16 ranks on two nodes at 180 GB/s of bus bandwidth sends half of each
    rank's buffer over its 50 GB/s NIC: 1.92 times what the NIC carries. The refusal said
    'at least the measured bus bandwidth' (180, a ratio of 3.6); it needs 96."""
    times = [30e-6 + s * bus_factor("all_to_all", 16) / 180e9 for s in SIZES]
    results = tmp_path / "alltoall_perf.txt"
    results.write_text(_table("all_to_all", 16, times, hosts=("node0", "node1")))
    with pytest.raises(InputError, match=r"1\.92 times faster than level infiniband's "
                                         r"bandwidth_gb_s 50 allows; expected a bandwidth_gb_s "
                                         r"of at least 96,"):
        fit_network(H100, [results])
