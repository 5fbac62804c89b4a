"""Generalized distance transforms (Felzenszwalb & Huttenlocher, 2012) in max form, in plain torch: the reference
twin of `distance_transform_triton`.

1-D, per row of ``f (R, n)`` with per-row ``a >= 0``, ``b`` and ``r`` (any reals)::

    out[p] = max_{q in [0, n)} f[q] - a d^2 - b d,    d = p - q - r,    arg[p] = the maximizing q,

for every output position ``p in [0, n)``. In a tree message, ``p`` is the parent's coordinate and ``q``
the child's (see "Spatial trees" below). For ``a > 0`` each ``q`` contributes a concave parabola in ``p``
of the same curvature; their upper envelope is built in one sweep over ``q`` (a stack of parabolas,
popping those that the new one hides) and read in one sweep over ``p``: O(n) per row instead of O(n^2).
For ``a == 0`` every ``q`` is a line of slope ``-b``, so one ``q = argmax f[q] + b q`` wins for every p.
Rows are vectorized: each Python-level step advances every row by one step of its own sweep.

Exactness: the envelope test compares breakpoints without division (by cross-multiplication, where ``b``
and ``r`` cancel), so it is exact when ``f`` and ``a`` are small integers; the read-out compares the
candidates' values computed as ``f[q] - a*d*d - b*d``, the brute-force formula. Ties go to the smallest
``q`` (the leftmost parabola maximal at p is always on the envelope). The Triton kernel does the same
arithmetic in the same order.

Spatial trees (pictorial structures). A node's label is a position ``l = (x, y)`` on an ``H x W`` grid,
x the column in ``[0, W)``, y the row in ``[0, H)``, flattened as ``y * W + x``. Edge e from parent p to
child c costs ``w_e . Delta(l_c - l_p - r_e)`` with ``Delta(dx, dy) = (dx, dx^2, dy, dy^2)``,
``w = (w_x, w_xx, w_y, w_yy)``, ``w_xx, w_yy >= 0`` and ``r_e = (r_x, r_y)`` the child's rest offset from
its parent. The message ``m(l_p) = max_{l_c} belief_c(l_c) - w . Delta(l_c - l_p - r)`` is a 2-D
transform with ``p`` = parent, ``q`` = child, ``d_gdt = -(l_c - l_p - r)``: per axis ``a = w_quadratic``,
``b = -w_linear``, ``r_gdt = -r`` (`kernels.tree_torch.spatial_level_op`).
"""

from __future__ import annotations

from typing import Tuple

import torch


def gdt_value(f_q: torch.Tensor, a, b, r, p, q: torch.Tensor) -> torch.Tensor:
    """``f_q - a d^2 - b d`` with ``d = (p - q) - r``, in this exact order of operations."""
    d = (p - q).to(f_q.dtype) - r
    return f_q - a * d * d - b * d


# Steps between the checks for finished rows on a device (each check makes the host wait for the device).
_DEVICE_CHECK_EVERY = 8


def distance_transform_1d_torch(f: torch.Tensor, a: torch.Tensor, b: torch.Tensor, r: torch.Tensor):
    """1-D transform of each row (module doc). ``f (R, n)``; ``a, b, r (R,)`` of f's dtype, ``a >= 0`` (not
    checked here). Returns ``out (R, n)`` and ``arg (R, n)`` long.

    Each row runs its own sequence of steps (a pop or a push while building the envelope, an advance or an
    output while reading it), the same sequence and arithmetic as the one-row loops of the Triton kernel;
    every Python-level step advances all rows by one step of their own, so the envelope takes at most
    ``2n - 3`` steps and the read-out ``2n - 1``; the only host synchronization is the check for finished
    rows once every row may be done (after ``n - 1`` and ``n`` steps; on a device every `_DEVICE_CHECK_EVERY`
    steps, as the steps of finished rows change nothing). Tables are flat and read or written
    with ``index_select`` / ``scatter_`` (the fast paths on CPU). Positions are held as floats of f's dtype
    (float32 for half precision; small integers: exact), their differences cast to f's dtype as in `gdt_value`."""
    R, n = f.shape
    dt, dev = f.dtype, f.device
    check_every = 1 if dev.type == "cpu" else _DEVICE_CHECK_EVERY
    out = f.new_empty(R, n)
    arg = torch.empty(R, n, dtype=torch.long, device=dev)
    if R == 0 or n == 0:
        return out, arg

    # Envelope: the first top+1 entries of a row of sq / sf hold q and f[q] of the parabolas on the upper
    # envelope of 0..q-1, left to right; (t, ft) is the top entry. The per-row tables are flat and column-major,
    # entry (row, column) at column * R + row, so that rows at the same column read neighbouring memory.
    # Column n of the padded f is a dummy read by rows that are done (q == n).
    pdt = dt if dt in (torch.float32, torch.float64) else torch.float32  # positions: exact integers
    base = torch.arange(R, device=dev)
    nR = n * R
    fpad = torch.cat([f, f[:, :1]], dim=1).t().reshape(-1)
    sq = torch.zeros(nR, dtype=pdt, device=dev)
    sf = f.new_zeros(nR)
    sf[:R] = f[:, 0]
    # flat indices: itop of the top (row + top * R), iq of f[q] (row + q * R)
    itop = base.clone()
    t = torch.zeros(R, dtype=pdt, device=dev)
    ft = f[:, 0].clone()
    iq = base + R
    qf = torch.ones(R, dtype=pdt, device=dev)
    for step in range(2 * n - 3):
        live = iq < nR
        if step >= n - 1 and (step - n + 1) % check_every == 0 and not bool(live.any()):
            break
        below = torch.maximum(itop - R, base)
        s, fs = sq.index_select(0, below), sf.index_select(0, below)
        fq = fpad.index_select(0, iq)
        qt, ts = (qf - t).to(dt), (t - s).to(dt)
        # pop t iff z(t, q) <= z(s, t), with z(i, j) the breakpoint where j overtakes i; a -inf parabola is
        # never on the envelope (and its breakpoints are NaN when s or q is -inf too)
        lhs = a * (qf - s).to(dt) * qt * ts
        rhs = (fq - ft) * ts - (ft - fs) * qt
        pop = live & (itop >= R) & ((lhs <= rhs) | (ft == -torch.inf))
        push = live & ~pop
        itop = torch.where(pop, below, itop.add(push, alpha=R))
        t = torch.where(pop, s, torch.where(push, qf, t))
        ft = torch.where(pop, fs, torch.where(push, fq, ft))
        sq.scatter_(0, itop, t)
        sf.scatter_(0, itop, ft)
        iq.add_(push, alpha=R)
        qf.add_(push)

    # Read-out: k walks the envelope; a row at position p either advances k (the next parabola is strictly
    # better at p) or writes p's output and moves to p + 1. Column n of out / arg takes the writes of rows
    # that are done. Flat indices: ik of the current parabola (row + k * R), ip of the output (row + p * R).
    outp = f.new_empty(nR + R)
    argp = torch.empty(nR + R, dtype=torch.long, device=dev)
    ik = base.clone()
    last = base + (nR - R)
    ip = base.clone()
    pf = torch.zeros(R, dtype=pdt, device=dev)
    for step in range(2 * n - 1):
        live = ip < nR
        if step >= n and (step - n) % check_every == 0 and not bool(live.any()):
            break
        i1 = torch.minimum(ik + R, last)
        q0, q1 = sq.index_select(0, ik), sq.index_select(0, i1)
        d0, d1 = (pf - q0).to(dt) - r, (pf - q1).to(dt) - r
        v0 = sf.index_select(0, ik) - a * d0 * d0 - b * d0  # gdt_value, in its order of operations
        v1 = sf.index_select(0, i1) - a * d1 * d1 - b * d1
        adv = live & (ik < itop) & (v1 > v0)
        outp.scatter_(0, ip, v0)
        argp.scatter_(0, ip, q0.long())
        ik.add_(adv, alpha=R)
        emit = live & ~adv
        ip.add_(emit, alpha=R)
        pf.add_(emit)
    out = outp.view(n + 1, R)[:n].t().contiguous()
    arg = argp.view(n + 1, R)[:n].t().contiguous()

    linear = a == 0
    if bool(linear.any()):
        pos = torch.arange(n, device=dev)
        best = (f + b.unsqueeze(1) * pos.to(dt)).argmax(dim=1)  # first maximum
        lin_arg = best.unsqueeze(1).expand(R, n)
        lin_out = gdt_value(f.gather(1, best.unsqueeze(1)), a.unsqueeze(1), b.unsqueeze(1), r.unsqueeze(1),
                            pos.unsqueeze(0), lin_arg)
        out = torch.where(linear.unsqueeze(1), lin_out, out)
        arg = torch.where(linear.unsqueeze(1), lin_arg, arg)
    return out, arg


def distance_transform_2d(f: torch.Tensor, ax, bx, rx, ay, by, ry, gdt_1d=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """2-D transform of ``f (R, H, W)`` (x = column, y = row), separable per axis:

    ``out[y, x] = max_{y', x'} f[y', x'] - ax dx^2 - bx dx - ay dy^2 - by dy`` with ``dx = x - x' - rx``,
    ``dy = y - y' - ry``; per-row parameters ``(R,)``. A row pass along x, then a column pass along y.

    Returns ``out (R, H, W)`` and ``arg (R, H, W)`` long, the maximizing flat position ``y' * W + x'``
    (ties: smallest y', then smallest x': the smallest flat index). ``gdt_1d``: the 1-D transform to use
    (default `distance_transform_1d_torch`).
    """
    gdt_1d = gdt_1d or distance_transform_1d_torch
    R, H, W = f.shape

    def rep(t, m):
        return t.repeat_interleave(m)

    g, argx = gdt_1d(f.reshape(R * H, W), rep(ax, H), rep(bx, H), rep(rx, H))  # g[r, y', x]
    g = g.view(R, H, W).transpose(1, 2).reshape(R * W, H)
    out, argy = gdt_1d(g, rep(ay, W), rep(by, W), rep(ry, W))  # out[(r, x), y]
    out = out.view(R, W, H).transpose(1, 2).contiguous()
    argy = argy.view(R, W, H).transpose(1, 2)
    argx = argx.view(R, H, W).gather(1, argy)  # the best x' in the chosen row y'
    return out, (argy * W + argx).contiguous()
