"""Evaluation metrics for labelled sequences: token and sequence error, and chunk F1 (conlleval)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

from ._validation import check_lengths, check_tensor


def _valid(y: torch.Tensor, lengths: Optional[torch.Tensor]) -> torch.Tensor:
    """The tokens within the lengths of a padded batch ``y (B, T)``, after checking ``y`` and ``lengths``."""
    check_tensor("y", y, ndim=2, integer=True)
    lengths = check_lengths(lengths, y.shape[0], y.shape[1], y.device)  # None: every sequence has length T
    return torch.arange(y.shape[1], device=y.device).unsqueeze(0) < lengths.unsqueeze(1)


def _check_predictions(y_hat: torch.Tensor, y: torch.Tensor) -> None:
    check_tensor("y_hat", y_hat, integer=True, device=y.device)
    if y_hat.shape != y.shape:
        raise ValueError(f"y_hat must have y's shape {tuple(y.shape)}, got {tuple(y_hat.shape)}")


def token_errors(y_hat: torch.Tensor, y: torch.Tensor, lengths: Optional[torch.Tensor]) -> Tuple[int, int]:
    """(wrong tokens, tokens) over a padded batch ``(B, T)`` (``lengths`` None: every sequence has length T); the
    error rate is their ratio."""
    valid = _valid(y, lengths)
    _check_predictions(y_hat, y)
    return int(((y_hat != y) & valid).sum()), int(valid.sum())


def sequence_errors(y_hat: torch.Tensor, y: torch.Tensor, lengths: Optional[torch.Tensor]) -> Tuple[int, int]:
    """(sequences with at least one wrong token, sequences): OCR's "word error"."""
    valid = _valid(y, lengths)
    _check_predictions(y_hat, y)
    wrong = ((y_hat != y) & valid).any(dim=1)
    return int(wrong.sum()), int(y.shape[0])


def _split_tag(tag: str) -> Tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    if not kind:
        if prefix in ("B", "I", "E", "S"):  # an untyped tag: conlleval's (prefix, "")
            return prefix, ""
        # a bare type: read as I-type (a run of one type is one chunk); conlleval has no such reading
        return "I", prefix
    return prefix, kind


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    return (
        prev_tag in ("E", "S")
        or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
        or (prev_tag != "O" and prev_type != type_)
    )


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    return (
        tag in ("B", "S")
        or (prev_tag in ("E", "S", "O") and tag in ("I", "E"))
        or (tag != "O" and prev_type != type_)
    )


def chunks(tags: Sequence[str]) -> Set[Tuple[int, int, str]]:
    """Chunks ``(start, end_exclusive, type)`` of one IOB/IOB2/IOE sentence, by conlleval's rules."""
    out = set()
    prev_tag, prev_type, start = "O", "", None
    for i, tag in enumerate(list(tags) + ["O"]):
        t, kind = _split_tag(tag)
        if start is not None and _end_of_chunk(prev_tag, t, prev_type, kind):
            out.add((start, i, prev_type))
            start = None
        if _start_of_chunk(prev_tag, t, prev_type, kind):
            start = i
        prev_tag, prev_type = t, kind
    return out


def chunk_f1(predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> Dict[str, float]:
    """Phrase-level precision, recall and F1 (in %) in the conlleval sense over a corpus of sentences."""
    if len(predicted) != len(gold):
        raise ValueError(f"predicted has {len(predicted)} sentences but gold has {len(gold)}")
    correct = n_pred = n_gold = 0
    for i, (p, g) in enumerate(zip(predicted, gold)):
        for name, sentence in (("predicted", p), ("gold", g)):
            if isinstance(sentence, str):  # a str is a sequence of one-letter "tags"
                raise TypeError(f"{name} must be a list of sentences (lists of tags), got the str {sentence!r} "
                                f"as sentence {i}")
        if len(p) != len(g):
            raise ValueError(f"sentence {i}: predicted has {len(p)} tags but gold has {len(g)}")
        cp, cg = chunks(p), chunks(g)
        correct += len(cp & cg)
        n_pred += len(cp)
        n_gold += len(cg)
    precision = 100.0 * correct / n_pred if n_pred else 0.0
    recall = 100.0 * correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "correct": correct, "predicted": n_pred,
            "gold": n_gold}


def labels_to_tags(y: torch.Tensor, lengths: Optional[torch.Tensor], names: Sequence[str]) -> List[List[str]]:
    """Padded label ids ``(B, T)`` to lists of tag strings; ids within the lengths must be in
    ``[0, len(names))``."""
    valid = _valid(y, lengths)
    inside = y[valid]
    if inside.numel() and not (0 <= int(inside.min()) and int(inside.max()) < len(names)):
        raise ValueError(f"y must hold label ids in [0, {len(names)}) within the lengths, got "
                         f"[{int(inside.min())}, {int(inside.max())}]")
    rows = y.tolist()
    return [[names[k] for k in row[:L]] for row, L in zip(rows, valid.sum(1).tolist())]
