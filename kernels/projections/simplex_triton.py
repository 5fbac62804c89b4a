"""Euclidean projection onto a product of simplices as a Triton kernel: one program per row, bisection.

Twin of `project_simplex_torch`. Sorting inside a program is awkward for long rows, so the threshold is
found by bisection on ``f(tau) = sum_j max(v_j - tau, 0)`` over ``v - max v`` (decreasing, ``f(-r) >= r >=
f(0) = 0``) for a fixed number of halvings, then made exact from the support: with ``S = {j : v_j > tau_lo}``,
``tau = (sum_S v_j - r) / |S|``. After 100 halvings of an interval of width ``r`` the bracket is below
the float64 spacing, so ``S`` is the support up to entries equal to ``tau`` (which change nothing). Rows
up to ``MAX_BLOCK`` entries are spread over the program's threads, at most 16 per thread (`row_warps`).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

MAX_BLOCK = 1 << 14
_HALVINGS = 100


def row_warps(block: int) -> int:
    """Warps for a program that holds a row of ``block`` entries: 4 up to 1024 entries, then one per 256 (at
    most 32). With 4 warps a row of 8192 float64 entries spills registers to local memory on sm_80 and sm_90,
    16384 entries by over a kilobyte per thread (`torchssvm.kernels.compile_check`, docs/benchmarks/
    triton_compile.md); at one warp per 256 entries the simplex row spills at most a few dozen bytes (the
    box-equality row, with more vectors per entry, still about 2 KB at 16384 float64 entries)."""
    return min(32, max(4, block // 256))


@triton.jit
def _simplex_kernel(v_ptr, mask_ptr, r_ptr, out_ptr, M, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
                    HALVINGS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    inb = offs < M
    valid = inb
    if HAS_MASK:
        valid = inb & (tl.load(mask_ptr + b * M + offs, mask=inb, other=0) != 0)
    v = tl.load(v_ptr + b * M + offs, mask=valid, other=float("-inf"))
    r = tl.load(r_ptr + b)
    v = v - tl.max(v, axis=0)  # relative to the row's maximum, as the torch twin: a small r is not rounded away
    hi = tl.zeros_like(r)
    lo = hi - r
    for _ in range(HALVINGS):
        mid = lo + (hi - lo) * 0.5
        f = tl.sum(tl.where(valid & (v > mid), v - mid, 0.0), axis=0)
        big = f >= r
        lo = tl.where(big, mid, lo)
        hi = tl.where(big, hi, mid)
    support = valid & (v > lo)
    count = tl.sum(support.to(tl.int32), axis=0)
    tau = (tl.sum(tl.where(support, v, 0.0), axis=0) - r) / count.to(v.dtype)
    x = tl.where(valid, tl.maximum(v - tau, 0.0), 0.0)
    tl.store(out_ptr + b * M + offs, x, mask=inb)


def project_simplex_triton(v: torch.Tensor, mask: Optional[torch.Tensor] = None,
                           radius: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Same contract as `project_simplex_torch`; rows of at most ``MAX_BLOCK`` entries."""
    B, M = v.shape
    if M > MAX_BLOCK:
        raise ValueError(f"v has {M} entries per row; the Triton kernel takes at most {MAX_BLOCK}")
    v = v.contiguous()
    out = torch.empty_like(v)
    if B == 0:
        return out
    if radius is None:
        radius = torch.ones(B, dtype=v.dtype, device=v.device)
    m = mask.to(torch.int8).contiguous() if mask is not None else v
    block = triton.next_power_of_2(max(M, 2))
    _simplex_kernel[(B,)](v, m, radius.to(v.dtype).contiguous(), out, M, HAS_MASK=mask is not None,
                          BLOCK=block, HALVINGS=_HALVINGS, num_warps=row_warps(block))
    return out
