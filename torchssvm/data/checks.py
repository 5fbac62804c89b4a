"""What the loaders check in the files they read, and the error that says what is wrong.

A data file that is truncated, corrupted or subtly wrong must not load: a word length of 0 in the OCR file
shifts every later word onto another word's letters, a label past the label set silently widens the model, a
NaN pixel poisons every gradient. So each loader reads its file through `text_lines` or `load_npz` (which turn
a truncated or corrupted gzip / zip / npz file and undecodable text into a `DataFileError`) and checks what it
read with the helpers below: array kinds and shapes, integer ranges, finite values, lengths >= 1 that add up to
the rows, and the documented sizes. Every error is a `DataFileError` whose message starts with the file's path
and says what is wrong; the low-level error it replaces is chained (``raise ... from``).
"""

from __future__ import annotations

import gzip
import pickle
import zipfile
import zlib
from typing import Iterator, Sequence

import numpy as np
import torch


class DataFileError(ValueError):
    """A data file that cannot be used: ``str(err)`` is ``"<path>: <problem>"``; ``err.path`` and
    ``err.problem`` hold the two parts."""

    def __init__(self, path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}" if str(path) else problem)

    def __reduce__(self):
        return type(self), (self.path, self.problem)


# What a damaged file raises while it is read: a truncated deflate stream (EOFError), a flipped byte in it
# (zlib.error, or a CRC mismatch: BadGzipFile / BadZipFile), a wrong format (BadGzipFile, BadZipFile, or numpy's
# ValueError / UnpicklingError for a file that is no npz at all) and text in another encoding.
_READ_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, zipfile.BadZipFile, UnicodeDecodeError)


def describe(err: BaseException) -> str:
    """What a low-level read error means for the file, in words."""
    if isinstance(err, UnicodeDecodeError):
        byte = err.object[err.start : err.start + 1].hex()
        return f"not {err.encoding} text: byte 0x{byte} cannot be decoded ({err.reason}); the file is corrupted"
    if isinstance(err, EOFError):
        return "truncated: the compressed data end before their end-of-stream marker"
    if isinstance(err, zlib.error):
        return f"corrupted compressed data ({err})"
    if isinstance(err, gzip.BadGzipFile):
        return f"not a valid gzip file, or a corrupted one ({err})"
    if isinstance(err, zipfile.BadZipFile):
        return f"not a valid zip archive, or a corrupted one ({err})"
    return f"{type(err).__name__}: {err}"


def text_lines(path, *, encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a text file, gunzipped when ``path`` ends in ``.gz``.

    A truncated or corrupted gzip stream and bytes that are not ``encoding`` text raise a `DataFileError`
    naming ``path``, wherever in the file they are. Errors raised by the caller while it handles a line are
    not touched.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding=encoding) as f:
            yield from f
    except _READ_ERRORS as err:
        raise DataFileError(path, describe(err)) from err


def load_npz(path, keys: Sequence[str]) -> dict:
    """The arrays ``keys`` of the npz archive ``path`` (no pickles), read in full.

    A file that is not an npz archive, a truncated or corrupted one (a CRC mismatch, a damaged array header)
    and a missing array raise a `DataFileError` naming ``path``.
    """
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise DataFileError(path, "is empty, not an npz archive")
    if head[:2] != b"PK":
        raise DataFileError(path, f"is not an npz (zip) archive: it starts with {head!r}")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise DataFileError(path, "is a single .npy array, not an npz archive")
        with z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DataFileError(path, f"has no array {missing[0]!r} (it holds {sorted(z.files)})")
            return {k: z[k] for k in keys}
    except DataFileError:
        raise
    except (*_READ_ERRORS, ValueError, pickle.UnpicklingError) as err:
        raise DataFileError(path, f"not a readable npz archive: {describe(err)}") from err


def check_kind(path, name: str, a: np.ndarray, kinds: str = "iub", *, ndim: int = None) -> None:
    """``a`` of a numpy kind in ``kinds`` ("iub": integers or booleans, "iubf": real numbers) and of
    ``ndim`` dimensions."""
    what = {"iub": "integers", "iubf": "real numbers"}.get(kinds, f"of kind {kinds!r}")
    if a.dtype.kind not in kinds:
        raise DataFileError(path, f"{name} must hold {what}, got dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise DataFileError(path, f"{name} must have {ndim} dimension(s), got shape {a.shape}")


def check_range(path, name: str, a: np.ndarray, low: int, high: int, *, what: str = "") -> None:
    """Every entry of the integer array ``a`` in ``[low, high)``; the error names the first one outside."""
    bad = np.flatnonzero((a < low) | (a >= high))
    if bad.size:
        i = np.unravel_index(bad[0], a.shape)
        where = ", ".join(map(str, i))
        raise DataFileError(path, f"{name}[{where}] = {a[i]} is outside [{low}, {high}){what} "
                                  f"({bad.size:,} entries are)")


def check_finite(path, name: str, a: np.ndarray) -> None:
    """No NaN or infinity in ``a``; the error names the first one."""
    if a.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            i = np.unravel_index(bad[0], a.shape)
            raise DataFileError(path, f"{name}[{', '.join(map(str, i))}] = {a[i]} is not finite "
                                      f"({bad.size:,} entries are not)")


def cast_values(path, name: str, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (float64, finite) as ``dtype``, after checking that ``dtype`` holds every value: a value finite in the
    file but past ``dtype``'s range (1e300 for float32) would load as inf. The error names the first such entry."""
    if x.numel() and x.dtype != dtype:
        top = torch.finfo(dtype).max
        bad = (x.abs() > top).nonzero()
        if bad.shape[0]:
            i = tuple(int(v) for v in bad[0])
            raise DataFileError(path, f"{name}[{', '.join(map(str, i))}] = {float(x[i])!r} does not fit "
                                      f"{str(dtype).replace('torch.', '')} (largest {top:.4g}; {bad.shape[0]:,} such "
                                      "entries): load it with dtype=torch.float64")
    return x.to(dtype)


def check_lengths(path, name: str, lengths: np.ndarray, total: int, *, item: str, part: str) -> None:
    """Every length >= 1 and the lengths adding up to ``total`` rows: each ``item`` (a word) owns the next
    ``lengths[i]`` rows (its ``part``s, letters), so a length of 0 or a wrong sum would shift every later
    item onto another one's rows."""
    bad = np.flatnonzero(lengths < 1)
    if bad.size:
        raise DataFileError(path, f"{name}[{bad[0]}] = {lengths[bad[0]]}: every {item} needs at least one {part} "
                                  f"({bad.size:,} {item}s have none)")
    s = int(lengths.astype(np.int64).sum())
    if s != total:
        raise DataFileError(path, f"{name} add up to {s:,} {part}s but the file holds {total:,}")


def check_size(path, what: str, got: int, expected: int, *, documented: str = "") -> None:
    """``got == expected`` (a documented size of the file); ``documented`` says which."""
    if got != expected:
        doc = f" ({documented})" if documented else ""
        raise DataFileError(path, f"expected {expected:,} {what}{doc}, got {got:,}")
