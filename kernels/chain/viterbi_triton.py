"""Batched Viterbi as Triton kernels: one program per sequence for small K, the GPU-wide max-plus product for large K.

Twin of `viterbi_torch`: the same recursion ``alpha_t[j] = max_i (alpha_{t-1}[i] + tr[i, j]) + u_t[j]`` and the same
tie rule (every argmax takes the smallest label index), so the kernels and the twin agree bitwise. Three kernels,
chosen by shape in `viterbi_triton` (``kernel="auto"``; each can be forced):

- ``"sequence"`` (`_viterbi_seq_kernel`, ``K <= 64``): one program decodes one whole sequence in one launch. The
  ``K x K`` transition tile stays in registers; a time step is one max-plus of the forward scores with the tile,
  its reduction over the previous label, and the next step's unary row already in flight (prefetched one step
  ahead). The forward pass computes maxima only (an add and a max per entry; tracking the argmax costs about three
  times that) and keeps the forward scores ``alpha_t`` ``(B, T, K)`` in a scratch history; the backtrack recomputes
  the one argmax it needs per step, ``argmax_i alpha_{t-1}[i] + tr[i, y_t]``, exactly the argmax the forward pass
  would have stored (the torch twin does the same).
- ``"grid"`` (`_viterbi_grid_kernel`, ``K > 64`` on CUDA): the step ``(B, K) x (K, K)`` max-plus product is tiled
  over the whole GPU. A work item is a block of ``BB`` sequences times a block of ``BJ`` output labels; it reads the
  ``BB x K`` forward scores of step t-1 and the ``K x BJ`` transition slice in ``BI``-long chunks and keeps a
  ``BB x BI x BJ`` running maximum in registers (only adds and maxes in the inner loop), reduced over the chunk axis
  once per step. The kernel is persistent: a cooperative launch of at most one program per SM walks the work items
  of every step and meets the other programs at a grid barrier (a global counter) between steps; the backtrack
  then runs one sequence per program, a whole row of ``K <= 4096`` labels at a time. Where the grid barrier is not
  wanted (the Triton interpreter runs programs one after the other, so there it uses one program) the same kernel
  runs one launch per step (``kernel="grid-steps"``).
- ``"legacy"`` (`_viterbi_kernel`): one program per sequence with argmax-tracking backpointers
  (a ``BLOCK x BLOCK``-tiled loop through a global scratch buffer above ``K = 64``). ``"auto"`` runs it for
  ``K > 64`` where a cooperative launch is not available, and above ``K = 4096``.

Timings of the three kernels: docs/benchmarks/oracles_cuda_roofline.md.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .guard_triton import ChainGuard, guard_shift, pow2
from .viterbi_torch import promote_chain_potentials

_SINGLE_TILE_MAX_K = 64
_TILE = 64
SEQUENCE_MAX_K = 64  # "auto" runs the one-program-per-sequence kernel up to this K
KERNELS = ("auto", "sequence", "grid", "grid-steps", "legacy")


# ---------------------------------------------------------------------------------------- scale and epilogue
@triton.jit
def _guard(part_ptr, n_parts, limit, dt: tl.constexpr, GUARD: tl.constexpr, BLOCK_P: tl.constexpr):
    """``(2**-s, 2**s)`` in ``dt``: the overflow guard's factors (`guard_triton`), 1 without ``GUARD``."""
    if GUARD:
        shift = guard_shift(part_ptr, n_parts, limit, BLOCK_P)
        sc = pow2(-shift).to(dt)
        inv = pow2(shift).to(dt)
    else:
        sc = tl.full([], 1.0, dt)
        inv = tl.full([], 1.0, dt)
    return sc, inv


@triton.jit
def _scaled(x, sc, ON: tl.constexpr):
    """``x`` times the guard's power of two ``sc`` (exact) where ``ON``."""
    if ON:
        x = x * sc
    return x


@triton.jit
def _result(score, b, inv, gold_ptr, GUARD: tl.constexpr, HINGE: tl.constexpr):
    """What a kernel stores for sequence ``b``: its best score, or with ``HINGE`` the margin-rescaled hinge
    ``max(score - gold[b], 0)`` (NaN kept: the prepare kernel's flag); with ``GUARD`` times ``inv = 2**s`` (the
    scores were computed on the potentials times ``2**-s``; a value past the dtype's range is +-inf)."""
    if HINGE:
        d = score - tl.load(gold_ptr + b)
        score = tl.where(d < 0, 0.0, d).to(d.dtype)  # torch's clamp_min(d, 0): NaN and -0.0 kept
    if GUARD:
        score = score * inv
    return score


# ------------------------------------------------------------------------------------------------- legacy kernel

@triton.jit
def _viterbi_kernel(
    unary_ptr, trans_ptr, start_ptr, end_ptr, len_ptr,
    bp_ptr, alpha_ptr, out_ptr, score_ptr, part_ptr, gold_ptr,
    T, K, trans_sb, trans_st, n_parts, guard_limit,
    HAS_START: tl.constexpr, HAS_END: tl.constexpr, PER_POSITION: tl.constexpr,
    SINGLE: tl.constexpr, BLOCK: tl.constexpr,
    GUARD: tl.constexpr = False, SCALE_UNARY: tl.constexpr = False, HINGE: tl.constexpr = False,
    BLOCK_P: tl.constexpr = 1,
):
    b = tl.program_id(0).to(tl.int64)
    sc, inv = _guard(part_ptr, n_parts, guard_limit, unary_ptr.dtype.element_ty, GUARD, BLOCK_P)
    SU: tl.constexpr = GUARD and SCALE_UNARY
    L = tl.load(len_ptr + b)
    u_base = unary_ptr + b * T * K
    tr_base = trans_ptr + b * trans_sb
    bp_base = bp_ptr + b * T * K
    NEG = float("-inf")

    if SINGLE:
        offs_i = tl.arange(0, BLOCK)
        offs_j = tl.arange(0, BLOCK)
        mi = offs_i < K
        mj = offs_j < K
        tmask = mi[:, None] & mj[None, :]
        alpha = _scaled(tl.load(u_base + offs_i, mask=mi, other=NEG), sc, SU)
        if HAS_START:
            alpha = alpha + _scaled(tl.load(start_ptr + offs_i, mask=mi, other=0.0), sc, GUARD)
        if not PER_POSITION:  # per-position tiles are loaded inside the loop (none exist when T == 1)
            tr = _scaled(tl.load(tr_base + offs_i[:, None] * K + offs_j[None, :], mask=tmask, other=NEG),
                         sc, GUARD)
        for t in range(1, L):
            if PER_POSITION:
                tr = _scaled(tl.load(tr_base + (t - 1) * trans_st + offs_i[:, None] * K + offs_j[None, :],
                                     mask=tmask, other=NEG), sc, GUARD)
            s = alpha[:, None] + tr
            best = tl.max(s, axis=0)
            arg = tl.argmax(s, axis=0)
            u = _scaled(tl.load(u_base + t * K + offs_j, mask=mj, other=NEG), sc, SU)
            tl.store(bp_base + t * K + offs_j, arg.to(tl.int32), mask=mj)
            alpha = best + u
        if HAS_END:
            alpha = alpha + _scaled(tl.load(end_ptr + offs_j, mask=mj, other=0.0), sc, GUARD)
        score = tl.max(alpha, axis=0)
        y = tl.argmax(alpha, axis=0).to(tl.int32)
    else:
        a_base = alpha_ptr + b * 2 * K
        for j0 in range(0, K, BLOCK):
            offs = j0 + tl.arange(0, BLOCK)
            m = offs < K
            a0 = _scaled(tl.load(u_base + offs, mask=m, other=NEG), sc, SU)
            if HAS_START:
                a0 = a0 + _scaled(tl.load(start_ptr + offs, mask=m, other=0.0), sc, GUARD)
            tl.store(a_base + offs, a0, mask=m)
        tl.debug_barrier()
        for t in range(1, L):
            src = a_base + ((t - 1) % 2) * K
            dst = a_base + (t % 2) * K
            tr_t = tr_base + (t - 1) * trans_st
            for j0 in range(0, K, BLOCK):
                offs_j = j0 + tl.arange(0, BLOCK)
                mj = offs_j < K
                best = tl.full([BLOCK], NEG, dtype=unary_ptr.dtype.element_ty)
                arg = tl.zeros([BLOCK], dtype=tl.int32)
                for i0 in range(0, K, BLOCK):
                    offs_i = i0 + tl.arange(0, BLOCK)
                    mi = offs_i < K
                    a = tl.load(src + offs_i, mask=mi, other=NEG)
                    tr = _scaled(tl.load(tr_t + offs_i[:, None] * K + offs_j[None, :],
                                         mask=mi[:, None] & mj[None, :], other=NEG), sc, GUARD)
                    s = a[:, None] + tr
                    tile_best = tl.max(s, axis=0)
                    tile_arg = tl.argmax(s, axis=0).to(tl.int32) + i0
                    upd = tile_best > best  # strict: an earlier tile keeps ties
                    best = tl.where(upd, tile_best, best)
                    arg = tl.where(upd, tile_arg, arg)
                u = _scaled(tl.load(u_base + t * K + offs_j, mask=mj, other=NEG), sc, SU)
                tl.store(dst + offs_j, best + u, mask=mj)
                tl.store(bp_base + t * K + offs_j, arg, mask=mj)
            tl.debug_barrier()
        fsrc = a_base + ((L - 1) % 2) * K
        bestv = tl.full([BLOCK], NEG, dtype=unary_ptr.dtype.element_ty)
        argv = tl.zeros([BLOCK], dtype=tl.int32)
        for j0 in range(0, K, BLOCK):
            offs = j0 + tl.arange(0, BLOCK)
            m = offs < K
            v = tl.load(fsrc + offs, mask=m, other=NEG)
            if HAS_END:
                v = v + _scaled(tl.load(end_ptr + offs, mask=m, other=0.0), sc, GUARD)
            upd = v > bestv
            bestv = tl.where(upd, v, bestv)
            argv = tl.where(upd, offs.to(tl.int32), argv)
        score = tl.max(bestv, axis=0)
        y = tl.min(tl.where(bestv == score, argv, K), axis=0).to(tl.int32)

    tl.store(score_ptr + b, _result(score, b, inv, gold_ptr, GUARD, HINGE))
    tl.debug_barrier()
    for s in range(0, L):
        t = L - 1 - s
        tl.store(out_ptr + b * T + t, y.to(tl.int64))
        prev = tl.load(bp_base + t * K + y, mask=t > 0, other=0)
        y = tl.where(t > 0, prev, y)


# ----------------------------------------------------------------------------------- one program per sequence

@triton.jit
def _viterbi_seq_kernel(
    unary_ptr, trans_ptr, start_ptr, end_ptr, len_ptr,
    hist_ptr, out_ptr, score_ptr, part_ptr, gold_ptr,
    T, K, trans_sb, trans_st, n_parts, guard_limit,
    HAS_START: tl.constexpr, HAS_END: tl.constexpr, PER_POSITION: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_T: tl.constexpr,
    GUARD: tl.constexpr = False, SCALE_UNARY: tl.constexpr = False, HINGE: tl.constexpr = False,
    BLOCK_P: tl.constexpr = 1,
):
    b = tl.program_id(0).to(tl.int64)
    sc, inv = _guard(part_ptr, n_parts, guard_limit, unary_ptr.dtype.element_ty, GUARD, BLOCK_P)
    SU: tl.constexpr = GUARD and SCALE_UNARY
    L = tl.load(len_ptr + b).to(tl.int32)
    u_base = unary_ptr + b * T * K
    h_base = hist_ptr + b * T * K
    tr_base = trans_ptr + b * trans_sb
    NEG = float("-inf")
    offs_i = tl.arange(0, BLOCK)  # previous label: rows of the tile
    offs_j = tl.arange(0, BLOCK)  # next label: columns
    mi = offs_i < K
    mj = offs_j < K
    tmask = mi[:, None] & mj[None, :]
    tile = offs_i[:, None] * K + offs_j[None, :]

    alpha = _scaled(tl.load(u_base + offs_j, mask=mj, other=NEG), sc, SU)
    if HAS_START:
        alpha = alpha + _scaled(tl.load(start_ptr + offs_j, mask=mj, other=0.0), sc, GUARD)
    # masks of the prefetches: a label bound of K while the step exists, else 0 (no lane loads)
    lim = tl.where(L > 1, K, 0)
    if PER_POSITION:
        tr_next = tl.load(tr_base + tile, mask=mi[:, None] & (offs_j[None, :] < lim), other=NEG)
    else:
        tr = _scaled(tl.load(tr_base + tile, mask=tmask, other=NEG), sc, GUARD)
    u_next = _scaled(tl.load(u_base + K + offs_j, mask=offs_j < lim, other=0.0), sc, SU)
    for t in range(1, L):
        # the loads of step t + 1 go out before step t's arithmetic (they do not depend on it)
        lim = tl.where(t + 1 < L, K, 0)
        u = u_next
        u_next = _scaled(tl.load(u_base + (t + 1) * K + offs_j, mask=offs_j < lim, other=0.0), sc, SU)
        if PER_POSITION:
            tr = _scaled(tr_next, sc, GUARD)
            tr_next = tl.load(tr_base + t * trans_st + tile, mask=mi[:, None] & (offs_j[None, :] < lim), other=NEG)
        tl.store(h_base + (t - 1) * K + offs_j, alpha, mask=mj)
        alpha = tl.max(alpha[:, None] + tr, axis=0) + u
    fin = alpha
    if HAS_END:
        fin = fin + _scaled(tl.load(end_ptr + offs_j, mask=mj, other=0.0), sc, GUARD)
    score = tl.max(fin, axis=0)
    y = tl.argmax(fin, axis=0).to(tl.int32)
    tl.store(score_ptr + b, _result(score, b, inv, gold_ptr, GUARD, HINGE))

    o_base = out_ptr + b * T
    for t0 in range(0, T, BLOCK_T):  # -1 past the length (the positions below it are written by the backtrack)
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tl.store(o_base + offs_t, tl.full([BLOCK_T], -1, tl.int64), mask=(offs_t >= L) & (offs_t < T))
    tl.debug_barrier()  # the history rows written by other threads of this program
    tl.store(o_base + (L - 1), y.to(tl.int64))
    h_next = tl.load(h_base + (L - 2) * K + offs_i, mask=offs_i < tl.where(L >= 2, K, 0), other=NEG)
    for s in range(1, L):
        t = L - s  # y = y_t; find y_{t-1}
        h = h_next
        h_next = tl.load(h_base + (t - 2) * K + offs_i, mask=offs_i < tl.where(t >= 2, K, 0), other=NEG)
        # column y_t of the transition tile (shared: read at the start, so likely still in the L1 cache)
        col = _scaled(tl.load(tr_base + (t - 1) * trans_st + offs_i * K + y, mask=mi, other=NEG), sc, GUARD)
        y = tl.argmax(h + col, axis=0).to(tl.int32)
        tl.store(o_base + (t - 1), y.to(tl.int64))


# ----------------------------------------------------------------------------- the max-plus product, GPU-wide

@triton.jit
def _grid_barrier(sync_ptr, target):
    """Every program arrives (after its stores) and waits until ``target`` arrivals are counted."""
    tl.debug_barrier()  # this program's stores are issued before its arrival is released
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _viterbi_grid_kernel(
    unary_ptr, trans_ptr, start_ptr, end_ptr, len_ptr,
    hist_ptr, out_ptr, score_ptr, sync_ptr, part_ptr, gold_ptr,
    B, T, K, KP, trans_sb, trans_st, t_begin, t_end, n_parts, guard_limit,
    HAS_START: tl.constexpr, HAS_END: tl.constexpr, PER_POSITION: tl.constexpr,
    BB: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr, BLOCK_T: tl.constexpr,
    STAGES: tl.constexpr, STEPS: tl.constexpr, BACKTRACK: tl.constexpr, SYNC: tl.constexpr,
    GUARD: tl.constexpr = False, SCALE_UNARY: tl.constexpr = False, HINGE: tl.constexpr = False,
    BLOCK_P: tl.constexpr = 1,
):
    """``STEPS``: run the forward steps ``t_begin <= t < min(t_end, max length)``; ``SYNC``: meet at the grid
    barrier after each (all programs resident: a cooperative launch); ``BACKTRACK``: then decode one sequence per
    program. The forward scores of step t go to ``hist[:, t]`` (rows of ``KP >= K`` entries, a whole number of
    128-byte lines, so that no row shares a cache line with another: a row is read only after it is written, and
    written past the L1 cache, so no L1 line can hold a stale copy); step 1 reads step 0's from the unary and start
    scores and writes them to ``hist[:, 0]``. ``BK >= K``: the backtrack reads a whole row at once."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    NEG = float("-inf")
    sc, inv = _guard(part_ptr, n_parts, guard_limit, unary_ptr.dtype.element_ty, GUARD, BLOCK_P)
    SU: tl.constexpr = GUARD and SCALE_UNARY
    n_jb = tl.cdiv(K, BJ)
    n_items = tl.cdiv(B, BB) * n_jb

    if STEPS:
        l_max = pid * 0  # an int32 scalar
        for b0 in range(0, B, BLOCK_T):
            offs = b0 + tl.arange(0, BLOCK_T)
            l_max = tl.maximum(l_max, tl.max(tl.load(len_ptr + offs, mask=offs < B, other=0).to(tl.int32), axis=0))
        t_stop = tl.minimum(t_end, l_max)
        for t in range(t_begin, t_stop):
            for item in range(pid, n_items, G):
                offs_b = (item // n_jb) * BB + tl.arange(0, BB)
                mb = offs_b < B
                act = mb & (tl.load(len_ptr + offs_b, mask=mb, other=0) > t)  # sequences that reach step t
                if tl.max(act.to(tl.int32), axis=0) > 0:
                    offs_j = (item % n_jb) * BJ + tl.arange(0, BJ)
                    mj = offs_j < K
                    ob = offs_b.to(tl.int64)[:, None]
                    # the forward scores of step t - 1: step 0's are the unary row 0 (+ start), the others in hist.
                    # One load either way (a load under a branch would not be pipelined).
                    first = t == 1
                    src = tl.where(first, unary_ptr, hist_ptr + (t - 1) * KP)
                    src_sb = tl.where(first, T * K, T * KP).to(tl.int64)
                    acc = tl.full([BB, BI, BJ], NEG, dtype=hist_ptr.dtype.element_ty)
                    # only an add and a max per entry in this loop; its loads are pipelined STAGES deep
                    for i0 in tl.range(0, K, BI, num_stages=STAGES):
                        offs_i = i0 + tl.arange(0, BI)
                        mi = offs_i < K
                        am = act[:, None] & mi[None, :]
                        a = tl.load(src + ob * src_sb + offs_i[None, :], mask=am, other=NEG)
                        if SU:  # step 0's scores are the unary row 0 (scaled here), the others scaled already
                            a = tl.where(first, a * sc, a)
                        if HAS_START:
                            a = tl.where(first, a + _scaled(tl.load(start_ptr + offs_i, mask=mi, other=0.0),
                                                            sc, GUARD)[None, :], a)
                        if PER_POSITION:
                            tr = _scaled(tl.load(trans_ptr + ob[:, :, None] * trans_sb + (t - 1) * trans_st
                                                 + offs_i[None, :, None] * K + offs_j[None, None, :],
                                                 mask=am[:, :, None] & mj[None, None, :], other=NEG), sc, GUARD)
                        else:
                            tr = _scaled(tl.load(trans_ptr + offs_i[:, None] * K + offs_j[None, :],
                                                 mask=mi[:, None] & mj[None, :], other=NEG), sc, GUARD)
                            tr = tr[None, :, :]
                        acc = tl.maximum(acc, a[:, :, None] + tr)
                    best = tl.max(acc, axis=1)
                    om = act[:, None] & mj[None, :]
                    u = _scaled(tl.load(unary_ptr + (ob * T + t) * K + offs_j[None, :], mask=om, other=0.0), sc,
                                SU)
                    tl.store(hist_ptr + (ob * T + t) * KP + offs_j[None, :], best + u, mask=om, cache_modifier=".cg")
                    if t == 1:
                        a0 = _scaled(tl.load(unary_ptr + ob * T * K + offs_j[None, :], mask=om, other=0.0), sc,
                                     SU)
                        if HAS_START:
                            a0 = a0 + _scaled(tl.load(start_ptr + offs_j, mask=mj, other=0.0), sc,
                                              GUARD)[None, :]
                        tl.store(hist_ptr + ob * T * KP + offs_j[None, :], a0, mask=om, cache_modifier=".cg")
            if SYNC:
                _grid_barrier(sync_ptr, (t - t_begin + 1) * G)

    if BACKTRACK:
        offs = tl.arange(0, BK)
        m = offs < K
        for bb in range(pid, B, G):
            b = tl.cast(bb, tl.int64)
            L = tl.load(len_ptr + b).to(tl.int32)
            h_base = hist_ptr + b * T * KP
            tr_base = trans_ptr + b * trans_sb
            o_base = out_ptr + b * T
            if L == 1:  # no step ran for this sequence: its forward scores are the first unary row (+ start)
                v = _scaled(tl.load(unary_ptr + b * T * K + offs, mask=m, other=NEG), sc, SU)
                if HAS_START:
                    v = v + _scaled(tl.load(start_ptr + offs, mask=m, other=0.0), sc, GUARD)
            else:
                v = tl.load(h_base + (L - 1) * KP + offs, mask=m, other=NEG, cache_modifier=".cg")
            if HAS_END:
                v = v + _scaled(tl.load(end_ptr + offs, mask=m, other=0.0), sc, GUARD)
            score, y = tl.max(v, axis=0, return_indices=True)
            tl.store(score_ptr + b, _result(score, b, inv, gold_ptr, GUARD, HINGE))
            for t0 in range(0, T, BLOCK_T):
                offs_t = t0 + tl.arange(0, BLOCK_T)
                tl.store(o_base + offs_t, tl.full([BLOCK_T], -1, tl.int64), mask=(offs_t >= L) & (offs_t < T))
            tl.store(o_base + (L - 1), y.to(tl.int64))
            # the forward-score row of step t - 1 does not depend on y_t: it is read one step ahead
            h_next = tl.load(h_base + (L - 2) * KP + offs, mask=offs < tl.where(L >= 2, K, 0), other=NEG,
                             cache_modifier=".cg")
            for s in range(1, L):
                t = L - s  # y = y_t; find y_{t-1}
                h = h_next
                h_next = tl.load(h_base + (t - 2) * KP + offs, mask=offs < tl.where(t >= 2, K, 0), other=NEG,
                                 cache_modifier=".cg")
                col = _scaled(tl.load(tr_base + (t - 1) * trans_st + offs.to(tl.int64) * K + y, mask=m, other=NEG),
                              sc, GUARD)
                y = tl.argmax(h + col, axis=0).to(tl.int32)
                tl.store(o_base + (t - 1), y.to(tl.int64))


# ------------------------------------------------------------------------------------------------------ wrapper

def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _sm_count(device: torch.device) -> int:
    if _interpreting():  # one program (also on the simulated CUDA device of `torchssvm.testing`, which has no SMs)
        return 1
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # compile_check records CPU launches for an H100-sized grid


def cooperative_launch_available(device: torch.device) -> bool:
    """Whether `_viterbi_grid_kernel` can run persistent (all programs resident, meeting at a grid barrier):
    on a CUDA device that supports cooperative launches; under the interpreter with one program."""
    if _interpreting():
        return True
    if device.type != "cuda":
        return False
    return bool(getattr(torch.cuda.get_device_properties(device), "cooperative_launch", True))


def choose_kernel(B: int, T: int, K: int, device: torch.device) -> str:
    """``kernel="auto"``: the sequence kernel up to `SEQUENCE_MAX_K` labels, else the persistent GPU-wide
    kernel where a cooperative launch is possible, else the legacy tiled kernel."""
    if K <= SEQUENCE_MAX_K:
        return "sequence"
    return "grid" if K <= GRID_MAX_K and cooperative_launch_available(device) else "legacy"


GRID_MAX_K = 4096  # the grid kernel's backtrack holds a whole row of K labels per program


def grid_tiles(B: int, K: int, sms: int, itemsize: int = 4, num_warps: int = 8) -> dict:
    """Tile sizes of `_viterbi_grid_kernel`: ``BB`` sequences x ``BJ`` output labels per work item, the
    output block that leaves the least work to the busiest of ``sms`` programs per step, counting per previous
    label ``BB x BJ`` max-plus operations and ``BB + BJ`` values read, at twice the cost of an operation (ties:
    the fewest items); ``BI``: the reduction chunk, the largest that keeps the running ``BB x BI x BJ`` maximum
    within 32 floats (16 doubles) per thread and pads K by at most an eighth (else the least padding);
    ``BK``: the backtrack's row, ``>= K``."""
    best = None
    for BB in (8, 4, 2, 1):
        if BB > triton.next_power_of_2(B):
            continue
        for BJ in (32, 16, 8, 4):
            items = triton.cdiv(B, BB) * triton.cdiv(K, BJ)
            key = (triton.cdiv(items, sms) * (BB * BJ + 2 * (BB + BJ)), items)
            if best is None or key < best[0]:
                best = (key, BB, BJ)
    _, BB, BJ = best
    per_thread = 32 if itemsize <= 4 else 16  # 64 spills a little at 8 warps (255 registers, Triton 3.9, sm_90)
    top = max(16, min(512, per_thread * 32 * num_warps // (BB * BJ), triton.next_power_of_2(K)))
    chunks = [top >> s for s in range(6) if top >> s >= 16]
    padded = [(triton.cdiv(K, bi) * bi, bi) for bi in chunks]
    fits = [bi for total, bi in padded if 8 * total <= 9 * K]
    BI = fits[0] if fits else min(padded)[1]
    return dict(BB=BB, BI=BI, BJ=BJ, BK=triton.next_power_of_2(K), STAGES=3)


def viterbi_triton(
    unary: torch.Tensor,
    transition: torch.Tensor,
    start: Optional[torch.Tensor],
    end: Optional[torch.Tensor],
    lengths: torch.Tensor,
    *,
    kernel: str = "auto",
    num_warps: Optional[int] = None,
    programs: Optional[int] = None,
    tiles: Optional[dict] = None,
    guard: Optional[ChainGuard] = None,
    scale_unary: bool = True,
    gold: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `viterbi_torch`; float32 or float64 potentials (promoted to one dtype).

    ``kernel``: one of `KERNELS` (``"auto"``: `choose_kernel`); ``num_warps``: override the kernel's warps per
    program; ``programs``: the number of programs of the grid kernels (default: one per SM, at most one per work
    item; under the interpreter the persistent ``"grid"`` takes one); ``tiles``: override `grid_tiles`' choice
    (keys ``BB``, ``BI``, ``BJ``, ``BK``, ``STAGES``).

    The overflow guard on a device (`guard_triton`): with ``guard`` (`chain_guard_partials` of these potentials, or
    of the ones the caller scaled them from) every kernel finds the guard's ``s`` itself, reads the potentials times
    ``2**-s`` (exact: a power of two; the unary as given with ``scale_unary=False``, where the caller scaled it
    already) and returns the scores times ``2**s``: +-inf where one does not fit the dtype, the labelling exact.
    ``gold`` ``(B,)``: the second output is then the margin-rescaled hinge ``max(score - gold, 0)`` per sequence
    (NaN where ``gold`` is NaN) instead of the best score (`Chain`'s fused hinge). Neither reads anything on the
    host; without them the kernels are those of before."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    unary, transition, start, end = promote_chain_potentials(unary, transition, start, end)
    B, T, K = unary.shape
    unary = unary.contiguous()
    transition = transition.contiguous()
    lengths = lengths.long().contiguous()
    per_position = transition.dim() == 4
    trans_sb = (T - 1) * K * K if per_position else 0
    trans_st = K * K if per_position else 0
    dev = unary.device
    score = torch.empty(B, dtype=unary.dtype, device=dev)
    if kernel == "auto":
        kernel = choose_kernel(B, T, K, dev)
    if B == 0:
        return torch.empty((0, T), dtype=torch.long, device=dev), score
    start_arg = start.contiguous() if start is not None else unary
    end_arg = end.contiguous() if end is not None else unary
    flags = dict(HAS_START=start is not None, HAS_END=end is not None, PER_POSITION=per_position)
    if guard is not None:
        flags.update(GUARD=True, SCALE_UNARY=bool(scale_unary), BLOCK_P=guard.block())
    if gold is not None:
        flags["HINGE"] = True
    extra = (unary if guard is None else guard.parts, unary if gold is None else gold)
    n_parts = 0 if guard is None else guard.programs
    limit = 0.0 if guard is None else guard.limit(unary.dtype)

    if kernel == "legacy":
        labels = torch.full((B, T), -1, dtype=torch.long, device=dev)
        backpointers = torch.empty((B, T, K), dtype=torch.int32, device=dev)
        single = K <= _SINGLE_TILE_MAX_K
        block = triton.next_power_of_2(K) if single else _TILE
        scratch = unary.new_empty(1 if single else B * 2 * K)
        _viterbi_kernel[(B,)](
            unary, transition, start_arg, end_arg, lengths, backpointers, scratch, labels, score, *extra,
            T, K, trans_sb, trans_st, n_parts, limit, SINGLE=single, BLOCK=block,
            num_warps=num_warps or (4 if single else 8), **flags,
        )
        return labels, score

    labels = torch.empty((B, T), dtype=torch.long, device=dev)
    block_t = min(1024, triton.next_power_of_2(T))
    if kernel == "sequence":
        if K > 128:
            raise ValueError(f"kernel='sequence' holds a K x K tile in registers: K <= 128, got {K}")
        hist = torch.empty((B, T, K), dtype=unary.dtype, device=dev)
        block = triton.next_power_of_2(K)
        # one warp holds a float32 tile of up to 64 x 64 (128 entries a thread) without spilling and needs no
        # barrier between warps in a step; float64 and per-position tiles (a second tile in flight) take more
        single = unary.element_size() <= 4 and not per_position
        nw = num_warps or (1 if block <= (64 if single else 16) else 2 if block <= 32 else 8 if block <= 64 else 16)
        _viterbi_seq_kernel[(B,)](
            unary, transition, start_arg, end_arg, lengths, hist, labels, score, *extra,
            T, K, trans_sb, trans_st, n_parts, limit, BLOCK=block, BLOCK_T=block_t, num_warps=nw, **flags,
        )
        return labels, score

    if K > GRID_MAX_K:
        raise ValueError(f"kernel={kernel!r} reads a whole row of labels per program: K <= {GRID_MAX_K}, got {K}")
    sms = _sm_count(dev)
    nw = num_warps or 8
    tiles = dict(grid_tiles(B, K, sms, unary.element_size(), nw), **(tiles or {}))
    n_items = triton.cdiv(B, tiles["BB"]) * triton.cdiv(K, tiles["BJ"])
    KP = triton.cdiv(K, 128 // unary.element_size()) * (128 // unary.element_size())  # whole 128-byte lines
    hist = torch.empty((B, T, KP), dtype=unary.dtype, device=dev)
    sync = torch.zeros(1, dtype=torch.int32, device=dev)
    args = (unary, transition, start_arg, end_arg, lengths, hist, labels, score, sync, *extra, B, T, K, KP, trans_sb,
            trans_st)
    tiles["BLOCK_T"] = block_t
    if kernel == "grid":
        if programs is None:
            programs = 1 if _interpreting() else min(sms, max(n_items, B))
        if _interpreting() and programs != 1:
            raise ValueError("the persistent kernel meets at a grid barrier: one program under the interpreter")
        coop = {"launch_cooperative_grid": True} if dev.type == "cuda" else {}
        _viterbi_grid_kernel[(programs,)](*args, 1, T, n_parts, limit, STEPS=True, BACKTRACK=True, SYNC=True,
                                          num_warps=nw, **tiles, **flags, **coop)
        return labels, score
    # "grid-steps": one launch per step, then the backtrack
    if programs is None:
        programs = n_items
    for t in range(1, T):
        _viterbi_grid_kernel[(programs,)](*args, t, t + 1, n_parts, limit, STEPS=True, BACKTRACK=False, SYNC=False,
                                          num_warps=nw, **tiles, **flags)
    _viterbi_grid_kernel[(min(programs, B),)](*args, 1, 1, n_parts, limit, STEPS=False, BACKTRACK=True, SYNC=False,
                                              num_warps=nw, **tiles, **flags)
    return labels, score
