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
    (src/util.cu:756-760) and result lines (src/util.cu:457, 508)."""
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
        lines.append(f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}"
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
