"""Where data files are found: ``root=``, else ``$TORCHSSVM_DATA``, else a user cache directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Optional


def data_root(root: Optional[str] = None) -> Path:
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("TORCHSSVM_DATA")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torchssvm"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def locate(root: Optional[str], relpath: str, *, url: Optional[str] = None, download: bool = False) -> Path:
    """Path of ``relpath`` under the data root; fetched from ``url`` only when missing and ``download``."""
    path = data_root(root) / relpath
    if path.exists():
        return path
    if not download or url is None:
        hint = f" or pass download=True to fetch it from {url}" if url else ""
        raise FileNotFoundError(
            f"{path} not found: pass root= or set TORCHSSVM_DATA to the folder holding {relpath}{hint}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
            shutil.copyfileobj(resp, out)
        os.replace(tmp, path)  # atomic: a partial download never looks like a data file
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
