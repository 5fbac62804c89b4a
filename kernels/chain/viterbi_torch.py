"""Batched Viterbi (max-sum on a chain) in plain torch: the reference twin of `viterbi_triton`.

Vectorized over the batch and the labels; the only Python loop is over time. Works on any device.
Tie-breaking (identical in the Triton kernel): every argmax takes the smallest label index, so among
all maximizing labellings the result is the smallest in reverse-lexicographic order
``(y_{L-1}, y_{L-2}, ..., y_0)``.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import numpy as np
import torch

# Above this many elements per time step ((B, K, K) scores) the batch is processed in chunks.
_MAX_STEP_ELEMENTS = 1 << 25


def promote_chain_potentials(unary, transition, start, end):
    """The chain potentials in their promoted dtype (no copies when the dtypes agree; None stays None)."""
    dt = functools.reduce(torch.promote_types, [t.dtype for t in (transition, start, end) if t is not None],
                          unary.dtype)
    return tuple(None if t is None else t.to(dt) for t in (unary, transition, start, end))


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
        labels ``(B, T)`` long, padded with -1 past each length, and the best scores ``(B,)`` in the potentials'
        promoted dtype.
    """
    unary, transition, start, end = promote_chain_potentials(unary, transition, start, end)
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

    if B == 1 and transition.dim() == 2 and unary.device.type == "cpu":
        return _viterbi_single(unary, transition, start, end, lengths)
    if B >= _BATCH_LAST_MIN_B:
        return _viterbi_batch_last(unary, transition, start, end, lengths)
    return _viterbi_batch_first(unary, transition, start, end, lengths)


# Both layouts store only the forward scores (amax is several times cheaper than max-with-indices on
# CPU); backtracking recomputes, for the one chosen label per sequence, the argmax over the stored
# forward scores, which is exactly the argmax the forward pass would have stored. The reduction over
# the previous label is fastest on CPU when it runs over the outermost axis with the batch innermost
# ("batch last", several times faster from B = 16), except for small batches of many labels, where it is slower.
_BATCH_LAST_MIN_B = 16


def _backtrack(cur, lengths, T, best_prev):
    """Labels ``(B, T)`` (-1 past each length) from the last labels ``cur (B,)``, walking back with
    ``best_prev(t, labels_at_t) -> labels_at_t_minus_1``."""
    # The masked walk is right for any lengths; the test for the plain one would make the host wait for a device.
    uniform = lengths.device.type == "cpu" and bool((lengths == T).all())
    minus_one = torch.full_like(cur, -1)
    out = []
    for t in range(T - 1, 0, -1):
        prev = best_prev(t, cur)
        if uniform:
            out.append(cur)
            cur = prev
        else:
            active = lengths > t
            out.append(torch.where(active, cur, minus_one))
            cur = torch.where(active, prev, cur)
    out.append(cur)
    return torch.stack(out[::-1], dim=1)


def _viterbi_single(unary, transition, start, end, lengths):
    """One sequence on CPU (the sequential dual solvers' case): per-op overhead dominates, so keep the
    back-pointers from ``max`` (first maximum, the same tie rule) and backtrack in Python."""
    T, L = unary.shape[1], int(lengths[0])
    u = unary[0]
    alpha = u[0] + start if start is not None else u[0]
    back = []
    for t in range(1, L):
        alpha, arg = (alpha.unsqueeze(1) + transition).max(0)
        alpha = alpha + u[t]
        back.append(arg)
    if end is not None:
        alpha = alpha + end
    score, cur = alpha.max(0)
    path = [int(cur)]
    if back:
        for row in reversed(torch.stack(back).tolist()):
            path.append(row[path[-1]])
    path.reverse()
    labels = torch.full((1, T), -1, dtype=torch.long)
    labels[0, :L] = torch.tensor(path)
    return labels, score.view(1)


def _viterbi_batch_first(unary, transition, start, end, lengths):
    B, T, K = unary.shape
    per_position = transition.dim() == 4
    trans_t = transition.transpose(-1, -2)  # [.., j, i]: reduce over the last axis
    if not per_position:
        trans_t = trans_t.contiguous()
    hist = unary.new_empty(T, B, K)
    rows = hist.unbind(0)
    alpha = torch.add(unary[:, 0], start, out=rows[0]) if start is not None else rows[0].copy_(unary[:, 0])
    for t in range(1, T):
        tr = trans_t[:, t - 1] if per_position else trans_t
        alpha = torch.amax(alpha.unsqueeze(1) + tr, dim=2, out=rows[t]).add_(unary[:, t])
    final = hist.gather(0, (lengths - 1).view(1, B, 1).expand(1, B, K)).squeeze(0)
    if end is not None:
        final = final + end
    score, cur = final.max(dim=1)
    batch = torch.arange(B, device=unary.device)

    def best_prev(t, cur):
        col = trans_t[batch, t - 1, cur] if per_position else trans_t.index_select(0, cur)  # (B, K)
        return (rows[t - 1] + col).argmax(dim=1)

    return _backtrack(cur, lengths, T, best_prev), score


def _viterbi_batch_last(unary, transition, start, end, lengths):
    B, T, K = unary.shape
    per_position = transition.dim() == 4
    u = unary.permute(1, 2, 0).contiguous().unbind(0)  # T x (K, B)
    tr = transition.permute(1, 2, 3, 0).contiguous() if per_position else transition.unsqueeze(2)
    hist = unary.new_empty(T, K, B)
    rows = hist.unbind(0)
    prev = hist.view(T, K, 1, B).unbind(0)  # the same rows as (K, 1, B): no unsqueeze per step
    if start is not None:
        torch.add(u[0], start.unsqueeze(1), out=rows[0])
    else:
        rows[0].copy_(u[0])
    for t in range(1, T):
        s = prev[t - 1] + (tr[t - 1] if per_position else tr)
        torch.amax(s, dim=0, out=rows[t]).add_(u[t])
    final = hist.gather(0, (lengths - 1).view(1, 1, B).expand(1, K, B)).squeeze(0)  # (K, B)
    if end is not None:
        final = final + end.unsqueeze(1)
    score, cur = final.max(dim=0)
    if not per_position and unary.device.type == "cpu" and hist.dtype != torch.bfloat16:  # numpy has no bfloat16
        return _backtrack_numpy(hist, transition, cur, lengths), score
    batch = torch.arange(B, device=unary.device)
    trans_t = None if per_position else transition.t().contiguous()

    def best_prev(t, cur):
        col = tr[t - 1][:, cur, batch] if per_position else trans_t.index_select(0, cur).t()  # (K, B)
        return (rows[t - 1] + col).argmax(dim=0)

    return _backtrack(cur, lengths, T, best_prev), score


def _backtrack_numpy(hist, transition, cur, lengths):
    """`_backtrack` of the batch-last layout on CPU in numpy (a few microseconds per step instead of
    torch's per-op overhead, which dominates for short steps): ``hist (T, K, B)`` forward scores, a
    shared ``transition (K, K)``, last labels ``cur (B,)``. Same argmax (first maximum) and padding."""
    T, K, B = hist.shape
    h, tr = hist.numpy(), transition.detach().numpy()
    cur, lengths = cur.numpy().copy(), lengths.cpu().numpy()
    out = np.full((B, T), -1, dtype=np.int64)
    for t in range(T - 1, 0, -1):
        active = lengths > t
        out[active, t] = cur[active]
        prev = (h[t - 1] + tr[:, cur]).argmax(0)
        cur = np.where(active, prev, cur)
    out[:, 0] = cur
    return torch.from_numpy(out)
