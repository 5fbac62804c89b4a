"""The exact block minimization of GDMM's factor duals: a small quadratic over the shifted simplex, batched.

For each row b (one factor, its active set ``mask[b]`` of ``m`` slots, the truth at slot ``top[b]``)

    min_d  f(d) = g^T d + 1/2 d^T H d    s.t.  val + d  in  {a : a_top <= C, a_j <= 0 (j != top), sum a = 0}

over the masked slots (Yen et al., 2016, eq. 11; ``d = 0`` off the mask). ``f`` is the augmented Lagrangian (eq. 12)
along the factor's own dual, which is exactly quadratic: ``g`` is its gradient at ``val`` and ``H`` its block
Hessian. For a unigram factor ``H`` is a multiple of the identity and one projected step is exact; for a
chain bigram factor ``H = I + rho (R^T R + K^T K)`` (``R``, ``K``: which active pairs share a row, a column)
and for a pairwise multi-label factor ``H = e_11 e_11^T + 2 rho (M_1^T M_1 + M_2^T M_2)``, which are not,
so "fully corrective on the active set" (Yen et al., 2016) needs this solver.

With ``u = cap - (val + d)`` (``cap``: C at the truth, 0 elsewhere) the set is the simplex
``{u >= 0, sum u = C}``, and the solver is the primal active-set method of `simplex_qp` (Nocedal & Wright,
Alg. 16.3) run on all rows at once: on the face ``F`` (the slots with ``u > 0``) the KKT system

    [H_FF  1] [ u_F]   [c_F]
    [1^T   0] [-nu ] = [ C ],      c = g + H u_0,

gives the face minimizer; the step towards it stops at the first ``u_j`` reaching 0 (``j`` leaves ``F``);
at the face minimizer the slot with the most negative multiplier ``grad_j - nu`` enters, and a row is done
when none does. Every step lowers ``f``; the method ends after finitely many face changes (``H`` is
positive definite on ``{sum d = 0}`` restricted to every face, true of both Hessians above). The
Frank-Wolfe gap ``<grad_u, u> - C min_j grad_u(j)`` bounds ``f - f*`` and is returned as the certificate.
"""

from __future__ import annotations

from typing import Optional

import torch


def block_hessian_chain(idx: torch.Tensor, K: int, rho: float) -> torch.Tensor:
    """``H (B, m, m) = I + rho ([row_a == row_b] + [col_a == col_b])`` over the valid pairs ``idx = k1 K + k2``
    (``-1``: free slot; its row and column are zero but the diagonal, which is 1)."""
    ok = idx >= 0
    i = idx.clamp_min(0)
    k1, k2 = i // K, i % K
    both = ok.unsqueeze(2) & ok.unsqueeze(1)
    share = (k1.unsqueeze(2) == k1.unsqueeze(1)).to(torch.float64) + (k2.unsqueeze(2) == k2.unsqueeze(1)).to(
        torch.float64)
    H = rho * share * both
    H.diagonal(dim1=1, dim2=2).add_(1.0)
    return H


def shifted_simplex_qp(val: torch.Tensor, grad: torch.Tensor, H: torch.Tensor, mask: torch.Tensor,
                       top: torch.Tensor, C: float, *, max_iter: Optional[int] = None):
    """The exact minimizer of ``g^T d + 1/2 d^T H d`` over the shifted simplex on each row's active set.

    Args:
        val: ``(B, m)`` float64, feasible (``val[top] in [0, C]``, the other masked entries ``<= 0``, masked
            sum 0, zero off the mask).
        grad: ``(B, m)``, the gradient at ``val``; H: ``(B, m, m)`` or ``(m, m)``, symmetric, positive definite
            on ``{sum d = 0}`` over every face of the mask.
        mask: ``(B, m)`` bool, the active slots; top: ``(B,)`` long, the truth's slot (masked in). Rows with no
            masked slot are left alone (``d = 0``).
        C: the cap of the truth (the SSVM's C).
        max_iter: face changes per row (default ``4 m + 10``); the iterate stays feasible and ``f`` never rises
            if it runs out.

    Returns ``(d (B, m), info)`` with ``info = {"iterations": (B,) long, "fw_gap": (B,) float64}``.
    """
    B, m = val.shape
    dev, f64 = val.device, torch.float64
    if H.dim() == 2:
        H = H.expand(B, m, m)
    if B == 0:
        return torch.zeros_like(val), {"iterations": torch.zeros(0, dtype=torch.long, device=dev),
                                       "fw_gap": torch.zeros(0, dtype=f64, device=dev)}
    rows = torch.arange(B, device=dev)
    cap = torch.zeros(B, m, dtype=f64, device=dev)
    cap[rows, top] = C
    u0 = (cap - val) * mask
    c = grad + (H @ u0.unsqueeze(2)).squeeze(2)
    u = u0.clone()
    free = mask & (u > 0)
    done = ~mask.any(1)
    scale = 1.0 + H.abs().amax((1, 2)) * C + c.abs().masked_fill(~mask, 0).amax(1)
    tiny = 1e-14 * scale
    iters = torch.zeros(B, dtype=torch.long, device=dev)
    max_iter = 4 * m + 10 if max_iter is None else max_iter
    eye = torch.eye(m + 1, dtype=f64, device=dev)
    for _ in range(max_iter):
        if bool(done.all()):
            break
        act = ~done
        ff = free.to(f64)
        A = torch.zeros(B, m + 1, m + 1, dtype=f64, device=dev)
        A[:, :m, :m] = H * (ff.unsqueeze(2) * ff.unsqueeze(1))
        A[:, :m, :m].diagonal(dim1=1, dim2=2).add_(1.0 - ff)
        A[:, :m, m] = ff
        A[:, m, :m] = ff
        A[done] = eye
        rhs = torch.cat([c * ff, torch.full((B, 1), C, dtype=f64, device=dev)], 1)
        target = torch.linalg.solve(A, rhs)[:, :m] * ff
        p = (target - u) * act.unsqueeze(1)
        dec = free & (p < 0)
        ratio = torch.where(dec, u / (-p).clamp_min(1e-300), torch.full_like(u, float("inf")))
        s_max = ratio.amin(1)
        blocked = act & (s_max < 1.0)
        s = torch.where(blocked, s_max, torch.ones_like(s_max))
        u = torch.where(act.unsqueeze(1), u + s.unsqueeze(1) * p, u).clamp_min(0.0)
        leave = blocked.unsqueeze(1) & dec & (ratio <= s_max.unsqueeze(1) * (1 + 1e-12))
        u = u.masked_fill(leave, 0.0)
        free = free & ~leave
        iters += act.long()
        # rows at their face minimizer: the slot with the most negative multiplier enters, or the row is done
        full = act & ~blocked
        g_u = (H @ u.unsqueeze(2)).squeeze(2) - c
        nu = torch.where(free, g_u, torch.zeros_like(g_u)).sum(1) / free.sum(1).clamp_min(1)
        cand = torch.where(mask & ~free, g_u, torch.full_like(g_u, float("inf")))
        g_in, j_in = cand.min(1)
        enter = full & (g_in < nu - tiny)
        free[rows[enter], j_in[enter]] = True
        done = done | (full & ~enter)
    g_u = (H @ u.unsqueeze(2)).squeeze(2) - c
    g_min = torch.where(mask, g_u, torch.full_like(g_u, float("inf"))).amin(1)
    fw_gap = torch.where(mask.any(1), (g_u * u * mask).sum(1) - C * g_min, torch.zeros_like(g_min))
    d = (u0 - u) * mask
    return d, {"iterations": iters, "fw_gap": fw_gap}
