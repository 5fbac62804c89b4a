"""One-hot factor marginals of chain labellings as a compiled CPU loop (numba): the CPU twin of
`chain_marginals_torch` (same layout, ``[unary (T, K) | transition counts (K, K) | start (K) | end (K)]``).

The torch twin builds index and sign tensors and scatters them, about twenty small operations (0.09 ms for the
difference of two corners at B = 64 on OCR); here one loop adds +-1 per factor. The entries are counts, exact in
any order, so the twins agree bitwise. float32 and float64 only.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._numba import jit as _jit


@_jit()
def _add_counts(out, y, L, T, K, sign):
    """``out (m,) += sign * m(y)`` for one labelling ``y (T,)`` (-1 past ``L``, which bounds only the end label);
    returns False at a label >= K."""
    for t in range(T):
        if y[t] >= K:
            return False
        if y[t] >= 0:
            out[t * K + y[t]] += sign
            if t >= 1:
                out[T * K + max(y[t - 1], 0) * K + y[t]] += sign
    out[T * K + K * K + max(y[0], 0)] += sign
    out[T * K + K * K + K + max(y[L - 1], 0)] += sign
    return True


@_jit()
def _marginals(labels, minus, has_minus, lengths, K, out):
    B, T = labels.shape
    one = out.dtype.type(1)
    for b in range(B):
        if not _add_counts(out[b], labels[b], lengths[b], T, K, one):
            return False
        if has_minus and not _add_counts(out[b], minus[b], lengths[b], T, K, -one):
            return False
    return True


def chain_marginals_numba(labels: torch.Tensor, lengths: torch.Tensor, num_labels: int,
                          minus: Optional[torch.Tensor] = None, dtype=torch.float64) -> torch.Tensor:
    """Same contract as `chain_marginals_torch`; CPU, ``dtype`` float32 or float64. Lengths in ``[1, T]`` and
    labels ``< num_labels`` are checked (the compiled loop does not check its indices)."""
    if labels.device.type != "cpu":
        raise ValueError(f"backend='numba' runs on CPU tensors, got labels on {labels.device}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"backend='numba' needs float32 or float64, got dtype {dtype}")
    B, T = labels.shape
    K = int(num_labels)
    if K < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    out = torch.zeros(B, T * K + K * K + 2 * K, dtype=dtype)
    if B == 0:
        return out
    if minus is not None and tuple(minus.shape) != (B, T):
        raise ValueError(f"minus must have the shape of labels ({B}, {T}), got {tuple(minus.shape)}")
    ln = lengths.detach().to(torch.long).contiguous().numpy()
    if ln.shape != (B,) or ln.min() < 1 or ln.max() > T:
        raise ValueError(f"lengths must have shape ({B},) and values in [1, {T}]")
    lab = labels.detach().to(torch.long).contiguous().numpy()
    mi = lab if minus is None else minus.detach().to(torch.long).contiguous().numpy()
    if not _marginals(lab, mi, minus is not None, ln, K, out.numpy()):
        raise ValueError(f"labels must be < num_labels = {K}")
    return out


