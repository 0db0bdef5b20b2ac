"""Writing pictures: PNG or SVG by the file's suffix, refused before drawing when the target
is bad, written atomically (:mod:`planner.report.output`)."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from planner.errors import InputError
from planner.report.output import FORMATS, check_target, write_atomic

_Drawn = TypeVar("_Drawn", bound=Callable[..., Figure])


def literal_text(draw: _Drawn) -> _Drawn:
    """``draw`` (a function that builds a figure) with its text drawn as given: matplotlib
    reads ``$...$`` as maths, so a model or sweep named ``nic $50 vs $100`` was set in
    italics and one named ``a $\\q$ b`` failed to draw after the whole search. Text made
    later, when the figure is drawn (a tick formatter's labels), is outside it: the
    formatters here write numbers only."""

    @functools.wraps(draw)
    def drawn(*args: Any, **kwargs: Any) -> Figure:
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return drawn  # type: ignore[return-value]


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
