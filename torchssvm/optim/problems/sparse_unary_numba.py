"""The compiled CPU twin (numba) of `sparse_unary.sparse_unary`: one loop over the blocks' tokens and attributes.

The torch form copies the batch's attribute ids out of the data set, masks the padding and runs ``embedding_bag``; here
the loop reads the data set's arrays in place and adds the weight rows, in less than half the time on CoNLL-2000
chunking (docs/benchmarks/bcfw_backends.md). Each token's sum runs over its attributes in order, as ``embedding_bag``'s,
so the twins agree to rounding (bitwise where the attribute values are ones).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ...kernels import _numba
from ...kernels._numba import jit as _jit
from ...kernels._numba import prange as _prange

# Above this many token-attribute slots times labels (B T A K) a batch is split over threads: the reads of E's
# rows are scattered, and two threads keep twice as many in flight.
_PARALLEL_MIN_WORK = 1 << 15


@_jit()
def _block(ids, values, has_values, index, lengths, E, out, b):
    """Adds block ``b``'s potentials into ``out[b]``; returns 0, or 1 for an index outside the data set, 2 for a
    length above T, 3 for an attribute id at or above ``E.shape[0]`` (checked here: the reads are not
    bounds-checked)."""
    T, K = out.shape[1], out.shape[2]
    n, _, A = ids.shape
    i = index[b]
    if i < 0 or i >= n:
        return 1
    if lengths[i] > T:
        return 2
    for t in range(lengths[i]):
        for a in range(A):
            j = ids[i, t, a]
            if j >= E.shape[0]:
                return 3
            if j >= 0:
                if has_values:
                    v = values[i, t, a]
                    for k in range(K):
                        out[b, t, k] += v * E[j, k]
                else:
                    for k in range(K):
                        out[b, t, k] += E[j, k]
    return 0


@_jit()
def _unary_serial(ids, values, has_values, index, lengths, E, out, codes):
    for b in range(out.shape[0]):
        codes[b] = _block(ids, values, has_values, index, lengths, E, out, b)


@_jit(parallel=True)
def _unary_parallel(ids, values, has_values, index, lengths, E, out, codes):
    for i in _prange(out.shape[0]):
        b = np.int64(i)  # prange's index is unsigned
        codes[b] = _block(ids, values, has_values, index, lengths, E, out, b)


_ERRORS = {1: "index must lie in [0, n), the data set's blocks", 2: "the blocks' lengths must be at most T",
           3: "ids must lie below E.shape[0] (-1 marks no attribute)"}


def sparse_unary_numba(ids: torch.Tensor, values: Optional[torch.Tensor], index: torch.Tensor, lengths: torch.Tensor,
                       E: torch.Tensor, T: int) -> torch.Tensor:
    """Same contract as `sparse_unary.sparse_unary`; CPU, E float32 or float64. The index, the lengths (at most
    ``T``) and the blocks' ids (below ``E.shape[0]``) are checked in the loop, which does not check its reads."""
    if E.device.type != "cpu" or E.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"the numba twin runs on CPU float32/float64 weights, got E of {E.dtype} on {E.device}")
    if ids.dim() != 3 or (values is not None and values.shape != ids.shape):
        raise ValueError(f"ids must be (n, T, A) with values of its shape or None, got {tuple(ids.shape)} and "
                         f"{None if values is None else tuple(values.shape)}")
    if not 0 <= T <= ids.shape[1] or lengths.shape != ids.shape[:1]:
        raise ValueError(f"T must lie in [0, {ids.shape[1]}] and lengths be ({ids.shape[0]},), got T = {T} and "
                         f"lengths {tuple(lengths.shape)}")
    B, K = index.shape[0], E.shape[1]
    out = torch.zeros(B, T, K, dtype=E.dtype)
    vals = E.new_zeros(1, 1, 1) if values is None else values.detach().to(E.dtype).contiguous()
    codes = np.zeros(B, dtype=np.int64)
    fn = _numba.serial_or_parallel(_unary_serial, _unary_parallel, B, B * T * ids.shape[2] * K, _PARALLEL_MIN_WORK)
    fn(ids.detach().contiguous().numpy(), vals.numpy(), values is not None, index.to(torch.long).contiguous().numpy(),
       lengths.to(torch.long).contiguous().numpy(), E.detach().contiguous().numpy(), out.numpy(), codes)
    code = int(codes.max()) if B else 0
    if code:
        raise ValueError(f"{_ERRORS[code]} (T = {T}, n = {ids.shape[0]}, E {tuple(E.shape)})")
    return out
