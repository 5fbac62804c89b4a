"""OCR handwritten words (Taskar et al. 2003), the chain benchmark of the BCFW papers
(Lacoste-Julien et al., 2013; Osokin et al., 2016).

52,152 letters of 16x8 binary pixels in 6,877 words, 26 labels, 10 folds. Splits of the papers:
OCR-small trains on fold 0 (626 words) and tests on folds 1..9 (6,251); OCR-large is the reverse.
"""

from __future__ import annotations

import gzip
from typing import Optional

import numpy as np
import torch

from .._validation import check_float_dtype
from .paths import locate
from .sequence_dataset import SequenceDataset

LETTERS = [chr(ord("a") + i) for i in range(26)]
NPZ = "ocr/letters.npz"
SOURCE = "ocr/letter.data.gz"
SOURCE_URL = "http://ai.stanford.edu/~btaskar/ocr/letter.data.gz"
SIZES = {("large", "train"): 6251, ("large", "test"): 626, ("small", "train"): 626, ("small", "test"): 6251}


def parse_letter_data(path) -> dict:
    """Parse Taskar's ``letter.data(.gz)`` (tab separated: id, letter, next_id, word_id, position, fold,
    128 pixels) into the arrays of ``letters.npz`` (pixels, labels, lengths, folds), words in file order."""
    opener = gzip.open if str(path).endswith(".gz") else open
    pixels, labels, lengths, folds = [], [], [], []
    current = 0
    with opener(path, "rt") as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 6 + 128:
                raise ValueError(f"{path}:{lineno}: expected 134 fields, got {len(fields)}")
            labels.append(ord(fields[1]) - ord("a"))
            pixels.append([int(v) for v in fields[6:]])
            current += 1
            if int(fields[2]) == -1:  # last letter of a word
                lengths.append(current)
                folds.append(int(fields[5]))
                current = 0
    if current:
        raise ValueError(f"{path}: the last word has no end marker (next_id = -1)")
    return {
        "pixels": np.asarray(pixels, dtype=np.uint8),
        "labels": np.asarray(labels, dtype=np.uint8),
        "lengths": np.asarray(lengths, dtype=np.int32),
        "folds": np.asarray(folds, dtype=np.int8),
    }


def _load_arrays(root: Optional[str], download: bool) -> dict:
    try:
        path = locate(root, NPZ)
    except FileNotFoundError as missing:
        if not download:
            raise FileNotFoundError(f"{missing} (or pass download=True to fetch {SOURCE_URL})") from None
        return parse_letter_data(locate(root, SOURCE, url=SOURCE_URL, download=True))
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in ("pixels", "labels", "lengths", "folds")}


def ocr(split: str = "train", variant: str = "large", *, root: Optional[str] = None, download: bool = False,
        dtype: torch.dtype = torch.float32) -> SequenceDataset:
    """The OCR words as a dense `SequenceDataset`: x ``(N, 14, 128)`` pixels, 26 labels.

    Args:
        split: ``"train"`` or ``"test"``.
        variant: ``"large"`` (train folds 1..9: 6,251 words) or ``"small"`` (train fold 0: 626 words).
        root: folder holding ``ocr/letters.npz`` (default ``$TORCHSSVM_DATA`` or the user cache).
        download: fetch Taskar's ``letter.data.gz`` when neither file is there.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if variant not in ("large", "small"):
        raise ValueError(f"variant must be 'large' or 'small', got {variant!r}")
    check_float_dtype(dtype)
    a = _load_arrays(root, download)
    lengths = a["lengths"].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    in_fold0 = a["folds"] == 0
    keep = in_fold0 if (variant == "small") == (split == "train") else ~in_fold0
    words = np.flatnonzero(keep)
    T = int(lengths.max())
    n = len(words)
    x = torch.zeros(n, T, 128, dtype=dtype)
    y = torch.full((n, T), -1, dtype=torch.long)
    pixels = torch.from_numpy(a["pixels"].astype(np.float32))
    labels = torch.from_numpy(a["labels"].astype(np.int64))
    for row, w in enumerate(words):
        s, L = int(starts[w]), int(lengths[w])
        x[row, :L] = pixels[s : s + L]
        y[row, :L] = labels[s : s + L]
    return SequenceDataset(x, y, torch.from_numpy(lengths[words]), num_labels=26, num_features=128,
                           label_names=LETTERS, name=f"ocr-{variant}-{split}")
