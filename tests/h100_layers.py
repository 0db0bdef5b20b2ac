"""What the tests of one layer's memory and time on the shared H100 read: the folder of its
measurements (``../shared/validation/h100``) and the two layer shapes its ``real_layer.py``
builds, as model specs (:func:`planner.diagnose.layer_memory.measured_layer_models`)."""

from __future__ import annotations

from planner.diagnose.layer_memory import measured_layer_models
from tests.conftest import SHARED

H100 = SHARED / "validation" / "h100"
SHAPES = measured_layer_models(H100 / "runs_one_gpu.json")
"""The two shapes ``real_layer.py`` builds, by its names."""
LLAMA_1B = SHAPES["llama3.2-1b"]
