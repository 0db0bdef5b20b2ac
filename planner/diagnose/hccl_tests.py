"""Reading Ascend hccl_test's stdout: the result table of all_reduce_test, all_gather_test,
reduce_scatter_test and alltoall_test.

Every layout rule cites ``hicann/oam-tools@ea0ce91e3a326ab6ae8a7c2caf88701343288f2b``, paths
under ``src/hccl_test/`` (``base`` is ``common/src/hccl_opbase_rootinfo_base``, ``common``
is ``common/src/hccl_test_common``, ``<op>.cc`` is ``opbase_test/hccl_<op>_rootinfo_test.cc``):

- the header is four names, ``"%-15s | %-12s | %-18s | %s"`` (base.cc:174, :197):
  ``data_size(Bytes):``, ``aveg_time(us):``, ``alg_bandwidth(GB/s):``, ``check_result:``
  (base.h:71-74; the tool's own example, docs/zh/hccl_test/execution.md:221, spells the
  second ``avg_time(us):``, and both are read);
- a row is ``"%-17llu | %-14.2f | %-20.5f | "`` then ``NULL`` when results were not checked
  (base.cc:177), else ``failed`` or ``success`` (base.cc:203, :205): data_size in bytes, the
  mean microseconds of one call, the algorithm bandwidth; a rank other than the root whose
  check failed prints ``local rank_id N, check result failed, `` and the same row
  (base.cc:187). Only the root rank prints the table; above it, the root prints ``the minbytes
  is ..., maxbytes is ..., iters is ..., warmup_iters is ...`` (common.cc:913);
- nothing printed names the collective, the data type, the rank count or the hosts: the
  collective is known from the binary's name (Makefile:37 lists them), which the file's name
  must hold, and the rank count (MPI's world size, common.cc:719) and the nodes are the
  caller's to give;
- alg_bandwidth is the collective's buffer over the time, times ``B_US_TO_GB_S = 1e6 / 1e9``
  (base.h:27): decimal GB/s, as nccl-tests' algbw. The buffer is the ``nbytes``
  :func:`planner.cost.collective_time_s` takes, derived from data_size per collective below.

data_size is the size asked for, not always the size sent. It becomes ``count = ceil(data_size
/ e)`` elements of ``e`` bytes (base.cc:46-97), and then, with ``n`` ranks:

- all-reduce sends and receives ``count e`` bytes (allreduce.cc:121-129) and
  divides that by the time (allreduce.cc:115): nbytes is ``count e``;
- all-gather gives each rank ``ceil(count / n)`` elements (allgather.cc:131-134), sends that
  and receives ``n`` times it (allgather.cc:138-139), bandwidth over the received
  (allgather.cc:125): nbytes, the output, is ``n e ceil(count / n)``;
- reduce-scatter gives each rank the same ``ceil(count / n)`` (reducescatter.cc:120-123),
  sends ``n`` times it and receives it (reducescatter.cc:128-129), bandwidth over the sent
  (reducescatter.cc:114): nbytes, the input, is ``n e ceil(count / n)``;
- all-to-all rounds count up to a multiple of ``n 128`` (``granularity``, common.h:192) when
  count is at least that or zero copy is on, else of ``n`` (alltoall.cc:113-117), sends and
  receives that buffer (alltoall.cc:120-124), bandwidth over it (alltoall.cc:103): nbytes is
  that one rank's buffer.

So for all-gather and reduce-scatter data_size is the whole output or input, not one NPU's
share (the tool's docs, docs/zh/hccl_test/execution.md:240, call it one NPU's data; the
source above is what the reader follows). Neither ``e`` (``-d``, fp32 by default, common.h:200)
nor zero copy is printed: the reader takes the buffer, among the element sizes and alignments
the tool can use, nearest alg_bandwidth x aveg_time (the tool's own ratio undone), and fp32's
when alg_bandwidth prints as zero. The candidates differ only when data_size is not a multiple
of ``n e`` (``n 128 e``), which the tool's size alignment for these collectives makes rare
(common.cc:357-383).

The bus bandwidth of a row is not printed: it is computed as nccl-tests defines it,
alg_bandwidth times :func:`~planner.diagnose.nccl_tests.bus_factor`, so that the report's
busbw column means the same for both tools.
"""

from __future__ import annotations

import math
import re
from itertools import pairwise
from pathlib import Path

from planner.diagnose.nccl_tests import NcclRow, NcclRun, bus_factor, table_number
from planner.errors import InputError
from planner.spec.reading import read_text
from planner.vocabulary import CollectiveKind

TESTS: dict[str, CollectiveKind] = {
    "all_reduce_test": "all_reduce",
    "all_gather_test": "all_gather",
    "reduce_scatter_test": "reduce_scatter",
    "alltoall_test": "all_to_all",
}
"""The hccl_test binaries read, and the collective each times."""

ELEMENT_BYTES = (1, 2, 4, 8)
"""The element sizes ``-d`` can choose (base.cc:46-97)."""
DEFAULT_ELEMENT_BYTES = 4
"""fp32, the tool's default data type (common.h:200)."""
ALLTOALL_GRANULARITY = 128
"""Elements per rank all-to-all aligns a large buffer to (common.h:192)."""

_HEADER = re.compile(r"^\s*data_size\(Bytes\):\s*\|\s*a\w*_time\(us\):\s*\|"
                     r"\s*alg_bandwidth\(GB/s\):\s*\|\s*check_result:")
_ROW = re.compile(r"^\s*(\d+)\s*\|\s*(\S+)\s*\|\s*(\S+)\s*\|\s*(\S+)\s*$")
_RANK_FAILED = re.compile(r"local rank_id\s+(\d+), check result failed,\s*(\d+)")


def is_hccl_tests_output(text: str) -> bool:
    """Whether ``text`` holds hccl_test's table header (``data_size(Bytes): | ...``)."""
    return any(_HEADER.match(line) for line in text.splitlines())


def buffer_candidates(kind: CollectiveKind, data_size: int, ranks: int) -> tuple[int, ...]:
    """The bytes hccl_test moves for one ``data_size`` row, one per element size (and, for
    all-to-all, per alignment) it may have run with; fp32's first.

    >>> buffer_candidates("all_gather", 8, 8)[0], buffer_candidates("all_reduce", 1001, 8)[0]
    (32, 1004)
    """
    out: list[int] = []
    for e in (DEFAULT_ELEMENT_BYTES, *(b for b in ELEMENT_BYTES if b != DEFAULT_ELEMENT_BYTES)):
        count = -(-data_size // e)
        if kind == "all_reduce":
            out.append(count * e)
        elif kind in ("all_gather", "reduce_scatter"):
            out.append(ranks * e * -(-count // ranks))
        else:
            large = ranks * ALLTOALL_GRANULARITY
            aligns = (large,) if count >= large else (ranks, large)  # the second: zero copy
            out += [e * align * -(-count // align) for align in aligns]
    return tuple(out)


def _nbytes(kind: CollectiveKind, data_size: int, ranks: int, time_us: float,
            algbw_gb_s: float) -> int:
    """The candidate buffer nearest the one alg_bandwidth x aveg_time implies (fp32's when
    the bandwidth printed as zero)."""
    candidates = buffer_candidates(kind, data_size, ranks)
    implied = algbw_gb_s * 1e9 * time_us * 1e-6
    if implied <= 0:
        return candidates[0]
    return min(candidates, key=lambda c: abs(math.log(c / implied)))  # first wins a tie


def _kind(path: Path) -> CollectiveKind:
    """The collective, from the binary's name in the file's name."""
    for binary, kind in TESTS.items():
        if binary in path.name:
            return kind
    raise InputError(f"{path}: hccl_test does not print its collective; expected a file name "
                     f"holding the binary's ({', '.join(TESTS)})")


def _row(path: Path, match: re.Match[str], kind: CollectiveKind, ranks: int) -> NcclRow:
    data_size = int(match.group(1))
    time_us = table_number(path, match.group(2), "aveg_time")
    algbw = table_number(path, match.group(3), "alg_bandwidth")
    check = match.group(4)
    if check == "failed":
        raise InputError(f"{path}: data_size {data_size} has check_result failed; expected "
                         f"success or NULL (a run with wrong results times nothing worth "
                         f"fitting)")
    if check not in ("success", "NULL"):
        raise InputError(f"{path}: data_size {data_size} has check_result {check!r}; expected "
                         f"success, failed or NULL")
    if time_us <= 0:
        raise InputError(f"{path}: data_size {data_size} has aveg_time {time_us:g} us; "
                         f"expected > 0")
    nbytes = _nbytes(kind, data_size, ranks, time_us, algbw)
    return NcclRow(size_bytes=nbytes, time_s=time_us * 1e-6, algbw_gb_s=algbw,
                   busbw_gb_s=algbw * bus_factor(kind, ranks))


def _check_counts(path: Path, ranks: int | None, nodes: int | None) -> tuple[int, int]:
    """The rank count and nodes the caller gave, checked: hccl_test prints neither."""
    if ranks is None:
        raise InputError(f"{path}: hccl_test does not print its rank count; expected --ranks N "
                         f"(mpirun's -n)")
    if ranks < 2:
        raise InputError(f"{path}: expected at least 2 ranks, got --ranks {ranks}")
    if nodes is not None and not (1 <= nodes <= ranks and ranks % nodes == 0):
        raise InputError(f"{path}: expected --nodes to divide --ranks {ranks} into whole "
                         f"nodes, got --nodes {nodes}")
    return ranks, nodes or 0


def read_hccl_tests(path: str | Path, *, ranks: int | None, nodes: int | None = None
                    ) -> NcclRun:
    """Read one hccl_test output file run on ``ranks`` ranks over ``nodes`` nodes (None: the
    ranks fill whole nodes), its sizes as the buffers the cost model prices.

    A ``failed`` check on any rank, sizes not increasing, or no table is refused; so is a
    missing ``ranks``, which the output does not state."""
    path = Path(path)
    lines = read_text(path).splitlines()
    kind = _kind(path)
    ranks, known_nodes = _check_counts(path, ranks, nodes)
    for line in lines:
        if m := _RANK_FAILED.search(line):
            raise InputError(f"{path}: rank {m.group(1)}'s check of data_size {m.group(2)} "
                             f"failed; expected every rank's results right")
    start = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    matches = [m for line in lines[start or 0:] if (m := _ROW.match(line))]
    if start is None or not matches:
        raise InputError(f"{path}: expected an hccl_test result table (a 'data_size(Bytes): | "
                         f"aveg_time(us): | alg_bandwidth(GB/s): | check_result:' header, then "
                         f"rows of size | time | bandwidth | check)")
    sizes = [int(m.group(1)) for m in matches]
    if any(b <= a for a, b in pairwise(sizes)):
        raise InputError(f"{path}: expected data sizes in increasing order, got "
                         f"{', '.join(map(str, sizes))}")
    rows = tuple(_row(path, m, kind, ranks) for m in matches)
    return NcclRun(path=str(path), kind=kind, ranks=ranks, hosts=(), nodes=known_nodes,
                   tool="hccl_test", rows=rows)
