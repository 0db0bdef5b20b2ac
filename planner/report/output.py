"""Writing results to files the way a careful user would: atomically, never over an input,
and refusing a bad target before the work that would fill it (a search can take minutes)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from planner.errors import InputError

FORMATS = (".png", ".svg")
"""The picture formats, by their files' suffixes."""
PLAN_REPORT = tuple(f"{name}{suffix}" for name in ("gantt", "memory", "time") for suffix in FORMATS)
"""What ``solve --report`` writes into its folder."""
SWEEP_REPORT = (*(f"{name}{suffix}" for name in ("pareto", "heatmap") for suffix in FORMATS),
                "index.html")  # fmt: skip
"""What ``sweep --report`` writes into its folder (the heatmap where there are two axes)."""


def check_target(path: Path, *, inputs: Sequence[Path | None] = (), option: str = "--out") -> None:
    """Refuse ``path`` as an output file: a folder, one of ``inputs`` (a plan written over its
    model would lose the model), or a file whose folder is missing or not writable."""
    try:
        _check_target(Path(path), inputs, option)
    except OSError as exc:  # a name the system refuses (too long, bad bytes)
        raise InputError(f"{option} {path}: cannot write there ({exc.strerror or exc})") from None


def _check_target(path: Path, inputs: Sequence[Path | None], option: str) -> None:
    target = path.resolve()
    if target.is_dir():
        raise InputError(f"{option} {path}: is a directory; give a file name")
    if any(p is not None and target == Path(p).resolve() for p in inputs):
        raise InputError(f"{option} {path}: is one of the inputs; choose another file")
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{option} {path}: folder {folder} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise InputError(f"{option} {path}: the file is not writable")


def check_folder(path: Path, *, option: str, files: Sequence[str] = ()) -> None:
    """Refuse ``path`` as an output folder: an existing file, a place it cannot be made, or
    one where a file of ``files`` cannot be written (a folder of that name, a read-only
    file), before the work that would fill it."""
    try:
        _check_folder(Path(path), option)
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot write there ({exc.strerror or exc})") from None
    if Path(path).is_dir():  # a folder to be made holds nothing in the way
        for name in files:
            target = Path(path) / name
            if target.is_dir() or (target.exists() and not os.access(target, os.W_OK)):
                what = "is a folder" if target.is_dir() else "is not writable"
                raise InputError(f"{option} {path}: {target} {what}; remove it or choose "
                                 f"another folder")  # fmt: skip


def _check_folder(path: Path, option: str) -> None:
    folder = path.resolve()
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{option} {path}: is a file; give a folder")
    if folder.is_dir() and not os.access(folder, os.W_OK):
        raise InputError(f"{option} {path}: the folder is not writable")
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise InputError(f"{option} {path}: cannot create it under {existing}")


def write_atomic(
    path: Path, data: str | bytes, *, inputs: Sequence[Path | None] = (), option: str = "--out"
) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename, so
    a reader never sees half a file; refused as :func:`check_target` says."""
    check_target(path, inputs=inputs, option=option)
    target = Path(path).resolve()
    # A short fixed prefix: the target's own name plus a suffix could pass the name limit.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".planner-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from others
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{option} {path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (read by setting it, the only way, and setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
