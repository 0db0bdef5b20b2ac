"""planner bench: the kernels it times are the cost model's, its fit gives back the block that
made the times, and on the CPU it writes a block the cluster file reads back."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.cost import executed_flops
from planner.diagnose.bench_cases import GROUPED_TOKENS, BenchCase, bench_cases
from planner.diagnose.bench_fit import _fit_grouped, fit_bench, predicted_s
from planner.diagnose.bench_torch import Timings, run_cases
from planner.diagnose.expert_gemms import FIT_MIN_TOKENS, fit_grouped_gemm, read_expert_gemms
from planner.errors import InputError
from planner.graph import lowered
from planner.spec import (
    AttentionEfficiency,
    DeviceEfficiency,
    DeviceSpec,
    GemmEfficiency,
    GroupedGemmEfficiency,
    ModelSpec,
    TrainingSpec,
)
from planner.spec.reading import load_cluster, load_model
from tests.cli_process import cli
from tests.conftest import REPO, shared

DATA = REPO / "tests" / "data" / "bench"
CPU_NODE = DATA / "cpu-node.json"
TINY = DATA / "tiny-llama.json"
LLAMA_8B = REPO / "instances" / "models" / "llama3-8b.json"
H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"


def _cases(model: ModelSpec, seq: int = 2048, precision: str = "bf16") -> list[BenchCase]:
    training = TrainingSpec(seq_length=seq, global_batch_size=1,
                            precision=precision)  # type: ignore[arg-type]
    return bench_cases(model, training, tensor_parallel=(1, 2, 4, 8), micro_batches=(1, 2))


# --------------------------------------------------------------------------- the cases


def test_gemms_are_the_layers_matmuls_in_three_orientations() -> None:
    """At TP1 and microbatch 1 the forward GEMMs of a decoder layer carry exactly the FLOPs the
    graph gives its linear ops; each one's two backward GEMMs the same again; at TP8 each
    column- or row-parallel shard an eighth."""
    model = load_model(LLAMA_8B)
    training = TrainingSpec(seq_length=2048, global_batch_size=1)
    cases = {c.label: c for c in _cases(model)}
    layer = lowered(model, training, 1)[1].ops_by_layer[1]
    for op in (op for op in layer if op.kind == "linear"):
        for pass_ in ("fwd", "dX", "dW"):
            case = cases.get(f"{op.name} tp1 mb1 {pass_}")
            # a shape met before (dX of one op, fwd of another) is timed once
            if case is not None:
                assert case.flops == op.flops
        tp8 = cases[f"{op.name} tp8 mb1 fwd"]
        assert tp8.flops == pytest.approx(op.flops / 8)
    qkv = cases["layer1.qkv_proj tp1 mb1 fwd"]
    assert qkv.shape == (2048, 4096, 4096 + 2 * 1024)  # 32 query heads, 8 K/V heads of 128
    # Megatron-LM's layouts, its weight stored (out, in): X W^T, dY W, dY^T X.
    down = {p: cases[f"layer1.mlp_down tp1 mb1 {p}"] for p in ("fwd", "dX", "dW")}
    assert [(c.shape, c.transposed) for c in down.values()] == [
        ((2048, 14336, 4096), "b"), ((2048, 4096, 14336), ""), ((4096, 2048, 14336), "a")]


def test_attention_is_the_kernel_the_cost_model_prices() -> None:
    """At the model's sequence and head dim, forward and backward carry the executed FLOPs of
    the graph's attention core (causal half, the backward's 2.5 times) and its keys per query
    and head dim; shorter sequences and the other head dims are timed beside it."""
    model = load_model(LLAMA_8B)
    training = TrainingSpec(seq_length=2048, global_batch_size=1)
    core = next(op for op in lowered(model, training, 1)[1].ops_by_layer[1]
                if op.kind == "attention")  # fmt: skip
    cases = {c.label: c for c in _cases(model)}
    forward, backward = cases["attention s2048 d128 fwd"], cases["attention s2048 d128 bwd"]
    executed = executed_flops(core, flash_attention=True)
    assert (forward.flops, backward.flops) == (executed.forward, executed.backward)
    assert forward.keys_per_query == 1024 and forward.head_dim == core.head_dim == 128
    assert {c.label for c in cases.values() if c.kind == "attention"} >= {
        "attention s128 d64 fwd", "attention s1024 d128 bwd"}


def test_memory_cases_reach_past_the_model_and_the_cache() -> None:
    """Adds from 1 Ki elements (the launch) to past four microbatches' residual stream and at
    least 64 Mi elements (past the last-level cache), three tensors each."""
    model = load_model(LLAMA_8B)
    adds = [c for c in _cases(model, seq=8192) if c.kernel == "add"]
    sizes = [c.shape[1] for c in adds]
    assert sizes[0] == 1024 and sizes[-1] >= 4 * 2 * 8192 * 4096 and 1 << 26 in sizes
    assert all(c.bytes_moved == 3 * 2 * c.shape[1] for c in adds)  # bf16


# --------------------------------------------------------------------------- the fit

KNOWN = DeviceEfficiency(
    gemm=GemmEfficiency(max_fraction=0.72, half_saturation_gflop=35.0),
    attention=AttentionEfficiency(max_fraction=0.55, half_saturation_tokens=400.0,
                                  half_saturation_head_dim=40.0),
    memory_bound_fraction=0.83, kernel_launch_us=4.5)


def _timed_by(device: DeviceSpec, cases: list[BenchCase], precision: str = "bf16",
              noise: float = 0.0) -> Timings:
    """The times the cost model gives ``cases`` on ``device``, times lognormal noise."""
    rng = np.random.default_rng(7)
    seconds = tuple(predicted_s(c, device, precision) * float(np.exp(rng.normal(0, noise)))
                    for c in cases)  # type: ignore[arg-type]
    return Timings(device_name="synthetic", backend="cuda", torch_version="-",
                   precision=precision, seconds=seconds)  # type: ignore[arg-type]


def test_fit_gives_back_the_block_that_made_the_times() -> None:
    """Times priced by the cost model with a known block fit back to that block."""
    h100 = load_cluster(H100).device
    device = h100.model_copy(update={"efficiency": KNOWN})
    cases = _cases(load_model(LLAMA_8B))
    fit = fit_bench(H100, cases, _timed_by(device, cases), model_name="llama3-8b",
                    seq_length=2048)  # fmt: skip
    got = fit.after
    assert got.gemm.max_fraction == pytest.approx(0.72, abs=2e-4)
    assert got.gemm.half_saturation_gflop == pytest.approx(35.0, rel=2e-3)
    assert got.memory_bound_fraction == pytest.approx(0.83, abs=2e-4)
    assert got.kernel_launch_us == pytest.approx(4.5, abs=0.02)
    assert got.attention is not None
    assert got.attention.max_fraction == pytest.approx(0.55, abs=2e-4)
    assert got.attention.half_saturation_tokens == pytest.approx(400.0, rel=2e-3)
    assert got.attention.half_saturation_head_dim == pytest.approx(40.0, rel=2e-3)
    for kind in ("gemm", "attention", "memory"):
        assert fit.median_error(kind, fitted=True) < 1e-3
    # What calibrate measured from whole runs is not the kernels' to change; that the file's
    # GEMM curve came from whole runs is said.
    assert got.overlap_contention == h100.efficiency.overlap_contention
    assert any("whole training runs" in note for note in fit.notes)


def test_fit_is_robust_to_timing_noise() -> None:
    """With 5 % lognormal noise on every time the fitted curve stays within a few percent of
    the one that made them where the model's kernels run (its largest GEMM)."""
    h100 = load_cluster(H100).device
    device = h100.model_copy(update={"efficiency": KNOWN})
    cases = _cases(load_model(LLAMA_8B))
    fit = fit_bench(H100, cases, _timed_by(device, cases, noise=0.05), model_name="llama3-8b",
                    seq_length=2048)  # fmt: skip
    fitted = h100.model_copy(update={"efficiency": fit.after})
    biggest = max((c for c in cases if c.kind == "gemm"), key=lambda c: c.flops)
    assert predicted_s(biggest, fitted, "bf16") == pytest.approx(
        predicted_s(biggest, device, "bf16"), rel=0.03)


def test_one_head_dim_keeps_the_head_dim_term() -> None:
    """Attention timed at one head dim cannot see the head-dim term: it is kept, and said."""
    h100 = load_cluster(H100).device
    device = h100.model_copy(update={"efficiency": KNOWN})
    cases = [c for c in _cases(load_model(LLAMA_8B)) if c.kind != "attention" or c.head_dim == 128]
    fit = fit_bench(H100, cases, _timed_by(device, cases), model_name="llama3-8b",
                    seq_length=2048)  # fmt: skip
    assert fit.after.attention is not None
    assert h100.efficiency.attention is not None  # the file's own, from the shared benches
    assert fit.after.attention.half_saturation_head_dim == (
        h100.efficiency.attention.half_saturation_head_dim)  # fmt: skip
    assert any("one head dim" in note for note in fit.notes)


def test_an_attention_term_on_its_bound_is_said() -> None:
    """Forward kernels timed three times slower than their backwards (a loaded machine's
    timings) push the backward's rate to its ceiling, 2.0: the fit writes the ceiling, and
    says it is the ceiling's, not the kernels'; the known block's own fit says nothing of
    the kind."""
    h100 = load_cluster(H100).device
    device = h100.model_copy(update={"efficiency": KNOWN})
    cases = _cases(load_model(LLAMA_8B))
    timed = _timed_by(device, cases)
    clean = fit_bench(H100, cases, timed, model_name="llama3-8b", seq_length=2048)
    assert not any("at its bound" in note for note in clean.notes)
    seconds = [3 * s if c.kernel == "attention_forward" else s
               for c, s in zip(cases, timed.seconds, strict=True)]  # fmt: skip
    fit = fit_bench(H100, cases, replace(timed, seconds=tuple(seconds)), model_name="llama3-8b",
                    seq_length=2048)  # fmt: skip
    assert fit.after.attention is not None and fit.after.attention.backward_fraction == 2.0
    assert ("attention.backward_fraction is at its bound, 2: the kernels do not pin it"
            in fit.notes)


def test_faster_than_the_peak_is_refused() -> None:
    """Kernels faster than the cluster file's device allows mean the wrong file: refused."""
    h100 = load_cluster(H100).device
    faster = h100.model_copy(update={"peak_tflops": {"bf16": 3000.0},
                                     "efficiency": KNOWN})  # fmt: skip
    cases = _cases(load_model(LLAMA_8B))
    with pytest.raises(InputError, match=r"GEMMs ran at .* above device H100-SXM5-80GB's bf16 "
                                         r"peak 989 TFLOP/s"):
        fit_bench(H100, cases, _timed_by(faster, cases), model_name="m", seq_length=2048)


def test_memory_faster_than_the_data_sheet_is_refused() -> None:
    """HBM faster than the file's bandwidth is the wrong file too; adds whose time is nearly
    all launch (a fitted launch a hair above or below theirs) do not decide it."""
    h100 = load_cluster(H100).device
    faster = h100.model_copy(update={"memory_bandwidth_gb_s": 6000.0, "efficiency": KNOWN})
    cases = _cases(load_model(LLAMA_8B))
    with pytest.raises(InputError, match=r"memory-bound kernels ran at \d+ GB/s, above device "
                                         r"H100-SXM5-80GB's memory_bandwidth_gb_s 3350"):
        fit_bench(H100, cases, _timed_by(faster, cases), model_name="m", seq_length=2048)
    slower_launch = h100.model_copy(update={"efficiency": KNOWN.model_copy(
        update={"kernel_launch_us": 4.49})})  # fmt: skip
    timed = _timed_by(slower_launch, cases)
    small = [i for i, c in enumerate(cases) if c.kernel == "add" and c.shape[1] <= 1 << 12]
    seconds = [s - 1e-8 if i in small else s for i, s in enumerate(timed.seconds)]
    fit_bench(H100, cases, replace(timed, seconds=tuple(seconds)), model_name="m",
              seq_length=2048)  # no refusal


def test_kernels_that_did_not_run_are_left_out() -> None:
    """A case the device had no memory for (None) is not fitted; without memory-bound kernels
    there is nothing to fit the bandwidth to."""
    h100 = load_cluster(H100).device
    device = h100.model_copy(update={"efficiency": KNOWN})
    cases = _cases(load_model(LLAMA_8B))
    timed = _timed_by(device, cases)
    biggest = max(range(len(cases)), key=lambda i: cases[i].flops)
    seconds = list(timed.seconds)
    seconds[biggest] = None
    fit = fit_bench(H100, cases, replace(timed, seconds=tuple(seconds)), model_name="m",
                    seq_length=2048)
    assert len(fit.rows) == len(cases) - 1
    no_memory = tuple(None if c.kind == "memory" else s for c, s in zip(cases, timed.seconds,
                                                                        strict=True))
    with pytest.raises(InputError, match="fewer than two memory-bound kernels"):
        fit_bench(H100, cases, replace(timed, seconds=no_memory), model_name="m",
                  seq_length=2048)


def test_write_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    """The written file reads back with the fitted block and its source; every other key is
    where it was; the validated runs, whose errors were the replaced block's, are dropped."""
    h100 = load_cluster(H100).device
    device = h100.model_copy(update={"efficiency": KNOWN})
    cases = _cases(load_model(LLAMA_8B))
    fit = fit_bench(H100, cases, _timed_by(device, cases), model_name="llama3-8b",
                    seq_length=2048, date="2026-11-24")  # fmt: skip
    path = tmp_path / "h100.json"
    path.write_text(fit.updated_json)
    written, before = load_cluster(path), load_cluster(H100)
    assert written.device.efficiency.gemm.max_fraction == fit.after.gemm.max_fraction
    # The whole attention curve, its fixed costs and backward rate too, not only its shape.
    curve, fitted = written.device.efficiency.attention, fit.after.attention
    assert curve is not None and fitted is not None
    assert curve.model_copy(update={"source": None}) == fitted.model_copy(update={"source": None})
    assert load_cluster(H100).device.efficiency.evidence  # the bundled file keeps its runs
    assert written.device.efficiency.validation == written.device.efficiency.evidence == ()
    assert "planner bench" in (written.device.efficiency.gemm.source or "")
    assert "2026-11-24" in fit.source and "llama3-8b" in fit.source
    assert written.network == before.network and written.host == before.host
    assert any("validated runs the error bands rest on" in note for note in fit.notes)
    assert list(json.loads(fit.updated_json)) == list(json.loads(H100.read_text()))


# --------------------------------------------------------------------------- on the CPU

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="planner bench needs PyTorch (the test extra has it)")


def _bench(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``planner bench ARGS`` on one CPU thread: with two, a kernel waits at its threads'
    barrier whenever the other core is busy (seen here: every attention kernel at 8 or 40 ms
    while other tests ran), and the times would say more about the machine than the fit."""
    return cli("bench", *args, columns=80, env={"OMP_NUM_THREADS": "1"}, timeout=300)


@needs_torch
def test_bench_on_the_cpu_writes_a_valid_block(tmp_path: Path) -> None:
    """On the CPU with the tiny model's shapes: exit 0, a cluster file that reads back with
    the fitted block in it, and a fit that reproduces what was measured."""
    cluster = tmp_path / "cpu.json"
    cluster.write_text(CPU_NODE.read_text())
    done = _bench(cluster, "--model", TINY, "--device", "cpu", "--tp", "1", "--tp", "2",
                  "--repeats", "3", "--min-time-ms", "5", "--write", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["written"] and report["timings"]["backend"] == "cpu"
    assert report["timings"]["precision"] == "fp32"  # the tiny model's training block
    efficiency = load_cluster(cluster).device.efficiency
    after = report["after"]
    assert (efficiency.gemm.max_fraction, efficiency.memory_bound_fraction,
            efficiency.kernel_launch_us) == (after["gemm"]["max_fraction"],
                                             after["memory_bound_fraction"],
                                             after["kernel_launch_us"])  # fmt: skip
    assert 0 < efficiency.gemm.max_fraction < 1 and efficiency.attention is not None
    assert efficiency.overlap_contention == 0.1  # kept
    assert "planner bench" in (efficiency.source or "")
    rows = report["rows"]
    assert {r["kind"] for r in rows} == {"gemm", "attention", "memory", "elementwise",
                                         "optimizer"}
    for kind in ("gemm", "attention"):
        errors = [abs(r["after_s"] / r["measured_s"] - 1) for r in rows if r["kind"] == kind]
        assert float(np.median(errors)) < 0.25, (kind, errors)


@needs_torch
def test_bench_tables_and_bad_device(tmp_path: Path) -> None:
    """The summary at 80 columns, not written without --write; a device that is not there is
    one line, exit 2, and the file untouched."""
    cluster = tmp_path / "cpu.json"
    cluster.write_text(CPU_NODE.read_text())
    done = _bench(cluster, "--model", TINY, "--tp", "1", "--micro-batch", "1", "--repeats", "1",
                  "--min-time-ms", "1")
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    import torch

    if not torch.cuda.is_available():  # auto fell back to the CPU: said, as it fits the CPU
        assert "no GPU or NPU is visible" in done.stderr
    for needle in ("GEMMs", "attention", "check, not fitted", "gemm.max_fraction",
                   "not written: --write"):
        assert needle in done.stdout
    assert cluster.read_text() == CPU_NODE.read_text()
    if not torch.cuda.is_available():
        wrong = _bench(cluster, "--model", TINY, "--device", "cuda", "--write")
        assert wrong.returncode == 2 and wrong.stdout == ""
        assert "--device cuda: PyTorch" in wrong.stderr and "Traceback" not in wrong.stderr
        assert cluster.read_text() == CPU_NODE.read_text()


def test_without_pytorch_bench_says_how_to_get_it() -> None:
    """Without PyTorch (the base install) the bench is one line naming the extra, exit 2;
    the other commands never import it."""
    script = ("import sys\nsys.modules['torch'] = None\nfrom planner.cli import main\n"
              "main()\n")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, "bench", str(CPU_NODE), "--model", str(TINY)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert "planner bench needs PyTorch" in done.stderr and "planner[bench]" in done.stderr
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- grouped GEMMs

KNOWN_GROUPED = GroupedGemmEfficiency(max_fraction=0.66, half_saturation_tokens=180.0,
                                      half_saturation_k=900.0)
MIXTRAL = REPO / "instances" / "models" / "mixtral-8x7b.json"


def test_grouped_cases_are_the_experts_projections_in_bf16_only() -> None:
    """Mixtral's first MoE layer: up (hidden to 2 x FFN, gated) and down (FFN to hidden), 8
    local experts, six token counts each; none in fp32 (no grouped kernel there) and none for
    a dense model."""
    model = load_model(MIXTRAL)
    grouped = [c for c in _cases(model) if c.kind == "grouped_gemm"]
    assert {c.shape for c in grouped} == {
        (8, t, k, n) for t in GROUPED_TOKENS
        for k, n in ((4096, 2 * 14336), (14336, 4096))}  # fmt: skip
    assert all(c.flops == 2.0 * c.shape[0] * c.shape[1] * c.shape[2] * c.shape[3]
               for c in grouped)  # fmt: skip
    assert not [c for c in _cases(model, precision="fp32") if c.kind == "grouped_gemm"]
    assert not [c for c in _cases(load_model(LLAMA_8B)) if c.kind == "grouped_gemm"]


def test_fit_gives_back_the_grouped_curve_that_made_the_times() -> None:
    """Mixtral's kernels priced with a known block and grouped-GEMM curve fit back to that
    curve, and the curve is written into the file."""
    h100 = load_cluster(H100).device
    device = h100.model_copy(update={"efficiency": KNOWN.model_copy(
        update={"grouped_gemm": KNOWN_GROUPED})})  # fmt: skip
    cases = _cases(load_model(MIXTRAL))
    fit = fit_bench(H100, cases, _timed_by(device, cases), model_name="mixtral-8x7b",
                    seq_length=2048)  # fmt: skip
    got = fit.after.grouped_gemm
    assert got is not None
    assert got.max_fraction == pytest.approx(0.66, abs=2e-3)
    assert got.half_saturation_tokens == pytest.approx(180.0, rel=1e-2)
    assert got.half_saturation_k == pytest.approx(900.0, rel=1e-2)
    assert fit.median_error("grouped_gemm", fitted=True) < 1e-3
    assert "grouped expert GEMMs" in (got.source or "")
    written = json.loads(fit.updated_json)["device"]["efficiency"]["grouped_gemm"]
    assert written["max_fraction"] == got.max_fraction


def test_the_shared_h100_expert_gemms_fit_through_the_bench() -> None:
    """The shared H100 grouped-GEMM times (``expert_gemms.jsonl``) read as the bench's cases:
    the bench's fit is the curve the expert GEMMs' own fit finds, and prices all but one of
    those of 128 tokens per expert and more within 15 % (issue 28's target; the README says
    23 of 24)."""
    measured = shared(REPO.parent / "shared" / "validation" / "h100" / "expert_gemms.jsonl")
    gemms = [g for g in read_expert_gemms(measured) if g.tokens_per_expert >= FIT_MIN_TOKENS]
    device = load_cluster(H100).device
    cases = [BenchCase(kind="grouped_gemm", kernel="grouped_matmul", label=g.label,
                       shape=(g.experts, g.tokens_per_expert, g.k, g.n), flops=g.flops,
                       bytes_moved=0.0) for g in gemms]  # fmt: skip
    notes: list[str] = []
    fitted = _fit_grouped(device, cases, np.array([g.grouped_s for g in gemms]), "cuda",
                          "test", notes)  # fmt: skip
    errors = [abs(predicted_s(c, fitted, "bf16") / g.grouped_s - 1)
              for c, g in zip(cases, gemms, strict=True)]  # fmt: skip
    assert sum(e > 0.15 for e in errors) <= 1 and float(np.median(errors)) < 0.10, errors
    direct = fit_grouped_gemm(gemms, device, source="test")
    assert fitted.efficiency.grouped_gemm == direct.model_copy(
        update={"source": "grouped_gemm: test"})


@needs_torch
def test_grouped_gemms_run_on_the_cpu_as_batched_gemms() -> None:
    """Without CUDA the grouped case runs as one ``torch.bmm`` of its shapes, and says so."""
    case = BenchCase(kind="grouped_gemm", kernel="grouped_matmul", label="up 4x128",
                     shape=(4, 128, 64, 96), flops=2.0 * 4 * 128 * 64 * 96, bytes_moved=0.0)
    timed = run_cases([case], precision="bf16", device="cpu", repeats=2, min_time_s=0.002)
    assert timed.seconds[0] is not None and timed.seconds[0] > 0
