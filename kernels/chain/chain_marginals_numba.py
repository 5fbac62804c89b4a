"""One-hot factor marginals of chain labellings as a compiled CPU loop (numba): the CPU twin of
`chain_marginals_torch` (same layout, ``[unary (T, K) | transition counts (K, K) | start (K) | end (K)]``).

The torch twin builds index and sign tensors and scatters them, about twenty small operations whose overhead outweighs
the work (docs/benchmarks/bcfw_backends.md); here one loop adds +-1 per factor. The entries are counts, exact in any
order, so the twins agree bitwise. float32 and float64 only. Each row is zeroed and counted (and, with ``subtract``, has
that row taken off) while it is in cache; a large batch's rows run on threads.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .. import _numba
from .._numba import jit as _jit
from .._numba import prange as _prange


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
def _row(labels, minus, has_minus, lengths, K, subtract, has_subtract, out, b):
    """Row ``b`` of ``out``: zeroed, the counts added, ``subtract``'s row taken off while the row is in cache;
    returns False at a label >= K."""
    row = out[b]
    for j in range(row.shape[0]):
        row[j] = 0
    one = out.dtype.type(1)
    if not _add_counts(row, labels[b], lengths[b], labels.shape[1], K, one):
        return False
    if has_minus and not _add_counts(row, minus[b], lengths[b], labels.shape[1], K, -one):
        return False
    if has_subtract:
        sub = subtract[b]
        for j in range(row.shape[0]):
            row[j] = row[j] - sub[j]
    return True


@_jit()
def _marginals(labels, minus, has_minus, lengths, K, subtract, has_subtract, out):
    for b in range(labels.shape[0]):
        if not _row(labels, minus, has_minus, lengths, K, subtract, has_subtract, out, b):
            return False
    return True


@_jit(parallel=True)
def _marginals_parallel(labels, minus, has_minus, lengths, K, subtract, has_subtract, out):
    ok = np.ones(labels.shape[0], dtype=np.bool_)
    for i in _prange(labels.shape[0]):
        ok[i] = _row(labels, minus, has_minus, lengths, K, subtract, has_subtract, out, np.int64(i))
    return ok.all()


# Above this many entries (B m) the rows run on threads: each is a stream over its row of ``out`` (and of
# ``subtract``), and two threads move more memory than one.
_PARALLEL_MIN_WORK = 1 << 15


def chain_marginals_numba(labels: torch.Tensor, lengths: torch.Tensor, num_labels: int,
                          minus: Optional[torch.Tensor] = None, dtype=torch.float64,
                          subtract: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Same contract as `chain_marginals_torch`; CPU, ``dtype`` float32 or float64. Lengths in ``[1, T]`` and
    labels ``< num_labels`` are checked (the compiled loop does not check its indices).

    ``subtract`` ``(B, m)`` of ``dtype``: returns ``m(y) [- m(y')] - subtract``, equal to the torch twin's result minus
    ``subtract`` (the FW direction ``m(y_i) - m(y) - z_i`` in one pass over memory instead of three)."""
    if labels.device.type != "cpu":
        raise ValueError(f"backend='numba' runs on CPU tensors, got labels on {labels.device}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"backend='numba' needs float32 or float64, got dtype {dtype}")
    B, T = labels.shape
    K = int(num_labels)
    if K < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    M = T * K + K * K + 2 * K
    out = torch.empty(B, M, dtype=dtype)
    if B == 0:
        return out
    if minus is not None and tuple(minus.shape) != (B, T):
        raise ValueError(f"minus must have the shape of labels ({B}, {T}), got {tuple(minus.shape)}")
    ln = lengths.detach().to(torch.long).contiguous().numpy()
    if ln.shape != (B,) or ln.min() < 1 or ln.max() > T:
        raise ValueError(f"lengths must have shape ({B},) and values in [1, {T}]")
    lab = labels.detach().to(torch.long).contiguous().numpy()
    mi = lab if minus is None else minus.detach().to(torch.long).contiguous().numpy()
    if subtract is not None and (tuple(subtract.shape) != (B, M) or subtract.dtype != dtype):
        raise ValueError(f"subtract must be ({B}, {M}) of {dtype}, got {tuple(subtract.shape)} of {subtract.dtype}")
    sub = out.numpy()[:1] if subtract is None else subtract.detach().contiguous().numpy()
    fn = _numba.serial_or_parallel(_marginals, _marginals_parallel, B, B * M, _PARALLEL_MIN_WORK)
    if not fn(lab, mi, minus is not None, ln, K, sub, subtract is not None, out.numpy()):
        raise ValueError(f"labels must be < num_labels = {K}")
    return out


