"""CoNLL-2000 text chunking (WSJ): 8,936 training and 2,012 test sentences, one token a line.

Tokens get CRFsuite-style sparse binary attributes (the feature set of Sha & Pereira 2003 used by the BCFW papers,
Lacoste-Julien et al., 2013 and Osokin et al., 2016): word identities at offsets -2..2, the word bigrams (-1,0) and
(0,1), POS identities at offsets -2..2, the four POS bigrams and three POS trigrams inside the window, plus ``__BOS__``
/ ``__EOS__`` on the first / last token. A template that reaches past the sentence yields nothing. The attribute
vocabulary is the set seen in the training split: 335,674 attributes (the papers' 74,658 came from a frequency-pruned
version of templates they do not list; ``min_count=3`` keeps 75,289, the closest match). Test attributes unseen in
training are dropped. With the OCR-style bias ``d = A K + K^2 + 3K`` for K = 22 chunk tags: 7,385,378 (all 335,674
attributes) or 1,656,908 (``min_count=3``; the papers' d is 1,643,026).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from typing import List, Optional, Tuple

import numpy as np
import torch

from .._validation import check_positive_int
from .checks import DataFileError, check_size, text_lines
from .paths import file_stamp, locate
from .sequence_dataset import SequenceDataset
from .token_features import TokenFeatures

URLS = {
    "train": "https://www.clips.uantwerpen.be/conll2000/chunking/train.txt.gz",
    "test": "https://www.clips.uantwerpen.be/conll2000/chunking/test.txt.gz",
}
# SHA-256 of the shared-task files these loaders are tested with (the original gzip files, dated 2007 in their
# headers); a download from `URLS` must match them.
SHA256 = {
    "train": "160109d8a1c31381976affcb534abbfa11e0bb5acabc60d4feb5c6b0874a8858",
    "test": "6864d222606f9deff739206a49f01d43651041b8deb94f0ea4e98ba0b14217ab",
}
TASKS = ("chunk", "pos")
SIZES = {"train": 8936, "test": 2012}  # sentences
NUM_TOKENS = {"train": 211727, "test": 47377}
NUM_LABELS = {"chunk": 22, "pos": 44}  # distinct tags in the training split
_CHUNK_TAG = re.compile(r"O|[BI]-[A-Z]+")  # IOB2

_WORD_OFFSETS = (-2, -1, 0, 1, 2)
_TEMPLATES: Tuple[Tuple[Tuple[int, int], ...], ...] = (
    tuple(((0, o),) for o in _WORD_OFFSETS)
    + ((((0, -1), (0, 0))), (((0, 0), (0, 1))))
    + tuple(((1, o),) for o in _WORD_OFFSETS)
    + tuple(((1, o), (1, o + 1)) for o in (-2, -1, 0, 1))
    + tuple(((1, o), (1, o + 1), (1, o + 2)) for o in (-2, -1, 0))
)
_COLUMN = ("w", "pos")


def read_conll(path) -> List[List[Tuple[str, str, str]]]:
    """Sentences as lists of ``(word, pos, chunk)`` from a (gzipped) CoNLL file: one token a line, a blank
    line between sentences.

    Checked: three fields a line, a chunk tag in IOB2 (``O``, ``B-X`` or ``I-X``), the gzip stream and UTF-8
    text (`text_lines`); errors are `DataFileError` naming ``path`` and the line.
    """
    sentences, cur = [], []
    for lineno, line in enumerate(text_lines(path), 1):
        fields = line.split()
        if not fields:
            if cur:
                sentences.append(cur)
                cur = []
            continue
        if len(fields) != 3:
            raise DataFileError(path, f"line {lineno}: expected 'word POS chunk', got {line.strip()!r}")
        if not _CHUNK_TAG.fullmatch(fields[2]):
            raise DataFileError(path, f"line {lineno}: chunk tag {fields[2]!r} is not IOB2 (O, B-X or I-X)")
        cur.append(tuple(fields))
    if cur:
        sentences.append(cur)
    return sentences


def check_split(path, split: str, sentences) -> None:
    """The documented sizes of a split: `SIZES` sentences and `NUM_TOKENS` tokens."""
    check_size(path, "sentences", len(sentences), SIZES[split], documented=f"the CoNLL-2000 {split} split")
    check_size(path, "tokens", sum(map(len, sentences)), NUM_TOKENS[split],
               documented=f"the CoNLL-2000 {split} split")


def token_attributes(sentence: List[Tuple[str, str, str]], *, use_pos: bool = True) -> List[List[str]]:
    """CRFsuite-style attribute strings of every token (see the module docstring); ``use_pos=False``
    keeps the word templates only (for the POS-tagging task, where POS attributes would give the answer)."""
    n = len(sentence)
    templates = _TEMPLATES if use_pos else tuple(tp for tp in _TEMPLATES if all(c == 0 for c, _ in tp))
    out = []
    for t in range(n):
        attrs = []
        for template in templates:
            parts = []
            for col, off in template:
                if not 0 <= t + off < n:
                    break
                parts.append(f"{_COLUMN[col]}[{off}]={sentence[t + off][col]}")
            else:
                attrs.append("|".join(parts))
        if t == 0:
            attrs.append("__BOS__")
        if t == n - 1:
            attrs.append("__EOS__")
        out.append(attrs)
    return out


@functools.lru_cache(maxsize=4)
def _sentences_of(stamp: tuple):
    return read_conll(stamp[0])


@functools.lru_cache(maxsize=4)
def _parsed_of(stamp: tuple, task: str):
    sentences = _sentences_of(stamp)
    return sentences, [token_attributes(s, use_pos=task != "pos") for s in sentences]


@functools.lru_cache(maxsize=8)
def _vocabulary_of(stamp: tuple, task: str, min_count: int):
    sentences, attributes = _parsed_of(stamp, task)
    counts = Counter(a for sent in attributes for tok in sent for a in tok)
    return {a: i for i, a in enumerate(sorted(a for a, c in counts.items() if c >= min_count))}


def _sentences(path: str):
    return _sentences_of(file_stamp(path))


def _parsed(path: str, task: str):
    return _parsed_of(file_stamp(path), task)


def _vocabulary(path: str, task: str, min_count: int):
    return _vocabulary_of(file_stamp(path), task, min_count)


def conll2000(split: str = "train", task: str = "chunk", *, root: Optional[str] = None, min_count: int = 1,
              features: str = "attributes", download: bool = False) -> SequenceDataset:
    """CoNLL-2000 as a `SequenceDataset`.

    Args:
        split: ``"train"`` or ``"test"``.
        task: ``"chunk"`` (22 IOB2 chunk tags) or ``"pos"`` (44 part-of-speech tags, the second chain;
            its attributes use the words only).
        root: folder holding ``conll2000/{train,test}.txt.gz``.
        min_count: keep attributes (or, with ``features="tokens"``, words) seen at least this often in
            the training split.
        features: ``"attributes"``: sparse `TokenFeatures` for linear models; ``"tokens"``: ``x`` is a
            long tensor ``(N, T, C)`` of word ids (and, for the chunk task, POS ids) for embedding
            layers, id 0 meaning unknown; the vocabularies are in ``dataset.meta``.

    Both files are checked (`read_conll`, `check_split`: the documented numbers of sentences and tokens, and
    22 chunk / 44 POS tags in training); a `DataFileError` names the file and what is wrong. ``download=True``
    fetches a missing file over https and checks it against `SHA256`.

    Labels and the attribute vocabulary come from the training split. A test tag never seen in training
    (``I-LST``, 2 chunk tokens) is mapped to ``O`` in ``y``; ``dataset.tags`` keeps the original strings,
    so `chunk_f1` against them is the true conlleval score.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    check_positive_int("min_count", min_count)
    if features not in ("attributes", "tokens"):
        raise ValueError(f"features must be 'attributes' or 'tokens', got {features!r}")
    train_path = str(locate(root, "conll2000/train.txt.gz", url=URLS["train"], download=download,
                            digest=SHA256["train"]))
    path = train_path if split == "train" else str(
        locate(root, "conll2000/test.txt.gz", url=URLS["test"], download=download, digest=SHA256["test"]))
    check_split(train_path, "train", _sentences(train_path))
    sentences = _sentences(path)
    check_split(path, split, sentences)
    col = 2 if task == "chunk" else 1
    labels = sorted({tok[col] for s in _sentences(train_path) for tok in s})
    check_size(train_path, f"{task} tags", len(labels), NUM_LABELS[task], documented="the CoNLL-2000 train split")
    label_id = {lab: i for i, lab in enumerate(labels)}
    fallback = label_id.get("O", 0) if task == "chunk" else 0
    n = len(sentences)
    T = max(len(s) for s in sentences)
    y = np.full((n, T), -1, dtype=np.int64)
    for i, sent in enumerate(sentences):
        y[i, : len(sent)] = [label_id.get(tok[col], fallback) for tok in sent]
    lengths = torch.tensor([len(s) for s in sentences], dtype=torch.long)
    tags = [[tok[col] for tok in s] for s in sentences]
    common = {"num_labels": len(labels), "label_names": labels, "tags": tags}
    name = f"conll2000-{task}-{split}"
    if features == "tokens":
        x, meta = _token_ids(train_path, sentences, task, min_count)
        return SequenceDataset(x, torch.from_numpy(y), lengths, num_features=len(meta["words"]), meta=meta,
                               name=name, **common)
    vocab = _vocabulary(train_path, task, min_count)
    _, attributes = _parsed(path, task)
    A = max(len(tok) for sent in attributes for tok in sent)
    ids = np.full((n, T, A), -1, dtype=np.int64)
    for i, attrs in enumerate(attributes):
        for t, tok in enumerate(attrs):
            r = [vocab[a] for a in tok if a in vocab]
            ids[i, t, : len(r)] = r
    return SequenceDataset(TokenFeatures(torch.from_numpy(ids)), torch.from_numpy(y), lengths,
                           num_features=len(vocab), meta={"attributes": list(vocab)}, name=name, **common)


def _token_ids(train_path: str, sentences, task: str, min_count: int):
    """``(N, T, C)`` word (and POS) ids with 0 for unknown / padding, and the vocabularies."""
    train = _sentences(train_path)
    counts = Counter(tok[0] for s in train for tok in s)
    words = ["<unk>"] + sorted(w for w, c in counts.items() if c >= min_count)
    columns = [(0, {w: i for i, w in enumerate(words)})]
    meta = {"words": words}
    if task == "chunk":
        pos = ["<unk>"] + sorted({tok[1] for s in train for tok in s})
        columns.append((1, {p: i for i, p in enumerate(pos)}))
        meta["pos"] = pos
    x = np.zeros((len(sentences), max(len(s) for s in sentences), len(columns)), dtype=np.int64)
    for i, sent in enumerate(sentences):
        for c, (col, index) in enumerate(columns):
            x[i, : len(sent), c] = [index.get(tok[col], 0) for tok in sent]
    return torch.from_numpy(x), meta
