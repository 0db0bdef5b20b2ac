"""What the tests of one layer's memory and time on the shared H100 read: the folder of its
measurements (``../shared/validation/h100``) and the two layer shapes its ``real_layer.py``
builds, as model specs."""

from __future__ import annotations

import json

from planner.spec import ModelSpec
from tests.conftest import SHARED

H100 = SHARED / "validation" / "h100"
RUNS = json.loads((H100 / "runs_one_gpu.json").read_text())
LLAMA_1B = ModelSpec.model_validate(RUNS[0]["model"]["spec"])
SHAPES = {
    "llama3.2-1b": LLAMA_1B,
    "llama3.1-8b": LLAMA_1B.model_copy(update={
        "name": "llama3.1-8b", "num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336,
        "tie_word_embeddings": False}),
}  # fmt: skip
"""The two shapes ``real_layer.py`` builds (its ``SHAPES``), as model specs."""
