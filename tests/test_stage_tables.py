"""The plan report's stage tables: the layers each stage holds, an interleaved or V-shaped
stage's as its model chunks where Megatron-Core and PyTorch's schedules place them
(:func:`planner.plan.chunks.chunk_layers`), checked against the layers a brute-force walk of the
virtual stages gives."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from planner.plan.chunks import chunk_layers, chunk_sizes
from planner.plan.config import ParallelConfig
from planner.report import plan_tables
from planner.spec.reading import load_cluster, load_model
from planner.uniform.plan import uniform_plan
from tests.conftest import CLUSTERS, MODELS


def _text(renderables: list, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for r in renderables:
        console.print(r)
    return console.export_text()


def _walk(layers: tuple[int, ...], vpp: int, v_shape: bool, mtp: int) -> list[set[int]]:
    """Each stage's layers by numbering every virtual stage's in schedule order, one by one."""
    cut, pp = chunk_sizes(layers, vpp, mtp), len(layers)
    ranks = ([*range(pp), *reversed(range(pp))] if v_shape
             else [s for _ in range(vpp) for s in range(pp)])  # fmt: skip
    seen = [0] * pp
    held: list[set[int]] = [set() for _ in layers]
    layer = 0
    for stage in ranks:
        for _ in range(cut[stage][seen[stage]]):
            layer += 1
            held[stage].add(layer)
        seen[stage] += 1
    return held


@pytest.mark.parametrize(("layers", "vpp", "v_shape", "mtp"), [
    ((12,) * 8, 6, False, 0), ((7, 8, 8, 7), 4, False, 0), ((7, 8, 8, 8, 8, 8, 8, 6), 4, False, 1),
    ((6, 6, 6, 6), 2, True, 0), ((8, 8), 8, False, 0), ((7, 7), 8, False, 0),
])  # fmt: skip
def test_chunks_hold_the_layers_the_virtual_stages_do(layers: tuple[int, ...], vpp: int,
                                                      v_shape: bool, mtp: int) -> None:
    ranges = chunk_layers(layers, vpp, v_shape=v_shape, mtp=mtp)
    for held, chunks, count in zip(_walk(layers, vpp, v_shape, mtp), ranges, layers, strict=True):
        assert {n for a, b in chunks for n in range(a, b + 1)} == held
        assert sum(b - a + 1 for a, b in chunks) == count
        assert len(chunks) <= vpp and all(a <= b for a, b in chunks)


def _rows(text: str) -> dict[str, str]:
    """Stage index (or run) -> its layers cell, from the costs table."""
    costs = text[text.rindex("stages: ms per microbatch"):]
    return {m[1]: m[2].strip() for m in re.finditer(r"^\s+(\d+(?:-\d+)?)\s{2,}(.+?)\s{2,}\d",
                                                    costs, flags=re.M)}  # fmt: skip


def test_interleaved_stages_print_their_chunks() -> None:
    """GPT-3 on 1,024 A100, TP4 PP8 VPP6: stage 0 holds layers 1-2, 17-18, ..., 81-82, not
    1-12; the folded devices row keeps the whole range; without interleaving, 1-12."""
    model = load_model(MODELS / "gpt3-175b.json")
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json")
    interleaved = uniform_plan(model, cluster, ParallelConfig(tp=4, pp=8, vpp=6, mbs=1))
    text = _text(plan_tables(interleaved), 80)
    rows = _rows(text)
    assert rows["0"] == "1-2, 17-18, ..." and rows["7"] == "15-16, 31-32, ..."
    assert "1-96 (12 each)" in text
    plain = _text(plan_tables(uniform_plan(model, cluster, ParallelConfig(tp=4, pp=8, mbs=1))),
                  80)  # fmt: skip
    assert _rows(plain)["0"] == "1-12"
    assert all(len(line) <= 80 for line in text.splitlines())


def test_modules_cut_needs_the_model() -> None:
    """DeepSeek-V3's recipe split (7 + 6 x 8 + 6 layers, VPP4, one MTP module in the loss's
    chunk) cuts only with the module counted: given it, the last stage's last chunk holds the
    module and the loss alone, so layer 61 ends stage 6's; without, a stage prints its one
    range rather than a wrong cut."""
    model = load_model(MODELS / "deepseek-v3.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=128)
    config = ParallelConfig(tp=2, pp=8, vpp=4, ep=64, mbs=1, first_stage_layers=7,
                            last_stage_layers=6, recompute="full")  # fmt: skip
    plan = uniform_plan(model, cluster, config)
    rows = _rows(_text(plan_tables(plan, mtp_layers=model.mtp_layers), 120))
    assert rows["0"] == "1, 16-17, ..." and rows["7"].endswith("...")
    cut = chunk_layers((7, 8, 8, 8, 8, 8, 8, 6), 4, mtp=1)
    assert (cut[6][-1], cut[7][-1]) == ((60, 61), (46, 47))
    assert _rows(_text(plan_tables(plan), 120))["0"] == "1-7"


def test_a_v_schedules_middle_stages_are_each_said() -> None:
    """Llama 3 70B on ZB-V, PP4: stage 1 holds layers 11-20 and 61-70, stage 3 the V's turn;
    the middle stages, alike in their costs, folded into one row of "(20 each)", which hid
    the pairing."""
    model = load_model(MODELS / "llama3-70b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=8)
    plan = uniform_plan(model, cluster, ParallelConfig(tp=8, pp=4, vpp=2, schedule="zb-v",
                                                       mbs=1, global_batch=128))  # fmt: skip
    rows = _rows(_text(plan_tables(plan), 100))
    assert rows == {"0": "1-10, 71-80", "1": "11-20, 61-70", "2": "21-30, 51-60",
                    "3": "31-40, 41-50"}
