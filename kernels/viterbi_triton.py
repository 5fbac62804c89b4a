"""Batched Viterbi as a Triton kernel: one program per sequence, labels tiled for large K.

Twin of `viterbi_torch` (same arithmetic, same tie-breaking: smallest label index wins, so the two
agree bitwise). For ``K <= 64`` the whole ``K x K`` transition tile and the forward scores live in
registers; above that the forward scores go through a small global scratch buffer and the max-plus
product is tiled ``BLOCK x BLOCK`` with a running (max, argmax) per output label, which supports any K
(tested up to 1024).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .viterbi_torch import promote_chain_potentials

_SINGLE_TILE_MAX_K = 64
_TILE = 64


@triton.jit
def _viterbi_kernel(
    unary_ptr, trans_ptr, start_ptr, end_ptr, len_ptr,
    bp_ptr, alpha_ptr, out_ptr, score_ptr,
    T, K, trans_sb, trans_st,
    HAS_START: tl.constexpr, HAS_END: tl.constexpr, PER_POSITION: tl.constexpr,
    SINGLE: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
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
        alpha = tl.load(u_base + offs_i, mask=mi, other=NEG)
        if HAS_START:
            alpha = alpha + tl.load(start_ptr + offs_i, mask=mi, other=0.0)
        if not PER_POSITION:  # per-position tiles are loaded inside the loop (none exist when T == 1)
            tr = tl.load(tr_base + offs_i[:, None] * K + offs_j[None, :], mask=tmask, other=NEG)
        for t in range(1, L):
            if PER_POSITION:
                tr = tl.load(tr_base + (t - 1) * trans_st + offs_i[:, None] * K + offs_j[None, :],
                             mask=tmask, other=NEG)
            s = alpha[:, None] + tr
            best = tl.max(s, axis=0)
            arg = tl.argmax(s, axis=0)
            u = tl.load(u_base + t * K + offs_j, mask=mj, other=NEG)
            tl.store(bp_base + t * K + offs_j, arg.to(tl.int32), mask=mj)
            alpha = best + u
        if HAS_END:
            alpha = alpha + tl.load(end_ptr + offs_j, mask=mj, other=0.0)
        score = tl.max(alpha, axis=0)
        y = tl.argmax(alpha, axis=0).to(tl.int32)
    else:
        a_base = alpha_ptr + b * 2 * K
        for j0 in range(0, K, BLOCK):
            offs = j0 + tl.arange(0, BLOCK)
            m = offs < K
            a0 = tl.load(u_base + offs, mask=m, other=NEG)
            if HAS_START:
                a0 = a0 + tl.load(start_ptr + offs, mask=m, other=0.0)
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
                    tr = tl.load(tr_t + offs_i[:, None] * K + offs_j[None, :],
                                 mask=mi[:, None] & mj[None, :], other=NEG)
                    s = a[:, None] + tr
                    tile_best = tl.max(s, axis=0)
                    tile_arg = tl.argmax(s, axis=0).to(tl.int32) + i0
                    upd = tile_best > best  # strict: an earlier tile keeps ties
                    best = tl.where(upd, tile_best, best)
                    arg = tl.where(upd, tile_arg, arg)
                u = tl.load(u_base + t * K + offs_j, mask=mj, other=NEG)
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
                v = v + tl.load(end_ptr + offs, mask=m, other=0.0)
            upd = v > bestv
            bestv = tl.where(upd, v, bestv)
            argv = tl.where(upd, offs.to(tl.int32), argv)
        score = tl.max(bestv, axis=0)
        y = tl.min(tl.where(bestv == score, argv, K), axis=0).to(tl.int32)

    tl.store(score_ptr + b, score)
    tl.debug_barrier()
    for s in range(0, L):
        t = L - 1 - s
        tl.store(out_ptr + b * T + t, y.to(tl.int64))
        prev = tl.load(bp_base + t * K + y, mask=t > 0, other=0)
        y = tl.where(t > 0, prev, y)


def viterbi_triton(
    unary: torch.Tensor,
    transition: torch.Tensor,
    start: Optional[torch.Tensor],
    end: Optional[torch.Tensor],
    lengths: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `viterbi_torch`; float32 or float64 potentials (promoted to one dtype)."""
    unary, transition, start, end = promote_chain_potentials(unary, transition, start, end)
    B, T, K = unary.shape
    unary = unary.contiguous()
    transition = transition.contiguous()
    per_position = transition.dim() == 4
    trans_sb = (T - 1) * K * K if per_position else 0
    trans_st = K * K if per_position else 0
    labels = torch.full((B, T), -1, dtype=torch.long, device=unary.device)
    score = torch.empty(B, dtype=unary.dtype, device=unary.device)
    if B == 0:
        return labels, score
    backpointers = torch.empty((B, T, K), dtype=torch.int32, device=unary.device)
    single = K <= _SINGLE_TILE_MAX_K
    block = triton.next_power_of_2(K) if single else _TILE
    scratch = unary.new_empty(1 if single else B * 2 * K)
    _viterbi_kernel[(B,)](
        unary, transition,
        start.contiguous() if start is not None else unary,
        end.contiguous() if end is not None else unary,
        lengths.long().contiguous(), backpointers, scratch, labels, score,
        T, K, trans_sb, trans_st,
        HAS_START=start is not None, HAS_END=end is not None, PER_POSITION=per_position,
        SINGLE=single, BLOCK=block,
        num_warps=4 if single else 8,
    )
    return labels, score
