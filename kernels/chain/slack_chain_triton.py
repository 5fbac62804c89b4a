"""Exact slack-rescaled chain oracle as a Triton kernel: one program per sequence.

Twin of `slack_viterbi_torch` (same recursion over the state (position, label, errors so far), same
arithmetic and tie rules, so the two agree bitwise). The forward scores of step t live in a
``BLOCK_E x BLOCK_K`` register tile (error counts x labels); the max-plus product runs over the previous
label i, and the entry read for output ``(e, j)`` is ``alpha[e, i]`` when ``j`` is the true label at t
(no new error) and ``alpha[e - 1, i]`` otherwise. That shifted read goes through a two-row global
scratch buffer per sequence, so the tile itself is never indexed. Backpointers ``(T, E, K)`` int32 feed
the scalar backtrack at the end, as in `viterbi_triton`.

Cost per sequence: ``T`` steps of ``K`` rank-one updates on an ``(T + 1) x K`` tile, i.e. ``O(T^2 K^2)``
work in ``T`` sequential steps, the DP's cost (Viterbi: ``O(T K^2)``). The tile holds every error count;
at step t only counts ``<= t + 1`` are reachable, and the unreachable ones stay ``-inf``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl


@triton.jit
def _slack_viterbi_kernel(
    unary_ptr, trans_ptr, start_ptr, end_ptr, len_ptr, target_ptr, cost_ptr, tscore_ptr, margin_ptr,
    bp_ptr, alpha_ptr, out_ptr, value_ptr,
    T, K, E, trans_sb, trans_st,
    HAS_START: tl.constexpr, HAS_END: tl.constexpr, PER_POSITION: tl.constexpr, HAS_MARGIN: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    L = tl.load(len_ptr + b)
    u_base = unary_ptr + b * T * K
    tr_base = trans_ptr + b * trans_sb
    y_base = target_ptr + b * T
    bp_base = bp_ptr + b * T * E * K
    a_base = alpha_ptr + b * 2 * E * K
    NEG = float("-inf")
    offs_e = tl.arange(0, BLOCK_E)
    offs_k = tl.arange(0, BLOCK_K)
    me = offs_e < E
    mk = offs_k < K
    tile = me[:, None] & mk[None, :]
    ee = offs_e[:, None] + offs_k[None, :] * 0  # (BLOCK_E, BLOCK_K) error count of each entry
    jj = offs_k[None, :] + offs_e[:, None] * 0  # label of each entry

    # t = 0: the true label opens with 0 errors, any other with 1.
    a0 = tl.load(u_base + offs_k, mask=mk, other=NEG)
    if HAS_START:
        a0 = a0 + tl.load(start_ptr + offs_k, mask=mk, other=0.0)
    y0 = tl.load(y_base)
    hit0 = jj == y0
    alpha = tl.where((hit0 & (ee == 0)) | ((~hit0) & (ee == 1)), a0[None, :] + tl.zeros_like(ee).to(a0.dtype), NEG)
    tl.store(a_base + ee * K + jj, alpha, mask=tile)
    tl.debug_barrier()

    for t in range(1, L):
        src = a_base + ((t - 1) % 2) * E * K
        dst = a_base + (t % 2) * E * K
        yt = tl.load(y_base + t)
        e_src = ee - (jj != yt).to(ee.dtype)  # a wrong label at t comes from one error fewer
        ok = tile & (e_src >= 0)
        best = tl.full([BLOCK_E, BLOCK_K], NEG, dtype=unary_ptr.dtype.element_ty)
        arg = tl.zeros([BLOCK_E, BLOCK_K], dtype=tl.int32)
        tr_t = tr_base + (t - 1) * trans_st
        for i in range(0, K):
            a = tl.load(src + e_src * K + i, mask=ok, other=NEG)
            tr = tl.load(tr_t + i * K + offs_k, mask=mk, other=NEG)
            s = a + tr[None, :]
            upd = s > best  # strict: the smallest previous label keeps ties
            best = tl.where(upd, s, best)
            arg = tl.where(upd, i, arg)
        u = tl.load(u_base + t * K + offs_k, mask=mk, other=NEG)
        tl.store(dst + ee * K + jj, best + u[None, :], mask=tile)
        tl.store(bp_base + t * E * K + ee * K + jj, arg, mask=tile)
        tl.debug_barrier()

    fin = tl.load(a_base + ((L - 1) % 2) * E * K + ee * K + jj, mask=tile, other=NEG)
    if HAS_END:
        fin = fin + tl.load(end_ptr + offs_k, mask=mk, other=0.0)[None, :]
    S = tl.max(fin, axis=1)  # (BLOCK_E,) best score with e errors
    last = tl.min(tl.where(fin == S[:, None], jj, BLOCK_K), axis=1)  # its first best last label
    cost = tl.load(cost_ptr + b)
    ts = tl.load(tscore_ptr + b)
    errors = offs_e.to(fin.dtype)
    if HAS_MARGIN:  # the overflow guard's 2**-s: Phi of the potentials times 2**-s, at 2**-s of its size
        phi = cost * errors * (tl.load(margin_ptr) + S - ts)
    else:
        phi = cost * errors * (1 + S - ts)
    phi = tl.where(S > NEG, phi, NEG)
    phi = tl.where(offs_e == 0, 0.0, phi)  # e = 0 is the truth itself
    phi = tl.where(me, phi, NEG)
    value = tl.max(phi, axis=0)
    e = tl.min(tl.where(phi == value, offs_e, BLOCK_E), axis=0)  # the smallest error count
    y = tl.sum(tl.where(offs_e == e, last, 0), axis=0)
    tl.store(value_ptr + b, value)
    truth = e == 0  # nothing violates: the truth itself (walking back could leave it where every score is -inf)
    for s in range(0, L):
        t = L - 1 - s
        tl.store(out_ptr + b * T + t, tl.where(truth, tl.load(y_base + t), y).to(tl.int64))
        prev = tl.load(bp_base + t * E * K + e * K + y, mask=t > 0, other=0)
        wrong = (y != tl.load(y_base + t)).to(e.dtype)
        e = tl.where(t > 0, e - wrong, e)
        y = tl.where(t > 0, prev, y)


def slack_viterbi_triton(
    unary: torch.Tensor,
    transition: torch.Tensor,
    start: Optional[torch.Tensor],
    end: Optional[torch.Tensor],
    lengths: torch.Tensor,
    target: torch.Tensor,
    cost: torch.Tensor,
    target_score: torch.Tensor,
    margin=1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `slack_viterbi_torch`; float32 or float64 potentials. ``margin`` other than the number 1 (a
    number or a 0-dim tensor on the device) is read by the kernel (``HAS_MARGIN``)."""
    B, T, K = unary.shape
    E = T + 1
    dt, dev = unary.dtype, unary.device
    unary = unary.contiguous()
    transition = transition.to(dt).contiguous()
    per_position = transition.dim() == 4
    trans_sb = (T - 1) * K * K if per_position else 0
    trans_st = K * K if per_position else 0
    labels = torch.full((B, T), -1, dtype=torch.long, device=dev)
    value = torch.empty(B, dtype=dt, device=dev)
    if B == 0:
        return labels, value
    backpointers = torch.empty((B, T, E, K), dtype=torch.int32, device=dev)
    scratch = unary.new_empty(B * 2 * E * K)
    has_margin = isinstance(margin, torch.Tensor) or margin != 1
    block_e, block_k = triton.next_power_of_2(E), triton.next_power_of_2(K)
    _slack_viterbi_kernel[(B,)](
        unary, transition,
        start.to(dt).contiguous() if start is not None else unary,
        end.to(dt).contiguous() if end is not None else unary,
        lengths.long().contiguous(), target.clamp_min(0).long().contiguous(),
        cost.to(dt).contiguous(), target_score.to(dt).contiguous(),
        unary if not has_margin else margin.to(dt).reshape(1) if isinstance(margin, torch.Tensor)
        else torch.full((1,), margin, dtype=dt, device=dev),  # a fill on the device, not a copy from the host
        backpointers, scratch, labels, value,
        T, K, E, trans_sb, trans_st,
        HAS_START=start is not None, HAS_END=end is not None, PER_POSITION=per_position, HAS_MARGIN=has_margin,
        BLOCK_E=block_e, BLOCK_K=block_k,
        # At most 16 tile entries per thread: with 4 warps a 64 x 64 tile already spills (compile_check).
        num_warps=min(16, max(4, block_e * block_k // 512)),
    )
    return labels, value
