"""Evaluate a chain model on a `SequenceDataset`: MAP decoding in batches, then the metrics."""

from __future__ import annotations

import torch

from ._validation import check_positive_int
from .data.sequence_dataset import SequenceDataset
from .metrics import chunk_f1, labels_to_tags, sequence_errors, token_errors
from .structures.chain import Chain


@torch.no_grad()
def predict_chain(model, structure: Chain, dataset: SequenceDataset, *, batch_size: int = 256,
                  device=None, backend: str = "auto", forward=None):
    """MAP labels of every sequence, ``(N, T)`` long padded with -1, on the CPU.

    ``forward(model, batch) -> potentials`` maps a `ChainBatch` to potentials; the default is
    ``model(batch.x)``. The model is put in eval mode for the pass and restored after.
    """
    batch_size = check_positive_int("batch_size", batch_size)
    device = device or next(model.parameters()).device
    forward = forward or (lambda m, b: m(b.x))
    out = torch.full(tuple(dataset.y.shape), -1, dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(dataset), batch_size):
            batch = dataset[s : s + batch_size].to(device)
            y_hat = structure.decode(forward(model, batch), batch.lengths, backend=backend)
            out[s : s + y_hat.shape[0], : y_hat.shape[1]] = y_hat.cpu()
    finally:
        model.train(was_training)
    return out


def evaluate_chain(model, structure: Chain, dataset: SequenceDataset, *, batch_size: int = 256, device=None,
                   backend: str = "auto", forward=None) -> dict:
    """``token_error`` and ``sequence_error`` (fractions), plus ``chunk_f1`` (%) when the dataset holds
    IOB chunk tags. ``forward`` as in `predict_chain`."""
    y_hat = predict_chain(model, structure, dataset, batch_size=batch_size, device=device, backend=backend,
                          forward=forward)
    wrong, total = token_errors(y_hat, dataset.y.cpu(), dataset.lengths.cpu())
    swrong, stotal = sequence_errors(y_hat, dataset.y.cpu(), dataset.lengths.cpu())
    result = {"token_error": wrong / max(total, 1), "sequence_error": swrong / max(stotal, 1)}
    if dataset.tags is not None and dataset.label_names and any("-" in n for n in dataset.label_names):
        pred = labels_to_tags(y_hat, dataset.lengths.cpu(), dataset.label_names)
        result["chunk_f1"] = chunk_f1(pred, dataset.tags)["f1"]
    return result
