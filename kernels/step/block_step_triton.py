"""The end of a mini-batch BCFW step as a Triton kernel: one program per block moves ``z`` and ``l`` and updates
the block's atom weights. Twin of `apply_block_step_torch` (rules there), bitwise: the same arithmetic in the
same order, compiled without fused multiply-adds (``enable_fp_fusion=False``), as torch's separate kernels
compute it. As torch ops the update is about twenty small kernels (the products, the scatters of the weights'
update, the writes back); here one launch.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .block_step_torch import STEP_TYPES


@triton.jit
def _block_step_kernel(z_ptr, ell_ptr, idx_ptr, zi_ptr, ell_i_ptr, gamma_ptr, dir_ptr, d_ell_ptr,
                       alpha_ptr, valid_ptr, s_slot_ptr, away_ptr, upper_ptr, kind_ptr,
                       M, C,
                       STEP: tl.constexpr, HAS_ALPHA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.load(idx_ptr + b).to(tl.int64)
    g = tl.load(gamma_ptr + b)
    cols = tl.arange(0, BLOCK_M)
    for off in range(0, M, BLOCK_M):
        m = off + cols
        mm = m < M
        zi = tl.load(zi_ptr + b * M + m, mask=mm, other=0.0)
        d = tl.load(dir_ptr + b * M + m, mask=mm, other=0.0)
        tl.store(z_ptr + i * M + m, zi + g * d, mask=mm)
    tl.store(ell_ptr + i, tl.load(ell_i_ptr + b) + g * tl.load(d_ell_ptr + b))
    if HAS_ALPHA:
        j = tl.arange(0, BLOCK_C)
        jm = j < C
        row = alpha_ptr + i * C
        a = tl.load(row + j, mask=jm, other=0.0)
        s = tl.load(s_slot_ptr + b)
        if STEP == 0:  # FW
            gc = tl.minimum(g, 1.0)
            out = (1.0 - gc) * a
            out = tl.where(j == s, out + gc, out)
        elif STEP == 1:  # pairwise
            out = tl.where(j == s, a + g, a)
        else:  # away steps: per block FW (kind 0) or away (kind 2)
            fw = tl.load(kind_ptr + b) == 0
            gc = tl.minimum(g, 1.0)
            scale = tl.where(fw, 1.0 - gc, 1.0 + g)
            add = tl.where(fw, gc, 0.0)
            out = scale * a
            out = tl.where(j == s, out + add, out)
        if STEP != 0:
            aw = tl.load(away_ptr + b)
            # the away atom's entry of `out`, recomputed from its old weight with the same operations
            a_aw = tl.load(row + aw)
            if STEP == 1:
                at_away = tl.where(aw == s, a_aw + g, a_aw)
            else:
                at_away = scale * a_aw
                at_away = tl.where(aw == s, at_away + add, at_away)
            moved = tl.where(g >= tl.load(upper_ptr + b), 0.0, at_away - g)
            if STEP == 2:
                moved = tl.where(fw, at_away, moved)
            out = tl.where(j == aw, moved, out)
        change = (g != 0) & (tl.load(valid_ptr + i) != 0)
        new = tl.where(change, tl.maximum(out, 0.0), a)
        tl.store(row + j, new, mask=jm)


def apply_block_step_triton(z: torch.Tensor, ell: torch.Tensor, idx: torch.Tensor, zi: torch.Tensor,
                            ell_i: torch.Tensor, gamma: torch.Tensor, direction: torch.Tensor, d_ell: torch.Tensor,
                            alpha: Optional[torch.Tensor] = None, alpha_valid: Optional[torch.Tensor] = None,
                            step: str = "fw", s_slot: Optional[torch.Tensor] = None,
                            away: Optional[torch.Tensor] = None, upper: Optional[torch.Tensor] = None,
                            kind: Optional[torch.Tensor] = None) -> None:
    """`apply_block_step_torch` (same arguments, in place); ``z``, ``ell`` and ``alpha`` must be contiguous
    float64."""
    B, M = direction.shape
    for name, t in (("z", z), ("ell", ell), ("alpha", alpha)):
        if t is not None and not (t.is_contiguous() and t.dtype == torch.float64):
            raise ValueError(f"{name} must be contiguous float64 (the kernel writes it in place)")
    if not B:
        return
    f64 = torch.float64
    gamma = gamma.to(f64).contiguous()
    has_alpha = alpha is not None
    C = alpha.shape[1] if has_alpha else 1
    dummy = gamma
    _block_step_kernel[(B,)](
        z, ell, idx.contiguous(), zi.to(f64).contiguous(), ell_i.to(f64).contiguous(), gamma,
        direction.to(f64).contiguous(), d_ell.to(f64).contiguous(),
        alpha if has_alpha else dummy, alpha_valid.contiguous() if has_alpha else dummy,
        s_slot.contiguous() if has_alpha else dummy,
        away.contiguous() if away is not None else dummy,
        upper.to(f64).contiguous() if upper is not None else dummy,
        kind.contiguous() if kind is not None else dummy,
        M, C, STEP=STEP_TYPES.index(step), HAS_ALPHA=has_alpha,
        BLOCK_M=min(1024, triton.next_power_of_2(max(M, 1))), BLOCK_C=triton.next_power_of_2(C),
        num_warps=4, enable_fp_fusion=False)
