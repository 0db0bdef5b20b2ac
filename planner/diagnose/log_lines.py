"""A training log's lines as its framework printed them: the launcher's prefix taken off each
line, the step lines read only when whole (a cut-off last line is no step), each marked where
its iterations were skipped or its loss was not a number, and a log of more than one run
refused.

- Megatron-LM's iteration line, ``training_log`` in NVIDIA/Megatron-LM@d98e8a64ddf3
  megatron/training/training.py:3567-3653: `` iteration N/M |``, then each field as
  `` name: value |`` (`` elapsed time per iteration (ms): X |`` at 3574-3576, `` global batch
  size: B |`` at 3598, `` number of skipped iterations: K |`` and `` number of nan
  iterations: J |`` at 3638-3641). An iteration is skipped when the optimizer found an inf or
  NaN gradient and did not step (megatron/core/optimizer/optimizer.py:820-822; training.py:3165,
  3224-3226: fp16's loss scaler backing off), and counted NaN when a skipped one's loss was
  inf or NaN (training.py:3296-3315); a loss that is not a number prints no loss field (3625)
  and ``grad norm: nan`` (3633). Its arguments dump, ``_print_args`` in
  megatron/training/arguments.py:1990-2001, prints ``--- arguments ---``, the arguments and
  ``--- end of arguments ---``, once a run.
- torchtitan's metrics line, ``MetricsProcessor.log`` at pytorch/torchtitan@73a0e69 (v0.2.2)
  torchtitan/components/metrics.py:461-470: ``step: N  loss: L  grad_norm: G  memory: ...
  tps: T  tflops: F  mfu: M%``, ANSI colours around each field, ``tps`` with thousands commas,
  ``loss: nan`` when it is not a number (``{:8.5f}``); its validation line (504-509) ends at
  ``tps`` and is no step. A run logs ``Starting job:`` (torchtitan/train.py:81), the device
  mesh (torchtitan/distributed/parallel_dims.py:131-135) and ``Building NAME FLAVORwith``
  (train.py:143-146) once.
- Prefixes: torchrun's ``--role rank --tee 3`` (torchtitan's run_train.sh:45) puts
  ``[rank0]:`` before each line of rank 0 (``LOG_RANK=0,1`` logs two ranks, run_train.sh:12),
  and ``srun -l`` puts the task number, ``0: ``; each prefix names a source, whose lines are
  read as one rank's.

>>> clean("0: [rank3]:\\x1b[31mstep:  1\\x1b[39m")
('0:[rank3]:', 'step:  1')
>>> [s.value for s in megatron_steps([" iteration 3/ 9 | elapsed time per iteration (ms): 1500.0 |",
...                                   " iteration 4/ 9 | elapsed time per iteration (ms): 15"])]
[1.5]
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from planner.errors import InputError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(r"\s*\d+: |\[[a-z]*\d+\]:")  # srun -l's "0: ", torchrun's "[rank0]:"
_MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEGATRON_MS = re.compile(r"\| elapsed time per iteration \(ms\):\s*([0-9.]+) \|")
_MEGATRON_BATCH = re.compile(r"\| global batch size:\s*(\d+) \|")
_MEGATRON_SKIPPED = re.compile(r"\| number of skipped iterations:\s*(\d+) \|")
_MEGATRON_NANS = re.compile(r"\| number of nan iterations:\s*(\d+) \|")
_MEGATRON_NOT_A_NUMBER = re.compile(r":\s*[-+]?(?:nan|inf)\s*\|", re.IGNORECASE)
_TITAN_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s(.*)\btps:\s*([0-9,]+)\s.*"
                         r"\bmfu:\s*(?:[0-9.]+%|N/A)")
_TITAN_MEMORY = re.compile(r"\bmemory:\s*([0-9.]+)GiB")
_TITAN_NOT_A_NUMBER = re.compile(r"\b(?:loss|grad_norm):\s*[-+]?(?:nan|inf)\b", re.IGNORECASE)
_DUMP_START = re.compile(r"-+ arguments -+")
_DUMP_END = re.compile(r"-+ end of arguments -+")
_ARG_LINE = re.compile(r"^\s*(\w+) \.+ (.*?)\s*$")
_TITAN_STARTS = {"Starting job:": "a 'Starting job' line",
                 "Building device mesh with parallelism:": "a device-mesh line",
                 "Building ": "a 'Building ... with {' line"}  # fmt: skip
TITAN_BUILD = re.compile(r"Building (\S+) (\S+?)\s*with (\{.*)$")
"""torchtitan's ``Building {name} {flavor}with {model args}`` (train.py:143-146 at 73a0e69):
its name, flavor and the model args as JSON."""
_TITAN_DEVICE = re.compile(r"\b[A-Z]+ capacity: (.+?) with [0-9.]+GiB memory")
_FRAMEWORKS = {"megatron": "Megatron-LM", "torchtitan": "torchtitan"}


def clean(line: str) -> tuple[str, str]:
    """The line's source (its launchers' prefixes, empty when none) and its text without them
    and without ANSI colours."""
    text, source = _ANSI.sub("", line), ""
    while m := _PREFIX.match(text):
        source, text = source + m.group(0).strip(), text[m.end():]
    return source, text


def texts(lines: list[str]) -> list[str]:
    """Each line's text, prefixes and colours taken off."""
    return [clean(line)[1] for line in lines]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLine:
    """One whole step line of a log."""

    line: int
    """Its line number in the log, from 1."""
    source: str
    """The prefix of the rank that printed it (:func:`clean`)."""
    step: int
    """The iteration (Megatron) or step (torchtitan) it reports, the last of its interval."""
    value: float
    """Seconds per iteration (Megatron) or tokens per second per device (torchtitan)."""
    global_batch: int | None = None
    """The global batch size it prints (Megatron)."""
    skipped: bool = False
    """Whether iterations of its interval were skipped (no optimizer step)."""
    nan: bool = False
    """Whether a loss or gradient norm of its interval was not a number."""
    reserved_gib: float | None = None
    """The most memory the caching allocator reserved over its interval, GiB (torchtitan's
    ``memory`` field: ``max_reserved_gib``, its peak reset after each line, metrics.py:465
    and 475 at 73a0e69); None where the line prints none (Megatron's)."""


def megatron_steps(lines: list[str]) -> list[StepLine]:
    """Megatron's whole iteration lines: each with its elapsed time field closed by ``|``."""
    steps = []
    for number, line in enumerate(lines, 1):
        source, text = clean(line)
        it, ms = _MEGATRON_ITER.search(text), _MEGATRON_MS.search(text)
        if it is None or ms is None:
            continue
        counts = [int(m.group(1)) if (m := r.search(text)) else 0
                  for r in (_MEGATRON_SKIPPED, _MEGATRON_NANS)]  # fmt: skip
        batch = _MEGATRON_BATCH.search(text)
        steps.append(StepLine(line=number, source=source, step=int(it.group(1)),
                              value=float(ms.group(1)) / 1000.0,
                              global_batch=int(batch.group(1)) if batch else None,
                              skipped=counts[0] > 0,
                              nan=counts[1] > 0 or bool(_MEGATRON_NOT_A_NUMBER.search(text))))
    return steps


def titan_steps(lines: list[str]) -> list[StepLine]:
    """torchtitan's whole metrics lines: each through its closing ``mfu`` field."""
    steps = []
    for number, line in enumerate(lines, 1):
        source, text = clean(line)
        if m := _TITAN_STEP.search(text):
            memory = _TITAN_MEMORY.search(m.group(2))
            steps.append(StepLine(line=number, source=source, step=int(m.group(1)),
                                  value=float(m.group(3).replace(",", "")),
                                  nan=bool(_TITAN_NOT_A_NUMBER.search(m.group(2))),
                                  reserved_gib=float(memory.group(1)) if memory else None))
    return steps


def one_source(steps: list[StepLine]) -> list[StepLine]:
    """The step lines of the first source that printed any (a log of several ranks holds each
    step once per rank)."""
    return [s for s in steps if s.source == steps[0].source] if steps else []


def megatron_arguments(lines: list[str]) -> dict[str, str]:
    """Megatron's ``arguments`` dump (the first one), name to printed value."""
    args: dict[str, str] = {}
    inside = False
    for text in texts(lines):
        text = text.strip()
        if _DUMP_START.fullmatch(text):
            inside = True
        elif inside and _DUMP_END.fullmatch(text):
            break
        elif inside and (m := _ARG_LINE.match(text)):
            args[m.group(1)] = m.group(2)
    return args


def titan_device(lines: list[str]) -> str | None:
    """The device torchtitan names, ``{DEVICE TYPE} capacity: {name} with {GiB}GiB memory``
    (``build_device_memory_monitor``, torchtitan/components/metrics.py:98-104 at 73a0e69; the
    name is ``torch.cuda.get_device_name``'s), or None.

    >>> titan_device(["[rank0]:... - INFO - CUDA capacity: NVIDIA H100 80GB HBM3 with 79.11GiB "
    ...               "memory"])
    'NVIDIA H100 80GB HBM3'
    """
    return next((m.group(1) for text in texts(lines) if (m := _TITAN_DEVICE.search(text))), None)


def _start_of_run(text: str) -> tuple[str, str] | None:
    """The framework and the line a run prints once, if ``text`` is one."""
    if _DUMP_START.fullmatch(text.strip()):
        return "megatron", "an arguments dump"
    for start, said in _TITAN_STARTS.items():
        if start in text and (start != "Building " or TITAN_BUILD.search(text)):
            return "torchtitan", said
    return None


def check_one_run(lines: list[str], *, where: str) -> None:
    """Refuse a log of more than one run (jobs appended to one file): a second arguments dump
    or torchtitan start-up line from one source, a framework other than the first run's, or a
    step that does not follow its source's last one; the error names where each run starts."""
    framework: str | None = None
    seen: set[tuple[str, str]] = set()
    last: dict[str, int] = {}
    starts: list[str] = []
    steps = {s.line: s for s in (*megatron_steps(lines), *titan_steps(lines))}
    for number, line in enumerate(lines, 1):
        source, text = clean(line)
        step, found = steps.get(number), _start_of_run(text)
        if step is not None and found is None:
            found = ("megatron" if _MEGATRON_MS.search(text) else "torchtitan", "")
        if found is None:
            continue
        kind, said = found
        if framework is None or kind != framework:
            why = said or "a step line"
        elif said and (source, said) in seen:
            why = said
        elif step is not None and step.step <= last.get(source, -1):
            why = f"step {step.step} after step {last[source]}"
        else:
            why = ""
        if why:
            starts.append(f"a {_FRAMEWORKS[kind]} run from line {number} ({why})")
            framework, seen, last = kind, set(), {}
        seen.add((source, said))
        if step is not None:
            last[source] = step.step
    if len(starts) > 1:
        counts = Counter(s.step for s in steps.values()).values()
        # every step printed as often: maybe one run's ranks, none of them prefixed
        ranks = (f"; or, each step printed {min(counts)} times, one run's ranks without a "
                 f"rank prefix: keep one rank's lines (torchrun --local-ranks-filter 0, as "
                 f"torchtitan's run_train.sh does with LOG_RANK)"
                 if len(set(counts)) == 1 and min(counts) > 1 else "")  # fmt: skip
        raise InputError(f"{where}: the log holds {len(starts)} runs, {', '.join(starts)}: "
                         f"split it into one log per run and read each{ranks}")  # fmt: skip
