"""The small dense QP of every cutting-plane method: a quadratic over one simplex.

    min_x  f(x) = 1/2 x^T Q x - c^T x    s.t.  x >= 0,  sum_i x_i = r     (or <= r with ``inequality=True``)

with ``Q (t, t)`` positive semi-definite. It is the dual of the 1-slack working-set QP (seed 004, OP2,
with ``Q = G / lam``, ``G`` the Gram matrix of the cuts and ``c`` their offsets), of qp-bmrm (seed 003,
eq. 10) and of the kernel SSVM (``r = C``). ``t`` is the number of cuts: tens to a few hundred.

Solver: FISTA with gradient restarts (O'Donoghue & Candes) on the simplex projection kernel
(`torchssvm.kernels.project_simplex`), warm-started, step ``1 / lambda_max(Q)``. Cut Gram matrices are
often ill-conditioned (cuts nearly parallel late in a run), where first-order steps crawl; so every few
iterations the face the iterate lies on is tried exactly: the KKT system of the equality-constrained QP
on the support ``S``,

    [Q_SS  1] [x_S]   [c_S]
    [1^T   0] [-nu] = [ r ],

and its solution is kept when it is feasible and lowers ``f``. The stopping rule is the Frank-Wolfe gap
``<grad, x> - r min_i grad_i <= tol``, which bounds ``f(x) - f*`` (an exact certificate of the QP).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..kernels import project_simplex


def qp_value(Q: torch.Tensor, c: torch.Tensor, x: torch.Tensor) -> float:
    return float(0.5 * x @ (Q @ x) - c @ x)


def frank_wolfe_gap(Q: torch.Tensor, c: torch.Tensor, x: torch.Tensor, radius: float) -> float:
    """``<grad f(x), x> - r min_i grad_i`` (``min(0, ...)`` for the inequality form is handled by the
    caller through the slack coordinate)."""
    g = Q @ x - c
    return float(g @ x - radius * g.min())


def _polish(Q, c, x, radius):
    """The exact minimizer of ``f`` on the face ``{x_S >= 0, sum x_S = r}`` of the support of ``x``, when
    its KKT system has a feasible solution; else None."""
    S = (x > 0).nonzero().squeeze(1)
    k = S.numel()
    if k == 0:
        return None
    K = torch.zeros(k + 1, k + 1, dtype=Q.dtype, device=Q.device)
    K[:k, :k] = Q[S][:, S]
    K[:k, k] = 1.0
    K[k, :k] = 1.0
    rhs = torch.cat([c[S], c.new_tensor([radius])])
    try:
        sol = torch.linalg.solve(K, rhs)
    except RuntimeError:  # singular face (dependent cuts): least squares, then check
        sol = torch.linalg.lstsq(K, rhs.unsqueeze(1)).solution.squeeze(1)
    xs = sol[:k]
    if not bool(torch.isfinite(xs).all()) or bool((xs < 0).any()):
        return None
    out = torch.zeros_like(x)
    out[S] = xs
    out = out * (radius / float(out.sum()))
    return out


@torch.no_grad()
def simplex_qp(Q: torch.Tensor, c: torch.Tensor, radius: float = 1.0, x0: Optional[torch.Tensor] = None, *,
               inequality: bool = False, tol: float = 1e-10, max_iter: int = 5000, polish_every: int = 25,
               backend: str = "auto"):
    """Args:
        Q: ``(t, t)`` PSD float64. c: ``(t,)``. radius: ``r > 0``.
        x0: a warm start ``(t,)`` (projected onto the feasible set first), or None (all weight on the
            coordinate with the largest ``c``).
        inequality: ``sum x <= r`` (a zero-cost slack coordinate is added internally).
        tol: Frank-Wolfe gap at which to stop (absolute, in units of ``f``).
        max_iter: FISTA iterations; polish_every: iterations between exact face solves.
        backend: of the projection kernel.

    Returns ``(x (t,), info)`` with ``info = {"iterations", "fw_gap", "value"}``."""
    if Q.dim() != 2 or Q.shape[0] != Q.shape[1] or c.shape != (Q.shape[0],):
        raise ValueError(f"Q must be (t, t) and c (t,), got {tuple(Q.shape)} and {tuple(c.shape)}")
    if not (radius > 0 and math.isfinite(radius)):
        raise ValueError(f"radius must be a finite number > 0, got {radius}")
    t = Q.shape[0]
    Q, c = Q.to(torch.float64), c.to(torch.float64)
    if inequality:  # slack coordinate: x_{t} = r - sum x, zero cost
        Q = torch.nn.functional.pad(Q, (0, 1, 0, 1))
        c = torch.nn.functional.pad(c, (0, 1))
        if x0 is not None:
            x0 = torch.cat([x0.to(torch.float64), x0.new_tensor([max(radius - float(x0.sum()), 0.0)])])
    T = Q.shape[0]
    if x0 is None:
        x = torch.zeros(T, dtype=torch.float64, device=Q.device)
        x[int(c.argmax())] = radius
    else:
        x = project_simplex(x0.to(torch.float64).reshape(1, T), radius=Q.new_tensor([radius]),
                            backend=backend).squeeze(0)
    L = float(torch.linalg.eigvalsh(Q)[-1])
    it, fw = 0, frank_wolfe_gap(Q, c, x, radius)
    if L <= 0:  # linear objective: the best vertex
        x = torch.zeros_like(x)
        x[int(c.argmax())] = radius
        fw = frank_wolfe_gap(Q, c, x, radius)
    else:
        y, s = x.clone(), 1.0
        rad = Q.new_tensor([radius])
        while fw > tol and it < max_iter:
            it += 1
            g = Q @ y - c
            x_new = project_simplex((y - g / L).unsqueeze(0), radius=rad, backend=backend).squeeze(0)
            if float(g @ (x_new - x)) > 0:  # gradient restart
                s = 1.0
            s_next = 0.5 * (1 + math.sqrt(1 + 4 * s * s))
            y = x_new + ((s - 1) / s_next) * (x_new - x)
            x, s = x_new, s_next
            if it % polish_every == 0 or it == 1:
                p = _polish(Q, c, x, radius)
                if p is not None and qp_value(Q, c, p) <= qp_value(Q, c, x):
                    x, y, s = p, p.clone(), 1.0
                fw = frank_wolfe_gap(Q, c, x, radius)
    value = qp_value(Q, c, x)
    info = {"iterations": it, "fw_gap": fw, "value": value}
    return (x[:t] if inequality else x), info
