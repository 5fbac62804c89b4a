"""Scores of labellings under linear-chain potentials; the torch twin of `chain_score_triton`."""

from __future__ import annotations

from typing import Optional

import torch


def chain_score_torch(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                      end: Optional[torch.Tensor], labels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``s(y) = start[y_0] + sum_{t < L} unary[t, y_t] + sum_{0 < t < L} transition[y_{t-1}, y_t] + end[y_{L-1}]``.

    Args:
        unary: ``(B, T, K)``.
        transition: ``(K, K)`` shared or ``(B, T-1, K, K)`` per position.
        start, end: ``(K,)`` or None.
        labels: ``(B, T)`` long; entries at or past ``lengths`` do not count (any value below K, -1 padding
            included).
        lengths: ``(B,)`` long, ``1 <= L <= T``.

    Returns ``(B,)`` in the dtype of ``unary``."""
    B, T, _ = unary.shape
    valid = torch.arange(T, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    yc = labels.clamp_min(0)
    zero = unary.new_zeros(())
    # where, not a product with the mask: a -inf potential read at a padded position must count 0, not NaN
    s = torch.where(valid, unary.gather(2, yc.unsqueeze(2)).squeeze(2), zero).sum(1)
    if T > 1:
        pair_valid = valid[:, 1:]
        if transition.dim() == 2:
            tr = transition[yc[:, :-1], yc[:, 1:]]
        else:
            K = unary.shape[2]
            flat = transition.reshape(B, T - 1, K * K)
            tr = flat.gather(2, (yc[:, :-1] * K + yc[:, 1:]).unsqueeze(2)).squeeze(2)
        s = s + torch.where(pair_valid, tr, zero).sum(1)
    if start is not None:
        s = s + start[yc[:, 0]]
    if end is not None:
        s = s + end[yc.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)]
    return s


def chain_labels_score_torch(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                             end: Optional[torch.Tensor], labels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Scores ``(B, C)`` of ``C`` labellings per example: ``labels (B, C, W)`` with ``W >= T`` (the first ``T``
    entries are read); the other arguments as `chain_score_torch`, shared ``(K, K)`` transitions."""
    B, C = labels.shape[:2]
    T, K = unary.shape[1:]
    rows = unary.unsqueeze(1).expand(B, C, T, K).reshape(B * C, T, K)
    lengths = lengths if C == 1 else lengths.repeat_interleave(C)
    return chain_score_torch(rows, transition, start, end, labels[:, :, :T].reshape(B * C, T), lengths).view(B, C)


def chain_inner_torch(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                      end: Optional[torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """``<theta_b, z_b>``: the score of fractional marginals, one per row of ``z``.

    Args:
        unary ``(B, T, K)``, transition ``(K, K)``, start, end ``(K,)`` or None: the potentials ``theta``.
        z ``(B, m)``: marginals in the chain SSVM's flat layout, ``[unary (T', K) | transition (K, K) | start (K) |
            end (K)]`` with ``T' >= T`` (positions from T on are not read).

    Returns ``(B,)`` in the promoted dtype."""
    B, T, K = unary.shape
    a = z.shape[1] - K * K - 2 * K
    zu = z[:, :a].view(B, a // K, K)[:, :T]
    out = (unary * zu).sum((1, 2)) + (z[:, a : a + K * K].view(B, K, K) * transition).sum((1, 2))
    if start is not None:
        zs = z[:, a + K * K : a + K * K + K]
        out = out + zs.to(out.dtype) @ start.to(out.dtype)  # @ does not promote
    if end is not None:
        out = out + z[:, a + K * K + K :].to(out.dtype) @ end.to(out.dtype)
    return out
