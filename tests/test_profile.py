"""planner profile and --profile: a profile's measurements price exactly the shards they
measured, the shared H100 layer measurements price its one-GPU steps, and a profile of another
device, model, stack or schema is refused with what differs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.diagnose.calibration import bundled_clusters
from planner.diagnose.fit import cluster_of, sized_for
from planner.diagnose.layer_memory import read_layer_records
from planner.diagnose.profile_records import profile_from_records
from planner.diagnose.runs import load_runs
from planner.errors import InputError
from planner.plan.config import ParallelConfig
from planner.plan.degrees import Degrees
from planner.plan.inputs import input_hash
from planner.sharding.profiled import with_profile
from planner.sharding.uniform import UniformQuery, uniform_layout, uniform_parts
from planner.spec import TrainingSpec
from planner.spec.profile import LayerMeasurement, LayerProfile, layer_shape
from planner.spec.reading import load_cluster, load_model, read_profile
from planner.sweep import read_sweep, sweep_points
from planner.uniform.batch import estimate_batch
from planner.uniform.estimate import estimate
from tests.cli_process import cli
from tests.conftest import REPO
from tests.h100_layers import H100, SHAPES

DATA = REPO / "tests" / "data" / "bench"
CPU_NODE = DATA / "cpu-node.json"
TINY = DATA / "tiny-llama.json"
DGX_H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="planner profile needs PyTorch (the test extra has it)")


def _records() -> list[dict]:
    return read_layer_records(H100 / "layers.jsonl")


def _priced_steps() -> list[tuple[str, float, float]]:
    """Each one-GPU H100 step: its id, the step priced from the layer measurements of its
    stack, and the measured step."""
    clusters = bundled_clusters(REPO / "instances" / "clusters")
    steps = []
    for run in load_runs(H100 / "runs_one_gpu.json"):
        cluster = sized_for(run, cluster_of(run, clusters))
        profile = profile_from_records(_records(), run.model, device=cluster.device.name,
                                       compiled=run.config.stack == "hf-compiled")  # fmt: skip
        priced = estimate(run.model, with_profile(cluster, run.model, profile), run.config)
        assert run.measured_step_time_s is not None
        steps.append((run.id, priced.step_time_s, run.measured_step_time_s))
    return steps


def test_h100_steps_priced_from_the_layer_measurements() -> None:
    """The five one-GPU steps priced from ``layers.jsonl``, each within the issue's 5 %:
    measured -2.3 to +0.2 % eager and recomputed, -4.7 % compiled. The profile measures
    neither the embedding nor the optimizer there; they are modelled, the embedding's dense
    gradient and fused AdamW's fp32 master read with them (before they were, the compiled step
    was -5.5 %). What the isolated layers miss of a whole step only adds time, so no step may
    come out more than the recomputed step's +0.2 % over its measurement."""
    errors = {name: predicted / measured - 1 for name, predicted, measured in _priced_steps()}
    assert len(errors) == 5
    for name, error in errors.items():
        assert -0.05 < error < 0.005, (name, error)


def test_a_profiled_shard_prices_as_measured() -> None:
    """Priced back, each measured shard of Llama-3.1-8B (TP 1-8, eager) gives its own
    forward, backward and kept bytes: the split operators' factor takes up what the
    residual stream's (at the unsplit layer's factor) leaves."""
    model = SHAPES["llama3.1-8b"]
    cluster = load_cluster(DGX_H100)
    profile = profile_from_records(_records(), model, device=cluster.device.name,
                                   compiled=False)  # fmt: skip
    profiled = with_profile(cluster, model, profile)
    shards = [m for m in profile.measured if m.kind == "dense"]
    assert sorted(m.tensor_parallel for m in shards) == [1, 1, 1, 2, 4, 8]
    for m in shards:
        query = UniformQuery(kind="dense", layout=uniform_layout(Degrees(tp=m.tensor_parallel)),
                             micro_batch_size=m.micro_batch_size, seq_length=m.seq_length,
                             precision="bf16", stack="hf-eager")  # fmt: skip
        parts = uniform_parts(model, profiled, query)
        assert parts.forward_s == pytest.approx(m.forward_s, rel=1e-9), m.label()
        assert parts.backward_s == pytest.approx(m.backward_s, rel=1e-9), m.label()
        assert parts.kept_bytes[0] == pytest.approx(m.kept_bytes, rel=1e-9), m.label()
        # full recomputation reruns the measured forward
        assert parts.rerun_s[2] == pytest.approx(m.forward_s, rel=1e-9)


def test_without_a_profile_nothing_changes() -> None:
    """A cluster with no layers prices as before, and names no profile in the plan."""
    model = load_model(REPO / "instances" / "models" / "llama3-8b.json")
    cluster = load_cluster(DGX_H100, nodes=1)
    result = estimate(model, cluster, ParallelConfig(tp=2))
    assert result.profiled == ()


def _profile(model_name: str = "llama3.1-8b") -> LayerProfile:
    model = SHAPES[model_name]
    return profile_from_records(_records(), model, device="H100-SXM5-80GB", compiled=False)


def test_another_device_or_model_is_refused_naming_the_difference() -> None:
    cluster = load_cluster(DGX_H100)
    a100 = load_cluster(REPO / "instances" / "clusters" / "dgx-a100-80gb.json")
    with pytest.raises(InputError, match="measured on H100-SXM5-80GB, the cluster's device is"):
        with_profile(a100, SHAPES["llama3.1-8b"], _profile())
    with pytest.raises(InputError, match="hidden_size 4096 in the profile, 2048 in the model"):
        with_profile(cluster, SHAPES["llama3.2-1b"], _profile())
    # more layers, another name: the same layers
    longer = SHAPES["llama3.1-8b"].model_copy(update={"num_layers": 80, "name": "deeper"})
    assert with_profile(cluster, longer, _profile()).device.efficiency.profile is not None


def test_profile_files_of_another_schema_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    data = json.loads(_profile().model_dump_json())
    path.write_text(json.dumps(data))
    assert read_profile(path) == _profile()
    data["schema_version"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="profile schema version 0; this planner reads version 1"):
        read_profile(path)
    data["schema_version"] = 1
    data["measured"][0]["forward_backward_s"] = 1.0  # and forward_s, backward_s
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"measured.0: .*forward_backward_s alone"):
        read_profile(path)


def test_a_measurement_gives_both_passes_or_their_sum() -> None:
    with pytest.raises(ValueError, match="together"):
        LayerMeasurement(kind="dense", micro_batch_size=1, seq_length=8, forward_s=1.0)
    both = LayerMeasurement(kind="head", micro_batch_size=1, seq_length=8,
                            forward_backward_s=1.0)  # fmt: skip
    assert both.tokens == 8 and both.label() == "head tp1 1x8"


def _planner(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``planner ARGS`` on one CPU thread (see tests/test_bench.py's ``_bench``)."""
    return cli(*args, columns=80, env={"OMP_NUM_THREADS": "1"}, timeout=300)


def priced_from(model: Path, profile: Path, *extra: str) -> dict:
    """``estimate --json`` of ``model`` on the CPU node's hf-eager stack with ``profile``."""
    priced = _planner("estimate", model, CPU_NODE, "--stack", "hf-eager", "--profile", profile,
                      *extra, "--json")  # fmt: skip
    assert priced.returncode == 0, priced.stderr
    return json.loads(priced.stdout)


def microbatch_s(profile: Path, counts: dict[str, int]) -> float:
    """One microbatch's seconds from ``profile``'s measurements: each kind's forward and
    backward, ``counts[kind]`` times (once if not given)."""
    return sum(counts.get(m.kind, 1) * (m.forward_s + m.backward_s)
               for m in read_profile(profile).measured
               if m.forward_s is not None and m.backward_s is not None)  # fmt: skip


@needs_torch
def test_profile_on_the_cpu_prices_the_tiny_model(tmp_path: Path) -> None:
    """``planner profile`` on the CPU writes a profile that ``estimate --profile`` prices the
    tiny model with: each microbatch's compute is the embedding's, two layers' and the head's
    measured seconds, and the headline says what was measured; another stack is refused."""
    out = tmp_path / "tiny.json"
    done = _planner("profile", CPU_NODE, "--model", TINY, "--device", "cpu", "--mbs", "1",
                    "--repeats", "1", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    assert f"written to {out}" in done.stdout.replace("\n", "")
    profile = read_profile(out)
    assert profile.shape == layer_shape(load_model(TINY)) and profile.precision == "fp32"
    assert {m.label() for m in profile.measured} == {"embedding tp1 1x256", "dense tp1 1x256",
                                                     "head tp1 1x256"}  # fmt: skip
    result = priced_from(TINY, out)
    assert result["time"]["compute_s"] == pytest.approx(8 * microbatch_s(out, {"dense": 2}),
                                                        rel=1e-6)  # fmt: skip
    assert result["profiled"] == ["embedding: measured (tp1 1x256)",
                                  "dense: measured (tp1 1x256)", "head: measured (tp1 1x256)",
                                  "optimizer: measured"]
    refused = _planner("estimate", TINY, CPU_NODE, "--profile", out)  # megatron-te
    assert refused.returncode == 2
    assert "measured on hf-eager; this run is priced on megatron-te" in " ".join(
        refused.stderr.split())


def test_without_pytorch_profile_says_how_to_get_it() -> None:
    script = ("import sys\nsys.modules['torch'] = None\nfrom planner.cli import main\n"
              "main()\n")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, "profile", str(CPU_NODE), "--model", str(TINY),
         "--out", "/tmp/never-written.json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert "planner profile needs PyTorch" in done.stderr and "planner[bench]" in done.stderr
    assert not Path("/tmp/never-written.json").exists()


def test_the_batch_prices_a_profile_as_estimate_does() -> None:
    """``estimate_batch`` (the sweep's and the searches' pricing) reads the same factors: each
    configuration's step and the lines of what was measured agree with ``estimate``'s."""
    model = SHAPES["llama3.1-8b"].model_copy(update={"training": None})
    cluster = load_cluster(DGX_H100, nodes=1)
    profiled = with_profile(cluster, model, profile_from_records(
        _records(), model, device=cluster.device.name, compiled=False))  # fmt: skip
    model = model.model_copy(update={"training": TrainingSpec(
        seq_length=8192, global_batch_size=16, stack="hf-eager")})  # fmt: skip
    configs = [ParallelConfig(tp=t, mbs=m, sp=sp) for t, m, sp in
               ((1, 1, False), (2, 1, False), (4, 2, False), (8, 1, True), (2, 4, True))]
    batch = estimate_batch(model, profiled, configs)
    for i, config in enumerate(configs):
        one = estimate(model, profiled, config)
        assert batch.columns["step_time_s"][i] == pytest.approx(one.step_time_s, rel=1e-9)
        assert list(batch.columns["profiled"][i]) == list(one.profiled)
    assert estimate(model, profiled, configs[1]).step_time_s != estimate(
        model, cluster, configs[1]).step_time_s  # fmt: skip


def test_a_plan_made_with_a_profile_names_its_cluster_file() -> None:
    """The profile is not the cluster file's: a plan priced with one still names the file's
    hash, and says in ``predicted.profiled`` what was measured."""
    model = SHAPES["llama3.1-8b"]
    cluster = load_cluster(DGX_H100, nodes=1)
    profiled = with_profile(cluster, model, _profile())
    assert input_hash(profiled) == input_hash(cluster)
    assert profiled.priced_json() != cluster.priced_json()  # what prices, remembered apart


def _sweep_file(tmp_path: Path, axes: str) -> Path:
    """A sweep of Llama-3.1-8B's layers on one H100 node with their eager profile."""
    model = SHAPES["llama3.1-8b"]
    (tmp_path / "model.json").write_text(model.model_dump_json())
    (tmp_path / "eager.json").write_text(_profile().model_dump_json())
    path = tmp_path / "sweep.toml"
    path.write_text(f'model = "model.json"\ncluster = "{DGX_H100}"\nprofile = "eager.json"\n'
                    f'[training]\nglobal_batch_size = 16\nseq_length = 8192\n'
                    f'stack = "hf-eager"\n[axes]\n{axes}\n')  # fmt: skip
    return path


def test_a_sweep_prices_its_points_with_its_profile(tmp_path: Path) -> None:
    """The sweep file's ``profile`` is set beside every point's cluster; an axis that changes
    the model or the device is refused, since the profile measured one of each."""
    sweep = read_sweep(_sweep_file(tmp_path, '"cluster.num_nodes" = [1, 2]'))
    points = sweep_points(sweep)
    assert all(p.cluster.device.efficiency.profile is not None for p in points)
    assert points[1].cluster.num_nodes == 2
    with pytest.raises(InputError, match=r"axis model.hidden_size changes the model or the "
                       "device"):  # fmt: skip
        read_sweep(_sweep_file(tmp_path, '"model.hidden_size" = [4096, 8192]'))


@needs_torch
def test_shorter_sequences_measure_the_shards_of_a_long_one(tmp_path: Path) -> None:
    """``--seq-len`` repeated profiles each length; a plan at the shorter one (a context- or
    sequence-parallel shard's length) reads its own measurement, one 4 times shorter than
    any measured holds the nearest's, and one further out carries it as extrapolated (never
    the model's own price, which a search would prefer for being unmeasured)."""
    out = tmp_path / "two.json"
    done = _planner("profile", CPU_NODE, "--model", TINY, "--device", "cpu", "--mbs", "1",
                    "--seq-len", "256", "--seq-len", "64", "--repeats", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    assert {m.seq_length for m in read_profile(out).measured} == {256, 64}
    at = {length: priced_from(TINY, out, "--seq-len", str(length))["profiled"]
          for length in (64, 16, 8)}  # fmt: skip
    assert "dense: measured (tp1 1x64)" in at[64]
    assert "dense: from the profile (tp1 1x16, held from sequence 64)" in at[16]
    assert "dense: from the profile (tp1 1x8, extrapolated from sequence 64)" in at[8]


@needs_torch
def test_explain_says_what_the_profile_measured_and_asks_for_it(tmp_path: Path) -> None:
    """A plan solved with a profile: explain prints what the profile measured of its price,
    and without ``--profile`` says the changes would be priced another way."""
    out, plan = tmp_path / "tiny.json", tmp_path / "plan.json"
    done = _planner("profile", CPU_NODE, "--model", TINY, "--device", "cpu", "--mbs", "1",
                    "--repeats", "1", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    solved = _planner("solve", TINY, CPU_NODE, "--framework", "any", "--stack", "hf-eager",
                      "--profile", out, "--out", plan)  # fmt: skip
    assert solved.returncode == 0, solved.stderr
    with_it = _planner("explain", plan, "--model", TINY, "--cluster", CPU_NODE, "--profile", out)
    assert with_it.returncode == 0, with_it.stderr
    text = " ".join(with_it.stdout.split())
    assert "profile: embedding: " in text and "optimizer: measured" in text
    assert "dense: measured (tp1 " in text or "dense: from the profile (tp1 " in text
    assert "give explain its --profile" not in with_it.stderr
    without = _planner("explain", plan, "--model", TINY, "--cluster", CPU_NODE)
    assert without.returncode == 0, without.stderr
    assert "give explain its --profile to price the changes the same way" in " ".join(
        without.stderr.split())


def test_a_model_with_multi_token_prediction_is_refused_in_one_line(tmp_path: Path) -> None:
    """The faithful head is the output layer and its loss alone; a model that trains
    multi-token-prediction modules is refused before anything runs, saying what to do."""
    model = tmp_path / "tiny-mtp.json"
    model.write_text(json.dumps(json.loads(TINY.read_text()) | {"mtp_layers": 1}))
    done = _planner("profile", CPU_NODE, "--model", model, "--device", "cpu",
                    "--out", tmp_path / "p.json")  # fmt: skip
    assert done.returncode != 0
    text = " ".join(done.stderr.split())  # one message, wrapped at the terminal's width
    assert text.startswith("error: tiny-llama trains 1 multi-token-prediction module(s), which "
                           "planner profile does not run: price it without --profile")
    assert not (tmp_path / "p.json").exists()
