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
- ``# nThread %d nGpus %d ...`` (src/util.cu:625) gives one process's ranks: a run has
  ``nProcs x nThreads x nGpus`` (src/common.cu:796), MPI's processes included, and one
  ``#  Rank %2d Group %2d Pid %6d on %10s device %2d ...`` line per rank of every process
  (src/util.cu:687) says how many ranks ran and where;
- ``# Collective test starting: %s`` (src/util.cu:624) names the test binary;
- busbw is algbw times the test's factor of the rank count n, its ``getBw`` function's
  ``factor`` (:data:`BUS_FACTORS`), and the redop column is the reduction's name (``sum``
  unless ``-o`` says otherwise, src/common.cu:57) for the tests that reduce, ``none`` for the
  others: a table whose busbw/algbw or redop is another test's is refused, as is a file of
  several tables.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
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

BUS_FACTORS: dict[str, tuple[int, bool]] = {
    "all_reduce_perf": (2, True),  # src/all_reduce.cu:63 (factor), :574 (redop)
    "reduce_scatter_perf": (1, True),  # src/reduce_scatter.cu:41, :98
    "all_gather_perf": (1, False),  # src/all_gather.cu:42, :87
    "alltoall_perf": (1, False),  # src/alltoall.cu:52, :393
    "gather_perf": (1, False),  # src/gather.cu:42, :117
    "scatter_perf": (1, False),  # src/scatter.cu:38, :113
    "broadcast_perf": (0, False),  # src/broadcast.cu:38, :103
    "reduce_perf": (0, True),  # src/reduce.cu:39, :104
    "sendrecv_perf": (0, True),  # src/sendrecv.cu:42, :120
}
"""Every nccl-tests binary's busbw / algbw, ``scale (n-1)/n`` of n ranks by its scale (0: 1
whatever n), and whether it reduces (a reduction's name in the redop column, else ``none``)."""
_FORMULAS = {2: "2(n-1)/n", 1: "(n-1)/n", 0: "1"}

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
    binary = next(b for b, k in TESTS.items() if k == kind)
    return _factor(BUS_FACTORS[binary][0], ranks)


def _factor(scale: int, ranks: int) -> float:
    """``scale (n-1)/n`` of ``ranks``, or 1 for scale 0 (:data:`BUS_FACTORS`)."""
    return scale * (ranks - 1) / ranks if scale else 1.0


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


def _ratio_bounds(path: Path, matches: list[re.Match[str]]) -> tuple[float, float, float]:
    """busbw / algbw as every row prints them, each number known to half its last digit
    (``getFloatStr``, src/util.cu:487): the bounds all rows agree on, and the ratio of the
    row with the largest algbw (nan: every algbw prints as zero)."""
    low, high, shown, largest = 0.0, math.inf, math.nan, 0.0
    for m in matches:
        algbw, busbw = float(m.group(7)), float(m.group(8))
        if not (math.isfinite(algbw) and math.isfinite(busbw)):
            continue
        d_alg, d_bus = _half_digit(m.group(7)), _half_digit(m.group(8))
        if algbw - d_alg <= 0:
            continue
        low = max(low, (busbw - d_bus) / (algbw + d_alg) * (1 - 1e-9))
        high = min(high, (busbw + d_bus) / (algbw - d_alg) * (1 + 1e-9))
        if algbw > largest:
            shown, largest = busbw / algbw, algbw
    if low > high:
        raise InputError(f"{path}: busbw/algbw differs between sizes ({low:.4f} above "
                         f"{high:.4f}); expected one test's table, one table per file")
    return low, high, shown


def _half_digit(text: str) -> float:
    """Half the unit of a printed number's last digit: ``115.37`` is 115.365 to 115.375."""
    exponent = Decimal(text).as_tuple().exponent
    return 0.5 * 10.0 ** exponent if isinstance(exponent, int) else 0.0


def _rank_counts(scale: int, low: float, high: float, per_process: int) -> tuple[int, float]:
    """The first and last rank count n >= 2, a multiple of ``per_process``, whose factor
    ``scale (n-1)/n`` lies in ``[low, high]`` (last: inf when unbounded; first > last: none).

    >>> _rank_counts(2, 1.749, 1.751, 1), _rank_counts(1, 0.8, 0.9, 2), _rank_counts(1, 1, 2, 1)
    ((8, 8), (6, 10), (2, 1))
    """
    if scale == 0:
        return (per_process if per_process > 1 else 2, math.inf) if low <= 1 <= high else (2, 1)
    if low >= scale:
        return 2, 1
    first = max(2, math.ceil(scale / (scale - low) - 1e-9))
    last = math.inf if high >= scale else math.floor(scale / (scale - high) + 1e-9)
    first = -(-first // per_process) * per_process
    last = last if math.isinf(last) else last // per_process * per_process
    return first, last


def _said(path: Path, binary: str, *, bounds: tuple[float, float, float], redop: str,
          ranks: int | None, per_process: int) -> InputError:
    """The refusal of a table that is not ``binary``'s, naming the tests its busbw/algbw (of
    ``ranks``, when the rank lines gave them) and redop say it is."""
    low, high, shown = bounds
    said: dict[str, int | None] = {}
    for name, (scale, reduces) in BUS_FACTORS.items():
        if reduces != (redop != "none"):
            continue
        if ranks is not None:
            if low <= _factor(scale, ranks) <= high:
                said[name] = ranks
            continue
        first, last = _rank_counts(scale, low, high, per_process)
        if first <= last:
            said[name] = first if first == last else None
    counts = set(said.values())
    if len(counts) == 1 and (n := counts.pop()):
        names = f"{_either(list(said))} of {n} ranks"
    else:
        names = _either([f"{name}{f' of {n} ranks' if n else ''}" for name, n in said.items()])
    ratio = f"busbw/algbw {shown:.4g}" if math.isfinite(shown) else "algbw 0 at every size"
    scale, reduces = BUS_FACTORS[binary]
    own = f"{_FORMULAS[scale]}, redop {'sum or another reduction' if reduces else 'none'}"
    return InputError(
        f"{path}: read as {binary}, but its {ratio} and redop {redop} say "
        f"{names or 'no nccl-tests test'}{f' of {ranks} ranks' if ranks and not said else ''} "
        f"({binary}'s: {own}); expected each test's output in a file named after it")


def _either(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))


def _ranks(path: Path, lines: list[str], kind: CollectiveKind,
           matches: list[re.Match[str]]) -> tuple[int, tuple[str, ...]]:
    """Ranks and hosts from the rank lines, else from the busbw/algbw ratio, the test's
    :func:`bus_factor` of the rank count; either way the ratio and the redop must be the
    declared test's."""
    binary = next(b for b, k in TESTS.items() if k == kind)
    scale, reduces = BUS_FACTORS[binary]
    bounds = _ratio_bounds(path, matches)
    redop = matches[0].group(4)
    threads = next((m for line in lines if (m := _THREADS.match(line))), None)
    per_process = int(threads.group(1)) * int(threads.group(2)) if threads else 1
    hosts = {int(m.group(1)): m.group(4) for line in lines if (m := _RANK.match(line))}
    if hosts:
        if len(hosts) < 2:
            raise InputError(f"{path}: expected at least 2 ranks, got {len(hosts)}")
        low, high, _ = bounds
        if reduces != (redop != "none") or not low <= _factor(scale, len(hosts)) <= high:
            raise _said(path, binary, bounds=bounds, redop=redop, ranks=len(hosts),
                        per_process=per_process)
        return len(hosts), tuple(dict.fromkeys(hosts[r] for r in sorted(hosts)))
    if scale and bounds[0] == 0 and bounds[1] < scale / 2:
        raise InputError(f"{path}: expected at least 2 ranks, got 1 (busbw 0 at every size)")
    first, last = _rank_counts(scale, bounds[0], bounds[1], per_process)
    if reduces != (redop != "none") or first > last:
        raise _said(path, binary, bounds=bounds, redop=redop, ranks=None,
                    per_process=per_process)
    if first < last:
        counts = f"{first} to {last:g}" if math.isfinite(last) else f"{first} or more"
        raise InputError(f"{path}: the '#  Rank ... device' lines are missing (nccl-tests "
                         f"prints one a rank) and busbw/algbw fits {binary} of {counts} "
                         f"ranks; expected the file with its rank lines")
    return first, ()


def _sizes_in_order(path: Path, lines: list[str], sizes: list[int]) -> None:
    """Sizes increase down one table; a file of two runs (two ``# nThread`` lines) or of
    several tables (``-d all``, ``-o all``) starts again."""
    pair = next(((a, b) for a, b in pairwise(sizes) if b <= a), None)
    if pair is None:
        return
    runs = sum(1 for line in lines if _THREADS.match(line))
    more = f"holds {runs} runs ({runs} '# nThread' lines): " if runs > 1 else ""
    raise InputError(f"{path}: {more}size {pair[1]} follows size {pair[0]}; expected sizes in "
                     f"increasing order, one table per file")


def read_nccl_tests(path: str | Path) -> NcclRun:
    """Read one nccl-tests output file: its out-of-place results, ranks and hosts.

    Out of place, because that is how training calls the collectives (gradients reduced into
    a separate buffer, gathered weights into a new one); in place can skip a copy and time
    faster. A row with ``#wrong`` above 0, sizes not increasing, no table, or a table of
    another test than the file's (by busbw/algbw and redop) is refused."""
    path = Path(path)
    lines = read_text(path).splitlines()
    kind = _kind(path, lines)
    matches = [m for line in lines
               if not line.lstrip().startswith("#") and (m := _RESULT.match(line))]  # fmt: skip
    rows = tuple(_row(path, m) for m in matches)
    if not rows:
        raise InputError(f"{path}: expected an nccl-tests result table (lines of size, count, "
                         f"type, redop, root, time, algbw, busbw, #wrong)")
    _sizes_in_order(path, lines, [r.size_bytes for r in rows])
    ranks, hosts = _ranks(path, lines, kind, matches)
    return NcclRun(path=str(path), kind=kind, ranks=ranks, hosts=hosts, nodes=len(hosts),
                   tool="nccl-tests", rows=rows)


def is_nccl_tests_output(text: str) -> bool:
    """Whether ``text`` looks like nccl-tests' stdout: a ``#`` comment line (its preamble and
    header) or a result line."""
    return any(line.startswith("#") or _RESULT.match(line)
               for line in (raw.lstrip() for raw in text.splitlines()))
