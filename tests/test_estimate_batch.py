"""``estimate_batch`` is ``estimate`` over arrays: on random configurations of every bundled
model and cluster, every column agrees with ``estimate``'s ``--json`` key to 1e-9 relative,
the same configurations fit, and the same ones are refused with the same message."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import planner
from planner.cost import in_flight_microbatches
from planner.errors import ConfigError, InputError
from planner.plan.config import ParallelConfig, resolve, resolve_each
from planner.plan.divisibility import RULES
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.batch import BatchEstimate, estimate_batch
from planner.uniform.columns import config_columns

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted((ROOT / "instances" / "models").glob("*.json"))
CLUSTERS = sorted((ROOT / "instances" / "clusters").glob("*.json"))
SAMPLES = 6_000
"""Random configurations in all, spread over every bundled model and cluster."""
ORDERS = ("tp-cp-ep-dp-pp", "tp-pp-cp-ep-dp", "cp-ep-dp-tp-pp", "pp-tp-cp-ep-dp")


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def random_config(rng: random.Random, model: ModelSpec, cluster: ClusterSpec) -> ParallelConfig:
    """A configuration that divides about half the time: degrees drawn from divisors, with a
    tenth of each knob drawn freely."""
    n = cluster.num_devices
    free = rng.random() < 0.1
    tp = rng.choice(_divisors(cluster.scale_up_devices, 16) + ([3] if free else []))
    tp = tp if model.num_attention_heads % tp == 0 else 1
    cp = rng.choice([1, 1, 1, 2, 4])
    rest = max(1, n // (tp * cp))
    layers = model.num_layers
    pp = rng.choice([d for d in _divisors(rest, layers) if layers % d == 0 or free] or [1])
    ep = 1
    if model.moe is not None:
        ep = rng.choice(_divisors(model.moe.num_experts, 64))
    first = last = None
    if pp > 2 and rng.random() < 0.15:
        first = last = max(1, layers // pp - 1)
    gpipe = rng.random() < 0.2
    zero_bubble = None if gpipe else rng.choice([None] * 6 + ["zb-h1", "zb-v"])
    chunks = [v for v in (1, 2, 3, 4) if (layers // pp) % v == 0 or free]
    sp = rng.random() < 0.7
    recompute = rng.choice(["none", "selective", "full"])
    # Half the full recomputations on some layers of each chunk (past a chunk's: all).
    some = recompute == "full" and rng.random() < 0.5
    return ParallelConfig(
        tp=tp, pp=pp, cp=cp, ep=ep, first_stage_layers=first, last_stage_layers=last,
        vpp=2 if zero_bubble == "zb-v" else 1 if gpipe or zero_bubble or pp == 1
        else rng.choice(chunks), mbs=rng.choice([1, 1, 2, 4]), sp=sp,
        recompute=recompute, recompute_layers=rng.randint(1, layers // pp + 1) if some else None,
        zero=rng.choice([0, 1, 1, 2, 3]),
        schedule="gpipe" if gpipe else zero_bubble or "1f1b",
        flash_attention=rng.random() < 0.8, overlap_grad_reduce=rng.random() < 0.5,
        overlap_param_gather=rng.random() < 0.5, tp_comm_overlap=sp and rng.random() < 0.4,
        cp_algo=rng.choice(["ring", "ring", "ulysses"]), rank_order=rng.choice(ORDERS),
        global_batch=rng.choice([None] * 6 + [96 * pp, 4096]),
        seq_len=rng.choice([None, None, 4096]), precision=rng.choice([None, None, "fp16"]),
        offload=rng.choice(["optimizer", "zero-offload"])
        if cluster.host is not None and rng.random() < 0.3 else "none",
        # DeepSpeed's optimizers keep and accumulate their gradients their own way; the eager
        # stacks run kernels and keep tensors of their own.
        stack=rng.choice(["megatron-deepspeed", "megatron-deepspeed", "torchtitan-eager",
                          "colossalai-hf"]) if rng.random() < 0.3 else None,
    )  # fmt: skip


def _flat(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        elif key != "stages":
            flat[f"{prefix}{key}"] = value
    return flat


def agree(batch: BatchEstimate, configs: list[ParallelConfig], model, cluster) -> int:
    """Assert every column of ``batch`` is what ``estimate`` says; returns how many priced."""
    priced = 0
    for i, config in enumerate(configs):
        try:
            expected = _flat(planner.estimate(model, cluster, config).to_dict())
        except ConfigError as exc:
            assert not batch.columns["divides"][i], config
            assert batch.refusal(i) == str(exc)
            continue
        priced += 1
        assert batch.columns["divides"][i], (config, batch.refusal(i))
        for key, want in expected.items():
            got = batch.columns[key][i]
            if want is None:
                assert isinstance(got, float) and math.isnan(got), (key, config)
            elif isinstance(want, float):
                assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (key, config)
            else:
                assert got == want, (key, config)
    return priced


def random_batches(
    seed: int, total: int
) -> Iterator[tuple[ModelSpec, ClusterSpec, list[ParallelConfig]]]:
    """About ``total`` random configurations, as many for every bundled model x cluster."""
    rng = random.Random(seed)
    pairs = [(m, c) for m in MODELS for c in CLUSTERS]
    for model_path, cluster_path in pairs:
        model = planner.load_model(model_path)
        cluster = planner.load_cluster(cluster_path)
        yield model, cluster, [random_config(rng, model, cluster)
                               for _ in range(total // len(pairs))]  # fmt: skip


def test_batch_agrees_with_estimate_on_random_configurations():
    """6,000 configurations over every bundled model x cluster (each pair about 45): every
    key equal, and most of them priced (not only refusals compared)."""
    priced = total = 0
    for model, cluster, configs in random_batches(14, SAMPLES):
        batch = estimate_batch(model, cluster, configs)
        priced += agree(batch, configs, model, cluster)
        total += len(configs)
    assert total >= 0.99 * SAMPLES
    assert priced >= 0.3 * total, (priced, total)


def test_resolving_at_once_is_resolving_each():
    """What the searches' spaces resolve at once (:func:`resolve_each`) is what ``resolve``
    gives each configuration, refusals included, over 2,000 random configurations of every
    bundled model and cluster (mixed sequences, batches, precisions and stacks in one call)."""
    resolved = refused = 0
    for model, cluster, configs in random_batches(7, 2_000):
        for config, at_once in zip(configs, resolve_each(model, cluster, configs), strict=True):
            try:
                one = resolve(model, cluster, config)
            except ConfigError:
                assert at_once is None, config
                refused += 1
                continue
            assert at_once == one, config
            resolved += 1
    assert resolved > 500 and refused > 500, (resolved, refused)


def test_columns_are_estimate_keys():
    model = planner.load_model(ROOT / "instances/models/llama3-8b.json")
    cluster = planner.load_cluster(ROOT / "instances/clusters/dgx-h100-80gb.json", nodes=2)
    config = ParallelConfig(tp=2, pp=2)
    batch = estimate_batch(model, cluster, [config])
    keys = set(_flat(planner.estimate(model, cluster, config).to_dict()))
    assert keys <= set(batch.columns)
    assert set(batch.columns) - keys == {"divides"}


def test_columns_broadcast_and_default():
    """Columns of one value broadcast; missing fields are ParallelConfig's defaults."""
    model = planner.load_model(ROOT / "instances/models/gpt3-175b.json")
    cluster = planner.load_cluster(ROOT / "instances/clusters/dgx-a100-80gb.json", nodes=128)
    batch = estimate_batch(model, cluster, {"tp": 8, "pp": [8, 16], "recompute": "full"})
    for i, pp in enumerate((8, 16)):
        want = planner.estimate(model, cluster, ParallelConfig(tp=8, pp=pp, recompute="full"))
        assert batch.columns["step_time_s"][i] == pytest.approx(want.step_time_s, rel=1e-12)
    assert batch.config(1) == ParallelConfig(tp=8, pp=16, recompute="full")
    assert config_columns([ParallelConfig(tp=8, pp=16, recompute="full")])["pp"].tolist() == [16]


@pytest.mark.parametrize("columns", [
    {"ep": [2, 4], "etp": None}, {"ep": [2, 2], "etp": [None, 1]},
    {"tp": [2, 4], "dp": None, "seq_len": [None, None]},
    {"recompute": "full", "recompute_layers": [None, 2], "global_batch": [None, 256]},
])  # fmt: skip
def test_none_in_a_column_is_the_fields_default(columns: dict) -> None:
    """None, an optional field's default, given in a column (or as its one value) prices as
    left out; it priced every row as not dividing, or raised a TypeError."""
    model = planner.load_model(ROOT / "instances/models/mixtral-8x7b.json")
    cluster = planner.load_cluster(ROOT / "instances/clusters/dgx-h100-80gb.json", nodes=16)
    batch = estimate_batch(model, cluster, columns)
    for i in range(2):
        row = {k: (v[i] if isinstance(v, list) else v) for k, v in columns.items()}
        want = planner.estimate(model, cluster, ParallelConfig(**row)).step_time_s
        assert batch.columns["divides"][i]
        assert batch.columns["step_time_s"][i] == pytest.approx(want, rel=1e-12)


def test_refusal_codes_name_the_first_rule():
    model = planner.load_model(ROOT / "instances/models/gpt3-175b.json")
    cluster = planner.load_cluster(ROOT / "instances/clusters/dgx-a100-80gb.json", nodes=128)
    batch = estimate_batch(model, cluster, {"tp": [8, 3, 8], "pp": [16, 8, 5]})
    names = [RULES[c].name if 0 <= c < len(RULES) else c for c in batch.refused_by.tolist()]
    assert names == [-1, "devices", "devices"]
    assert batch.refusal(0) is None
    # a rank order Megatron cannot spell is the column's error, as ParallelConfig's
    with pytest.raises(InputError, match=r"column 'rank_order': 'x': use tp, cp, ep"):
        estimate_batch(model, cluster, {"tp": 8, "pp": 16, "rank_order": ["tp-cp-ep-dp-pp", "x"]})


def test_unknown_field_is_refused():
    model = planner.load_model(ROOT / "instances/models/gpt3-175b.json")
    cluster = planner.load_cluster(ROOT / "instances/clusters/dgx-a100-80gb.json")
    with pytest.raises(InputError, match="no configuration field 'tensor_parallel'"):
        estimate_batch(model, cluster, {"tensor_parallel": np.array([8])})


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "gpipe", "zb-h1", "zb-v"])
def test_a_later_stage_never_holds_more(schedule: str) -> None:
    """The step composer takes a run of equal stages' peak memory at its first stage
    (``cost.step.step_totals``): no schedule keeps more microbatches on a later stage."""
    for pp in range(1, 33):
        for vpp in (1, 2, 3, 4) if schedule == "interleaved" else (1,):
            for m in (1, 2, 3, pp, 2 * pp, 5 * pp + 1):
                if schedule == "zb-v" and m < 2 * pp - 1:
                    continue  # the configuration requires m >= 2p - 1 (rule zb_v_microbatches)
                held = [in_flight_microbatches(schedule, stage=i, pp=pp, vpp=vpp,
                                               num_microbatches=m) for i in range(pp)]
                assert held == sorted(held, reverse=True), (pp, vpp, m, held)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"tp": [1, 2], "pp": [1, 2, 4]}, "column 'tp' has 2 values, the longest 3"),
        ({"tp": [1, 2], "recompute": ["none", "bogus"]}, "column 'recompute': 'bogus'"),
        ({"schedule": ["gpipe", "zb"]}, "column 'schedule': 'zb'"),
        ({"recompute": ["full", "selective"], "recompute_layers": 2},
         "row 1: recompute_layers(2) needs recompute 'full', not 'selective'"),
        ({"tp": [0, 8]}, "column 'tp': 0: Input should be greater than 0"),
        ({"tp": [1.5]}, "column 'tp' holds floats"),
    ],
)
def test_bad_columns_are_refused_as_estimate_refuses_them(columns: dict, message: str) -> None:
    """A value ``ParallelConfig`` refuses is one InputError naming the column, never a
    numpy error or a silent default (a misspelt schedule is not 1F1B)."""
    model = planner.load_model(ROOT / "instances/models/gpt3-175b.json")
    cluster = planner.load_cluster(ROOT / "instances/clusters/dgx-a100-80gb.json")
    with pytest.raises(InputError, match=re.escape(message)):
        estimate_batch(model, cluster, columns)
