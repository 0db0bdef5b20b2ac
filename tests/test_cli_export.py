"""`planner estimate --out` writes the configuration as a plan; `planner export` turns a plan
into a framework's launch configuration."""

from __future__ import annotations

import json
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.plan.files import plan_from_json
from planner.report.bands import with_band
from planner.report.output import write_atomic
from tests.cli_process import cli
from tests.test_cli import A100, GPT3, _error_text

LLAMA = "instances/models/llama3-8b.json"
H100 = "instances/clusters/dgx-h100-80gb.json"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    done = cli("estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--sp", "--recompute",
                "selective", "--zero", "1", "--out", path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture(scope="module")
def any_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A per-operator plan (``--framework any``) of Llama 3 8B on one node."""
    path = tmp_path_factory.mktemp("any") / "plan.json"
    done = cli("solve", LLAMA, H100, "--nodes", "1", "--framework", "any", "--out", path)
    assert done.returncode == 0, done.stderr
    return path


def test_estimate_out_writes_a_plan(plan_file: Path) -> None:
    """The plan reads back, says what was priced and carries the configuration, complete."""
    plan = plan_from_json(plan_file.read_text())
    assert plan.summary().startswith("TP8 x PP16 x DP8, mbs 1, 1F1B, sequence parallel")
    assert (plan.method, plan.framework) == ("uniform", "megatron")
    assert plan.configuration is not None
    assert (plan.configuration.dp, plan.configuration.global_batch) == (8, 1536)


def test_export_megatron_flags(plan_file: Path, tmp_path: Path) -> None:
    """To a file: the flags parse back to the plan's degrees and the model's shape; stderr
    says the prediction against the device's memory."""
    out = tmp_path / "megatron.sh"
    done = cli("export", plan_file, "--format", "megatron", "--model", GPT3, "--cluster", A100,
                "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    words = shlex.split(out.read_text().replace("\\\n", " "))
    flags = dict(pairwise(words))  # each flag to the word after it
    assert flags["--tensor-model-parallel-size"] == "8"
    assert flags["--pipeline-model-parallel-size"] == "16"
    assert (flags["--num-layers"], flags["--hidden-size"]) == ("96", "12288")
    assert "--use-distributed-optimizer" in words and "--sequence-parallel" in words
    plan = plan_from_json(plan_file.read_text())
    assert (f"predicted {with_band(plan.predicted.step_time_s, plan.predicted.error_band)} per "
            f"step, "
            f"{plan.predicted.peak_memory_gib:.1f} GiB peak per device of 80 GiB") in done.stderr


def test_export_defaults_to_the_framework_the_plan_was_made_for(
    plan_file: Path, any_plan: Path
) -> None:
    """Without ``--format``, a plan estimated (or solved) for Megatron-LM exports as Megatron-LM
    launches it, the same text as with ``--format megatron``; a plan made for ``any`` names
    no framework, so the user is asked for one."""
    inputs = ("--model", GPT3, "--cluster", A100)
    default = cli("export", plan_file, *inputs)
    named = cli("export", plan_file, "--format", "megatron", *inputs)
    assert default.returncode == named.returncode == 0, default.stderr
    assert default.stdout == named.stdout and "--pipeline-model-parallel-size 16" in default.stdout
    done = cli("export", any_plan, "--model", LLAMA, "--cluster", H100)
    assert done.returncode == 2
    assert _error_text(done.stderr) == (
        "error: the plan was made for 'any', not for one framework: pass --format, one of "
        "megatron, mindspeed, deepspeed, colossalai, torchtitan")


def test_export_of_a_per_operator_plan_is_refused(any_plan: Path) -> None:
    """A plan solved for ``any`` has no framework's launch: exit 2, one line, with the command
    that solves for the framework asked."""
    done = cli("export", any_plan, "--format", "torchtitan", "--model", LLAMA, "--cluster", H100)
    assert done.returncode == 2
    text = _error_text(done.stderr)
    assert "per-operator shardings, which no framework launches" in text
    assert f"planner solve {LLAMA} {H100} --nodes 1" in text
    assert "--framework torchtitan" in text


def test_export_to_a_framework_that_refuses_names_why(plan_file: Path) -> None:
    """Megatron's selective recomputation is not Colossal-AI's: refused, with the reason and
    the command that solves for Colossal-AI."""
    done = cli("export", plan_file, "--format", "colossalai", "--model", GPT3, "--cluster",
                A100)  # fmt: skip
    assert done.returncode == 2, done.stdout
    text = _error_text(done.stderr)
    assert text.startswith("error: Colossal-AI cannot launch this plan: ")
    assert "--framework colossalai" in text


def test_export_errors_are_one_line(plan_file: Path, tmp_path: Path) -> None:
    """Unknown format, a missing plan, a plan of another schema version, another model: exit
    2, one line."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(json.loads(plan_file.read_text()) | {"schema_version": 9}))
    inputs = ("--model", GPT3, "--cluster", A100)
    for args, needle in (
        ((plan_file, "--format", "slurm", *inputs), "choose from megatron, mindspeed"),
        ((tmp_path / "none.json", "--format", "megatron", *inputs), "cannot read"),
        ((bad, "--format", "megatron", *inputs), "schema_version 9 is not supported"),
        ((plan_file, "--format", "megatron", "--model", LLAMA, "--cluster", A100),
         "is not the model the plan was made for"),
    ):
        done = cli("export", *args)
        assert done.returncode == 2 and needle in _error_text(done.stderr), done.stderr


def test_write_atomic_refuses_inputs_and_folders(tmp_path: Path) -> None:
    """Never over an input, never a folder, never a folder that is missing; otherwise the
    file appears whole."""
    source = tmp_path / "model.json"
    source.write_text("{}")
    with pytest.raises(InputError, match="is one of the inputs"):
        write_atomic(source, "x", inputs=[source])
    with pytest.raises(InputError, match="is a directory"):
        write_atomic(tmp_path, "x")
    with pytest.raises(InputError, match="does not exist"):
        write_atomic(tmp_path / "no" / "plan.json", "x")
    write_atomic(tmp_path / "plan.json", "whole")
    assert (tmp_path / "plan.json").read_text() == "whole"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_solve_then_export_round_trip(framework: str, tmp_path: Path) -> None:
    """``solve --framework F --out`` then ``export --format F``: exit 0, the launch text on
    stdout, the prediction on stderr, nothing changed."""
    plan_path = tmp_path / "plan.json"
    done = cli("solve", LLAMA, H100, "--nodes", "2", "--global-batch", "128", "--seq-len",
                "8192", "--framework", framework, "--out", plan_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    exported = cli("export", plan_path, "--format", framework, "--model", LLAMA, "--cluster",
                    H100)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    plan = plan_from_json(plan_path.read_text())
    p = plan.predicted
    assert f"predicted {with_band(p.step_time_s, p.error_band)} per step" in exported.stderr
    assert "error" not in exported.stderr
    if framework == "torchtitan":
        import tomllib

        tables = tomllib.loads(exported.stdout)
        assert tables["training"]["global_batch_size"] == 128
    else:
        assert "--global-batch-size 128" in exported.stdout


def test_estimate_out_says_when_its_framework_cannot_launch_it(tmp_path: Path) -> None:
    """``estimate --framework torchtitan --out`` of TP without SP (``--no-sp`` given: the
    framework's switches would set it) writes the plan (it was priced) and says, after the
    tables, the reason torchtitan's profile gives, which is the reason ``export`` then refuses
    it with; a configuration the framework launches gets no such note, only the one naming
    the switches ``--framework`` set."""
    model, cluster = "instances/models/llama3-70b.json", "instances/clusters/dgx-h100-80gb.json"
    plan = tmp_path / "plan.json"
    done = cli("estimate", model, cluster, "--nodes", "16", "--tp", "8", "--pp", "8",
                "--zero", "1", "--no-sp", "--recompute", "full", "--framework",
                "torchtitan", "--out", plan)  # fmt: skip
    assert done.returncode == 0 and plan.exists(), done.stderr
    assert "note:" in done.stderr and "torchtitan, which cannot launch it" in done.stderr
    assert "without sp" in done.stderr
    refused = cli("export", plan, "--format", "torchtitan", "--model", model,
                   "--cluster", cluster)  # fmt: skip
    assert refused.returncode == 2 and "without sp" in refused.stderr
    fine = cli("estimate", model, cluster, "--nodes", "16", "--tp", "8", "--pp", "8",
                "--zero", "1", "--sp", "--framework", "megatron", "--out", tmp_path / "m.json")
    assert fine.returncode == 0 and "cannot launch" not in fine.stderr, fine.stderr
    assert fine.stderr.startswith("note: Megatron-LM's switches as solve sets them: "
                                  "--overlap-grad-reduce --overlap-param-gather")  # fmt: skip
