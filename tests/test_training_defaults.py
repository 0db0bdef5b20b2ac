"""The run's sequence length, global batch and precision are filled in one place
(:func:`planner.spec.reading.fill_training`): every entry point takes the options first, the
model's training block next, and refuses a missing setting with one InputError naming the
command-line options to pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from planner.diagnose.info import model_info
from planner.errors import InputError
from planner.ilp import layer_query
from planner.options import SolveOptions, training_of
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import fill_training, load_cluster, load_model
from tests.conftest import CLUSTERS, MODELS


@pytest.fixture(scope="module")
def gpt3() -> ModelSpec:
    return load_model(MODELS / "gpt3-175b.json")


@pytest.fixture(scope="module")
def bare(gpt3: ModelSpec) -> ModelSpec:
    """GPT-3 175B without its training block."""
    return gpt3.model_copy(update={"training": None})


@pytest.fixture(scope="module")
def cluster() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-a100-80gb.json", 16)


def test_options_win_over_the_training_block(gpt3: ModelSpec) -> None:
    """Each setting given is kept; each left out comes from the model's block."""
    assert gpt3.training is not None
    filled = fill_training(gpt3, seq_length=1024, precision="fp16")
    assert (filled.seq_length, filled.global_batch_size, filled.precision) == (
        1024, gpt3.training.global_batch_size, "fp16")  # fmt: skip
    assert fill_training(gpt3) == gpt3.training


@pytest.mark.parametrize(
    ("given", "missing"),
    [({}, "no sequence length and no global batch size (the model has no training block): "
          "pass --seq-len and --global-batch"),
     ({"seq_length": 2048}, "no global batch size (the model has no training block): pass "
                            "--global-batch"),
     ({"global_batch_size": 8}, "no sequence length (the model has no training block): pass "
                                "--seq-len")],
    ids=["both", "batch", "sequence"],
)  # fmt: skip
def test_a_missing_setting_names_its_option(
    bare: ModelSpec, given: dict[str, int], missing: str
) -> None:
    """Without a training block, exactly the settings not given are named, as the command
    line spells them; precision alone has a default (bf16)."""
    with pytest.raises(InputError) as caught:
        fill_training(bare, **given)  # type: ignore[arg-type]
    assert str(caught.value) == f"gpt3-175b: {missing}"
    assert fill_training(bare, seq_length=8, global_batch_size=8).precision == "bf16"


def _entry_points(cluster: ClusterSpec) -> dict[str, Callable[[ModelSpec], object]]:
    return {
        "solve": lambda m: training_of(m, SolveOptions(global_batch_size=8)),
        "estimate": lambda m: resolve(m, cluster, ParallelConfig(tp=8, global_batch=128)),
        "layer": lambda m: layer_query(m, kind="dense", mesh="1x8"),
    }


@pytest.mark.parametrize("entry", ["solve", "estimate", "layer"])
def test_every_entry_point_refuses_alike(
    bare: ModelSpec, cluster: ClusterSpec, entry: str
) -> None:
    """``solve``'s options, ``estimate``'s configuration and ``layer``'s query all refuse a
    model without a training block and without ``--seq-len`` with the same InputError."""
    with pytest.raises(InputError, match=r"^gpt3-175b: no sequence length \(the model has no "
                                         r"training block\): pass --seq-len$"):  # fmt: skip
        _entry_points(cluster)[entry](bare)


def test_entry_points_take_the_block(gpt3: ModelSpec, cluster: ClusterSpec) -> None:
    """With the block, every entry point runs at the block's sequence length and precision;
    ``info`` falls back to the longest sequence only for a model without one."""
    block = gpt3.training
    assert block is not None
    assert training_of(gpt3, SolveOptions()) == block
    assert resolve(gpt3, cluster, ParallelConfig(tp=8, pp=16)).training == block
    query = layer_query(gpt3, kind="dense", mesh="1x8")
    assert (query.seq_length, query.precision) == (block.seq_length, block.precision)
    assert model_info(gpt3)["seq_length"] == block.seq_length
    bare = gpt3.model_copy(update={"training": None})
    assert model_info(bare)["seq_length"] == gpt3.max_position_embeddings


def test_a_zero_sequence_is_refused_not_replaced(gpt3: ModelSpec) -> None:
    """A sequence length of 0 is an error to report, not a missing option to fill from the
    block."""
    with pytest.raises(InputError, match=r"--seq-len must be positive, got 0"):
        layer_query(gpt3, kind="dense", mesh="1x8", seq_len=0)
    with pytest.raises(InputError, match=r"^--seq-len"):
        training_of(gpt3, SolveOptions(seq_length=0))
