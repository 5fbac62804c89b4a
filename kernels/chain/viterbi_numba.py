"""Batched Viterbi as a compiled CPU loop (numba): the fast CPU twin of `viterbi_torch`.

On a CPU the torch twin pays a few tensor operations per time step, so for the batches a dual solver decodes
(the misses of a mini-batch, a handful of sequences of 10-15 positions) its time is per-op overhead, not the
arithmetic (docs/benchmarks/bcfw_backends.md). Here one compiled loop decodes a sequence (forward
scores, then the backtrack), sequences of a large batch run on different threads (``prange``), and the forward
step runs over the previous label in the outer loop so that the inner loop over the next label vectorizes.

The arithmetic is the torch twin's: the forward score is ``max_i (alpha_{t-1}[i] + transition[i, j]) +
unary[t, j]``, the backtrack recomputes ``alpha_{t-1}[i] + transition[i, y_t]`` and takes the first maximum, so
labels and scores are bitwise equal to `viterbi_torch` (and to the Triton kernel); the tests assert it. NaN
follows torch: a NaN wins a maximum, the first NaN wins an argmax.

float32 and float64 only (numba has no half types); ``backend="auto"`` picks this twin for CPU tensors when
numba imports.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from .. import _numba
from .._numba import jit as _jit
from .._numba import prange as _prange

# Above this much work (B T K^2 additions) a batch is split over threads; below it the threads' start costs more.
_PARALLEL_MIN_WORK = 1 << 20


def available() -> bool:
    return _numba.available()


@_jit()
def _decode(unary, trans, start, end, L, b, per_position, has_start, has_end, alpha, out):
    """Sequence ``b`` of the batch: labels into ``out (T,)`` (-1 past ``L``), returns the best score. ``trans``
    is ``(B, T-1, K, K)`` when ``per_position`` else ``(1, 1, K, K)``; ``alpha (T, K)`` scratch."""
    T, K = unary.shape[1], unary.shape[2]
    for j in range(K):
        alpha[0, j] = unary[b, 0, j] + start[j] if has_start else unary[b, 0, j]
    tb = b if per_position else 0
    for t in range(1, L):
        tt = t - 1 if per_position else 0
        for j in range(K):
            alpha[t, j] = alpha[t - 1, 0] + trans[tb, tt, 0, j]
        for i in range(1, K):
            a = alpha[t - 1, i]
            for j in range(K):
                v = a + trans[tb, tt, i, j]
                if v > alpha[t, j] or v != v:  # a NaN wins, as in torch.amax
                    alpha[t, j] = v
        for j in range(K):
            alpha[t, j] = alpha[t, j] + unary[b, t, j]
    cur = 0
    best = alpha[L - 1, 0] + end[0] if has_end else alpha[L - 1, 0]
    if best == best:
        for j in range(1, K):
            v = alpha[L - 1, j] + end[j] if has_end else alpha[L - 1, j]
            if v != v:  # the first NaN, as torch.max
                cur, best = j, v
                break
            if v > best:
                cur, best = j, v
    for t in range(L, T):
        out[t] = -1
    out[L - 1] = cur
    for t in range(L - 1, 0, -1):
        tt = t - 1 if per_position else 0
        bi = 0
        bv = alpha[t - 1, 0] + trans[tb, tt, 0, cur]
        if bv == bv:
            for i in range(1, K):
                v = alpha[t - 1, i] + trans[tb, tt, i, cur]
                if v != v:
                    bi = i
                    break
                if v > bv:
                    bi, bv = i, v
        cur = bi
        out[t - 1] = cur
    return best


@_jit()
def _viterbi_serial(unary, trans, start, end, lengths, per_position, has_start, has_end, labels, scores):
    alpha = np.empty((unary.shape[1], unary.shape[2]), dtype=unary.dtype)
    for b in range(unary.shape[0]):
        scores[b] = _decode(unary, trans, start, end, lengths[b], b, per_position, has_start, has_end, alpha,
                            labels[b])


@_jit(parallel=True)
def _viterbi_parallel(unary, trans, start, end, lengths, per_position, has_start, has_end, labels, scores):
    for i in _prange(unary.shape[0]):
        b = np.int64(i)  # prange's index is unsigned: one integer type for `_decode`
        alpha = np.empty((unary.shape[1], unary.shape[2]), dtype=unary.dtype)
        scores[b] = _decode(unary, trans, start, end, lengths[b], b, per_position, has_start, has_end, alpha,
                            labels[b])


def viterbi_numba(
    unary: torch.Tensor,
    transition: torch.Tensor,
    start: Optional[torch.Tensor],
    end: Optional[torch.Tensor],
    lengths: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `viterbi_torch`: ``unary (B, T, K)``, ``transition (K, K)`` or ``(B, T-1, K, K)``,
    ``start``/``end`` ``(K,)`` or None, ``lengths (B,)`` with ``1 <= lengths <= T``; returns labels ``(B, T)`` long
    (-1 past each length) and the best scores ``(B,)``. CPU, float32 or float64. The lengths are checked here (the
    compiled loop does not check its indices), and so are the shapes."""
    if unary.device.type != "cpu":
        raise ValueError(f"backend='numba' runs on CPU tensors, got unary on {unary.device}")
    if unary.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"backend='numba' needs float32 or float64, got unary of {unary.dtype}")
    B, T, K = unary.shape
    if K < 1:
        raise ValueError("unary must have at least one label (K >= 1)")
    for name, t in (("transition", transition), ("start", start), ("end", end)):
        if t is not None and t.dtype != unary.dtype:
            raise ValueError(f"backend='numba' computes in one dtype: {name} is {t.dtype}, unary {unary.dtype}")
    if tuple(transition.shape) not in ((K, K), (B, T - 1, K, K)):
        raise ValueError(f"transition must have shape ({K}, {K}) or ({B}, {T - 1}, {K}, {K}), "
                         f"got {tuple(transition.shape)}")
    for name, t in (("start", start), ("end", end)):
        if t is not None and tuple(t.shape) != (K,):
            raise ValueError(f"{name} must have shape ({K},), got {tuple(t.shape)}")
    labels = torch.empty(B, T, dtype=torch.long)
    scores = unary.new_empty(B)
    if B == 0:
        return labels, scores
    ln = lengths.detach().to(torch.long).contiguous().numpy()
    if ln.shape != (B,) or ln.min() < 1 or ln.max() > T:
        raise ValueError(f"lengths must have shape ({B},) and values in [1, {T}]")
    per_position = transition.dim() == 4
    trans = transition.detach().contiguous()
    trans = trans if per_position else trans.view(1, 1, K, K)
    zeros = unary.new_zeros(K)
    s = zeros if start is None else start.detach().contiguous()
    e = zeros if end is None else end.detach().contiguous()
    fn = _numba.serial_or_parallel(_viterbi_serial, _viterbi_parallel, B, B * T * K * K, _PARALLEL_MIN_WORK)
    fn(unary.detach().contiguous().numpy(), trans.numpy(), s.numpy(), e.numpy(), ln, per_position,
       start is not None, end is not None, labels.numpy(), scores.numpy())
    return labels, scores

