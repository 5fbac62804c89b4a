"""An in-memory dataset of dense feature vectors with binary label vectors (multi-label classification)."""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional

import torch

from .._validation import check_positive_int
from .sequence_dataset import batch_index


class MultiLabelBatch(NamedTuple):
    """``x``: ``(B, D)`` float; ``y``: ``(B, K)`` long of 0 / 1."""

    x: torch.Tensor
    y: torch.Tensor

    def to(self, device) -> MultiLabelBatch:
        return MultiLabelBatch(self.x.to(device), self.y.to(device))


class MultiLabelDataset(torch.utils.data.Dataset):
    """``x (n, D)`` float features and ``y (n, K)`` 0 / 1 labels; indexing returns a `MultiLabelBatch`."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, name: str = ""):
        if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
            raise ValueError(f"x must be (n, D) and y (n, K) with the same n, got {tuple(x.shape)} and "
                             f"{tuple(y.shape)}")
        self.x, self.y, self.name = x, y.long(), name

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_labels(self) -> int:
        return int(self.y.shape[1])

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, index) -> MultiLabelBatch:
        index = batch_index(index, len(self), "examples")
        return MultiLabelBatch(self.x[index], self.y[index])

    def batches(self, batch_size: int, *, shuffle: bool = False,
                generator: Optional[torch.Generator] = None) -> Iterator[MultiLabelBatch]:
        check_positive_int("batch_size", batch_size)
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for s in range(0, n, batch_size):
            yield self[order[s : s + batch_size]]

    def subset(self, indices) -> MultiLabelDataset:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return MultiLabelDataset(self.x[idx], self.y[idx], name=f"{self.name}[{len(idx)}]")

    def __repr__(self) -> str:
        return (f"MultiLabelDataset({self.name!r}, n={len(self)}, num_features={self.num_features}, "
                f"num_labels={self.num_labels})")
