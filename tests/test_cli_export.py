"""`planner estimate --out` writes the configuration as a plan; `planner export` turns a plan
into a framework's launch configuration."""

from __future__ import annotations

import json
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.output import write_atomic
from planner.plan import Plan
from tests.test_cli import A100, GPT3, _run


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    done = _run("estimate", GPT3, A100, "--tp", "8", "--pp", "16", "--sp", "--recompute",
                "selective", "--zero", "1", "--out", path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


def test_estimate_out_writes_a_plan(plan_file: Path) -> None:
    """The plan reads back and says what was priced."""
    plan = Plan.from_json(plan_file.read_text())
    assert plan.summary().startswith("TP8 x PP16 x DP8, mbs 1, 1F1B, sequence parallel")
    assert plan.method == "uniform"


def test_export_megatron_flags(plan_file: Path, tmp_path: Path) -> None:
    """To a file: the flags parse back to the plan's degrees; nothing needed changing."""
    out = tmp_path / "megatron.sh"
    done = _run("export", plan_file, "--format", "megatron", "--out", out)
    assert done.returncode == 0 and done.stderr == ""
    words = shlex.split(out.read_text().replace("\\\n", " "))
    flags = dict(pairwise(words))  # each flag to the word after it
    assert flags["--tensor-model-parallel-size"] == "8"
    assert flags["--pipeline-model-parallel-size"] == "16"
    assert "--use-distributed-optimizer" in words and "--sequence-parallel" in words


def test_export_notes_changes_with_their_price(plan_file: Path) -> None:
    """DeepSpeed's config cannot carry tensor or pipeline degrees: a note says so, and with
    the model and cluster the closest configuration is priced."""
    done = _run("export", plan_file, "--format", "deepspeed", "--model", GPT3, "--cluster", A100)
    assert done.returncode == 0
    assert json.loads(done.stdout)["train_batch_size"] == 1536
    notes = done.stderr.strip().splitlines()
    assert notes[0].startswith("note: not ds_config keys")
    assert "predicted at" in notes[-1]


def test_export_errors_are_one_line(plan_file: Path, tmp_path: Path) -> None:
    """Unknown format, a missing plan, a plan of another schema version: exit 2, one line."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(json.loads(plan_file.read_text()) | {"schema_version": 9}))
    for args, needle in (
        ((plan_file, "--format", "slurm"), "formats: megatron"),
        ((tmp_path / "none.json", "--format", "megatron"), "cannot read"),
        ((bad, "--format", "megatron"), "schema_version 9 is not supported"),
    ):
        done = _run("export", *args)
        assert done.returncode == 2 and needle in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


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
