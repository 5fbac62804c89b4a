"""Projection onto a box with one linear equality as a Triton kernel: one program per row, bisection.

Twin of `project_box_equality_torch` (same problem, change of variables and notation as there,
``h_i(lam) = clip(lam * inv_i, l'_i, u'_i)``, ``f(lam) = sum_i h_i(lam) - z'``). Sorting inside a program is
awkward, so the root of f is bracketed by bisection and the last step is exact, the way
`project_simplex_triton` does it:

1. ``[kmin, kmax]``, the smallest and largest finite kinks. If ``f(kmin) >= 0`` the root lies in
   ``(-inf, kmin]``, if ``f(kmax) < 0`` in ``(kmax, inf)``; neither segment holds a kink, so it is solved as is.
   Otherwise bisection on ``[kmin, kmax]`` keeps ``f(lo) < 0 <= f(hi)`` for at most ``HALVINGS = 128`` steps,
   stopping early once ``lo`` and ``hi`` are adjacent floats (55-65 steps in float64 on our random rows; up to
   the cap when the root is 0, where floats are dense).
2. Exact finish on the bracket: coordinates whose lower kink is ``>= hi`` sit at ``l'``, whose upper kink is
   ``<= lo`` at ``u'``, the others are free, and ``lam = (z' - sum_fixed) / sum_free inv_i`` (clamped into the
   bracket). The final bracket is at most ``2^-128`` of the kink spread or one float spacing wide, so a kink
   left inside it moves ``x`` by rounding only.

Rows up to ``MAX_BLOCK`` entries are spread over the program's threads (`simplex_triton.row_warps`). From
4096 float64 entries on, the row vectors the bisection keeps no longer fit in registers and part of them
spills to local memory. The bounds, sigma and d2 may be shared by all rows (row stride 0): they are read
through strides, never copied per row.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .box_equality_torch import Bound
from .simplex_triton import row_warps

MAX_BLOCK = 1 << 14
_HALVINGS = 128


@triton.jit
def _f(t, inv, lp, up, zp):
    return tl.sum(tl.minimum(tl.maximum(t * inv, lp), up), axis=0) - zp


@triton.jit
def _box_equality_kernel(m_ptr, l_ptr, u_ptr, s_ptr, d2_ptr, z_ptr, out_ptr, n,
                         l_rs, l_cs, u_rs, u_cs, s_rs, s_cs, d_rs, d_cs,
                         HAS_D2: tl.constexpr, BLOCK: tl.constexpr, HALVINGS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    inb = offs < n
    m = tl.load(m_ptr + b * n + offs, mask=inb, other=0.0)
    lo_x = tl.load(l_ptr + b * l_rs + offs * l_cs, mask=inb, other=0.0)
    hi_x = tl.load(u_ptr + b * u_rs + offs * u_cs, mask=inb, other=0.0)
    s = tl.load(s_ptr + b * s_rs + offs * s_cs, mask=inb, other=1.0)
    inv = s * s
    if HAS_D2:
        inv = inv / tl.load(d2_ptr + b * d_rs + offs * d_cs, mask=inb, other=1.0)
    inv = tl.where(inb, inv, 0.0)  # padding lanes: h = clip(0, 0, 0) = 0
    pos = s > 0
    lp = tl.where(inb, tl.where(pos, s * (lo_x - m), s * (hi_x - m)), 0.0)
    up = tl.where(inb, tl.where(pos, s * (hi_x - m), s * (lo_x - m)), 0.0)
    zp = tl.load(z_ptr + b) - tl.sum(tl.where(inb, s * m, 0.0), axis=0)

    safe = tl.where(inb, inv, 1.0)
    ka = lp / safe
    kb = up / safe
    fa = inb & (tl.abs(ka) < float("inf"))
    fb = inb & (tl.abs(kb) < float("inf"))
    kmin = tl.minimum(tl.min(tl.where(fa, ka, float("inf")), axis=0), tl.min(tl.where(fb, kb, float("inf")), axis=0))
    kmax = tl.maximum(tl.max(tl.where(fa, ka, float("-inf")), axis=0),
                      tl.max(tl.where(fb, kb, float("-inf")), axis=0))
    has_kinks = kmin <= kmax
    kmin = tl.where(has_kinks, kmin, 0.0)
    kmax = tl.where(has_kinks, kmax, 0.0)
    left = _f(kmin, inv, lp, up, zp) >= 0
    right = _f(kmax, inv, lp, up, zp) < 0

    lo = kmin
    hi = kmax
    mid = lo + (hi - lo) * 0.5
    it = 0
    while (it < HALVINGS) & (mid > lo) & (mid < hi):  # stops early once lo, hi are adjacent floats
        big = _f(mid, inv, lp, up, zp) >= 0
        lo = tl.where(big, lo, mid)
        hi = tl.where(big, mid, hi)
        mid = lo + (hi - lo) * 0.5
        it += 1
    lo = tl.where(left | ~has_kinks, float("-inf"), tl.where(right, kmax, lo))
    hi = tl.where(right | ~has_kinks, float("inf"), tl.where(left, kmin, hi))

    at_lower = inb & (ka >= hi)
    at_upper = inb & (kb <= lo)
    free = inb & ~(at_lower | at_upper)
    fixed = tl.sum(tl.where(at_lower, lp, 0.0), axis=0) + tl.sum(tl.where(at_upper, up, 0.0), axis=0)
    slope = tl.sum(tl.where(free, inv, 0.0), axis=0)
    has = slope > 0
    lam = (zp - fixed) / tl.where(has, slope, 1.0)
    lam = tl.where(has, lam, tl.where(lo > float("-inf"), lo, hi))
    lam = tl.maximum(tl.minimum(lam, hi), lo)

    v = lam * inv
    x = m + tl.minimum(tl.maximum(v, lp), up) / s
    x = tl.where(v <= lp, tl.where(pos, lo_x, hi_x), x)
    x = tl.where(v >= up, tl.where(pos, hi_x, lo_x), x)
    x = tl.maximum(tl.minimum(x, hi_x), lo_x)
    tl.store(out_ptr + b * n + offs, x, mask=inb)


def _strided(t: Bound, m: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        t = torch.tensor(float(t), dtype=m.dtype, device=m.device)
    t = t.to(m.dtype)
    if t.dim() < 2:
        t = t.contiguous()  # expand keeps stride 0 on the broadcast dimensions
    return t.expand_as(m)


def project_box_equality_triton(m: torch.Tensor, lower: Bound, upper: Bound, sigma: Bound, z: Bound,
                                d2: Optional[Bound] = None) -> torch.Tensor:
    """Same contract as `project_box_equality_torch`; rows of at most ``MAX_BLOCK`` entries."""
    B, n = m.shape
    if n > MAX_BLOCK:
        raise ValueError(f"m has {n} entries per row; the Triton kernel takes at most {MAX_BLOCK}")
    m = m.contiguous()
    out = torch.empty_like(m)
    if B == 0:
        return out
    lo, hi, s = (_strided(t, m) for t in (lower, upper, sigma))
    d = _strided(d2, m) if d2 is not None else m
    zt = z if isinstance(z, torch.Tensor) else torch.tensor(float(z), dtype=m.dtype, device=m.device)
    zt = zt.to(m.dtype).expand(B).contiguous()
    block = triton.next_power_of_2(max(n, 2))
    _box_equality_kernel[(B,)](m, lo, hi, s, d, zt, out, n,
                               lo.stride(0), lo.stride(1), hi.stride(0), hi.stride(1), s.stride(0), s.stride(1),
                               d.stride(0), d.stride(1), HAS_D2=d2 is not None,
                               BLOCK=block, HALVINGS=_HALVINGS, num_warps=row_warps(block))
    return out
