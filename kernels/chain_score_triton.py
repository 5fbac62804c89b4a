"""Scores of labellings under linear-chain potentials as a Triton kernel: one program per labelling.

Twin of `chain_labels_score_torch`. A mini-batch BCFW step scores every cached labelling of its blocks and the
oracle scores the ground truth; as torch ops each is about fifteen small kernels (gathers, masks, sums), here it
is one launch (docs/benchmarks/host_syncs.md). The sums run in another order than the twin's, so the two agree
to rounding, not bitwise.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


def label_warps(block: int) -> int:
    """Warps for a program that holds one labelling of ``block`` positions (this kernel, the corners, the atoms'
    selection and insertion): one per 32 positions, 1 to 4."""
    return max(1, min(4, block // 32))


@triton.jit
def _chain_score_kernel(unary_ptr, trans_ptr, start_ptr, end_ptr, len_ptr, labels_ptr, out_ptr,
                        C, T, K, W,
                        HAS_START: tl.constexpr, HAS_END: tl.constexpr, BLOCK_T: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)  # labelling r = b C + c
    b = r // C
    L = tl.load(len_ptr + b)
    t = tl.arange(0, BLOCK_T)
    valid = t < L
    row = labels_ptr + r * W
    y = tl.maximum(tl.load(row + t, mask=valid, other=0), 0).to(tl.int64)
    s = tl.sum(tl.load(unary_ptr + b * T * K + t * K + y, mask=valid, other=0.0), axis=0)
    pair = valid & (t >= 1)
    y_prev = tl.maximum(tl.load(row + t - 1, mask=pair, other=0), 0).to(tl.int64)
    s += tl.sum(tl.load(trans_ptr + y_prev * K + y, mask=pair, other=0.0), axis=0)
    if HAS_START:
        s += tl.load(start_ptr + tl.maximum(tl.load(row), 0))
    if HAS_END:
        s += tl.load(end_ptr + tl.maximum(tl.load(row + L - 1), 0))
    tl.store(out_ptr + r, s)


def chain_labels_score_triton(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                              end: Optional[torch.Tensor], labels: torch.Tensor,
                              lengths: torch.Tensor) -> torch.Tensor:
    """Same contract as `chain_labels_score_torch` (shared ``(K, K)`` transitions)."""
    B, C, W = labels.shape
    T, K = unary.shape[1:]
    if transition.dim() != 2:
        raise ValueError(f"transition must be shared (K, K) here, got shape {tuple(transition.shape)}")
    unary, transition, labels = unary.contiguous(), transition.contiguous(), labels.contiguous()
    out = torch.empty(B, C, dtype=unary.dtype, device=unary.device)
    if B * C == 0:
        return out
    block = triton.next_power_of_2(T)
    _chain_score_kernel[(B * C,)](
        unary, transition, unary if start is None else start.contiguous(), unary if end is None else end.contiguous(),
        lengths.contiguous(), labels, out, C, T, K, W,
        HAS_START=start is not None, HAS_END=end is not None, BLOCK_T=block, num_warps=label_warps(block))
    return out
