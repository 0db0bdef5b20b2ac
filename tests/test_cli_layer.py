"""`planner layer`: one layer's ILP from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_process import cli
from tests.test_cli import A100, GPT3, _error_text


def test_layer_json_and_dump(tmp_path: Path) -> None:
    """--json gives the solution (Megatron's pattern on one node for GPT-3); --dump-model
    writes the program in LP format, with one one-hot row per node."""
    lp = tmp_path / "layer.lp"
    done = cli("layer", GPT3, A100, "--mesh", "1x8", "--json", "--dump-model", lp)
    assert done.returncode == 0, done.stderr
    solution = json.loads(done.stdout)
    strategies = {c["op"].split(".")[-1]: c["strategy"] for c in solution["choices"]}
    assert strategies["qkv_proj"] == "R,heads" and strategies["mlp_down"] == "R,ffn"
    assert solution["report"]["status"] == "optimal"
    text = lp.read_text()
    assert text.startswith("\\ layer\nMinimize") and text.count("one_strategy_") == 9


def test_layer_infeasible_budget_is_one_line() -> None:
    """A budget below what any sharding needs: exit 2, one line with the least memory."""
    done = cli("layer", GPT3, A100, "--mesh", "1x8", "--budget-gib", "0.5")
    assert done.returncode == 2
    assert "least memory any choice needs is 3.90 GiB" in _error_text(done.stderr)


def test_layer_bad_options() -> None:
    """A malformed mesh or a kind the model lacks: exit 2 with the allowed values."""
    bad_mesh = cli("layer", GPT3, A100, "--mesh", "8")
    assert bad_mesh.returncode == 2 and "--mesh must look like 2x4" in bad_mesh.stderr
    bad_kind = cli("layer", GPT3, A100, "--kind", "moe")
    assert bad_kind.returncode == 2 and "has no 'moe' layer" in bad_kind.stderr


def test_layer_with_deepep() -> None:
    """--moe-dispatcher deepep: Mixtral's MoE layer on two nodes (2x8) takes no strategy that
    spreads the experts one rank a node (DeepEP's groups beyond a node take 8 from each),
    and the program has fewer variables for it; a model without experts is refused in one
    line."""
    mixtral = "instances/models/mixtral-8x7b.json"
    h100 = "instances/clusters/dgx-h100-80gb.json"
    args = ("layer", mixtral, h100, "--nodes", "2", "--kind", "moe", "--mesh", "2x8", "--mbs",
            "16", "--json")  # fmt: skip
    free, pinned = (json.loads(cli(*args, *extra).stdout)
                    for extra in ((), ("--moe-dispatcher", "deepep")))  # fmt: skip
    for solution in (free, pinned):
        assert solution["report"]["status"] == "optimal"
    assert pinned["report"]["num_variables"] < free["report"]["num_variables"]
    for choice in pinned["choices"]:
        axis0 = choice["strategy"].split(",")[0]
        assert not axis0.startswith("experts"), choice
    dense = cli("layer", GPT3, A100, "--moe-dispatcher", "deepep")
    assert dense.returncode == 2 and "has no experts to exchange" in _error_text(dense.stderr)
