"""One-hot factor marginals of chain labellings as a Triton kernel: one program per labelling (pair).

Twin of `chain_marginals_torch` (same layout). The counts are accumulated with atomic adds of +-1, exact in any
order, so the two agree bitwise. One launch and a fill, where the twin runs about twenty small kernels.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .chain_score_triton import label_warps


@triton.jit
def _add_counts(out, row, L, T, K, sign, BLOCK_T: tl.constexpr):
    """Add ``sign * m(y)`` of the labelling at ``row`` (``T`` entries, -1 past the length ``L``) to ``out``."""
    t = tl.arange(0, BLOCK_T)
    inb = t < T
    y = tl.load(row + t, mask=inb, other=-1)
    valid = y >= 0
    yc = tl.maximum(y, 0).to(tl.int64)
    one = tl.full([BLOCK_T], 1.0, out.dtype.element_ty) * sign
    tl.atomic_add(out + t * K + yc, one, mask=valid, sem="relaxed")
    pair = valid & (t >= 1)
    y_prev = tl.maximum(tl.load(row + t - 1, mask=inb & (t >= 1), other=0), 0).to(tl.int64)
    tl.atomic_add(out + T * K + y_prev * K + yc, one, mask=pair, sem="relaxed")
    # start and end: one entry each, through lane 0 of the same vectors
    first = tl.maximum(tl.load(row), 0).to(tl.int64)
    last = tl.maximum(tl.load(row + L - 1), 0).to(tl.int64)
    tl.atomic_add(out + T * K + K * K + first + t * 0, one, mask=t == 0, sem="relaxed")
    tl.atomic_add(out + T * K + K * K + K + last + t * 0, one, mask=t == 0, sem="relaxed")


@triton.jit
def _chain_marginals_kernel(labels_ptr, minus_ptr, len_ptr, out_ptr, T, K, M,
                            HAS_MINUS: tl.constexpr, BLOCK_T: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    L = tl.load(len_ptr + b)
    out = out_ptr + b * M
    _add_counts(out, labels_ptr + b * T, L, T, K, 1.0, BLOCK_T)
    if HAS_MINUS:
        _add_counts(out, minus_ptr + b * T, L, T, K, -1.0, BLOCK_T)


def chain_marginals_triton(labels: torch.Tensor, lengths: torch.Tensor, num_labels: int,
                           minus: Optional[torch.Tensor] = None, dtype=torch.float64) -> torch.Tensor:
    """Same contract as `chain_marginals_torch`."""
    B, T = labels.shape
    K = num_labels
    M = T * K + K * K + 2 * K
    out = torch.zeros(B, M, dtype=dtype, device=labels.device)
    if B == 0:
        return out
    labels, block = labels.contiguous(), triton.next_power_of_2(T)
    _chain_marginals_kernel[(B,)](labels, labels if minus is None else minus.contiguous(), lengths.contiguous(),
                                  out, T, K, M, HAS_MINUS=minus is not None, BLOCK_T=block,
                                  num_warps=label_warps(block))
    return out
