"""Where data files are found: ``root=``, else ``$TORCHSSVM_DATA``, else a user cache directory; and how a missing
one is downloaded (`locate`): over https only, checked against its SHA-256 digest where one is known, and
written atomically, so that a failed or interrupted download never leaves a file that looks like data."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
import warnings
from pathlib import Path
from typing import Optional

from .._atomic import sync_folder
from .checks import DataFileError

_CHUNK = 1 << 20


class DownloadError(OSError):
    """A download that failed (network error, interrupted transfer, a redirect away from https): the message
    starts with the destination path and names the URL; nothing is left at the path."""


class UnverifiedDownloadWarning(UserWarning):
    """A file was downloaded from a source whose SHA-256 digest is not known, so its bytes were not checked
    (the loader's content checks still apply)."""


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
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def file_stamp(path) -> tuple:
    """``(resolved path, mtime in ns, size)``: the key of a parse cache, so that a file changed on disk is read and
    checked again, not served from memory."""
    resolved = os.path.realpath(path)
    st = os.stat(resolved)
    return resolved, st.st_mtime_ns, st.st_size


def locate(root: Optional[str], relpath: str, *, url: Optional[str] = None, download: bool = False,
           digest: Optional[str] = None) -> Path:
    """Path of ``relpath`` under the data root; fetched from ``url`` only when missing and ``download``.

    ``digest``: the SHA-256 (hex) the downloaded bytes must have; None where the source's digest is not
    known, and then the download goes ahead with an `UnverifiedDownloadWarning`. See `download_file`.
    """
    path = data_root(root) / relpath
    if path.exists():
        if not path.is_file():  # a folder where the file should be: say so, not IsADirectoryError mid-read
            raise DataFileError(path, "is a folder or another non-regular file, not the data file "
                                      f"{relpath}: move it aside or pass another root=")
        return path
    if not download or url is None:
        hint = f" or pass download=True to fetch it from {url}" if url else ""
        raise FileNotFoundError(
            f"{path} not found: pass root= or set TORCHSSVM_DATA to the folder holding {relpath}{hint}"
        )
    download_file(url, path, digest=digest)
    return path


def download_file(url: str, path, *, digest: Optional[str] = None, timeout: float = 60.0) -> Path:
    """Fetch ``url`` to ``path`` atomically.

    Only ``https://`` URLs are fetched (a plain-http download can be altered on the way), and a redirect must
    stay on https. The bytes go to a temporary file in ``path``'s folder, are flushed and fsynced, their
    SHA-256 is compared with ``digest`` (when known), and only then is the file renamed to ``path``
    (`os.replace`, atomic on one file system). A transfer shorter than the announced Content-Length, any error
    on the way and a digest mismatch leave nothing at ``path``: a `DownloadError` (OSError) names the URL for
    transfer failures, a `DataFileError` (ValueError) for a mismatch. ``digest=None`` (a source whose digest is
    not known) downloads with an `UnverifiedDownloadWarning`.
    """
    path = Path(path)
    if not isinstance(url, str) or not url.startswith("https://"):
        raise ValueError(f"refusing to download {url!r} to {path}: only https:// URLs are fetched")
    if digest is not None and (len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest)):
        raise ValueError(f"digest must be a SHA-256 in lower-case hex (64 digits), got {digest!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        h, size = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                final = resp.geturl() if hasattr(resp, "geturl") else url
                if final and not final.startswith("https://"):
                    raise DownloadError(f"{path}: {url} redirected to {final}, which is not https")
                announced = resp.headers.get("Content-Length") if getattr(resp, "headers", None) else None
                for chunk in iter(lambda: resp.read(_CHUNK), b""):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                if announced is not None and announced.isdigit() and int(announced) != size:
                    raise DownloadError(f"{path}: the download from {url} was cut short: {size:,} of "
                                        f"{int(announced):,} bytes")
                out.flush()
                os.fsync(out.fileno())
        except DownloadError:
            raise
        except Exception as err:  # network errors, http.client.IncompleteRead, timeouts, ...
            raise DownloadError(f"{path}: the download from {url} failed: {type(err).__name__}: {err}") from err
        got = h.hexdigest()
        if digest is None:
            warnings.warn(f"{path}: no SHA-256 digest is known for {url}, so the download ({size:,} bytes, "
                          f"SHA-256 {got}) is not verified; the loader still checks its content",
                          UnverifiedDownloadWarning, stacklevel=3)
        elif got != digest:
            raise DataFileError(path, f"the download from {url} has SHA-256 {got}, expected {digest}; nothing "
                                      f"was written (if the source has changed, fetch the file yourself and "
                                      f"place it here)")
        os.replace(tmp, path)
        sync_folder(path.parent)  # the rename itself survives a crash
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path

