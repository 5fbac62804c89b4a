"""Batched Viterbi (max-sum on a chain) in plain torch: the reference twin of `viterbi_triton`.

Vectorized over the batch and the labels; the only Python loop is over time. Works on any device.
Tie-breaking (identical in the Triton kernel): every argmax takes the smallest label index, so among
all maximizing labellings the result is the smallest in reverse-lexicographic order
``(y_{L-1}, y_{L-2}, ..., y_0)``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

# Above this many elements per time step ((B, K, K) scores) the batch is processed in chunks.
_MAX_STEP_ELEMENTS = 1 << 25


def viterbi_torch(
    unary: torch.Tensor,
    transition: torch.Tensor,
    start: Optional[torch.Tensor],
    end: Optional[torch.Tensor],
    lengths: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """MAP labelling of a batch of chains.

    Args:
        unary: ``(B, T, K)`` scores of label k at position t.
        transition: ``(K, K)`` shared, or ``(B, T-1, K, K)`` per position; entry ``[.., i, j]`` scores
            label i at position t followed by label j at t+1.
        start, end: ``(K,)`` scores of the first / last label, or None.
        lengths: ``(B,)`` long, ``1 <= lengths <= T``.

    Returns:
        labels ``(B, T)`` long, padded with -1 past each length, and the best scores ``(B,)``.
    """
    B, T, K = unary.shape
    if B * K * K > _MAX_STEP_ELEMENTS and B > 1:
        chunk = max(1, _MAX_STEP_ELEMENTS // (K * K))
        parts = [
            viterbi_torch(
                unary[s : s + chunk],
                transition[s : s + chunk] if transition.dim() == 4 else transition,
                start,
                end,
                lengths[s : s + chunk],
            )
            for s in range(0, B, chunk)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    per_position = transition.dim() == 4
    alpha = unary[:, 0]
    if start is not None:
        alpha = alpha + start
    backpointers = torch.zeros(B, T, K, dtype=torch.long, device=unary.device)
    for t in range(1, T):
        trans_t = transition[:, t - 1] if per_position else transition
        best, arg = (alpha.unsqueeze(2) + trans_t).max(dim=1)
        active = (lengths > t).unsqueeze(1)
        alpha = torch.where(active, best + unary[:, t], alpha)
        backpointers[:, t] = arg
    final = alpha + end if end is not None else alpha
    score, cur = final.max(dim=1)

    labels = torch.full((B, T), -1, dtype=torch.long, device=unary.device)
    for t in range(T - 1, -1, -1):
        active = lengths > t
        labels[:, t] = torch.where(active, cur, labels[:, t])
        if t > 0:
            prev = backpointers[:, t].gather(1, cur.unsqueeze(1)).squeeze(1)
            cur = torch.where(active, prev, cur)
    return labels, score
