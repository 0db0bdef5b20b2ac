"""Every "does not divide" names what does not divide and by how much (issue 25: ``solve ...
--cp 64`` said "no uniform configuration divides" and stopped): the rule's own arithmetic when
the pins break one, else which level of the search the pins leave empty, with its numbers."""

from __future__ import annotations

import pytest

from planner.baselines.heuristic import _failure
from planner.errors import ConfigError
from planner.frameworks.megatron import interleaving_chunks
from planner.options import Pins, SolveOptions, training_of
from planner.plan.config import ParallelConfig, ResolvedConfig
from planner.search.targets import solve
from planner.spec import TrainingSpec
from planner.spec.reading import load_cluster, load_model

GPT3 = "instances/models/gpt3-175b.json"
LLAMA8B = "../shared/reference/hf/Meta-Llama-3.1-8B.config.json"
A100 = "instances/clusters/dgx-a100-80gb.json"
H100 = "instances/clusters/dgx-h100-80gb.json"
NVL72 = "instances/clusters/gb200-nvl72.json"


@pytest.mark.parametrize(("model", "cluster", "nodes", "run", "pins", "message"), [
    # each pin divides alone; together with the search's rules nothing is left
    (GPT3, A100, 16, (None, None), Pins(tp=16),
     r"^no uniform configuration divides gpt3-175b on 128 x A100-SXM4-80GB at global batch "
     r"1536, sequence 2048 with --tp 16: tp\(16\) does not divide the 8 devices of a "
     r"scale-up domain \(nvlink\), which tensor parallelism stays inside$"),
    (LLAMA8B, NVL72, 36, (65536, 72), Pins(cp=16),
     r"with --cp 16: tp\(1\) x cp\(16\) = 16 neither divides the 72 devices of a scale-up "
     r"domain \(nvlink5\) nor spans whole ones$"),
    (LLAMA8B, H100, 8, (8192, 64), Pins(pp=2, zero=3),
     r"with --pp 2, --zero 3: ZeRO-3 is searched without a pipeline only \(pp\(2\): ZeRO 0 "
     r"or 1\)$"),
    # a pin that breaks a rule: the rule's arithmetic
    (LLAMA8B, H100, 8, (1 << 20, 8), Pins(tp=8, cp=16),
     r"^tp\(8\) x pp\(1\) x cp\(16\) = 128 does not divide the 64 devices \(pinned: --tp 8, "
     r"--cp 16\)$"),
    (LLAMA8B, H100, 8, (8192, 8), Pins(mbs=16, tp=8, cp=8),
     r"^global_batch\(8\) is not divisible by dp\(1\) x mbs\(16\) = 16: a global batch of 16 "
     r"would divide \(pinned"),
    # the pin's own rule before one the free degrees would mend (it said the batch of 2048
    # did not divide 16,384 data-parallel ranks)
    ("../shared/reference/hf/DeepSeek-V3.config.json", H100, 2048, (8192, 2048), Pins(ep=512),
     r"^num_experts\(256\) is not divisible by ep\(512\) \(pinned: --ep 512\)$"),
], ids=["tp-outside-the-domain", "cp-straddling-racks", "zero3-with-pp", "devices",
        "batch", "experts-before-batch"])  # fmt: skip
def test_a_search_that_divides_nothing_says_what_does_not(
    model: str, cluster: str, nodes: int, run: tuple[int | None, int | None], pins: Pins,
    message: str,
) -> None:  # fmt: skip
    seq, batch = run
    options = SolveOptions(seq_length=seq, global_batch_size=batch, pins=pins)
    with pytest.raises(ConfigError, match=message):
        solve(load_model(model), load_cluster(cluster, nodes), options)


def test_the_heuristic_that_divides_nothing_shows_the_arithmetic() -> None:
    """The rule of thumb's first configuration's broken rule, beside the advice."""
    model, cluster = load_model(GPT3), load_cluster(A100, 16)
    options = SolveOptions(global_batch_size=7)
    first = ParallelConfig(tp=8, pp=8, global_batch=7, seq_len=2048)
    error = _failure(model, cluster, training_of(model, options), options, None, first=[first])
    assert str(error) == (
        "the heuristic found no configuration of gpt3-175b that divides 128 devices at global "
        "batch 7 (e.g. global_batch(7) is not divisible by dp(2) x mbs(1) = 2: a global batch "
        "of 6 or 8 would divide); try a global batch divisible by more data-parallel sizes")


def test_megatrons_interleaving_names_the_stages_that_do_not_divide() -> None:
    """Llama 3.1 405B's 126 layers as 7 + 8 x 14 + 7 on 16 stages interleave: the embedding
    and the loss each take a layer's slot (Meta's layout); as 5 + 8 x 14 + 9 they do not, and
    the profile's rule, read on a resolution as it is given, names the stages."""
    llama = load_model("instances/models/llama3.1-405b.json")

    def resolved(first: int, last: int) -> ResolvedConfig:
        config = ParallelConfig(tp=8, pp=16, vpp=2, first_stage_layers=first,
                                last_stage_layers=last)  # fmt: skip
        return ResolvedConfig(config=config, training=TrainingSpec(seq_length=8192,
                              global_batch_size=16), dp=1, num_microbatches=16,
                              num_devices=128, stage_layers=(first, *[8] * 14, last))  # fmt: skip

    assert interleaving_chunks(resolved(7, 7), llama) is None
    assert interleaving_chunks(resolved(5, 9), llama) == (
        "interleaved 1F1B splits every stage into vpp(2) equal chunks, the embedding's and "
        "the loss's slots a layer short: stages of 5 and 9 layers do not cut so")  # fmt: skip
