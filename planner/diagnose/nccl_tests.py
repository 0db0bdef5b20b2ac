"""Reading nccl-tests' stdout: the result table, the ranks and their hosts.

Every layout rule cites ``NVIDIA/nccl-tests@a0b82b2260cf5152b9f8c061bbf7eaf0ba096432``:

- a result line is the preamble ``"%12li  %12li  %8s  %6s  %6s"`` (size in bytes, count,
  type, redop, root; src/util.cu:457), then the out-of-place body and the in-place body, each
  ``"  %7s  %6s  %6s  %6g"`` (time in us, algbw and busbw in GB/s, #wrong; src/util.cu:508),
  or ``N/A`` for #wrong when results were not checked (src/util.cu:510); the header above the
  table (src/util.cu:756-760) names the columns in that order;
- the size column is ``max(sendBytes, expectedBytes)`` (src/common.cu:938): the all-reduced
  buffer, the all-gather's output, the reduce-scatter's input, one rank's all-to-all buffer,
  which is the ``nbytes`` :func:`planner.cost.collective_time_s` takes;
- ``# nThread %d nGpus %d ...`` (src/util.cu:625) and one ``#  Rank %2d Group %2d Pid %6d on
  %10s device %2d ...`` line per rank (src/util.cu:687) say how many ranks ran and where;
- ``# Collective test starting: %s`` (src/util.cu:624) names the test binary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from planner.errors import InputError
from planner.spec.reading import read_text
from planner.vocabulary import CollectiveKind

TESTS: dict[str, CollectiveKind] = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all",
}
"""The nccl-tests binaries read, and the collective each times."""

_RESULT = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)"  # size, count, type, redop, root
    r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)"  # out-of-place: time, algbw, busbw, #wrong
    r"(?:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+))?"  # in-place, the same four
)
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+(-?\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device")
_THREADS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclRow:
    """One message size of a result table, out of place."""

    size_bytes: int
    """The size column: the buffer :func:`planner.cost.collective_time_s` calls ``nbytes``."""
    time_s: float
    """Measured seconds per collective (the table's microseconds)."""
    algbw_gb_s: float
    """The table's algorithm bandwidth, size over time, GB/s."""
    busbw_gb_s: float
    """The table's bus bandwidth, GB/s."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclRun:
    """One collective test's output file (nccl-tests, or Ascend's hccl_test)."""

    path: str
    """The file read."""
    kind: CollectiveKind
    """The collective timed."""
    ranks: int
    """Ranks in the communicator."""
    hosts: tuple[str, ...]
    """The distinct hosts the ranks ran on, in order of first rank (empty: not printed)."""
    nodes: int
    """How many nodes the ranks ran on (0: not known; the ranks then fill whole nodes)."""
    tool: str
    """The tool that printed the file: ``nccl-tests`` or ``hccl_test``."""
    rows: tuple[NcclRow, ...]
    """The table, smallest size first."""


def bus_factor(kind: CollectiveKind, ranks: int) -> float:
    """busbw / algbw as nccl-tests defines it (NVIDIA/nccl-tests@a0b82b2
    doc/PERFORMANCE.md:138-143: 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
    reduce-scatter and all-to-all; src/all_reduce.cu:63, src/all_gather.cu:42,
    src/alltoall.cu:52).

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 4)
    (1.75, 0.75)
    """
    return (2.0 if kind == "all_reduce" else 1.0) * (ranks - 1) / ranks


def _kind(path: Path, lines: list[str]) -> CollectiveKind:
    """The collective, from the ``starting`` line or else from the file's name."""
    names = [m.group(1) for line in lines if (m := _STARTING.match(line))]
    for name in [*(Path(n).name for n in names), path.name]:
        for binary, kind in TESTS.items():
            if name.startswith(binary):
                return kind
    raise InputError(f"{path}: expected nccl-tests output of {', '.join(TESTS)} (a "
                     f"'# Collective test starting:' line or a file named after the test)")


def table_number(path: Path, text: str, what: str) -> float:
    """A number of a test's result table; anything else is an InputError naming the file and
    the column."""
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{path}: expected a number for {what}, got {text!r}") from None


def _row(path: Path, match: re.Match[str]) -> NcclRow:
    size = int(match.group(1))
    time_us, algbw, busbw = (table_number(path, match.group(i), name) for i, name in
                             ((6, "time"), (7, "algbw"), (8, "busbw")))  # fmt: skip
    wrong = match.group(9)
    if wrong != "N/A" and table_number(path, wrong, "#wrong") != 0:
        raise InputError(f"{path}: size {size} has #wrong {wrong}; expected 0 (a run with wrong "
                         f"results times nothing worth fitting)")
    if time_us <= 0:
        raise InputError(f"{path}: size {size} has time {time_us:g} us; expected > 0")
    return NcclRow(size_bytes=size, time_s=time_us * 1e-6, algbw_gb_s=algbw, busbw_gb_s=busbw)


def _ranks(path: Path, lines: list[str], kind: CollectiveKind,
           rows: tuple[NcclRow, ...]) -> tuple[int, tuple[str, ...]]:
    """Ranks and hosts from the rank lines, else ``nThread x nGpus`` (one process), else the
    busbw/algbw ratio, which is :func:`bus_factor` of the rank count."""
    hosts = {int(m.group(1)): m.group(4) for line in lines if (m := _RANK.match(line))}
    if hosts:
        return len(hosts), tuple(dict.fromkeys(hosts[r] for r in sorted(hosts)))
    threads = next((m for line in lines if (m := _THREADS.match(line))), None)
    if threads is not None:
        return int(threads.group(1)) * int(threads.group(2)), ()
    largest = rows[-1]
    ratio = largest.busbw_gb_s / largest.algbw_gb_s if largest.algbw_gb_s > 0 else 0.0
    per_rank = 1 - ratio / (2 if kind == "all_reduce" else 1)  # 1/n
    if not 0 < per_rank <= 0.5:
        raise InputError(f"{path}: expected '#  Rank' lines or a '# nThread' line to count the "
                         f"ranks (busbw/algbw {ratio:.3f} fits no rank count)")
    return round(1 / per_rank), ()


def read_nccl_tests(path: str | Path) -> NcclRun:
    """Read one nccl-tests output file: its out-of-place results, ranks and hosts.

    Out of place, because that is how training calls the collectives (gradients reduced into
    a separate buffer, gathered weights into a new one); in place can skip a copy and time
    faster. A row with ``#wrong`` above 0, sizes not increasing, or no table is refused."""
    path = Path(path)
    lines = read_text(path).splitlines()
    kind = _kind(path, lines)
    rows = tuple(_row(path, m) for line in lines
                 if not line.lstrip().startswith("#") and (m := _RESULT.match(line)))  # fmt: skip
    if not rows:
        raise InputError(f"{path}: expected an nccl-tests result table (lines of size, count, "
                         f"type, redop, root, time, algbw, busbw, #wrong)")
    sizes = [r.size_bytes for r in rows]
    if any(b <= a for a, b in pairwise(sizes)):
        raise InputError(f"{path}: expected message sizes in increasing order, got "
                         f"{', '.join(map(str, sizes))}")
    ranks, hosts = _ranks(path, lines, kind, rows)
    if ranks < 2:
        raise InputError(f"{path}: expected at least 2 ranks, got {ranks}")
    return NcclRun(path=str(path), kind=kind, ranks=ranks, hosts=hosts, nodes=len(hosts),
                   tool="nccl-tests", rows=rows)


def is_nccl_tests_output(text: str) -> bool:
    """Whether ``text`` looks like nccl-tests' stdout: a ``#`` comment line (its preamble and
    header) or a result line."""
    return any(line.startswith("#") or _RESULT.match(line)
               for line in (raw.lstrip() for raw in text.splitlines()))
