"""A padded in-memory dataset of labelled sequences, batched the way the chain structure expects."""

from __future__ import annotations

import numbers
from typing import Iterator, NamedTuple, Optional, Union

import torch

from .._validation import check_positive_int
from .token_features import TokenFeatures

Features = Union[torch.Tensor, TokenFeatures]


def batch_index(index, n: int, items: str):
    """A dataset's index as a tensor index: an integer (a Python, numpy or 0-dim tensor one) becomes the slice of a
    batch of one, and out of range raises IndexError (which also ends Python's iteration over the dataset);
    slices and index tensors pass through."""
    if isinstance(index, torch.Tensor) and index.dim() == 0:
        index = int(index)
    if isinstance(index, numbers.Integral):
        index = int(index)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} {items}")
        index = slice(index % n, index % n + 1)
    return index


class ChainBatch(NamedTuple):
    """``x``: ``(B, T, D)`` float or `TokenFeatures` ``(B, T, A)``; ``y``: ``(B, T)`` long, -1 padded;
    ``lengths``: ``(B,)`` long. T is the longest length in the batch."""

    x: Features
    y: torch.Tensor
    lengths: torch.Tensor

    def to(self, device) -> ChainBatch:
        return ChainBatch(self.x.to(device), self.y.to(device), self.lengths.to(device))


class SequenceDataset(torch.utils.data.Dataset):
    """Sequences padded to a common length.

    Indexing with an int, a slice, or an index tensor returns a `ChainBatch` (an int gives a batch of
    one) trimmed to the longest sequence it holds. ``num_labels`` and ``num_features`` size the model
    (``LinearChainModel(ds.num_features, ds.num_labels, sparse=ds.sparse)``); ``label_names``, ``tags``
    (original string labels, for chunk F1) and ``meta`` (e.g. vocabularies) are kept when the source has
    them. ``x`` may also be a long tensor of token ids ``(N, T, C)`` for embedding models.
    """

    def __init__(self, x: Features, y: torch.Tensor, lengths: torch.Tensor, *, num_labels: int,
                 num_features: int, label_names=None, tags=None, meta=None, name: str = ""):
        n = lengths.shape[0]
        if y.shape[0] != n or x.shape[0] != n:
            raise ValueError(f"x, y and lengths must have the same number of sequences, got "
                             f"{x.shape[0]}, {y.shape[0]}, {n}")
        self.x, self.y, self.lengths = x, y, lengths.long()
        self.num_labels, self.num_features = int(num_labels), int(num_features)
        self.label_names = list(label_names) if label_names is not None else None
        self.tags = tags
        self.meta = dict(meta or {})
        self.name = name

    @property
    def sparse(self) -> bool:
        return isinstance(self.x, TokenFeatures)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def __getitem__(self, index) -> ChainBatch:
        index = batch_index(index, len(self), "sequences")
        lengths = self.lengths[index]
        T = int(lengths.max()) if lengths.numel() else 1
        return ChainBatch(self.x[index][:, :T], self.y[index][:, :T], lengths)

    def batches(self, batch_size: int, *, shuffle: bool = False, generator: Optional[torch.Generator] = None,
                drop_last: bool = False) -> Iterator[ChainBatch]:
        """Mini-batches in order, or in a random order drawn from ``generator``."""
        check_positive_int("batch_size", batch_size)
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        stop = n - n % batch_size if drop_last else n
        for s in range(0, stop, batch_size):
            yield self[order[s : s + batch_size]]

    def subset(self, indices) -> SequenceDataset:
        """A new dataset of the sequences at ``indices`` (padding kept at this dataset's size)."""
        idx = torch.as_tensor(list(indices) if not isinstance(indices, torch.Tensor) else indices, dtype=torch.long)
        tags = [self.tags[i] for i in idx.tolist()] if self.tags is not None else None
        return SequenceDataset(self.x[idx], self.y[idx], self.lengths[idx], num_labels=self.num_labels,
                               num_features=self.num_features, label_names=self.label_names, tags=tags,
                               meta=self.meta, name=f"{self.name}[{len(idx)}]")

    def to(self, device) -> SequenceDataset:
        return SequenceDataset(self.x.to(device), self.y.to(device), self.lengths.to(device),
                               num_labels=self.num_labels, num_features=self.num_features,
                               label_names=self.label_names, tags=self.tags, meta=self.meta, name=self.name)

    def __repr__(self) -> str:
        kind = "sparse" if self.sparse else ("token ids" if not self.x.is_floating_point() else "dense")
        return (f"SequenceDataset({self.name!r}, n={len(self)}, tokens={self.num_tokens}, "
                f"num_labels={self.num_labels}, num_features={self.num_features} {kind})")
