"""Sparse token attributes of a padded batch of sequences (`TokenFeatures`) and their argument check.

The type of a `SequenceDataset`'s sparse inputs (CoNLL-2000's attribute ids) and of a sparse `LinearChainModel`'s
inputs: it lives with the data, the lowest layer that holds it, so that datasets build it without importing
the models (`torchssvm.models` re-exports both names).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .._validation import check_finite, check_tensor


class TokenFeatures(NamedTuple):
    """Sparse token attributes of a padded batch of sequences.

    - ``ids``: ``(B, T, A)`` long attribute ids in ``[0, num_features)``, -1 for "no attribute".
    - ``values``: ``(B, T, A)`` float attribute values, or None for binary attributes (value 1).

    Indexing (an int, a slice, an index tensor) selects batch rows like a tensor: ``features[0]`` is the
    first sequence's ``(T, A)`` attributes. Unpacking, ``len`` and the field names stay the NamedTuple's
    ``(ids, values)``.
    """

    ids: torch.Tensor
    values: Optional[torch.Tensor] = None

    def to(self, device) -> TokenFeatures:
        return TokenFeatures(self.ids.to(device), None if self.values is None else self.values.to(device))

    def __getitem__(self, index):
        return TokenFeatures(self.ids[index], None if self.values is None else self.values[index])

    @property
    def shape(self):
        return self.ids.shape


def check_token_features(name: str, x: TokenFeatures, num_features: int, *, device=None, finite: bool = False) -> None:
    """``x.ids (B, T, A)`` integer in ``[-1, num_features)`` (-1: no attribute) and ``x.values`` None or a float
    tensor of that shape (finite with ``finite``); a ValueError / TypeError naming ``name.ids`` / ``name.values``."""
    ids = check_tensor(f"{name}.ids", x.ids, ndim=3, integer=True, device=device)
    if ids.numel():
        lo, hi = torch.stack([ids.min(), ids.max()]).tolist()
        if hi >= num_features or lo < -1:
            raise ValueError(f"{name}.ids holds attribute {hi if hi >= num_features else lo}, outside "
                             f"[0, {num_features}) (-1 marks no attribute)")
    if x.values is not None:
        check_tensor(f"{name}.values", x.values, ndim=3, floating=True, device=ids.device)
        if x.values.shape != ids.shape:
            raise ValueError(f"{name}.values must have the shape of {name}.ids {tuple(ids.shape)}, got "
                             f"{tuple(x.values.shape)}")
        if finite:
            check_finite({f"{name}.values": x.values})
