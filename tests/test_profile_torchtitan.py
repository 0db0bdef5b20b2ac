"""``planner profile --framework torchtitan``: torchtitan's own Llama 3 block (v0.2.2), and its
Qwen3 block with experts, built at each shard, profiled on the CPU and priced on the
``torchtitan-eager`` stack as it measured;
what it keeps is the stack's count but for the norms, which a CPU runs composite; a model
that is not Llama-shaped, a compiled stack and a missing package are refused in one line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.spec.reading import load_model, read_profile
from tests.conftest import HF, REPO, shared
from tests.test_profile import CPU_NODE, TINY, _planner

needs_torchtitan = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchtitan") is None,
    reason="--framework torchtitan needs PyTorch and torchtitan (the test extra has both)")
SHAPE = ("--precision", "fp32", "--seq-len", "256", "--tp", "1", "--device", "cpu")


@pytest.fixture(scope="module")
def titan_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama profiled with torchtitan's block at TP 1 and 2, microbatch 1."""
    out = tmp_path_factory.mktemp("titan") / "titan.json"
    done = _planner("profile", CPU_NODE, "--model", TINY, "--framework", "torchtitan", *SHAPE,
                    "--tp", "2", "--mbs", "1", "--repeats", "1", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    return out


@needs_torchtitan
def test_torchtitans_block_prices_a_torchtitan_eager_step_as_measured(titan_profile: Path) -> None:
    """The tiny Llama's layers run as torchtitan builds them: the profile names torchtitan
    and the torchtitan-eager stack, an estimate on that stack prices the step's compute as the
    embedding, two blocks and the head measured, and one on another stack is refused."""
    out = titan_profile
    profile = read_profile(out)
    assert profile.stack == "torchtitan-eager"
    assert profile.layer_code.startswith("torchtitan v0.2.2")
    assert sorted(m.label() for m in profile.measured) == [
        "dense tp1 1x256", "dense tp2 1x256", "embedding tp1 1x256", "embedding tp2 1x256",
        "head tp1 1x256", "head tp2 1x256"]
    priced = _planner("estimate", TINY, CPU_NODE, "--stack", "torchtitan-eager", "--profile",
                      out, "--json")  # fmt: skip
    assert priced.returncode == 0, priced.stderr
    result = json.loads(priced.stdout)
    passes = {m.kind: m.forward_s + m.backward_s for m in profile.measured  # type: ignore[operator]
              if m.tensor_parallel == 1}  # fmt: skip
    microbatch = passes["embedding"] + 2 * passes["dense"] + passes["head"]
    assert result["time"]["compute_s"] == pytest.approx(8 * microbatch, rel=1e-6)
    assert "dense: measured (tp1 1x256)" in result["profiled"]
    refused = _planner("estimate", TINY, CPU_NODE, "--stack", "hf-eager", "--profile", out)
    assert refused.returncode == 2
    assert "measured on torchtitan-eager; this run is priced on hf-eager" in " ".join(
        refused.stderr.split())


@needs_torchtitan
def test_the_block_keeps_the_stacks_count_but_for_the_cpus_composite_norms(
    titan_profile: Path,
) -> None:
    """What torchtitan's block saves, over the torchtitan-eager count, at TP 1 and 2: exactly
    what the CPU's composite RMSNorm keeps beyond CUDA's fused kernel (its fp32 normalized
    output, 4 bytes an element, and a value a token, twice a layer) and SDPA's log-sum-exp
    (4 bytes a head and token)."""
    out = titan_profile
    model = load_model(TINY)
    for m in read_profile(out).measured:
        if m.kind != "dense":
            continue
        tokens, tp = m.micro_batch_size * m.seq_length, m.tensor_parallel
        h, heads, groups, ffn = (model.hidden_size, model.num_attention_heads // tp,
                                 model.query_groups // tp, model.ffn // tp)  # fmt: skip
        d = model.head_dim
        counted = 4 * (8 * h + 4 * heads * d + 4 * groups * d + 8 * ffn) / 2  # fp32: 4 B
        norms, lse = 2 * (4 * h + 4), 4 * heads
        assert m.kept_bytes == tokens * (counted + norms + lse), m.label()


@needs_torchtitan
def test_the_compiled_block_keeps_the_compiled_stacks_count(tmp_path: Path) -> None:
    """``--stack compile`` runs torchtitan's block under ``torch.compile`` (and its head, whose
    loss torchtitan compiles): what Inductor's partitioner saves is the torchtitan-compiled
    count, ``8h + 4q + 4kv + 6f`` in fp32 here, plus a value a token per norm and SDPA's
    log-sum-exp; the profile names the stack an estimate on it then takes."""
    out = tmp_path / "compiled.json"
    done = _planner("profile", CPU_NODE, "--model", TINY, "--framework", "torchtitan", *SHAPE,
                    "--stack", "compile", "--mbs", "1", "--repeats", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    profile = read_profile(out)
    assert profile.stack == "torchtitan-compiled"
    model = load_model(TINY)
    h, heads, groups, ffn, d = (model.hidden_size, model.num_attention_heads,
                                model.query_groups, model.ffn, model.head_dim)  # fmt: skip
    dense = next(m for m in profile.measured if m.kind == "dense")
    counted = 4 * (8 * h + 4 * heads * d + 4 * groups * d + 6 * ffn) / 2  # fp32: 4 B
    assert dense.kept_bytes == 256 * (counted + 2 * 4 + 4 * heads)
    priced = _planner("estimate", TINY, CPU_NODE, "--stack", "torchtitan-compiled",
                      "--profile", out)  # fmt: skip
    assert priced.returncode == 0, priced.stderr


@needs_torchtitan
def test_torchtitans_moe_block_and_grouped_experts_price_the_step(tmp_path: Path) -> None:
    """The tiny MoE model (q/k norms, a shared expert, its first layer dense) runs torchtitan's
    Qwen3 blocks: the MoE block around its routed experts, and the experts apart as
    torchtitan's ``GroupedExperts`` on the rows each computes; a step on the torchtitan-eager
    stack prices each part as measured, its routed experts at the rows a microbatch routes."""
    out = tmp_path / "moe.json"
    model = REPO / "tests/data/bench/tiny-moe.json"
    done = _planner("profile", CPU_NODE, "--model", model, "--framework", "torchtitan", *SHAPE,
                    "--mbs", "1", "--repeats", "1", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = read_profile(out)
    assert profile.layer_code == "torchtitan v0.2.2 (TransformerBlock, qwen3)"
    assert sorted(m.label() for m in profile.measured) == [
        "dense tp1 1x256", "embedding tp1 1x256", "experts tp1 ep1 1x256", "head tp1 1x256",
        "moe tp1 1x256"]
    priced = _planner("estimate", model, CPU_NODE, "--stack", "torchtitan-eager", "--profile",
                      out, "--json")  # fmt: skip
    assert priced.returncode == 0, priced.stderr
    result = json.loads(priced.stdout)
    passes = {m.kind: m.forward_s + m.backward_s for m in profile.measured}  # type: ignore[operator]
    microbatch = sum(passes.values())  # one layer of each kind
    assert result["time"]["compute_s"] == pytest.approx(8 * microbatch, rel=1e-6)
    assert "experts: measured (tp1 ep1 512 rows)" in result["profiled"]


@needs_torchtitan
def test_what_torchtitans_block_cannot_run_is_refused() -> None:
    """A model that is not Llama-shaped is refused naming what differs; ``--stack compile``
    runs torchtitan's blocks compiled (``torchtitan-compiled``), but for a model with experts,
    whose blocks torchtitan compiles submodule by submodule, refused before any layer runs;
    Colossal-AI's layers run eager only."""
    from planner.cli.profile import _profiled_stack
    from planner.diagnose.titan_layers import TorchtitanCode

    with pytest.raises(InputError, match="gpt3-175b has layernorm, not RMSNorm: without "
                       "--framework the planner's faithful layer runs"):  # fmt: skip
        TorchtitanCode(load_model(REPO / "instances/models/gpt3-175b.json"))
    tiny = load_model(TINY)
    assert _profiled_stack("torchtitan", "compile", tiny) == "torchtitan-compiled"
    assert _profiled_stack("torchtitan", "eager", tiny) == "torchtitan-eager"
    with pytest.raises(InputError, match="its layers run eager here"):
        _profiled_stack("colossalai", "compile", tiny)
    experts = shared(HF / "Qwen3-30B-A3B.config.json")
    done = _planner("profile", CPU_NODE, "--framework", "torchtitan", "--model", experts,
                    "--stack", "compile", *SHAPE, "--out", "/tmp/never-written.json")
    assert done.returncode == 2 and done.stdout == ""
    assert ("--stack compile --framework torchtitan: stack torchtitan-compiled: torchtitan "
            "compiles Qwen3-30B-A3B's blocks submodule by submodule, its routed experts eager, "
            "which the stack (counted on whole dense blocks) does not price; use "
            "torchtitan-eager") in " ".join(done.stderr.split())
    assert not Path("/tmp/never-written.json").exists()


def test_without_torchtitan_it_names_the_extra_and_the_faithful_layer() -> None:
    script = ("import sys\nsys.modules['torchtitan'] = None\nfrom planner.cli import main\n"
              "main()\n")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, "profile", str(CPU_NODE), "--model", str(TINY),
         "--framework", "torchtitan", *SHAPE, "--out", "/tmp/never-written.json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    message = " ".join(done.stderr.split())
    assert "planner[torchtitan]" in message and "faithful layer" in message
