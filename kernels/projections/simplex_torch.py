"""Euclidean projection onto a product of simplices, batched, in plain torch (sort-based).

Row b of ``v (B, M)`` is projected onto ``{x >= 0, sum_j x_j = radius_b}`` over its valid entries
(``mask``), invalid entries get 0: the feasible set of the dual of an n-slack SSVM over working sets
(one simplex per example). The classical rule (Held, Wolfe & Crowder, 1974; Duchi et al., 2008): sort the
valid entries decreasingly, ``rho = max{j : u_j > (sum_{k <= j} u_k - r) / j}``, ``tau = (sum_{k <= rho} u_k - r)
/ rho``, ``x = max(v - tau, 0)``, computed on ``v - max_j v_j`` (so that a radius far below ``max |v|`` is
not lost to rounding). ``O(M log M)`` per row, every row at once.
"""

from __future__ import annotations

from typing import Optional

import torch


def simplex_threshold_torch(v: torch.Tensor, mask: Optional[torch.Tensor], radius: torch.Tensor) -> torch.Tensor:
    """``tau (B,)`` with ``sum_j max(v_j - tau, 0) = radius`` over each row's valid entries."""
    vv = v if mask is None else v.masked_fill(~mask, -torch.inf)
    u, _ = torch.sort(vv, dim=1, descending=True)
    valid = torch.isfinite(u)
    css = torch.cumsum(torch.where(valid, u, torch.zeros_like(u)), 1)
    j = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)
    cond = valid & (u * j > css - radius.unsqueeze(1))
    rho = (cond * torch.arange(1, v.shape[1] + 1, device=v.device)).amax(1)  # the last j that holds (>= 1)
    return (css.gather(1, (rho - 1).clamp_min(0).unsqueeze(1)).squeeze(1) - radius) / rho.to(v.dtype)


def project_simplex_torch(v: torch.Tensor, mask: Optional[torch.Tensor] = None,
                          radius: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Args:
        v: ``(B, M)`` float.
        mask: ``(B, M)`` bool of valid entries (every row needs one), or None (all valid).
        radius: ``(B,)`` > 0, or None (1).

    Returns ``x (B, M)``: the projection of each row onto its simplex, 0 on invalid entries."""
    if radius is None:
        radius = torch.ones(v.shape[0], dtype=v.dtype, device=v.device)
    # Relative to the row's largest valid entry, so that a radius below the float spacing of max(v) keeps its
    # meaning (otherwise sum_{k<=1} u_k - r rounds to u_1 and no j qualifies)
    top = (v if mask is None else v.masked_fill(~mask, -torch.inf)).amax(1, keepdim=True)
    shifted = v - top
    tau = simplex_threshold_torch(shifted, mask, radius.to(v.dtype))
    x = (shifted - tau.unsqueeze(1)).clamp_min(0)
    return x if mask is None else x.masked_fill(~mask, 0.0)
