"""The ``planner`` command line as a user sees it: a process a command, run from the repository
root (``tests.cli_process``).

What the commands print (the ``--json`` objects and their agreement with the library), and how
they fail: every bad input gives exit code 2, exactly one ``error:`` message on stderr (wrapped
at words to the terminal's width, its continuation lines indented) that names the file (or the
option) and the problem, nothing on stdout, and never a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import pytest

import planner
from tests.cli_process import cli
from tests.conftest import HF, REPO, SHARED, needs_shared, shared

GPT3 = "instances/models/gpt3-175b.json"
MIXTRAL = "instances/models/mixtral-8x7b.json"
A100 = "instances/clusters/dgx-a100-80gb.json"
H100 = "instances/clusters/dgx-h100-80gb.json"
# Files of ../shared as a user types them from the repository root.
LLAMA_405B_HF = "../shared/reference/hf/Meta-Llama-3.1-405B.config.json"
CALIBRATION_RUNS = "../shared/validation/calibration_runs.json"

# Published parameter counts: Mixtral 8x7B (Mistral AI's model card: 46.7B total, 12.9B
# active) and Llama 3.1 405B (Meta's model card), to the parameter as transformers counts them.
MIXTRAL_PARAMS_TOTAL = 46_702_792_704
MIXTRAL_PARAMS_ACTIVE = 12_879_925_248
LLAMA_405B_PARAMS = 405_853_388_800

ESTIMATE_KEYS = {
    "step_time_s",
    "tokens_per_s",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "mfu",
    "peak_memory_gib",
    "fits",
    "memory",
    "time",
}
MEMORY_KEYS = {"weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "other_gib"}
TIME_KEYS = {
    "compute_s",
    "tensor_parallel_comm_s",
    "context_parallel_comm_s",
    "expert_parallel_comm_s",
    "pipeline_comm_s",
    "pipeline_bubble_s",
    "data_parallel_comm_exposed_s",
    "optimizer_s",
}


@cache
def _json_of(*args: str) -> Any:
    """The parsed stdout of a command that must succeed (cached: several tests read one)."""
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _shared_file(arg: str) -> Path:
    """The file of ../shared that ``arg`` names from the repository root."""
    return SHARED.parent / arg.removeprefix("../")


def _needs(*args: str) -> pytest.MarkDecorator:
    """Skip when one of ``args`` names a file of ../shared that is missing."""
    return needs_shared(*(_shared_file(arg) for arg in args if arg.startswith("../shared/")))


def _error_text(stderr: str) -> str:
    """The one ``error:`` message on ``stderr``, its lines joined as the library said it
    (continuation lines are indented; a command's lines end with a backslash; a way out
    starts with ``- ``)."""
    lines = stderr.rstrip("\n").splitlines()
    assert lines and lines[0].startswith("error: "), stderr
    assert all(line.startswith("  ") for line in lines[1:]), stderr
    return " ".join(line.strip().removesuffix(" \\") for line in lines)


def _assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit code 2, nothing on stdout, one ``error:`` message on stderr (one line, or wrapped
    at words with its continuation lines indented) containing every needle."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    text = _error_text(done.stderr)
    for needle in needles:
        assert needle in text, (needle, text)


# --------------------------------------------------------------------------- estimate


def test_estimate_json_is_the_library_estimate() -> None:
    """``estimate --json`` prints one object with the documented keys, and its values are
    exactly ``planner.estimate(...).to_dict()`` for the same inputs."""
    printed = _json_of("estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--json")
    assert set(printed) >= ESTIMATE_KEYS
    assert set(printed["memory"]) >= MEMORY_KEYS
    assert set(printed["time"]) == TIME_KEYS
    assert isinstance(printed["fits"], bool)
    expected = planner.estimate(
        planner.load_model(REPO / GPT3),
        planner.load_cluster(REPO / A100),
        planner.ParallelConfig(tp=8, pp=16),
    ).to_dict()
    priced = printed.pop("configuration")  # the configuration priced, as resolved
    assert printed == expected
    assert (priced["tp"], priced["pp"], priced["dp"]) == (8, 16, 8)
    assert printed["num_devices"] == 1024


def test_estimate_table_shows_the_step_time_and_the_fit() -> None:
    """Without ``--json`` the tables carry the step time (to the millisecond) and whether the
    configuration fits in memory."""
    done = cli("estimate", GPT3, A100, "--tp", "8", "--pp", "16")
    assert done.returncode == 0, done.stderr
    step = _json_of("estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--json")["step_time_s"]
    assert f"{step:.3f}" in done.stdout
    assert "fits" in done.stdout


def test_nodes_resizes_the_cluster() -> None:
    """``--nodes N`` prices the same cluster type with N nodes of 8 devices: data parallelism
    takes up the change."""
    printed = _json_of("estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--nodes", "16", "--json")
    assert printed["num_devices"] == 8 * 16
    assert printed["dp"] == 1
    expected = planner.estimate(
        planner.load_model(REPO / GPT3),
        planner.load_cluster(REPO / A100, nodes=16),
        planner.ParallelConfig(tp=8, pp=16),
    ).to_dict()
    assert printed.pop("configuration")["dp"] == 1
    assert printed == expected


def test_a_command_that_draws_nothing_loads_no_plotting_or_fitting_library() -> None:
    """matplotlib and scipy load only when a command draws or fits: importing them costs
    every other command 0.8 s of its start (``estimate`` starts in 0.6 s, not 1.4 s)."""
    script = ("import sys\nfrom planner.cli import main\ntry:\n    main()\nexcept SystemExit:\n"
              "    pass\nprint(sorted(m for m in ('matplotlib', 'scipy') if m in sys.modules),"
              " file=sys.stderr)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, "estimate", GPT3, A100, "--tp", "8",
                           "--pp", "16", "--json"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert json.loads(done.stdout)["num_devices"] == 1024, done.stderr
    assert done.stderr.strip() == "[]"


# --------------------------------------------------------------------------- info, schema


@pytest.mark.parametrize(
    ("model", "total", "active"),
    [
        (MIXTRAL, MIXTRAL_PARAMS_TOTAL, MIXTRAL_PARAMS_ACTIVE),
        # a HF config.json, as it is
        pytest.param(LLAMA_405B_HF, LLAMA_405B_PARAMS, LLAMA_405B_PARAMS,
                     marks=_needs(LLAMA_405B_HF)),
    ],
    ids=["mixtral-8x7b", "hf-llama-3.1-405b"],
)
def test_info_counts_published_parameters(model: str, total: int, active: int) -> None:
    """``info --json`` reports the published total and active parameter counts."""
    printed = _json_of("info", model, "--json")
    assert printed["params_total"] == total
    assert printed["params_active"] == active


def test_info_writes_the_model_it_read_as_a_model_json(tmp_path: Path) -> None:
    """``info --write-model`` turns a Hugging Face config into the model.json the planner read
    of it (which loads back to the same model), so a key the config has no field for can be
    set: Mixtral 8x22B's router spread, which ``estimate`` then prices (it slows the
    expert-parallel step). It never writes over the model it reads."""
    config = shared(HF / "Mixtral-8x22B-v0.1.config.json")
    out = tmp_path / "mixtral.json"
    done = cli("info", config, "--write-model", out)
    assert done.returncode == 0, done.stderr
    assert planner.load_model(out) == planner.load_model(config)
    written = json.loads(out.read_text())
    written["moe"]["expert_load_cv"] = 0.5
    spread = tmp_path / "spread.json"
    spread.write_text(json.dumps(written))
    run = ("--nodes", "16", "--seq-len", "4096", "--global-batch", "256", "--tp", "2",
           "--pp", "8", "--ep", "8", "--etp", "1", "--sp", "--zero", "1", "--json")  # fmt: skip
    steps = [_json_of("estimate", str(m), H100, *run)["step_time_s"] for m in (out, spread)]
    assert steps[1] > steps[0]
    _assert_one_line_error(cli("info", out, "--write-model", out), "--write-model")


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        here = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return here + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


@pytest.mark.parametrize(
    ("kind", "key", "instances"),
    [("model", "num_layers", "models"), ("cluster", "num_nodes", "clusters")],
)
def test_schema_describes_the_bundled_files(kind: str, key: str, instances: str) -> None:
    """``schema model|cluster`` prints a JSON Schema: an object type whose properties include
    the key fields, whose required fields are properties, whose ``$ref``s all resolve, and
    which every bundled instance file satisfies at the top level (no unknown or missing key)."""
    schema = _json_of("schema", kind)
    assert schema["type"] == "object"
    properties = schema["properties"]
    assert key in properties
    required = set(schema.get("required", []))
    assert required <= set(properties)
    for ref in _refs(schema):
        assert ref.startswith("#/$defs/"), ref
        assert ref.removeprefix("#/$defs/") in schema["$defs"], ref
    files = sorted((REPO / "instances" / instances).glob("*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        assert set(data) <= set(properties), path.name
        assert required <= set(data), path.name


# --------------------------------------------------------------------------- validate


@_needs(CALIBRATION_RUNS)
def test_validate_lists_every_publishedplanner() -> None:
    """``validate --json`` gives one row per published run (20) with the measured and predicted
    step times and the relative error predicted / measured - 1."""
    result = _json_of("validate", CALIBRATION_RUNS, "--json")
    rows = result["runs"]
    assert result["skipped"] == []
    assert len(rows) == 20
    for row in rows:
        assert row["measured_s"] > 0.0
        assert row["predicted_s"] > 0.0
        assert row["error"] == pytest.approx(row["predicted_s"] / row["measured_s"] - 1, rel=1e-9)


# --------------------------------------------------------------------------- bad input

Json = dict[str, Any]


def _gpt3(**changes: Any) -> Json:
    data: Json = json.loads((REPO / GPT3).read_text())
    return data | changes


def _a100(**changes: Any) -> Json:
    data: Json = json.loads((REPO / A100).read_text())
    return data | changes


def _hf_llama(**changes: Any) -> Json:
    data: Json = json.loads(shared(HF / "Meta-Llama-3.1-8B.config.json").read_text())
    return data | changes


@dataclass(frozen=True)
class BadFile:
    """A broken input file and the words its error message must contain."""

    name: str
    content: Callable[[], str]
    role: Literal["model", "cluster"]
    """Which argument of ``estimate`` it replaces."""
    needles: tuple[str, ...] = ()


BAD_FILES = [
    BadFile("malformed", lambda: '{\n  "name": "x",\n  "num_layers": 2,,\n}\n', "model",
            ("line 3", "column 19")),
    BadFile("unknown-field", lambda: json.dumps(_gpt3(colour="red")), "model",
            ("colour", "unknown")),
    BadFile("negative-size", lambda: json.dumps(_gpt3(hidden_size=-5)), "model",
            ("hidden_size",)),
    BadFile("zero-size", lambda: json.dumps(_gpt3(num_layers=0)), "model", ("num_layers",)),
    BadFile("heads-by-groups", lambda: json.dumps(_gpt3(num_query_groups=7)), "model",
            ("num_attention_heads", "num_query_groups", "96", "7")),
    BadFile("unknown-hf-model-type", lambda: json.dumps(_hf_llama(model_type="martian")),
            "model", ("martian",)),
    BadFile("not-an-object", lambda: "[1, 2, 3]", "model", ("object",)),
    BadFile("cluster-unknown-field", lambda: json.dumps(_a100(racks=4)), "cluster",
            ("racks", "unknown")),
    BadFile("cluster-zero-nodes", lambda: json.dumps(_a100(num_nodes=0)), "cluster",
            ("num_nodes",)),
]  # fmt: skip


@pytest.mark.parametrize("bad", BAD_FILES, ids=lambda bad: bad.name)
def test_bad_file_is_one_line_naming_the_file(bad: BadFile, tmp_path: Path) -> None:
    """A broken model or cluster file: exit 2 and one line naming the file and the problem."""
    path = tmp_path / f"{bad.name}.json"
    path.write_text(bad.content())
    model, cluster = (path, A100) if bad.role == "model" else (GPT3, path)
    _assert_one_line_error(cli("estimate", model, cluster), str(path), *bad.needles)


def test_missing_file_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A file that does not exist: exit 2 and one line naming it, for ``estimate`` and ``info``."""
    missing = tmp_path / "nowhere.json"
    _assert_one_line_error(cli("estimate", missing, A100), str(missing))
    _assert_one_line_error(cli("info", missing), str(missing))


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        # Placed on 128 nodes, tp 7 does not even divide the devices.
        (["--tp", "7"], ("tp(7)", "1024")),
        # On 7 nodes it does, and the 96 heads are what tp 7 cannot split.
        (["--nodes", "7", "--tp", "7"], ("num_attention_heads", "96", "tp(7)")),
        (["--tp", "8", "--pp", "16", "--vpp", "4"], ("num_layers(96)", "pp(16)", "vpp(4)", "64")),
        (["--tp", "8", "--pp", "16", "--global-batch", "100"],
         ("global_batch(100)", "dp(8)", "mbs(1)")),
        (["--tp", "8", "--pp", "16", "--dp", "4"], ("dp(4)", "512", "1024")),
        (["--zero", "5"], ("--zero", "5")),
        (["--tp", "0"], ("--tp",)),
        (["--nodes", "0"], ("--nodes", "0")),
    ],
    ids=["tp-devices", "heads-by-tp", "layers-by-pp-vpp", "batch-by-dp-mbs", "dp-product",
         "zero-5", "tp-0", "nodes-0"],
)  # fmt: skip
def test_configuration_that_does_not_divide_is_one_line(
    options: list[str], needles: tuple[str, ...]
) -> None:
    """A configuration that does not divide, or an out-of-range option: exit 2 and one line
    showing the arithmetic that failed (or naming the option)."""
    _assert_one_line_error(cli("estimate", GPT3, A100, *options), *needles)


# ------------------------------------------------------------------ usage and option errors

@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", GPT3, A100, "--recompute", "bogus"], "bogus"),
        (["estimate", GPT3, A100, "--tp", "abc"], "--tp"),
        (["estimate", GPT3, A100, "--no-such-option"], "--no-such-option"),
        (["estimate", GPT3], "cluster"),
        (["schema", "graph"], "graph"),
    ],
    ids=["bad-choice", "not-an-integer", "unknown-option", "missing-argument", "schema-kind"],
)
def test_usage_error_exits_2_without_traceback(args: list[str], needle: str) -> None:
    """A command line that does not parse is a usage error: exit 2, the offending option or
    value on stderr, no traceback (click's usage message may take more than one line)."""
    done = cli(*args)
    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    assert needle in done.stderr


@pytest.mark.parametrize("content", [None, "[{,]"], ids=["missing", "malformed"])
def test_validate_bad_runs_file_is_one_line(content: str | None, tmp_path: Path) -> None:
    """``validate`` on a runs file that is missing or not JSON: exit 2, one line naming it."""
    path = tmp_path / "runs.json"
    if content is not None:
        path.write_text(content)
    _assert_one_line_error(cli("validate", path, "--json"), str(path))


@pytest.mark.parametrize("value", ["0", "-5"])
def test_info_rejects_a_non_positive_seq_len(value: str) -> None:
    """``info --seq-len`` must be positive, like ``estimate --seq-len``."""
    _assert_one_line_error(cli("info", GPT3, "--seq-len", value), "--seq-len")


@pytest.mark.parametrize("option", ["--seq-len", "--global-batch"])
def test_option_error_names_the_option_as_typed(option: str) -> None:
    """An out-of-range option is named as the user spells it on the command line."""
    _assert_one_line_error(cli("estimate", GPT3, A100, option, "0"), option)


# ------------------------------------------------------------ malformed input, every command

PLAN = "tests/fuzz_plan_uniform.json"


def _plan(**changes: Any) -> Json:
    data: Json = json.loads((REPO / PLAN).read_text())
    return data | changes


@dataclass(frozen=True)
class Malformed:
    """A command run on one broken file (written as ``bad.json``, put where ``{bad}`` is)."""

    args: tuple[str, ...]
    content: Callable[[], str | bytes] | None
    needles: tuple[str, ...]


MALFORMED = {
    "solve": Malformed(("solve", "{bad}", A100), lambda: json.dumps(_gpt3(num_layers=1000)),
                       ("num_layers: 1000 is above the limit of 256",)),
    "compare": Malformed(("compare", GPT3, "{bad}"),
                         lambda: json.dumps(_a100()).replace("80.0", "NaN", 1),
                         ("device.memory_gib", "finite number, got nan")),
    "simulate": Malformed(("simulate", "{bad}"), lambda: json.dumps(_plan())[:500],
                          ("invalid JSON at line 1, column",)),
    "export": Malformed(("export", "{bad}", "--format", "megatron", "--model", GPT3,
                         "--cluster", A100),
                        lambda: json.dumps(_plan(num_microbatches=10**6)),
                        ("num_microbatches 1000000 is above the limit",)),
    "explain": Malformed(("explain", "{bad}", "--model", GPT3, "--cluster", A100),
                         lambda: json.dumps(_plan(num_microbatches=10**6)),
                         ("num_microbatches 1000000 is above the limit",)),
    "estimate": Malformed(("estimate", GPT3, "{bad}"), lambda: bytes(range(256)),
                          ("not a text file",)),
    "info": Malformed(("info", "{bad}"), lambda: json.dumps(_hf_llama(num_hidden_layers="32")),
                      ("num_hidden_layers must be an integer, got '32'",)),
    "schema": Malformed(("schema", "cluster.json"), None, ("cluster.json",)),
    "layer": Malformed(("layer", GPT3, A100, "--dump-model", "{bad}"), None,
                       ("--dump-model", "is a directory")),
    # A malformed record is left out and listed (tests/test_validate_skips.py); a file that
    # holds no list of records is the error.
    "validate": Malformed(("validate", "{bad}"), lambda: json.dumps({"runs": []}),
                          ("bad.json", "expected a JSON list of run records")),
    "sweep": Malformed(("sweep", "{bad}", "--out", "{bad}.parquet"),
                       lambda: 'model = "m.json"\n[axes\n', ("invalid TOML at line 2",)),
    "runs from-log": Malformed(("runs", "from-log", "{bad}", "--model", GPT3, "--cluster", A100),
                               lambda: "step: 1  loss: 2.0  tps: many\n",
                               ("bad.json", "expected Megatron-LM iteration lines")),
    "calibrate": Malformed(("calibrate", "{bad}", "--gpu", "A100"),
                           lambda: "[" * 100_000 + "]" * 100_000,
                           ("JSON nested too deeply",)),
    "bench": Malformed(("bench", "{bad}", "--model", "tests/data/bench/tiny-llama.json"),
                       lambda: json.dumps(_a100()).replace("2039", '"fast"', 1),
                       ("bad.json", "memory_bandwidth_gb_s", "got 'fast'")),
    "profile": Malformed(("profile", "tests/data/bench/cpu-node.json", "--model", "{bad}",
                          "--out", "{bad}.profile.json"),
                         lambda: '{"name": "m", "num_layers": 2,',
                         ("bad.json", "invalid JSON at line 1")),
    "calibrate-network": Malformed(("calibrate-network", A100, "{bad}"),
                                   lambda: "# nThread 1 nGpus 8\nsize time\n",
                                   ("bad.json", "expected nccl-tests output")),
}  # fmt: skip


def test_every_command_has_a_malformed_input_case() -> None:
    """A new command gets its malformed-input case here."""
    from planner.cli import app

    groups = {f"{group.name} {command.name}" for group in app.registered_groups
              for command in group.typer_instance.registered_commands}  # fmt: skip
    assert set(MALFORMED) == {command.name for command in app.registered_commands} | groups


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=_needs(*case.args)) for case in MALFORMED.values()],
    ids=list(MALFORMED),
)
def test_malformed_input_is_one_line_for_every_command(case: Malformed, tmp_path: Path) -> None:
    """Each command on a broken file (or a folder where a file belongs): exit 2, one line on
    stderr naming the file and the problem, no traceback."""
    bad = tmp_path / "bad.json"
    if case.content is None:
        bad.mkdir()
    else:
        content = case.content()
        bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    args = [arg.replace("{bad}", str(bad)) for arg in case.args]
    _assert_one_line_error(cli(*args), *case.needles)


# --------------------------------------------------------------------------- calibrate-network

NCCL = REPO / "tests" / "data" / "nccl"


def test_calibrate_network_is_also_two_words() -> None:
    """``planner calibrate network`` (the issue's spelling) runs calibrate-network, --debug
    before it or not; ``calibrate`` with a runs file named otherwise is calibrate."""
    args = (NCCL / "h100-pcie-nvlink-pair.json", NCCL / "all_reduce_perf_sample.txt")
    hyphen = cli("calibrate-network", *args)
    assert hyphen.returncode == 0, hyphen.stderr
    for spelled in (("calibrate", "network"), ("--debug", "calibrate", "network")):
        two = cli(*spelled, *args)
        assert (two.returncode, two.stdout) == (0, hyphen.stdout), two.stderr
    _assert_one_line_error(cli("calibrate", "networks", "--gpu", "A100"), "networks")


def test_calibrate_network_writes_only_the_level(tmp_path: Path) -> None:
    """--write puts the fit into the cluster file; a bad table leaves the file as it was."""
    cluster = tmp_path / "pair.json"
    cluster.write_text((NCCL / "h100-pcie-nvlink-pair.json").read_text())
    wrong = tmp_path / "all_reduce_perf.txt"
    wrong.write_text((NCCL / "all_reduce_perf_sample.txt").read_text().replace(
        "  0   9291.5", "  2   9291.5"))
    before = cluster.read_text()
    _assert_one_line_error(cli("calibrate-network", cluster, wrong, "--write"),
                           str(wrong), "#wrong 2")
    _assert_one_line_error(cli("calibrate-network", cluster, NCCL / "all_reduce_perf_sample.txt",
                                "--level", "1", "--write"), "levels 0 to 0")
    assert cluster.read_text() == before
    done = cli("calibrate-network", cluster, NCCL / "all_reduce_perf_sample.txt", "--write")
    assert done.returncode == 0, done.stderr
    level = json.loads(cluster.read_text())["network"][0]
    assert level["efficiency"]["bandwidth_fraction"] == 0.3856
    assert "all_reduce_perf_sample.txt" in level["efficiency"]["source"]


def test_calibrate_network_keeps_a_bundled_file_as_it_was_laid_out(tmp_path: Path) -> None:
    """A bundled cluster file keeps its 14 validated runs a line each; --write expanded each
    to a dozen lines (~200 lines of diff for one number). Only the level's two lines change."""
    cluster = tmp_path / "dgx-h100-80gb.json"
    original = (REPO / "instances/clusters/dgx-h100-80gb.json").read_text()
    cluster.write_text(original)
    done = cli("calibrate-network", cluster, NCCL / "all_reduce_perf_sample.txt", "--write")
    assert done.returncode == 0, done.stderr
    after = cluster.read_text().splitlines()
    changed = [b for a, b in zip(original.splitlines(), after, strict=True) if a != b]
    assert [line.split(":")[0].strip() for line in changed] == [
        '"bandwidth_fraction"', '"source"']


@pytest.mark.parametrize("command", ["estimate", "solve"])
def test_fp8_on_a_device_without_a_measured_speedup_is_one_line(command: str) -> None:
    """The FP8 stack on an A100 (no FP8 GEMMs measured, ``efficiency.fp8`` absent): one error
    naming the field and the bench that measures it, from ``estimate`` and ``solve`` alike."""
    done = cli(command, "instances/models/llama3-8b.json",
                "instances/clusters/dgx-a100-80gb.json", "--nodes", "1",
                "--stack", "megatron-te-fp8")  # fmt: skip
    _assert_one_line_error(done, "stack megatron-te-fp8: device A100-SXM4-80GB has no FP8 GEMM",
                           "device.efficiency.fp8", "planner bench CLUSTER --model MODEL --fp8")


def test_solve_json_keeps_its_notes_on_stderr() -> None:
    """A pin the plan has no room for is said beside ``--json`` too, on stderr, with stdout
    one plan JSON (the note was dropped under ``--json``)."""
    done = cli("solve", MIXTRAL, H100, "--nodes", "1", "--tp", "8", "--ep", "1",
               "--moe-dispatcher", "deepep", "--global-batch", "64", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["configuration"]["tp"] == 8
    assert done.stderr.startswith("note: --moe-dispatcher deepep: the plan spreads no experts")
