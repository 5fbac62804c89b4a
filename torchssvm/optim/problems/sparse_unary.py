"""Unary potentials of sparse token attributes for a mini-batch of a data set, read in place.

``unary[b, t] = sum_a values[i, t, a] E[ids[i, t, a]]`` for block ``i = index[b]`` and ``t < lengths[i]`` (0 on
padding), ``(B, T, K)``: the emission part of a `LinearChainModel`'s potentials on `TokenFeatures`. The torch form
gathers the batch's attributes and sums them with one ``embedding_bag``; `sparse_unary_numba` is its compiled CPU
twin, which reads the data set's arrays in place.
"""

from __future__ import annotations

from typing import Optional

import torch


def sparse_unary(ids: torch.Tensor, values: Optional[torch.Tensor], index: torch.Tensor, lengths: torch.Tensor,
                 E: torch.Tensor, T: int) -> torch.Tensor:
    """Args:
        ids: ``(n, T', A)`` long attribute ids of the whole data set, -1 for absent; values: ``(n, T', A)`` or None
            (all ones).
        index: ``(B,)`` the blocks; lengths: ``(n,)`` the sequences' lengths; E: ``(D, K)`` the emission weights.
        T: the width of the output, at least the longest of the blocks' lengths and at most ``T'``.

    Returns ``(B, T, K)`` in E's dtype.
    """
    B = index.shape[0]
    x_ids = ids[index][:, :T]
    tokens = torch.arange(T, device=ids.device).unsqueeze(0) < lengths[index].unsqueeze(1)
    picked = x_ids[tokens]
    weight = (picked >= 0).to(E.dtype)  # absent attributes weigh 0
    if values is not None:  # absent slots weigh 0 whatever value they hold (as the numba twin skips them)
        weight = torch.where(picked >= 0, values[index][:, :T][tokens].to(E.dtype), 0.0)
    unary = E.new_zeros(B, T, E.shape[1])
    unary[tokens] = torch.nn.functional.embedding_bag(picked.clamp_min(0), E, per_sample_weights=weight, mode="sum")
    return unary
