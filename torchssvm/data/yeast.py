"""Yeast multi-label data (Elisseeff & Weston, 2001): 1,500 train / 917 test genes, 103 dense features, 14 labels.

Read from ``yeast/yeast_{train,test}.svm.gz`` under the data root (LIBSVM multi-label format:
``l1,l2,... idx:val ...`` with 1-based feature ids), the standard LIBSVM copies.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .checks import DataFileError, cast_values, check_size, text_lines
from .multilabel_dataset import MultiLabelDataset
from .paths import locate

NUM_FEATURES = 103
NUM_LABELS = 14
SIZES = {"train": 1500, "test": 917}


def parse_libsvm_multilabel(lines, num_features: int, num_labels: int, *, source: str = ""):
    """``(x (n, D) float64, y (n, K) long)`` from LIBSVM multi-label lines ``l1,l2,... idx:val ...``.

    Labels must be integers in ``[0, num_labels)``, feature ids integers in ``[1, num_features]`` (once per
    line) and values finite. Errors are `DataFileError` naming the line (and ``source``, when given).
    """
    xs, ys = [], []
    for no, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        parts = line.split()
        head, feats = (parts[0], parts[1:]) if ":" not in parts[0] else ("", parts)
        x = [0.0] * num_features
        y = [0] * num_labels
        for lab in filter(None, head.split(",")):
            try:
                k = int(lab)
            except ValueError:
                raise DataFileError(source, f"line {no}: label {lab!r} is not an integer") from None
            if not 0 <= k < num_labels:
                raise DataFileError(source, f"line {no}: label {k} outside [0, {num_labels})")
            y[k] = 1
        seen = set()
        for f in feats:
            i, sep, v = f.partition(":")
            try:
                j, val = int(i) - 1, float(v if sep else "")  # float("") raises too: no ":"
            except ValueError:
                raise DataFileError(source, f"line {no}: {f!r} is not a feature id:value pair") from None
            if not 0 <= j < num_features:
                raise DataFileError(source, f"line {no}: feature id {i} outside [1, {num_features}]")
            if j in seen:
                raise DataFileError(source, f"line {no}: feature id {i} given twice")
            if not math.isfinite(val):
                raise DataFileError(source, f"line {no}: feature {i} has the non-finite value {v!r}")
            seen.add(j)
            x[j] = val
        xs.append(x)
        ys.append(y)
    return torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.long)


def yeast(split: str = "train", root: Optional[str] = None, *, dtype=torch.float32) -> MultiLabelDataset:
    """The Yeast ``split`` (``"train"`` or ``"test"``) as a `MultiLabelDataset` of ``dtype`` features.

    The file is checked: every line (`parse_libsvm_multilabel`: labels in [0, 14), feature ids in [1, 103],
    finite values), the documented size (`SIZES`), the gzip stream and the text encoding; a `DataFileError`
    names the file and what is wrong.
    """
    if split not in SIZES:
        raise ValueError(f"split must be one of {tuple(SIZES)}, got {split!r}")
    path = locate(root, f"yeast/yeast_{split}.svm.gz")
    x, y = parse_libsvm_multilabel(text_lines(path), NUM_FEATURES, NUM_LABELS, source=str(path))
    check_size(path, "examples", x.shape[0], SIZES[split], documented=f"the Yeast {split} split")
    return MultiLabelDataset(cast_values(path, "x", x, dtype), y, name=f"yeast-{split}")
