"""The small dense QP of every cutting-plane method: a quadratic over one simplex.

    min_x  f(x) = 1/2 x^T Q x - c^T x    s.t.  x >= 0,  sum_i x_i = r     (or <= r with ``inequality=True``)

with ``Q (t, t)`` positive semi-definite. It is the dual of the 1-slack working-set QP (Yu & Joachims, 2008, OP2,
with ``Q = G / lam``, ``G`` the Gram matrix of the cuts and ``c`` their offsets), of qp-bmrm (Zhang et al., 2010,
eq. 10) and of the kernel SSVM (``r = C``). ``t`` is the number of cuts: tens to a few hundred.

Solvers (``method``):

- ``"active_set"`` (default): a primal active-set method on the support ``S`` (Nocedal & Wright, Alg.
  16.3, specialised to the simplex). Each iteration solves the KKT system of the equality-constrained QP
  on ``S``,

      [Q_SS  1] [x_S]   [c_S]
      [1^T   0] [-nu] = [ r ],

  and moves towards its solution with an exact line search, stopping at the first coordinate that hits 0
  (which leaves ``S``); at a stationary face the coordinate with the most negative multiplier
  ``grad_j - nu`` enters. Cut Gram matrices are small (``t`` up to a few hundred), ill-conditioned
  (``Q = G / lam`` with tiny ``lam``, nearly parallel cuts) and rank-deficient (``t > d``): first-order
  methods crawl there, while the active-set method is exact up to rounding and, warm-started from the
  previous cutting-plane iterate, needs few iterations per new cut (one per support change). Singular
  faces get a tiny ridge (least squares as the last resort); the line search keeps every step a descent
  step either way, and the projected gradient on the face stands in when the face solve gives none.
- ``"fista"``: FISTA with gradient restarts (O'Donoghue & Candes) on the simplex projection kernel
  (`torchssvm.kernels.project_simplex`), step ``1 / lambda_max(Q)``, with an exact face solve every
  ``polish_every`` iterations. For large ``t`` or batched use on a GPU.

Both stop on the Frank-Wolfe gap ``<grad, x> - r min_i grad_i <= tol``, which bounds ``f(x) - f*`` (an
exact certificate of the QP). The active-set method also stops when the KKT conditions hold to rounding
(no coordinate can enter, the face gives no descent) even if the gap is above a too-small ``tol``, and
hands its iterate to FISTA only if it runs out of iterations (``10 t + 50``).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from ...kernels import project_simplex


def qp_value(Q: torch.Tensor, c: torch.Tensor, x: torch.Tensor) -> float:
    return float(0.5 * x @ (Q @ x) - c @ x)


def frank_wolfe_gap(Q: torch.Tensor, c: torch.Tensor, x: torch.Tensor, radius: float) -> float:
    """``<grad f(x), x> - r min_i grad_i`` (``min(0, ...)`` for the inequality form is handled by the
    caller through the slack coordinate)."""
    return _fw_gap(Q @ x - c, x, radius)


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


def _face_solve(Qn, cn, F, radius):
    """A solution ``x_F`` of the KKT system on the face ``F`` (numpy, float64). Singular faces (dependent
    cuts) get a ridge of ``1e-10 max diag Q_FF`` (the minimizer of the slightly regularized face QP; the
    caller's line search keeps the step a descent step); least squares as the last resort."""
    k = F.size
    K = np.zeros((k + 1, k + 1))
    K[:k, :k] = Qn[np.ix_(F, F)]
    K[:k, k] = 1.0
    K[k, :k] = 1.0
    rhs = np.append(cn[F], radius)
    ridge = 1e-10 * max(float(np.abs(np.diag(K)[:k]).max()), 1e-300)
    for attempt in range(2):
        try:
            sol = np.linalg.solve(K, rhs)
            ok = np.all(np.isfinite(sol))
            if ok and (attempt or np.linalg.norm(K @ sol - rhs)
                       <= 1e-9 * (np.linalg.norm(rhs) + np.abs(K).max() * np.linalg.norm(sol))):
                return sol[:k]
        except np.linalg.LinAlgError:
            pass
        K[np.arange(k), np.arange(k)] += ridge
    return np.linalg.lstsq(K, rhs, rcond=None)[0][:k]


def _null_direction(Qn, g, F, tiny):
    """A descent direction along which ``f`` is linear on the face ``F`` (``Q_FF d = -mu 1``, ``sum d = 0``: the null
    space of the face's KKT matrix), or None. On a singular face without a minimizer in its affine hull (the
    objective falls without bound along such a direction) this is the active-set method's step to the boundary;
    the ridge solve has no meaningful answer there."""
    k = F.size
    if k < 2:
        return None
    QFF = Qn[np.ix_(F, F)]
    # the border in Q's units: with Q ~ 1e18 against a border of 1, the relative cut-off of the SVD took the
    # constraint's own direction (sum d != 0) for a null direction
    border = max(float(np.abs(QFF).max()), 1e-300)
    K = np.zeros((k + 1, k + 1))
    K[:k, :k] = QFF
    K[:k, k] = border
    K[k, :k] = border
    _, sv, vt = np.linalg.svd(K)
    best = None
    for v in vt[sv <= 1e-9 * sv[0]]:
        d = v[:k] / max(np.abs(v[:k]).max(), 1e-300)
        Qd = QFF @ d
        if abs(d.sum()) > 1e-9 * k or np.abs(Qd - Qd.mean()).max() > 1e-8 * border:
            continue  # not a flat direction of the face after all
        gd = float(g[F] @ d)
        if gd > 0:
            d, gd = -d, -gd
        if gd < -tiny and (best is None or gd < best[1]):
            best = (d, gd)
    if best is None:
        return None
    p = np.zeros(Qn.shape[0])
    p[F] = best[0]
    return p


def _pairwise_step(Qn, g, x, tiny):
    """One pairwise Frank-Wolfe step with exact line search; returns ``(x, free)``. At a KKT point (the best
    coordinate no better than the worst support coordinate) ``x`` comes back unchanged."""
    radius = x.sum()
    S = np.flatnonzero(x > 0)
    i = int(np.argmin(g))
    j = int(S[np.argmax(g[S])])
    gp = float(g[i] - g[j])
    if i != j and gp < -tiny:
        curv = float(Qn[i, i] - 2 * Qn[i, j] + Qn[j, j])
        s = min(-gp / curv if curv > 0 else np.inf, float(x[j]))
        x = x.copy()
        x[i] += s
        x[j] = 0.0 if s >= x[j] else x[j] - s
        x = np.maximum(x, 0.0)
        x *= radius / x.sum()
    return x, x > 0


def _rounding(Qn, cn, x) -> float:
    """The size of a gradient difference that rounding can fake at ``x``: from the magnitudes of the gradient's
    terms there, ``|Q| |x|`` and ``|c|`` (a bound by ``max|Q| r`` took real descents for rounding where the mass sits
    on coordinates of small curvature, e.g. the slack of the inequality form against cuts of norm 1e8). A change of
    ``f`` along a step of length up to ``r`` is compared with ``r`` times it."""
    return 1e-15 * (1.0 + float((np.abs(Qn) @ np.abs(x)).max()) + float(np.abs(cn).max()))


def _fw_gap(g, x, radius) -> float:
    """`frank_wolfe_gap` from the gradient ``g`` at ``x`` (numpy)."""
    return float(g @ x - radius * g.min())


def _entering(g, free, tiny):
    """The coordinate outside the support ``free`` with the most negative multiplier, or None when none improves on
    the support's best gradient by more than ``tiny``."""
    out = np.flatnonzero(~free)
    if out.size == 0 or g[out].min() >= g[free].min() - tiny:
        return None
    return out[np.argmin(g[out])]


def _active_set(Qn, cn, radius, x, tol, max_iter):
    """Primal active-set iterations from the feasible ``x`` (numpy); returns ``(x, iterations, fw_gap, done)``
    with ``done`` False when ``max_iter`` ran out or the iterate lost its mass (FISTA takes over) (``fw_gap``
    above ``tol`` with ``done`` True means the KKT conditions hold to rounding: no coordinate can enter and the
    face gives no descent)."""
    free = x > 0
    it = 0
    while True:
        g = Qn @ x - cn
        tiny = _rounding(Qn, cn, x)  # gradient differences; tiny * radius for f along a face step
        fw = _fw_gap(g, x, radius)
        if fw <= tol or it >= max_iter:
            return x, it, fw, fw <= tol
        it += 1
        F = np.flatnonzero(free)
        xf = _face_solve(Qn, cn, F, radius)
        p = np.zeros_like(x)
        p[F] = xf - x[F]
        gp = float(g @ p)
        if not gp < -tiny * radius and np.all(xf >= 0):
            # a short face step near the optimum falls under the test's threshold (sized for steps of length r)
            # although it is a real descent: take the face's minimizer when it lowers the Frank-Wolfe gap
            x_face = np.zeros_like(x)
            x_face[F] = xf
            if x_face.sum() > 0:
                x_face *= radius / x_face.sum()
                g_face = Qn @ x_face - cn
                fw_face = _fw_gap(g_face, x_face, radius)
                if fw_face < fw:
                    x, free = x_face, x_face > 0
                    j = _entering(g_face, free, tiny)
                    if j is None:
                        return x, it, fw_face, True  # KKT to rounding
                    free[j] = True
                    continue
        if not gp < -tiny * radius:  # the face solve gave no descent (singular face)
            p = _null_direction(Qn, g, F, tiny)
            if p is None:  # none along the face's flat directions either: a pairwise Frank-Wolfe step
                x_new, free = _pairwise_step(Qn, g, x, tiny)
                if np.array_equal(x_new, x):
                    return x, it, fw, True  # KKT to rounding
                x = x_new
                continue
            gp = float(g @ p)
        pQp = float(p @ Qn @ p)
        s_line = -gp / pQp if pQp > 0 else np.inf
        dec = F[p[F] < 0]
        ratios = x[dec] / -p[dec]
        s_max = float(ratios.min()) if ratios.size else np.inf
        s = min(s_line, s_max)
        if not s > 0:
            # a blocked face step: the (ridge) solve of a singular face wants a coordinate that sits at 0
            # lower, so it would leave, re-enter and cycle. A pairwise Frank-Wolfe step (mass from the worst
            # support coordinate to the best coordinate, exact line search) always makes progress.
            x, free = _pairwise_step(Qn, g, x, tiny)
            continue
        x_prev, x = x, x + s * p
        if s >= s_max:  # a coordinate reached 0: it leaves the support
            x[dec[ratios <= s_max * (1 + 1e-12)]] = 0.0
        x = np.maximum(x, 0.0)
        if not x.sum() > 0:  # the step took all the mass (a wrong direction): FISTA takes over
            return x_prev, it, fw, False
        x *= radius / x.sum()
        free = x > 0
        if s >= s_max:
            continue
        # the face is solved (exactly, or to rounding on an ill-conditioned face, where waiting for an exact
        # solve would zigzag): the most negative multiplier g_j - nu enters; if none does, the next iteration's
        # test (Frank-Wolfe gap, face step) decides
        j = _entering(Qn @ x - cn, free, tiny)
        if j is not None:
            free[j] = True


@torch.no_grad()
def simplex_qp(Q: torch.Tensor, c: torch.Tensor, radius: float = 1.0, x0: Optional[torch.Tensor] = None, *,
               inequality: bool = False, tol: float = 1e-10, max_iter: int = 5000, polish_every: int = 25,
               method: str = "active_set", backend: str = "auto"):
    """Args:
        Q: ``(t, t)`` PSD float64. c: ``(t,)``. radius: ``r > 0``.
        x0: a warm start ``(t,)`` (rescaled to the radius when it is >= 0, else projected onto the feasible set),
            or None (all weight on the coordinate with the largest ``c``).
        inequality: ``sum x <= r`` (a zero-cost slack coordinate is added internally).
        tol: Frank-Wolfe gap at which to stop (absolute, in units of ``f``).
        max_iter: FISTA iterations (active set: ``10 t + 50``); polish_every: FISTA iterations between exact
            face solves.
        method: ``"active_set"`` or ``"fista"`` (see the module docstring).
        backend: of the projection kernel (FISTA).

    Returns ``(x (t,), info)`` with ``info = {"iterations", "fw_gap", "value", "solved"}``; ``solved`` is False when
    the iterations ran out with the gap above ``tol`` (the active-set method's KKT-to-rounding stop counts as
    solved)."""
    if Q.dim() != 2 or Q.shape[0] != Q.shape[1] or c.shape != (Q.shape[0],):
        raise ValueError(f"Q must be (t, t) and c (t,), got {tuple(Q.shape)} and {tuple(c.shape)}")
    if not (radius > 0 and math.isfinite(radius)):
        raise ValueError(f"radius must be a finite number > 0, got {radius}")
    if method not in ("active_set", "fista"):
        raise ValueError(f"method must be 'active_set' or 'fista', got {method!r}")
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
    elif bool((x0 >= 0).all()) and float(x0.sum()) > 0:  # feasible up to the sum (a warm start): keep its support
        x = x0.to(torch.float64) * (radius / float(x0.sum()))
    else:  # the projection would turn a feasible point's zeros into rounding-level weights (support of size t)
        x = project_simplex(x0.to(torch.float64).reshape(1, T), radius=Q.new_tensor([radius]),
                            backend=backend).squeeze(0)
    it, fw = 0, frank_wolfe_gap(Q, c, x, radius)
    if method == "active_set" and fw > tol:
        xn, it, fw, done = _active_set(Q.cpu().numpy(), c.cpu().numpy(), float(radius), x.cpu().numpy(), tol,
                                 10 * T + 50)
        x = torch.from_numpy(xn).to(Q.device)
        if done:
            value = qp_value(Q, c, x)
            return (x[:t] if inequality else x), {"iterations": it, "fw_gap": fw, "value": value, "solved": True}
    handed, handed_fw = x, fw  # FISTA may end worse than the iterate it starts from
    L = float(torch.linalg.eigvalsh(Q)[-1])
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
    if fw > handed_fw and qp_value(Q, c, handed) < qp_value(Q, c, x):
        x, fw = handed, handed_fw
    value = qp_value(Q, c, x)
    info = {"iterations": it, "fw_gap": fw, "value": value, "solved": fw <= tol}
    return (x[:t] if inequality else x), info
