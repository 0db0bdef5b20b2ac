"""Inputs no plan can keep, refused in one line before anything is priced on them (exit 2, no
traceback), and what the errors then say: found by trying the commands as a new user does
(each of these printed a traceback, a plan, or a launch before)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import planner as lib
from planner.errors import InputError
from planner.frameworks import launch
from planner.options import Pins, SolveOptions
from tests.cli_process import cli
from tests.conftest import CLUSTERS, HF, MODELS, SHARED, shared

LLAMA = MODELS / "llama3-8b.json"
H100 = CLUSTERS / "dgx-h100-80gb.json"


def _refused(*args: str | Path) -> str:
    """The one error of ``planner ARGS``, which must exit 2 without a traceback."""
    done = cli(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr.startswith("error: ")
    return " ".join(done.stderr.split())


@pytest.mark.parametrize(("modules", "expected"), [
    ("attn", "--recompute-modules 'attn': recompute module 'attn': expected some of core_attn"),
    ("", "--recompute-modules '': recompute_modules names no module"),
])  # fmt: skip
def test_an_unknown_recompute_module_is_one_line(modules: str, expected: str) -> None:
    """solve, compare (and a sweep's pins) build the pins before any configuration: an
    unknown module is the flag's error, as estimate's is, not pydantic's traceback."""
    for command in ("solve", "compare"):
        assert expected in _refused(command, LLAMA, H100, "--nodes", "1",
                                    "--recompute-modules", modules)  # fmt: skip
    with pytest.raises(InputError, match="needs --recompute selective, not full"):
        Pins(recompute_modules="op", recompute="full")


def test_a_margin_as_large_as_the_device_is_refused() -> None:
    """No plan fits beside it, and every way out would fail alike (--method grid suggested
    itself)."""
    for command in ("solve", "estimate"):
        message = _refused(command, LLAMA, H100, "--nodes", "1", "--memory-margin", "200")
        assert message == ("error: --memory-margin 200 GiB leaves nothing of H100-SXM5-80GB's "
                           "79.65 GiB to fill")


def test_a_layer_mesh_larger_than_the_cluster_is_refused() -> None:
    message = _refused("layer", MODELS / "gpt3-175b.json", CLUSTERS / "dgx-a100-80gb.json",
                       "--mesh", "1x100000")  # fmt: skip
    assert "--mesh 1x100000 spans 100,000 devices; the cluster has 1,024" in message


def test_more_recomputed_layers_than_a_chunk_holds_is_refused() -> None:
    """It printed "full-recompute (99 layers per chunk)" for a 32-layer model."""
    message = _refused("estimate", LLAMA, H100, "--nodes", "1", "--tp", "8", "--recompute",
                       "full", "--recompute-layers", "99")  # fmt: skip
    assert "a model chunk holds at most 32 decoder layers (pp 1, vpp 1)" in message


def test_bf16_moments_with_a_zero_stage_that_drops_them_is_refused() -> None:
    """Adam's moments are bf16 only inside Megatron-LM's distributed optimizer: with --zero 0
    pinned no configuration keeps the pin (a plan came back with a note)."""
    message = _refused("solve", LLAMA, H100, "--nodes", "1", "--zero", "0",
                       "--optimizer-moments", "bf16")  # fmt: skip
    assert "--optimizer-moments bf16 with --zero 0" in message


def test_a_plan_that_does_not_fit_is_not_exported(tmp_path: Path) -> None:
    """estimate --out writes a plan that does not fit (to record what was priced); export
    refused nothing of it and printed a launch that runs out of memory."""
    plan = tmp_path / "plan.json"
    done = cli("estimate", LLAMA, H100, "--nodes", "1", "--tp", "1", "--mbs", "4",
               "--framework", "megatron", "--out", plan)  # fmt: skip
    assert done.returncode == 2 and plan.exists()
    message = _refused("export", plan, "--model", LLAMA, "--cluster", H100)
    assert "its launch would run out of memory; solve for one that fits:" in message
    assert f"planner solve {LLAMA} {H100} --nodes 1 --framework megatron" in message


def test_a_remedy_is_listed_once() -> None:
    """Every knob at its leanest at once came to --nodes 512 alone, which the list had
    already said."""
    done = cli("estimate", shared(HF / "Meta-Llama-3.1-405B.config.json"), H100, "--nodes",
               "16", "--tp", "8", "--pp", "2", "--mbs", "1", "--zero", "1", "--recompute",
               "full", "--seq-len", "8192", "--global-batch", "256", "--framework",
               "deepspeed", timeout=300)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("- --nodes 512 ") == 1, done.stderr


def test_an_offload_the_framework_does_not_take_says_why() -> None:
    """DeepSpeed runs ZeRO-Offload beside ZeRO-3 too; what it refuses there is the planner's
    pricing, which the way out now says (it said "deepspeed does not launch it")."""
    done = cli("solve", shared(HF / "Meta-Llama-3.1-405B.config.json"), H100, "--nodes", "16",
               "--framework", "deepspeed", "--seq-len", "8192", "--global-batch", "256",
               timeout=300)  # fmt: skip
    message = " ".join(done.stderr.split())
    assert done.returncode == 2, message
    assert "(DeepSpeed: offload zero-offload with ZeRO-3: " in message
    assert "which is not priced" in message and "does not launch it" not in message


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    """JSON keeps the last of a key given twice, silently: the model planned was not the one
    the file seemed to say."""
    model = tmp_path / "model.json"
    text = LLAMA.read_text().replace('"num_layers": 32,', '"num_layers": 32, "num_layers": 40,')
    assert text.count('"num_layers"') == 2
    model.write_text(text)
    assert _refused("info", model) == f"error: {model}: key 'num_layers' given twice in one object"


def test_a_profile_that_is_not_one_says_so(tmp_path: Path) -> None:
    """The path once (it was said twice), and a model file given as a profile named as not
    one (it read "profile schema version None")."""
    missing = tmp_path / "none.json"
    assert _refused("estimate", LLAMA, H100, "--nodes", "1", "--profile", missing) == (
        f"error: --profile {missing}: cannot read (No such file or directory)")
    message = _refused("estimate", LLAMA, H100, "--nodes", "1", "--profile", LLAMA)
    assert message == (f"error: --profile {LLAMA}: not a layer profile (no schema_version: "
                       f"`planner profile` writes one)")


def test_a_usage_error_is_one_sentence() -> None:
    """click lays a choice's list out on lines of their own, tab-indented, which printed as
    "Choose from:         model," with "cluster" on the next line."""
    assert _refused("schema") == ("error: planner schema: Missing argument 'kind'. Choose from: "
                                  "model, cluster")


# --------------------------------------------------------------------------- the library


def test_a_negative_margin_is_refused_by_the_library() -> None:
    """``estimate(..., memory_margin_gib=-1000)`` said that 580 GiB fit on an 80 GiB H100, and
    ``SolveOptions(memory_margin_gib=-5)`` failed only after its whole search, on the plan's
    schema; the command line's ``min=0`` had kept both from its users."""
    model, cluster = lib.load_model(LLAMA), lib.load_cluster(H100, nodes=1)
    with pytest.raises(InputError, match=r"^memory margin -1000 GiB: a margin is at least 0"):
        lib.estimate(model, cluster, lib.ParallelConfig(tp=8), memory_margin_gib=-1000)
    with pytest.raises(InputError, match=r"^memory margin -1000 GiB"):
        lib.estimate_batch(model, cluster, {"tp": [8]}, memory_margin_gib=-1000)
    with pytest.raises(InputError, match=r"^memory margin -5 GiB"):
        SolveOptions(memory_margin_gib=-5)
    assert lib.estimate(model, cluster, lib.ParallelConfig(tp=8), memory_margin_gib=0).fits


@pytest.mark.parametrize(("build", "expected"), [
    (lambda: Pins(tp=0), "--tp 0: a degree is a whole number, at least 1"),
    (lambda: Pins(tp="8"), "--tp '8': a degree is a whole number, at least 1"),
    (lambda: Pins(recompute="sometimes"), "--recompute 'sometimes': choose from none, "
                                          "selective, full"),
    (lambda: Pins(zero=5), "--zero 5: ZeRO stages are 0, 1, 2, 3"),
    (lambda: SolveOptions(micro_batch_sizes=()), "micro_batch_sizes (): one or more whole "
                                                 "numbers, each at least 1"),
    (lambda: SolveOptions(time_limit_s=-1), "time_limit_s -1: seconds, at least 0"),
])  # fmt: skip
def test_options_out_of_range_are_refused_when_built(build, expected: str) -> None:
    """Each was taken until a search used it: a pydantic error naming ParallelConfig (not the
    pin), a TypeError, an IndexError, or a time limit "(-1 s) passed after 0 of 2520
    configurations"."""
    with pytest.raises(InputError) as refused:
        build()
    assert str(refused.value) == expected


def test_a_launch_of_another_models_plan_is_refused() -> None:
    """``frameworks.launch`` wrote Llama 3 8B's launch for a plan priced for Llama 3 70B;
    ``export`` checked the files, the library did not."""
    cluster = lib.load_cluster(H100, nodes=2)
    plan = lib.solve(lib.load_model(LLAMA), cluster)
    with pytest.raises(InputError, match="the model llama3-70b is not the model the plan was "
                                         "made for \\(llama3-8b"):
        launch(plan, "megatron", model=lib.load_model(MODELS / "llama3-70b.json"),
               cluster=cluster)  # fmt: skip
    assert "--num-layers 32" in launch(plan, "megatron", model=lib.load_model(LLAMA),
                                       cluster=cluster).text  # fmt: skip


def test_the_cpu_is_not_measured_under_a_gpus_name(tmp_path: Path) -> None:
    """With no GPU visible, ``--device auto`` timed the CPU: ``bench --write`` put its GEMM
    curve (0.15 % of peak) into the H100's file, and ``profile`` wrote a profile named H100
    that ``--profile`` then priced with. Both are refused before any timing; a file of the
    user's own machine (no platform) is measured as before."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: auto times it")
    h100 = tmp_path / "h100.json"
    h100.write_text(H100.read_text())
    tiny = "tests/data/bench/tiny-llama.json"
    message = _refused("bench", h100, "--model", tiny, "--micro-batch", "1", "--write")
    assert message.startswith("error: --write: this run times the CPU, not H100-SXM5-80GB (a "
                              "cuda device, none visible here)")
    assert h100.read_text() == H100.read_text()
    out = tmp_path / "p.json"
    message = _refused("profile", H100, "--model", tiny, "--mbs", "1", "--tp", "1", "--out", out)
    assert message.startswith("error: planner profile: this run times the CPU, not H100")
    assert not out.exists()


def test_validate_runs_from_any_folder(tmp_path: Path) -> None:
    """``--clusters`` defaulted to ``instances/clusters`` relative to the working folder:
    from anywhere but the repository's root, validate and calibrate failed on a file they
    had not been given."""
    runs = shared(SHARED / "validation" / "h100" / "runs_one_gpu.json")
    done = cli("validate", runs, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pytorch on H100 (dgx-h100-80gb)" in done.stdout


def test_a_bench_degree_that_splits_nothing_is_refused_before_timing() -> None:
    """``bench --tp 3`` on a model of 4 heads timed a dozen seconds of attention and
    memory-bound kernels, then said that no GEMM ran."""
    message = _refused("bench", "tests/data/bench/cpu-node.json", "--model",
                       "tests/data/bench/tiny-llama.json", "--tp", "3")  # fmt: skip
    assert message == ("error: --tp 3: splits none of tiny-llama's GEMMs (its heads, experts "
                       "and widths); a degree that divides them, or 1")


@pytest.mark.parametrize(("options", "said"), [
    ({"framework": "megatorn"}, "framework 'megatorn' is not a framework the planner knows"),
    ({"stack": "nope"}, "stack 'nope': choose from megatron-te,"),
    ({"backend": "gurobi"}, "backend 'gurobi': choose from ortools, pulp, cpsat"),
    ({"max_mesh_nodes": 0}, "max_mesh_nodes 0: a whole number, at least 1"),
])  # fmt: skip
def test_solve_options_are_checked_when_built(options: dict, said: str) -> None:
    """A job spec an embedder validates before queueing it: each bad option is an InputError
    when SolveOptions is built (the framework and stack were refused only by solve, after
    loading; an unknown backend only by a per-operator search; a mesh of 0 nodes never). The
    run's length and batch are checked with the model's block, by training_of."""
    with pytest.raises(InputError, match=re.escape(said)):
        SolveOptions(**options)


def test_a_rank_order_is_checked_before_the_degrees_divide() -> None:
    """``--rank-order bogus`` with degrees that divide nothing: the spelling's error, which
    estimate gave only once the degrees divided (a batch error first), said as solve's pins
    say theirs."""
    message = _refused("estimate", MODELS / "gpt3-175b.json", CLUSTERS / "dgx-a100-80gb.json",
                       "--rank-order", "bogus")  # fmt: skip
    assert message == ("error: --rank-order 'bogus': use tp, cp, ep, dp, pp once each, with "
                       "cp-ep-dp together (default tp-cp-ep-dp-pp)")


def test_compare_takes_frameworks_or_methods() -> None:
    """--methods beside --frameworks was ignored without a word."""
    message = _refused("compare", LLAMA, H100, "--nodes", "1", "--frameworks", "megatron",
                       "--methods", "grid")  # fmt: skip
    assert message == ("error: --frameworks compares each framework's best plan, --methods the "
                       "methods on one target: give one of them")


def test_version_is_the_packages() -> None:
    from importlib.metadata import version

    done = cli("--version")
    assert (done.returncode, done.stdout) == (0, f"planner {version('planner')}\n")
