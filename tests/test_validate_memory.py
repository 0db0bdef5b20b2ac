"""``validate`` prices measured memory: the one-GPU H100 steps (``h100/runs_one_gpu.json``,
PyTorch eager and compiled Hugging Face Llama) against their allocated and reserved peaks, the
fit verdict of every published run against whether it ran, and the records' memory fields
checked as input."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from planner.diagnose.calibration import ValidationRow, validate
from planner.diagnose.fit import sized_for
from planner.diagnose.run_records import software_of, stack_of
from planner.diagnose.runs import load_runs, load_runs_noting, run_from_record
from planner.errors import InputError
from planner.spec.reading import load_cluster
from tests.cli_process import cli
from tests.conftest import CLUSTERS, SHARED, needs_shared, shared

_validate_cli = partial(cli, columns=80, timeout=300)

H100_RUNS = SHARED / "validation" / "h100" / "runs_one_gpu.json"
VALIDATION = SHARED / "validation"


@pytest.fixture(scope="module")
def h100_rows() -> list[ValidationRow]:
    result = validate([shared(H100_RUNS)], CLUSTERS)
    assert not result.skipped
    return result.rows


# --- the one-GPU H100 runs --------------------------------------------------------------------


def test_h100_records_name_their_stack() -> None:
    """Hugging Face transformers in eager PyTorch is the ``hf-eager`` stack, with
    torch.compile ``hf-compiled``; the family is ``pytorch``; the checkpointed run recomputes
    every layer; AMP bf16 is bf16 compute."""
    runs = {r.id: r for r in load_runs(shared(H100_RUNS))}
    assert len(runs) == 5
    assert {r.family for r in runs.values()} == {"pytorch"}
    assert {r.config.stack for i, r in runs.items() if "compiled" not in i} == {"hf-eager"}
    assert runs["h100_llama3.2-1b_s8192_mb1x4_compiled"].config.stack == "hf-compiled"
    assert runs["h100_llama3.2-1b_s8192_mb1x4_ckpt"].config.recompute == "full"
    assert {r.config.precision for r in runs.values()} == {"bf16"}
    assert all(r.device == "H100" and r.num_devices == 1 for r in runs.values())


def test_other_frameworks_keep_their_family_and_stack() -> None:
    """Each framework keeps its family; MosaicML's Composer runs its own stack (FSDP1 and
    flash-attn's fused loss), Megatron-DeepSpeed DeepSpeed's optimizers, torchtitan its own
    eager block, the others Megatron-Core's accounting."""
    for framework, family, stack in [
        ("Megatron-LM", "megatron", "megatron-te"), ("PyTorch FSDP", "fsdp", "megatron-te"),
        ("MosaicML Composer + PyTorch FSDP", "fsdp", "composer-fsdp"),
        ("Megatron-DeepSpeed", "deepspeed", "megatron-deepspeed"),
        ("torchtitan", "fsdp", "torchtitan-eager"),
    ]:  # fmt: skip
        software = software_of({"software": {"framework": framework}})
        assert (software.family, software.stack) == (family, stack), framework
    assert software_of({}).stack == "megatron-te"  # a Megatron-LM record of its era
    assert stack_of("PyTorch eager with torch.compile (Hugging Face transformers)") == \
        "hf-compiled"


@needs_shared(H100_RUNS)
def test_one_gpu_run_is_one_node_of_the_bundled_device() -> None:
    """A run on fewer devices than a node of its bundled cluster is priced on one node of
    that many of the same device (the one-GPU runs on the 8-GPU H100 file)."""
    run = load_runs(H100_RUNS)[0]
    bundled = load_cluster(CLUSTERS / "dgx-h100-80gb.json")
    one = sized_for(run, bundled)
    assert (one.num_nodes, one.devices_per_node, one.num_devices) == (1, 1, 1)
    assert one.device == bundled.device


def test_h100_peaks_within_targets(h100_rows: list[ValidationRow]) -> None:
    """Allocated within 8 %, reserved within 10 % of what torch measured (the issue's
    targets; the count of each stack's kept tensors puts them within 0.5 % and 1.5 %: AMP's
    16 bytes of states a parameter, every layer's kept bytes, and the loss's backward on top,
    with full recomputation too, the loss running before any layer is rebuilt); every run
    ran and is predicted to fit."""
    assert len(h100_rows) == 5
    for r in h100_rows:
        assert r.memory_error is not None and abs(r.memory_error) <= 0.005, r.id
        assert r.reserved_error is not None and abs(r.reserved_error) <= 0.015, r.id
        assert r.predicted_fits and not r.measured_oom and not r.fit_missed, r.id
        # Reserved is the allocated peak and the allocator's slack; the device's peak adds the
        # CUDA context on top.
        assert r.predicted_peak_memory_gib < r.predicted_reserved_memory_gib < r.peak_memory_gib


@needs_shared(H100_RUNS)
def test_priced_on_the_file_beside_the_runs_the_same() -> None:
    """``--cluster h100-sxm-1gpu.json`` (the one-device file beside the runs) prices the
    same allocated and reserved peaks (it differs in its CUDA context only)."""
    bundled = validate([H100_RUNS], CLUSTERS).rows
    beside = validate([H100_RUNS], CLUSTERS, cluster=H100_RUNS.parent / "h100-sxm-1gpu.json")
    for a, b in zip(bundled, beside.rows, strict=True):
        assert a.predicted_peak_memory_gib == pytest.approx(b.predicted_peak_memory_gib)
        assert a.predicted_reserved_memory_gib == pytest.approx(b.predicted_reserved_memory_gib)


# --- every published run that ran fits --------------------------------------------------------

RUNS_FILES = sorted(p.name for p in VALIDATION.glob("*.json") if p.name != "param_counts.json")


@pytest.mark.parametrize("name", [*RUNS_FILES, "h100/runs_one_gpu.json"])
def test_every_run_that_ran_is_predicted_to_fit(name: str) -> None:
    """A published run that ran (a record that does not say it ran out of memory ran) is not
    predicted over its device's memory; one that ran out of memory is not predicted to fit
    beside its stack's margin."""
    rows = validate([shared(VALIDATION / name)], CLUSTERS).rows
    assert rows
    missed = [(r.id, round(r.peak_memory_gib, 1), "OOM" if r.measured_oom else "ran")
              for r in rows if r.fit_missed]  # fmt: skip
    assert not missed, missed


def test_runs_that_filled_the_device_are_within_the_margin() -> None:
    """MosaicML tuned MPT's microbatches to fill an A100 40 GB: 8 of those runs are priced
    at 38.3-39.3 GiB, under the device's 40 and over the 38 its 5 % margin leaves (no MPT run
    measured its peak, so composer-fsdp's margin is the unmeasured default). Within the margin
    is the model's own uncertainty, not a miss; the search would not choose them."""
    rows = validate([shared(VALIDATION / "fsdp_runs.json")], CLUSTERS).rows
    tight = [r for r in rows if not r.predicted_fits]
    assert len(tight) == 8 and all(r.id.startswith("mpt_A100_40GB") for r in tight)
    for r in tight:
        assert 38.0 < r.peak_memory_gib <= 40.0 and not r.predicted_over and not r.fit_missed


# --- records as input -------------------------------------------------------------------------


def _h100_record() -> dict:
    return json.loads(shared(H100_RUNS).read_text())[0]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("peak_memory_allocated_gib", -1, "measured.peak_memory_allocated_gib must be a positive "
     "number of GiB, got -1"),
    ("peak_memory_reserved_gib", "x", "measured.peak_memory_reserved_gib must be a positive "
     "number of GiB, got 'x'"),
    ("peak_memory_allocated_gib", True, "measured.peak_memory_allocated_gib must be a positive "
     "number of GiB, got True"),
    ("oom", "yes", "measured.oom must be true or false, got 'yes'"),
])  # fmt: skip
def test_bad_memory_fields(tmp_path: Path, field: str, value: object, message: str) -> None:
    """A memory field that is not a positive number, or ``oom`` that is not a boolean, is
    refused naming the field; validate lists the record by its id with that one line."""
    record = _h100_record() | {"id": "bad-memory"}
    record["measured"] = record["measured"] | {field: value}
    with pytest.raises(InputError, match=f"^{message}$"):
        run_from_record(record)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([record, _h100_record()]))
    assert load_runs_noting(path).skipped == [f"bad-memory: {message}"]
    done = _validate_cli("validate", path)
    assert done.returncode == 0, done.stderr
    assert f"- bad-memory: {message}" in " ".join(done.stdout.split())


def test_oom_run_without_a_step_time_is_priced(tmp_path: Path) -> None:
    """A run that ran out of memory before a step was timed is priced for its memory (its
    verdict), not left out; calibrate leaves it out of the fit, saying why."""
    from planner.diagnose.calibration import calibrate

    record = _h100_record() | {"id": "ran-out"}
    record["measured"] = {"oom": True}
    record["parallel"] = record["parallel"] | {"microbatch": 16, "global_batch": 64}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([record, _h100_record()]))
    [oom, ran] = validate([path], CLUSTERS).rows
    assert (oom.id, oom.measured_s, oom.error, oom.measured_oom) == ("ran-out", None, None, True)
    assert not oom.predicted_fits and not oom.fit_missed  # 16 x 2,048 tokens do not fit
    assert ran.error is not None and not ran.measured_oom
    fit = calibrate([path], CLUSTERS, chip="H100")
    assert fit.skipped == ["ran-out: ran out of memory, no step time to fit"]
    done = _validate_cli("validate", path)
    assert done.returncode == 0, done.stderr
    assert "1 ran out of memory, 0 of them predicted to fit" in " ".join(done.stdout.split())


@needs_shared(H100_RUNS)
def test_json_and_table_carry_memory() -> None:
    """``--json`` has the memory keys on every row; the table fits 80 columns."""
    done = _validate_cli("validate", H100_RUNS, "--json")
    assert done.returncode == 0, done.stderr
    [row, *_] = json.loads(done.stdout)["runs"]
    for key in ("predicted_peak_memory_gib", "predicted_reserved_memory_gib",
                "measured_peak_memory_gib", "measured_reserved_memory_gib", "measured_oom",
                "predicted_fits", "memory_error", "reserved_error", "fit_missed"):  # fmt: skip
        assert key in row, key
    assert row["measured_peak_memory_gib"] == 48.447 and row["measured_oom"] is False
    done = _validate_cli("validate", H100_RUNS)
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    text = " ".join(done.stdout.split())
    assert "h100_llama3.2-1b_s8192_mb1x4_compiled" in text
    assert "pytorch on H100 (dgx-h100-80gb) memory, |error| of 5 runs: allocated median" in text
