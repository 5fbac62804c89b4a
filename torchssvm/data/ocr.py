"""OCR handwritten words (Taskar et al. 2003), the chain benchmark of the BCFW papers
(Lacoste-Julien et al., 2013; Osokin et al., 2016).

52,152 letters of 16x8 binary pixels in 6,877 words, 26 labels, 10 folds. Splits of the papers:
OCR-small trains on fold 0 (626 words) and tests on folds 1..9 (6,251); OCR-large is the reverse.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .._validation import check_float_dtype
from . import checks
from .checks import DataFileError, check_kind, check_lengths, check_range, check_size
from .paths import locate
from .sequence_dataset import SequenceDataset

LETTERS = [chr(ord("a") + i) for i in range(26)]
NPZ = "ocr/letters.npz"
SOURCE = "ocr/letter.data.gz"
# Taskar's file. Its SHA-256 is not recorded (``letters.npz`` is a conversion of the data, with a digest of its
# own), so a download of it is not verified byte for byte and warns: the line checks of `parse_letter_data`,
# `check_ocr_arrays` and the documented sizes below are what vouch for it.
SOURCE_URL = "https://ai.stanford.edu/~btaskar/ocr/letter.data.gz"
SOURCE_SHA256 = None
NUM_PIXELS = 128  # 16 x 8
NUM_FOLDS = 10
FOLD_SIZES = (626, 704, 684, 698, 693, 651, 739, 717, 690, 675)  # words per fold, folds 0..9
NUM_WORDS = 6877
NUM_LETTERS = 52152
SIZES = {("large", "train"): 6251, ("large", "test"): 626, ("small", "train"): 626, ("small", "test"): 6251}
_KEYS = ("pixels", "labels", "lengths", "folds")


def check_ocr_arrays(path, a: dict) -> None:
    """The arrays of ``letters.npz`` (or parsed from ``letter.data``) are consistent, a `DataFileError` naming
    ``path`` otherwise: ``pixels (L, 128)`` finite 0 / 1, ``labels (L,)`` in [0, 26), ``lengths (W,)`` >= 1
    adding up to L (a length of 0 or a wrong sum shifts every later word onto another word's letters) and
    ``folds (W,)`` in [0, 10). The documented sizes of the full file are checked by `check_documented_sizes`.
    """
    pixels, labels, lengths, folds = (a[k] for k in _KEYS)
    check_kind(path, "pixels", pixels, "iubf", ndim=2)
    for name in ("labels", "lengths", "folds"):
        check_kind(path, name, a[name], ndim=1)
    if pixels.shape[1] != NUM_PIXELS:
        raise DataFileError(path, f"pixels must have {NUM_PIXELS} columns (16 x 8 images), got shape {pixels.shape}")
    if labels.shape[0] != pixels.shape[0]:
        raise DataFileError(path, f"labels has {labels.shape[0]:,} entries but pixels {pixels.shape[0]:,} rows "
                                  f"(one a letter)")
    if folds.shape[0] != lengths.shape[0]:
        raise DataFileError(path, f"folds has {folds.shape[0]:,} entries but lengths {lengths.shape[0]:,} "
                                  f"(one a word)")
    checks.check_finite(path, "pixels", pixels)
    off = np.flatnonzero((pixels != 0) & (pixels != 1))
    if off.size:
        r, c = divmod(int(off[0]), NUM_PIXELS)
        raise DataFileError(path, f"pixels[{r}, {c}] = {pixels[r, c]}: pixels must be 0 or 1 (binary images)")
    check_range(path, "labels", labels, 0, len(LETTERS), what=" (the letters a..z)")
    check_lengths(path, "lengths", lengths, labels.shape[0], item="word", part="letter")
    check_range(path, "folds", folds, 0, NUM_FOLDS)


def check_documented_sizes(path, a: dict) -> None:
    """The full OCR file: no fold empty (an empty fold leaves a split without data), 6,877 words, 52,152
    letters, the fold sizes `FOLD_SIZES`."""
    counts = np.bincount(a["folds"].astype(np.int64), minlength=NUM_FOLDS)
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        raise DataFileError(path, f"fold {empty[0]} holds no word (the OCR data set uses folds 0..{NUM_FOLDS - 1})")
    check_size(path, "words", a["lengths"].shape[0], NUM_WORDS, documented="the OCR data set")
    check_size(path, "letters", a["labels"].shape[0], NUM_LETTERS, documented="the OCR data set")
    counts = counts.tolist()
    if tuple(counts) != FOLD_SIZES:
        raise DataFileError(path, f"expected folds of {'/'.join(map(str, FOLD_SIZES))} words (the OCR data set), "
                                  f"got {'/'.join(map(str, counts))}")


def parse_letter_data(path) -> dict:
    """Parse Taskar's ``letter.data(.gz)`` (tab separated: id, letter, next_id, word_id, position, fold,
    128 pixels) into the arrays of ``letters.npz`` (pixels, labels, lengths, folds), words in file order.

    Each line is checked (134 fields, integer ids, a letter a..z, 0 / 1 pixels, ``next_id`` the next line's id
    or -1 at a word's end, consecutive positions and one word id and fold within a word) and then the arrays
    (`check_ocr_arrays`); errors are `DataFileError` naming ``path`` and the line.
    """
    pixels, labels, lengths, folds = [], [], [], []
    current, word_fold, word, last_position, expect_id = 0, None, None, None, None
    for lineno, line in enumerate(checks.text_lines(path), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 6 + NUM_PIXELS:
            raise DataFileError(path, f"line {lineno}: expected 134 fields, got {len(fields)}")
        try:
            ident, nxt, word_id, position, fold = (int(fields[i]) for i in (0, 2, 3, 4, 5))
            px = [int(v) for v in fields[6:]]
        except ValueError:
            raise DataFileError(path, f"line {lineno}: the ids, position, fold and pixels must be integers, "
                                      f"got {' '.join(fields[:6])!r} ...") from None
        letter = fields[1]
        if len(letter) != 1 or not "a" <= letter <= "z":
            raise DataFileError(path, f"line {lineno}: the letter must be one of a..z, got {letter!r}")
        if any(v not in (0, 1) for v in px):
            raise DataFileError(path, f"line {lineno}: pixels must be 0 or 1")
        if expect_id is not None and ident != expect_id:
            raise DataFileError(path, f"line {lineno}: id {ident}, but the previous line's next_id is {expect_id} "
                                      f"(a line is missing or out of order)")
        if current and position != last_position + 1:
            raise DataFileError(path, f"line {lineno}: letter position {position} follows {last_position} "
                                      f"(a line is missing or out of order)")
        if current and word_id != word:
            raise DataFileError(path, f"line {lineno}: word id {word_id} inside word {word}")
        if current and fold != word_fold:
            raise DataFileError(path, f"line {lineno}: fold {fold} inside a word of fold {word_fold}")
        labels.append(ord(letter) - ord("a"))
        pixels.append(px)
        current, word_fold, word, last_position = current + 1, fold, word_id, position
        if nxt == -1:  # last letter of a word
            lengths.append(current)
            folds.append(fold)
            current, expect_id = 0, None
        else:
            expect_id = nxt
    if current:
        raise DataFileError(path, "the last word has no end marker (next_id = -1)")
    a = {
        "pixels": np.asarray(pixels, dtype=np.uint8).reshape(-1, NUM_PIXELS),
        "labels": np.asarray(labels, dtype=np.uint8),
        "lengths": np.asarray(lengths, dtype=np.int32),
        "folds": np.asarray(folds, dtype=np.int8),
    }
    check_ocr_arrays(path, a)
    return a


def _load_arrays(root: Optional[str], download: bool) -> dict:
    """The checked arrays of ``letters.npz`` (or of Taskar's ``letter.data.gz``, downloaded when asked)."""
    try:
        path = locate(root, NPZ)
    except FileNotFoundError as missing:
        if not download:
            raise FileNotFoundError(f"{missing} (or pass download=True to fetch {SOURCE_URL})") from None
        path = locate(root, SOURCE, url=SOURCE_URL, download=True, digest=SOURCE_SHA256)
        a = parse_letter_data(path)
    else:
        a = checks.load_npz(path, _KEYS)
        check_ocr_arrays(path, a)
    check_documented_sizes(path, a)
    a["path"] = path
    return a


def ocr(split: str = "train", variant: str = "large", *, root: Optional[str] = None, download: bool = False,
        dtype: torch.dtype = torch.float32) -> SequenceDataset:
    """The OCR words as a dense `SequenceDataset`: x ``(N, 14, 128)`` pixels, 26 labels.

    Args:
        split: ``"train"`` or ``"test"``.
        variant: ``"large"`` (train folds 1..9: 6,251 words) or ``"small"`` (train fold 0: 626 words).
        root: folder holding ``ocr/letters.npz`` (default ``$TORCHSSVM_DATA`` or the user cache).
        download: fetch Taskar's ``letter.data.gz`` (https; its digest is not known, see `SOURCE_SHA256`) when
            neither file is there.

    The file is checked before use (`check_ocr_arrays`, then the documented sizes: 6,877 words, 52,152
    letters, `FOLD_SIZES`, `SIZES`); a `DataFileError` names it and what is wrong.
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
    check_size(a["path"], f"words in the {variant} {split} split", len(words), SIZES[variant, split],
               documented="the OCR data set")
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
