"""The BCFW step's choice of atoms (the cache test and the away atom) as a Triton kernel: one program per block.

Twin of `select_atoms_torch` (same arithmetic in the same order, same first-index tie-breaking: the two agree
bitwise). As torch ops the choice is about 35 small kernels (masked argmax and argmin, the test, the selections,
the gap refresh), here one launch.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from torchssvm._device import host_to_device

from ..chain.chain_score_triton import label_warps


@triton.jit
def _select_atoms_kernel(aH_ptr, count_ptr, a_labels_ptr, a_loss_ptr, a_alpha_ptr, idx_ptr, base_ptr, ell_ptr,
                         gaps_ptr, labels_ptr, loss_ptr, H_ptr, misses_ptr,
                         s_labels_ptr, s_loss_ptr, s_H_ptr, away_ptr, away_H_ptr, alpha_a_ptr, labels_a_ptr,
                         loss_a_ptr,
                         params_ptr, C, W, n,
                         CACHE: tl.constexpr, AWAY: tl.constexpr, BLOCK_W: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.load(idx_ptr + b).to(tl.int64)
    c = tl.load(count_ptr + i)
    w = tl.arange(0, BLOCK_W)
    wm = w < W
    base = tl.load(base_ptr + b)
    ell = tl.load(ell_ptr + b)
    H = tl.maximum(tl.load(H_ptr + b), 0.0)
    fresh = (base + H) / n - ell
    s_row = tl.load(labels_ptr + b * W + w, mask=wm, other=-1)
    if CACHE:
        best = c * 0  # the first highest-scoring cached atom (slot 0, the truth, is always cached)
        best_H = tl.load(aH_ptr + b * C)
        for j in range(1, C):
            h = tl.load(aH_ptr + b * C + j)
            take = (c > j) & (h > best_H)
            best = tl.where(take, j, best)
            best_H = tl.where(take, h, best_H)
        g_hat = (base + best_H) / n - ell
        gap = tl.load(gaps_ptr + i)
        # factor, floor: float64; a block never visited (gap inf) misses, also where factor * inf is NaN
        hit = (g_hat >= tl.maximum(tl.load(params_ptr) * gap, tl.load(params_ptr + 1))) & (gap < float("inf"))
        cached_row = tl.load(a_labels_ptr + (b * C + best) * W + w, mask=wm, other=-1)
        s_row = tl.where(w * 0 + hit.to(tl.int32) > 0, cached_row, s_row)  # vector mask (see atoms_insert_triton)
        tl.store(s_loss_ptr + b, tl.where(hit, tl.load(a_loss_ptr + b * C + best), tl.load(loss_ptr + b)))
        tl.store(s_H_ptr + b, tl.where(hit, best_H, H))
        tl.store(gaps_ptr + i, tl.where(hit, gap, fresh))
        tl.atomic_add(misses_ptr, 1 - hit.to(tl.int64), sem="relaxed")
    else:
        tl.store(s_loss_ptr + b, tl.load(loss_ptr + b))
        tl.store(s_H_ptr + b, H)
        tl.store(gaps_ptr + i, fresh)
    tl.store(s_labels_ptr + b * W + w, s_row, mask=wm)
    if AWAY:
        away = c * 0  # the first lowest-scoring active atom (slot 0 with +inf if none is active)
        away_H = tl.load(aH_ptr + b * C) * 0.0 + float("inf")
        for j in range(0, C):
            h = tl.load(aH_ptr + b * C + j)
            take = (c > j) & (tl.load(a_alpha_ptr + b * C + j) > 0) & (h < away_H)
            away = tl.where(take, j, away)
            away_H = tl.where(take, h, away_H)
        tl.store(away_ptr + b, away)
        tl.store(away_H_ptr + b, away_H)
        tl.store(alpha_a_ptr + b, tl.load(a_alpha_ptr + b * C + away))
        tl.store(loss_a_ptr + b, tl.load(a_loss_ptr + b * C + away))
        tl.store(labels_a_ptr + b * W + w, tl.load(a_labels_ptr + (b * C + away) * W + w, mask=wm), mask=wm)


def select_atoms_triton(a_H: torch.Tensor, count: torch.Tensor, a_labels: torch.Tensor, a_loss: torch.Tensor,
                        a_alpha: torch.Tensor, idx: torch.Tensor, base: torch.Tensor, ell: torch.Tensor,
                        gaps: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor, H: torch.Tensor, n: int,
                        factor: Optional[float], floor: float, misses: Optional[torch.Tensor], away: bool,
                        params: Optional[torch.Tensor] = None):
    """`select_atoms_torch`: same arguments and returns. ``params``: ``[factor or 0, floor]`` as a float64 tensor on
    the device, if the caller keeps one (a CUDA graph cannot replay the copy of them from the host)."""
    B, C, W = a_labels.shape
    if not gaps.is_contiguous():
        raise ValueError("gaps must be contiguous (the kernel writes it in place)")
    dev, f64 = a_H.device, torch.float64
    s_labels = torch.empty(B, W, dtype=a_labels.dtype, device=dev)
    s_loss, s_H = torch.empty(B, dtype=f64, device=dev), torch.empty(B, dtype=f64, device=dev)
    outs = (torch.empty(B, dtype=torch.long, device=dev), torch.empty(B, dtype=f64, device=dev),
            torch.empty(B, dtype=f64, device=dev), torch.empty(B, W, dtype=a_labels.dtype, device=dev),
            torch.empty(B, dtype=f64, device=dev))
    if B:
        # a Python float reaches a kernel as float32: the test's constants travel as a float64 tensor (queued)
        if params is None:
            params = host_to_device(torch.tensor([0.0 if factor is None else factor, floor], dtype=f64), dev)
        block = triton.next_power_of_2(W)
        a_H, a_labels, a_loss, a_alpha = (t.contiguous() for t in (a_H, a_labels, a_loss, a_alpha))
        _select_atoms_kernel[(B,)](
            a_H, count, a_labels, a_loss, a_alpha, idx.contiguous(), base.contiguous(), ell.contiguous(), gaps,
            labels.to(a_labels.dtype).contiguous(), loss.to(f64).contiguous(), H.to(f64).contiguous(),
            misses if misses is not None else s_loss, s_labels, s_loss, s_H, *outs, params, C, W, n,
            CACHE=factor is not None, AWAY=bool(away), BLOCK_W=block, num_warps=label_warps(block))
    return s_labels, s_loss, s_H, (outs if away else None)
