"""Adult (UCI) in the LIBSVM "a9a" encoding: 32,561 people, 123 binary features, labels +1 (income > 50K) / -1.

Read from ``adult/a9a.txt.gz`` under the data root (LIBSVM binary format: ``+1 idx:val ...`` with 1-based
feature ids), the standard LIBSVM copy, whose SHA-256 is ``SHA256`` (a file that fails the loader's checks
gets its own digest and this one in the error, to tell a damaged copy from the documented one). The loader
downloads nothing: LIBSVM serves a9a uncompressed, and that file's digest is not recorded here. Only the LIBSVM
training file is shipped, so train/test splits are drawn from it by a seeded random permutation
(`split_indices`). Yu & Joachims (2008) train on 22,697 examples: ``test_fraction=9864 / 32561`` gives exactly
that split size.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from array import array
from typing import Optional

import torch

from .._validation import check_float_dtype, check_seed
from .checks import DataFileError, cast_values, check_size, text_lines
from .paths import file_stamp, locate, sha256

RELPATH = "adult/a9a.txt.gz"
NUM_FEATURES = 123
SIZE = 32561
NUM_POSITIVE = 7841  # 24.08% of SIZE, counted from the file
SHA256 = "2b74490fe18a90c2bd239b65ad059793acfd943053b7de8273ab4798644961a0"  # of a9a.txt.gz
SPLITS = ("train", "test", "all")
_LABELS = {"+1": 1, "1": 1, "-1": -1}
_FEATURES = re.compile(r"(?:\d+:[^\s:]+(?: |$))*")  # space-joined idx:value tokens


def _line_error(source: str, no: int, feats, num_features: int) -> DataFileError:
    """The error of a line that failed the fast path of `parse_libsvm_binary`, found token by token."""
    seen = set()
    for tok in feats:
        idx, _, val = tok.partition(":")
        try:
            if not idx.isdigit():
                raise ValueError
            j, v = int(idx) - 1, float(val)
        except ValueError:
            return DataFileError(source, f"line {no}: expected idx:value (idx a positive integer), got {tok!r}")
        if not 0 <= j < num_features:
            return DataFileError(source, f"line {no}: feature id {idx} outside [1, {num_features}]")
        if j in seen:
            return DataFileError(source, f"line {no}: feature id {idx} appears twice")
        if not math.isfinite(v):
            return DataFileError(source, f"line {no}: feature {idx} has non-finite value {val!r}")
        seen.add(j)
    return DataFileError(source, f"line {no}: malformed features {' '.join(feats)!r}")


def parse_libsvm_binary(lines, num_features: int, *, source: str = ""):
    """``(x (n, D) float64 dense, y (n,) long in {-1, +1})`` from LIBSVM binary lines ``±1 idx:val ...``.

    Feature ids are 1-based and must lie in ``[1, num_features]``, once per line; values must be finite.
    Blank lines are skipped. Errors are `DataFileError` naming the line (and ``source``, when given).
    """
    rows, cols, vals, ys = array("q"), array("q"), array("d"), []  # arrays: cheap to hand to torch
    for no, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        lab = _LABELS.get(parts[0])
        if lab is None:
            raise DataFileError(source, f"line {no}: label must be +1 or -1, got {parts[0]!r}")
        feats = parts[1:]
        # fast path (C-level builtins): every token is digits:value, then range, duplicate and finiteness checks
        rest = " ".join(feats)
        try:
            if not _FEATURES.fullmatch(rest):
                raise ValueError
            kv = rest.replace(":", " ").split()
            js = list(map(int, kv[0::2]))
            vs = list(map(float, kv[1::2]))
            if js and (min(js) < 1 or max(js) > num_features or len(set(js)) != len(js)):
                raise ValueError
            if not all(map(math.isfinite, vs)):
                raise ValueError
        except ValueError:
            raise _line_error(source, no, feats, num_features) from None
        rows.extend([len(ys)] * len(js))
        cols.extend(js)
        vals.extend(vs)
        ys.append(lab)
    x = torch.zeros(len(ys), num_features, dtype=torch.float64)
    if rows:
        r, c = torch.frombuffer(rows, dtype=torch.int64), torch.frombuffer(cols, dtype=torch.int64)
        x[r, c - 1] = torch.frombuffer(vals, dtype=torch.float64)
    return x, torch.tensor(ys, dtype=torch.long)


@functools.lru_cache(maxsize=4)
def _load_all(path: str, mtime_ns: int, size: int):
    """Parsed ``(x float64, y long)`` of the whole file, cached per (resolved path, mtime, size): a file
    changed on disk is parsed again. Callers must not modify the returned tensors.

    Checked: every line (`parse_libsvm_binary`), the documented sizes (`SIZE` examples, `NUM_POSITIVE` of
    them +1) and the gzip stream and text encoding (`text_lines`); errors are `DataFileError` naming ``path``."""
    try:
        x, y = parse_libsvm_binary(text_lines(path), NUM_FEATURES, source=path)
        check_size(path, "examples", x.shape[0], SIZE, documented="the a9a size")
        check_size(path, "examples labelled +1", int((y == 1).sum()), NUM_POSITIVE, documented="the a9a count")
    except DataFileError as err:
        raise DataFileError(path, f"{err.problem} (this file's SHA-256 is {sha256(path)}, the documented "
                                  f"copy's {SHA256})") from err
    return x, y


def split_indices(n: int, test_fraction: float = 0.3, seed: int = 0):
    """``(train_idx, test_idx)``, sorted, disjoint and covering ``range(n)``: the first
    ``round(test_fraction * n)`` entries of a ``torch.randperm(n)`` seeded with ``seed`` are the test set."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real):
        raise TypeError(f"test_fraction must be a number, got {type(test_fraction).__name__}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    seed = check_seed(seed)
    n_test = round(test_fraction * n)
    if not 0 < n_test < n:
        raise ValueError(f"test_fraction={test_fraction} leaves an empty train or test set of {n} examples")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    return perm[n_test:].sort().values, perm[:n_test].sort().values


def a9a(split: str = "train", *, test_fraction: float = 0.3, seed: int = 0, root: Optional[str] = None,
        dtype: torch.dtype = torch.float32):
    """The a9a ``split`` as ``(x (n, 123) dtype, y (n,) long in {-1, +1})``, rows in file order.

    ``"all"`` is the whole file (32,561 rows); ``"train"`` and ``"test"`` are the two sides of
    `split_indices` ``(32561, test_fraction, seed)`` (defaults: 22,793 / 9,768), so a fixed ``seed`` gives a
    fixed split. The file is parsed once per process (cached on its resolved path); every call returns
    fresh tensors.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    check_float_dtype(dtype)
    train_idx, test_idx = split_indices(SIZE, test_fraction, seed)
    stamp = file_stamp(locate(root, RELPATH))
    path = stamp[0]
    x, y = _load_all(*stamp)
    if split == "all":
        return cast_values(path, "x", x, dtype).clone(), y.clone()
    idx = train_idx if split == "train" else test_idx
    return cast_values(path, "x", x, dtype).index_select(0, idx), y.index_select(0, idx)
