"""Atomic file writes: a file at ``path`` is the whole old content or the whole new one, never a part.

The bytes go to a temporary file in the same folder (a rename is atomic only within one file system), which is
flushed and synced to the disk before `os.replace` puts it at ``path``; the folder is then synced so that the rename
itself survives a power loss (POSIX). A process killed at any point leaves the previous file intact, and at worst a
``.tmp`` file of its own beside it, which the next write of the same path removes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Union


def sync_folder(folder: Path) -> None:
    """Best effort: flush a folder's entries (a rename) to the disk; not every platform can open a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder cannot be opened on some systems (Windows): the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Union[str, os.PathLike], write: Callable) -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a binary file object, then it is synced and renamed to
    ``path``. On any error (in ``write`` too) ``path`` is left as it was and the temporary file is removed."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f".{path.name}.*.tmp"):  # left by a writer killed before its rename
        try:
            stale.unlink()
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    sync_folder(folder)
    return path


def atomic_write_bytes(path: Union[str, os.PathLike], data: bytes) -> Path:
    """`atomic_write` of ``data``."""
    return atomic_write(path, lambda f: f.write(data))
