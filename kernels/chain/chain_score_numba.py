"""Scores of labellings and of marginals under linear-chain potentials as compiled CPU loops (numba): the CPU twins
of `chain_labels_score_torch` and `chain_inner_torch`.

A mini-batch BCFW step scores every cached labelling of its blocks and the blocks' marginals: on a CPU the torch twins'
dozen small tensor operations cost far more than the arithmetic, a few thousand additions
(docs/benchmarks/bcfw_backends.md). The sums here run in a fixed order (positions in order, then transitions, start,
end), which is not always torch's reduction order: the results equal the torch twin's to rounding (as the Triton
kernels' do); the tests bound the difference.

float32 and float64 only; ``backend="auto"`` picks these for CPU tensors of those dtypes when numba imports.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._numba import jit as _jit

_DTYPES = (torch.float32, torch.float64)


@_jit()
def _labels_score(unary, trans, start, end, labels, lengths, has_start, has_end, out):
    """Writes ``out (B, C)``; returns False (and stops) at a label >= K inside a length."""
    B, C = out.shape
    K = unary.shape[2]
    dt = unary.dtype.type
    for b in range(B):
        L = lengths[b]
        for c in range(C):
            y = labels[b, c]
            s = dt(0)
            for t in range(L):
                if y[t] >= K:
                    return False
                s += unary[b, t, max(y[t], 0)]
            p = dt(0)
            for t in range(1, L):
                p += trans[max(y[t - 1], 0), max(y[t], 0)]
            s += p
            if has_start:
                s += start[max(y[0], 0)]
            if has_end:
                s += end[max(y[L - 1], 0)]
            out[b, c] = s
    return True


@_jit()
def _inner(unary, trans, start, end, z, has_start, has_end, out):
    B, T, K = unary.shape
    a = z.shape[1] - K * K - 2 * K
    dt = unary.dtype.type
    for b in range(B):
        s = dt(0)
        for t in range(T):
            for k in range(K):
                s += unary[b, t, k] * z[b, t * K + k]
        p = dt(0)
        for i in range(K):
            for j in range(K):
                p += z[b, a + i * K + j] * trans[i, j]
        s += p
        if has_start:
            q = dt(0)
            for k in range(K):
                q += z[b, a + K * K + k] * start[k]
            s += q
        if has_end:
            q = dt(0)
            for k in range(K):
                q += z[b, a + K * K + K + k] * end[k]
            s += q
        out[b] = s


def _check(unary: torch.Tensor, transition: torch.Tensor, start, end) -> None:
    if unary.device.type != "cpu":
        raise ValueError(f"backend='numba' runs on CPU tensors, got unary on {unary.device}")
    if unary.dtype not in _DTYPES:
        raise ValueError(f"backend='numba' needs float32 or float64, got unary of {unary.dtype}")
    K = unary.shape[2]
    if K < 1:
        raise ValueError("unary must have at least one label (K >= 1)")
    if tuple(transition.shape) != (K, K):
        raise ValueError(f"transition must have shape ({K}, {K}) (shared), got {tuple(transition.shape)}")
    for name, t in (("start", start), ("end", end)):
        if t is not None and tuple(t.shape) != (K,):
            raise ValueError(f"{name} must have shape ({K},), got {tuple(t.shape)}")


def _arrays(dt, *tensors):
    return [t.detach().to(dt).contiguous().numpy() for t in tensors]


def _same_dtype(unary: torch.Tensor, *others) -> None:
    for name, t in others:
        if t is not None and t.dtype != unary.dtype:
            raise ValueError(f"backend='numba' computes in one dtype: {name} is {t.dtype}, unary {unary.dtype}")


def chain_labels_score_numba(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                             end: Optional[torch.Tensor], labels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Same contract as `chain_labels_score_torch`: scores ``(B, C)`` of ``labels (B, C, W)`` (``W >= T``, entries
    at or past each length ignored) under ``unary (B, T, K)`` and shared ``transition (K, K)``; ``lengths`` in
    ``[1, T]`` and labels ``< K`` within them (checked: the compiled loop does not check its indices)."""
    _check(unary, transition, start, end)
    _same_dtype(unary, ("transition", transition), ("start", start), ("end", end))
    B, T, K = unary.shape
    C = labels.shape[1]
    out = unary.new_empty(B, C)
    if B == 0 or C == 0:
        return out
    if labels.dim() != 3 or labels.shape[0] != B or labels.shape[2] < T:
        raise ValueError(f"labels must have shape ({B}, C, >= {T}), got {tuple(labels.shape)}")
    ln = lengths.detach().to(torch.long).contiguous().numpy()
    if ln.shape != (B,) or ln.min() < 1 or ln.max() > T:
        raise ValueError(f"lengths must have shape ({B},) and values in [1, {T}]")
    lab = labels.detach().to(torch.long).contiguous().numpy()
    zeros = unary.new_zeros(K)
    dt = unary.dtype
    u, tr, s, e = _arrays(dt, unary, transition, zeros if start is None else start, zeros if end is None else end)
    if not _labels_score(u, tr, s, e, lab, ln, start is not None, end is not None, out.numpy()):
        raise ValueError(f"labels must be < num_labels = {K} within each length")
    return out


def chain_inner_numba(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                      end: Optional[torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """Same contract as `chain_inner_torch`: ``<theta_b, z_b>`` ``(B,)`` of potentials ``unary (B, T, K)``, shared
    ``transition (K, K)``, ``start``/``end`` and flat marginals ``z (B, m)``, ``m = T' K + K^2 + 2 K`` with
    ``T' >= T``; computed in the promoted dtype."""
    _check(unary, transition, start, end)
    B, T, K = unary.shape
    a = z.shape[1] - K * K - 2 * K if z.dim() == 2 else -1
    if z.dim() != 2 or z.shape[0] != B or a < T * K or a % K:
        raise ValueError(f"z must have shape ({B}, T' {K} + {K * K + 2 * K}) with T' >= {T}, got {tuple(z.shape)}")
    dt = z.dtype
    for t in (unary, transition, start, end):
        dt = dt if t is None else torch.promote_types(dt, t.dtype)
    if dt not in _DTYPES:
        raise ValueError(f"backend='numba' needs float32 or float64, got the promoted dtype {dt}")
    out = torch.empty(B, dtype=dt)
    if B == 0:
        return out
    zeros = unary.new_zeros(K)
    u, tr, s, e, zz = _arrays(dt, unary, transition, zeros if start is None else start,
                              zeros if end is None else end, z)
    _inner(u, tr, s, e, zz, start is not None, end is not None, out.numpy())
    return out
