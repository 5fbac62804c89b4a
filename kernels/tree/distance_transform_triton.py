"""The 1-D generalized distance transform (max form) as a Triton kernel: one program per row.

Twin of `distance_transform_1d_torch` (same contract, same envelope test, same value formula and order of
operations, same tie-breaking: smallest q), so the two agree bitwise. The envelope is a stack of positions
in a global scratch row; building it and reading it out are sequential loops inside the program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gdt_value(f_q, a, b, r, p, q):
    d = (p - q).to(f_q.dtype) - r
    return f_q - a * d * d - b * d


@triton.jit
def _gdt_1d_kernel(f_ptr, a_ptr, b_ptr, r_ptr, v_ptr, out_ptr, arg_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    f_base = f_ptr + row * n
    v_base = v_ptr + row * n
    o_base = out_ptr + row * n
    g_base = arg_ptr + row * n
    a = tl.load(a_ptr + row)
    b = tl.load(b_ptr + row)
    r = tl.load(r_ptr + row)
    offs = tl.arange(0, BLOCK)
    if a == 0:
        fv = tl.load(f_base + offs, mask=offs < n, other=float("-inf"))
        lin = fv + b * offs.to(fv.dtype)
        best = tl.argmax(lin, axis=0).to(tl.int64)
        fb = tl.load(f_base + best)
        for p in range(0, n):
            tl.store(o_base + p, _gdt_value(fb, a, b, r, p, best))
            tl.store(g_base + p, best)
    else:
        top = tl.zeros([], dtype=tl.int64)
        tl.store(v_base, top)
        for q in range(1, n):
            fq = tl.load(f_base + q)
            active = top > 0
            while active:
                t = tl.load(v_base + top)
                s = tl.load(v_base + top - 1)
                ft = tl.load(f_base + t)
                fs = tl.load(f_base + s)
                lhs = a * (q - s).to(fq.dtype) * (q - t).to(fq.dtype) * (t - s).to(fq.dtype)
                rhs = (fq - ft) * (t - s).to(fq.dtype) - (ft - fs) * (q - t).to(fq.dtype)
                pop = (lhs <= rhs) | (ft == float("-inf"))  # a -inf parabola is never on the envelope
                top = tl.where(pop, top - 1, top)
                active = pop & (top > 0)
            top = top + 1
            tl.store(v_base + top, q + tl.zeros([], dtype=tl.int64))
        k = tl.zeros([], dtype=tl.int64)
        for p in range(0, n):
            cont = k < top
            while cont:
                q0 = tl.load(v_base + k)
                q1 = tl.load(v_base + k + 1)
                g1 = _gdt_value(tl.load(f_base + q1), a, b, r, p, q1)
                adv = g1 > _gdt_value(tl.load(f_base + q0), a, b, r, p, q0)
                k = tl.where(adv, k + 1, k)
                cont = adv & (k < top)
            qk = tl.load(v_base + k)
            tl.store(o_base + p, _gdt_value(tl.load(f_base + qk), a, b, r, p, qk))
            tl.store(g_base + p, qk)


def distance_transform_1d_triton(f: torch.Tensor, a: torch.Tensor, b: torch.Tensor, r: torch.Tensor):
    """Same contract as `distance_transform_1d_torch`; float32 or float64."""
    R, n = f.shape
    f = f.contiguous()
    out = f.new_empty(R, n)
    arg = torch.empty(R, n, dtype=torch.long, device=f.device)
    if R == 0 or n == 0:
        return out, arg
    scratch = torch.empty(R, n, dtype=torch.long, device=f.device)
    # One warp per row: the envelope loops are scalar and every warp of a program would repeat them, so more
    # warps add no speed and only lower how many rows an SM keeps in flight.
    _gdt_1d_kernel[(R,)](
        f, a.to(f.dtype).contiguous(), b.to(f.dtype).contiguous(), r.to(f.dtype).contiguous(),
        scratch, out, arg, n, BLOCK=triton.next_power_of_2(n), num_warps=1,
    )
    return out, arg
