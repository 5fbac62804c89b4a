"""Scores under linear-chain potentials as Triton kernels: of labellings, one program per labelling (twin:
`chain_labels_score_torch`), and of fractional marginals, ``<theta_b, z_b>``, one program per row (twin:
`chain_inner_torch`).

Labellings: A mini-batch BCFW step scores every cached labelling of its blocks and the
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


@triton.jit
def _chain_inner_kernel(unary_ptr, trans_ptr, start_ptr, end_ptr, z_ptr, out_ptr, TK, K, M,
                        HAS_START: tl.constexpr, HAS_END: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK)
    zrow = z_ptr + b * M
    a = M - K * K - 2 * K  # where the transition part of a row starts
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for off in range(0, TK, BLOCK):  # unary: position t, label k at t K + k in both
        i = off + r
        m = i < TK
        u = tl.load(unary_ptr + b * TK + i, mask=m, other=0.0).to(tl.float64)
        acc += u * tl.load(zrow + i, mask=m, other=0.0).to(tl.float64)
    for off in range(0, K * K, BLOCK):
        i = off + r
        m = i < K * K
        acc += tl.load(trans_ptr + i, mask=m, other=0.0).to(tl.float64) * \
            tl.load(zrow + a + i, mask=m, other=0.0).to(tl.float64)
    for off in range(0, K, BLOCK):
        i = off + r
        m = i < K
        if HAS_START:
            acc += tl.load(start_ptr + i, mask=m, other=0.0).to(tl.float64) * \
                tl.load(zrow + a + K * K + i, mask=m, other=0.0).to(tl.float64)
        if HAS_END:
            acc += tl.load(end_ptr + i, mask=m, other=0.0).to(tl.float64) * \
                tl.load(zrow + a + K * K + K + i, mask=m, other=0.0).to(tl.float64)
    tl.store(out_ptr + b, tl.sum(acc, axis=0))


def chain_inner_triton(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                       end: Optional[torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """Same contract as `chain_inner_torch`; the sums run in float64 (returned in the promoted dtype)."""
    B, T, K = unary.shape
    if transition.dim() != 2:
        raise ValueError(f"transition must be shared (K, K) here, got shape {tuple(transition.shape)}")
    dtype = torch.promote_types(unary.dtype, z.dtype)
    out = torch.empty(B, dtype=torch.float64, device=unary.device)
    if B:
        unary, transition, z = unary.contiguous(), transition.contiguous(), z.contiguous()
        _chain_inner_kernel[(B,)](
            unary, transition, unary if start is None else start.contiguous(),
            unary if end is None else end.contiguous(), z, out, T * K, K, z.shape[1],
            HAS_START=start is not None, HAS_END=end is not None,
            BLOCK=min(1024, triton.next_power_of_2(max(T * K, K * K))), num_warps=4)
    return out if dtype == torch.float64 else out.to(dtype)
