"""Hypothesis strategies for malformed inputs, and the property every reader must keep: a
malformed file gives a :class:`~planner.errors.PlannerError`, never another exception.

Shared by ``tests/test_fuzz_inputs.py`` (150 cases a reader in CI) and
``benchmarks/fuzz_inputs.py`` (thousands). Every input starts from a real file (the bundled
models and clusters, the Hugging Face configs in ``shared/reference/hf``, two plans the
planner wrote, the published calibration runs) and is damaged: a value anywhere in it
replaced by a wrong type, a huge, negative or zero number, NaN or an infinity; a key deleted
or added; a number scaled; then the JSON text truncated, spliced with random bytes, or
replaced by binary, deep nesting or an integer too long to read. Mild damage (a layer count
doubled) leaves a valid input, which then goes one cheap step further downstream (parameter
counts and FLOPs, one uniform estimate, the schedule simulator, an export) so that what the
readers accept is also safe to use.
"""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from hypothesis import strategies as st

from planner.diagnose.calibration import BUNDLED_CLUSTERS, validation_rows
from planner.diagnose.info import model_info
from planner.diagnose.runs import load_runs
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS, launch
from planner.plan.config import ParallelConfig
from planner.plan.files import plan_from_json
from planner.simulate.events import simulate_plan
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.limits import MAX_GLOBAL_BATCH_SIZE
from planner.spec.reading import load_cluster, load_model, read_text
from planner.uniform.estimate import estimate

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"  # CI clones the repository with shared/ beside it
MODELS = REPO / "instances" / "models"
CLUSTERS = REPO / "instances" / "clusters"
HF = SHARED / "reference" / "hf"
PLANS = (REPO / "tests" / "fuzz_plan_ilp.json", REPO / "tests" / "fuzz_plan_uniform.json")
"""An ILP plan (GPT 1.7B on one DGX A100, operator shardings) and a uniform one (four
interleaved stages, sequence parallel, selective recompute, distributed optimizer), both
written by the planner."""
CALIBRATION_RUNS = SHARED / "validation" / "calibration_runs.json"
FSDP_RUNS = SHARED / "validation" / "fsdp_runs.json"
"""MPT's runs: records with a ``software`` block, read by its own rules."""

Outcome = Literal["accepted", "planner_error"]
"""What a property saw: the input was read (and used), or refused with a PlannerError."""

Json = Any


# --------------------------------------------------------------------------- the real inputs


@cache
def _documents(kind: str) -> tuple[Json, ...]:
    """The real files of one kind, parsed."""
    paths = {
        "model": sorted(MODELS.glob("*.json")),
        "hf": sorted(HF.glob("*.json")),
        "cluster": sorted(CLUSTERS.glob("*.json")),
        "plan": list(PLANS),
        "runs": [CALIBRATION_RUNS, *([FSDP_RUNS] if FSDP_RUNS.exists() else [])],
    }[kind]
    return tuple(json.loads(path.read_text()) for path in paths)


@cache
def small_model() -> ModelSpec:
    """The fixed model a damaged cluster is tried with (GPT 1.7B)."""
    return load_model(MODELS / "gpt-1.7b.json")


@cache
def small_cluster() -> ClusterSpec:
    """The fixed cluster a damaged model is tried on (one DGX A100)."""
    return load_cluster(CLUSTERS / "dgx-a100-80gb.json", nodes=1)


# --------------------------------------------------------------------------- damaged values

_SPECIAL_NUMBERS = (0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 10**4000, 1e308, -1e308, 5e-324,
                    0.5, -0.0, float("nan"), float("inf"), float("-inf"))  # fmt: skip
"""Numbers that break arithmetic: zero, negatives, past 32/64 bits, past float, NaN."""
_SPECIAL_TEXT = ("", " ", "a\nb", "\x00", "bf16", "llama", "1f1b", "96", "1e3", "NaN", "é" * 3)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(_SPECIAL_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(_SPECIAL_TEXT),
)
"""A JSON scalar of any type, biased to the values that break arithmetic."""

values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6,
)  # fmt: skip
"""Any JSON value, nested garbage included."""

Path_ = tuple[str | int, ...]


def _paths(doc: Json, here: Path_ = ()) -> list[Path_]:
    """Every location in ``doc``, the root included."""
    out = [here]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*here, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += _paths(value, (*here, index))
    return out


def _get(doc: Json, path: Path_) -> Json:
    for step in path:
        doc = doc[step]
    return doc


def _set(doc: Json, path: Path_, value: Json) -> Json:
    """``doc`` with the value at ``path`` replaced (the root too)."""
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def _delete(doc: Json, path: Path_) -> Json:
    if path:
        del _get(doc, path[:-1])[path[-1]]
    return doc


def _scaled(value: Json, factor: Json) -> Json:
    """A number moved to a nearby or absurd value, or written as text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if factor == "text":
        return str(value)
    if factor == "half":
        return value + 0.5
    return value * factor


@st.composite
def damaged(draw: st.DrawFn, kind: str) -> Json:
    """A real document of ``kind`` with one to three damages anywhere in it."""
    doc = copy.deepcopy(draw(st.sampled_from(_documents(kind))))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        op = draw(st.sampled_from(["replace", "delete", "extra", "scale", "scale", "scale"]))
        target = _get(doc, path)
        if op == "replace":
            doc = _set(doc, path, draw(values))
        elif op == "delete":
            doc = _delete(doc, path)
        elif op == "extra" and isinstance(target, dict):
            target[draw(st.text(max_size=8))] = draw(values)
        elif op == "scale":
            factor = draw(st.sampled_from([2, 4, 16, 1024, 10**6, 10**30, 0, -1, "half", "text"]))
            doc = _set(doc, path, _scaled(target, factor))
    return doc


@st.composite
def damaged_text(draw: st.DrawFn, kind: str) -> bytes:
    """A damaged document of ``kind`` as a file's bytes, the text itself damaged at times."""
    # NaN and infinities as Python's json writes (and reads) them; integers stay below the
    # 4,300 digits str() refuses, so the "long int" case below is the only one past it.
    text = json.dumps(draw(damaged(kind)), allow_nan=True)
    how = draw(st.sampled_from(["as is"] * 6 + ["truncate", "splice", "binary", "nest",
                                                 "long int", "bom", "empty"]))  # fmt: skip
    data = text.encode()
    if how == "truncate":
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    elif how == "splice":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    elif how == "binary":
        data = draw(st.binary(max_size=64))
    elif how == "nest":
        depth = draw(st.sampled_from([10, 1000, 100_000]))
        data = b"[" * depth + b"]" * depth
    elif how == "long int":
        data = b'{"num_layers": ' + b"9" * 5000 + b"}"
    elif how == "bom":
        data = b"\xef\xbb\xbf" + data
    elif how == "empty":
        data = b""
    return data


# --------------------------------------------------------------------------- the properties


def _with_file(data: bytes, use: Callable[[Path], None]) -> None:
    """Run ``use`` on a temporary file holding ``data``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.json"
        path.write_bytes(data)
        use(path)


def _model_downstream(path: Path) -> None:
    model = load_model(path)
    model_info(model)
    estimate(model, small_cluster(), ParallelConfig(global_batch=8, seq_len=512))


def _cluster_downstream(path: Path) -> None:
    cluster = load_cluster(path)
    # One sequence per device: data parallelism over the whole cluster divides the batch.
    batch = min(cluster.num_devices, MAX_GLOBAL_BATCH_SIZE)
    estimate(small_model(), cluster, ParallelConfig(global_batch=batch, seq_len=512))


def _plan_downstream(path: Path) -> None:
    plan = plan_from_json(read_text(path), source=str(path))
    plan.summary()
    simulate_plan(plan)
    for fmt in FRAMEWORKS:
        # A damaged plan may no longer be one a framework launches: a PlannerError says so.
        with contextlib.suppress(PlannerError):
            launch(plan, fmt, model=small_model(), cluster=small_cluster())


@cache
def _calibration_clusters() -> dict[str, ClusterSpec]:
    return {gpu: load_cluster(CLUSTERS / name) for gpu, name in BUNDLED_CLUSTERS.items()}


def _runs_downstream(path: Path) -> None:
    validation_rows(load_runs(path), _calibration_clusters())


@dataclass(frozen=True, slots=True)
class Property:
    """One reader's property: which documents are damaged, and what is done with them."""

    name: str
    kind: str
    use: Callable[[Path], None]
    shared: Path | None = None
    """The folder or file of ../shared the documents come from (None: the repository's)."""

    def check(self, data: bytes) -> Outcome:
        """Read (and use) ``data``; "accepted" or "planner_error". Any other exception is
        the bug this property looks for and propagates."""
        try:
            _with_file(data, self.use)
        except PlannerError as exc:
            message = str(exc)
            # The CLI prints the message as one line: it must be one, and say something.
            assert message and "\n" not in message, repr(message)
            return "planner_error"
        return "accepted"


PROPERTIES = (
    Property("model.json -> info, estimate", "model", _model_downstream),
    Property("HF config.json -> info, estimate", "hf", _model_downstream, shared=HF),
    Property("cluster.json -> estimate", "cluster", _cluster_downstream),
    Property("plan.json -> simulate, export", "plan", _plan_downstream),
    Property("calibration runs -> validate", "runs", _runs_downstream, shared=CALIBRATION_RUNS),
)
"""Every reader with its downstream step."""
