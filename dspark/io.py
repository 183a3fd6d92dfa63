"""Atomic file writes: a reader (or a crash) never sees half a file."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def _mode(full: int) -> int:
    """``full`` (0o666 for files, 0o777 for folders) less the process's umask: the mode ``open`` or ``mkdir``
    would give. Temporary files and folders are made private (0o600, 0o700), which a rename would keep."""
    umask = os.umask(0)
    os.umask(umask)
    return full & ~umask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it over ``path``.

    The file ends with the mode any other tool's file would have (0o666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _mode(0o666))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def restore_interrupted(path: str | os.PathLike) -> None:
    """Put back the folder at ``path`` if a process died between :func:`atomic_directory`'s two renames (the old
    folder moved aside, the new one not yet in place): readers and the next writer then find the old folder."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    if old.is_dir() and not path.exists():
        os.replace(old, path)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike):
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` in one rename.

    The folder ends with the mode ``mkdir`` would give it (0o777 less the umask), and the files written into it
    with the mode ``open`` would give them (some writers, safetensors among them, make files private)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    restore_interrupted(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        os.chmod(tmp, _mode(0o777))
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file() and not file.is_symlink():
                os.chmod(file, _mode(0o777 if os.access(file, os.X_OK) else 0o666))
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)
