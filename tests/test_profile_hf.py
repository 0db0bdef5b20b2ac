"""``planner profile --framework transformers``: Hugging Face's own layers, built from the
model's config.json at each shard, profiled on the CPU and priced as they measured; the
frameworks whose layers are not run, a planner model file, and a missing package are each
refused in one line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from planner.sharding.profiled import with_profile
from planner.spec.reading import load_cluster, load_model, read_profile
from tests.conftest import REPO
from tests.test_profile import CPU_NODE, DATA, TINY, _planner, microbatch_s, priced_from

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="--framework transformers needs PyTorch and transformers (the test extra has both)")
TINY_LLAMA_HF = DATA / "tiny-llama.config.json"
TINY_MIXTRAL_HF = DATA / "tiny-mixtral.config.json"
SHAPE = ("--precision", "fp32", "--seq-len", "256")


def _profiled(tmp_path: Path, model: Path, *extra: str) -> tuple[Path, dict]:
    """Profile ``model`` with transformers' layers at TP 1, microbatch 1; price it."""
    out = tmp_path / "hf.json"
    done = _planner("profile", CPU_NODE, "--model", model, "--framework", "transformers",
                    "--device", "cpu", "--tp", "1", "--mbs", "1", "--repeats", "1", *SHAPE,
                    *extra, "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    return out, priced_from(model, out, "--global-batch", "8", *SHAPE)


@needs_transformers
def test_hugging_face_llama_layers_price_the_step_as_measured(tmp_path: Path) -> None:
    """The tiny Llama's config.json: transformers' LlamaDecoderLayer runs at TP 1; the
    profile names transformers as its layer code, and the step's compute is the embedding,
    the two layers and the head as measured. The layer keeps within 5 % of the bytes the
    hf-eager accounting prices (fp32 on the CPU: its norms keep their input and output, every
    projection shares the norm's output)."""
    out, result = _profiled(tmp_path, TINY_LLAMA_HF)
    profile = read_profile(out)
    assert profile.layer_code.startswith("transformers 5.")
    assert [m.label() for m in profile.measured] == [
        "embedding tp1 1x256", "dense tp1 1x256", "head tp1 1x256"]
    assert result["time"]["compute_s"] == pytest.approx(
        8 * microbatch_s(out, {"dense": 2}), rel=1e-6)
    profiled = with_profile(load_cluster(CPU_NODE), load_model(TINY_LLAMA_HF), profile)
    factors = profiled.device.efficiency.profile
    assert factors is not None
    kept = {f.kind: f.kept for f in factors.layers}
    assert kept["dense"] == pytest.approx(1.0, abs=0.05)  # measured 1.01-1.03
    assert kept["head"] == pytest.approx(1.0, abs=0.02)


@needs_transformers
def test_hugging_face_mixtral_layers_are_measured_around_and_in_their_experts(
        tmp_path: Path) -> None:  # fmt: skip
    """The tiny Mixtral's config.json: its MoE layer with the experts module replaced, and
    the experts module (8 then 4 experts) on balanced routing; the step prices the layer as
    the two parts measured."""
    out, result = _profiled(tmp_path, TINY_MIXTRAL_HF, "--ep", "1", "--ep", "2")
    assert [m.label() for m in read_profile(out).measured] == [
        "embedding tp1 1x256", "moe tp1 1x256", "head tp1 1x256", "experts tp1 ep1 1x256",
        "experts tp1 ep2 1x256"]
    parts = {"moe": 2, "experts": 2}
    ep1 = microbatch_s(out, parts) - next(
        m.forward_s + m.backward_s for m in read_profile(out).measured  # type: ignore[operator]
        if m.label() == "experts tp1 ep2 1x256") * 2
    assert result["time"]["compute_s"] == pytest.approx(8 * ep1, rel=1e-6)
    assert "experts: measured (tp1 ep1 512 rows)" in result["profiled"]


@pytest.mark.parametrize(("args", "says"), [
    (("--framework", "megatron", "--model", TINY_LLAMA_HF),
     "--framework megatron: the layers profiled are transformers', colossalai's or "
     "torchtitan's or, without --framework, the planner's faithful layer (as --stack names); "
     "Megatron-Core's own layers are not run yet"),
    (("--framework", "transformers", "--model", TINY),
     "transformers builds its layers from the model's Hugging Face config.json;"),
])
def test_layers_it_cannot_run_are_refused_in_one_line(args: tuple[str, ...], says: str) -> None:
    done = _planner("profile", CPU_NODE, *args, "--device", "cpu", *SHAPE, "--out",
                    "/tmp/never-written.json")  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert says in " ".join(done.stderr.split())
    assert len(done.stderr.strip().splitlines()) <= 3  # one message, wrapped at 80 columns


@pytest.mark.parametrize("missing", ["transformers", "torch"])
def test_without_transformers_it_names_the_package_and_the_faithful_layer(missing: str) -> None:
    """Without transformers, or without PyTorch, the one line names the extra that installs
    both."""
    script = (f"import sys\nsys.modules['{missing}'] = None\nfrom planner.cli import main\n"
              "main()\n")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, "profile", str(CPU_NODE), "--model", str(TINY_LLAMA_HF),
         "--framework", "transformers", "--device", "cpu", *SHAPE, "--out",
         "/tmp/never-written.json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    message = " ".join(done.stderr.split())
    assert "planner[transformers]" in message
    if missing == "transformers":
        assert "needs the transformers package" in message
        assert "without --framework the planner's faithful layer runs" in message
    else:
        assert "--framework transformers needs PyTorch" in message


@needs_transformers
def test_colossalai_profiles_hugging_faces_layers_cast_to_its_precision(tmp_path: Path) -> None:
    """``--framework colossalai`` runs Hugging Face's layers as Colossal-AI casts them (no
    autocast): a profile of the ``colossalai-hf`` stack, whose layer at TP 1 and 2 keeps
    exactly that stack's count plus SDPA's log-sum-exp, the norms' value a token (the norm
    runs as written on any device) and the rotary cosines and sines, which the profiled layer
    computes for itself (a model, once for all its layers)."""
    out = tmp_path / "colossalai.json"
    done = _planner("profile", CPU_NODE, "--model", TINY_LLAMA_HF, "--framework", "colossalai",
                    "--device", "cpu", "--tp", "1", "--tp", "2", "--mbs", "1", "--repeats", "1",
                    *SHAPE, "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = read_profile(out)
    assert profile.stack == "colossalai-hf" and profile.layer_code.startswith("transformers 5.")
    model = load_model(TINY_LLAMA_HF)
    layers = [m for m in profile.measured if m.kind == "dense"]
    assert [m.tensor_parallel for m in layers] == [1, 2]
    for m in layers:
        tp, tokens, d = m.tensor_parallel, m.micro_batch_size * m.seq_length, model.head_dim
        q, kv = model.num_attention_heads // tp * d, model.query_groups // tp * d
        # fp32, 4 bytes an element: each norm's input and normalized output and the output its
        # projections read, q, k, v and the attention's output, gate, up, SiLU's output, product
        counted = 4 * (6 * model.hidden_size + 2 * q + 2 * kv + 4 * model.ffn // tp)
        extra = 4 * model.num_attention_heads // tp + 2 * 4 + 2 * 4 * d  # lse, rstd, cos, sin
        assert m.kept_bytes == tokens * (counted + extra), m.label()
