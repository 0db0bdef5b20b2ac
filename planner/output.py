"""Writing results to files the way a careful user would: atomically, never over an input."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from planner.errors import InputError


def write_atomic(path: Path, text: str, *, inputs: Sequence[Path] = ()) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename, so
    a reader never sees half a file. Refuses a folder, a missing or unwritable folder, and any
    of ``inputs`` (a plan written over its model would lose the model)."""
    target = path.resolve()
    if target.is_dir():
        raise InputError(f"--out {path}: is a directory; give a file name")
    if any(target == Path(p).resolve() for p in inputs):
        raise InputError(f"--out {path}: is one of the inputs; choose another file")
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"--out {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"--out {path}: folder {folder} is not writable")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
