"""Writing pictures: PNG or SVG by the file's suffix, refused before drawing when the target
is bad, written atomically (:mod:`planner.report.output`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from planner.errors import InputError
from planner.report.output import check_target, write_atomic

FORMATS = (".png", ".svg")


def save(figure: Figure, path: str | Path, *, option: str = "--out") -> Path:
    """Write ``figure`` as PNG or SVG, by ``path``'s suffix, atomically
    (:func:`planner.report.output.write_atomic`)."""
    path = Path(path)
    check_picture(path, option=option)
    FigureCanvasAgg(figure)
    image = io.BytesIO()
    figure.savefig(image, format=path.suffix.lower()[1:], dpi=150, bbox_inches="tight")
    write_atomic(path, image.getvalue(), option=option)
    return path


def check_picture(path: Path, *, inputs: Sequence[Path] = (), option: str = "--out") -> None:
    """Refuse a picture file before drawing it: an unknown suffix, or a bad target
    (:func:`planner.report.output.check_target`)."""
    check_target(path, inputs=inputs, option=option)
    if path.suffix.lower() not in FORMATS:
        raise InputError(f"{option} {path}: cannot write a {path.suffix or 'suffix-less'!r} "
                         f"picture; use one of {', '.join(FORMATS)}")  # fmt: skip
