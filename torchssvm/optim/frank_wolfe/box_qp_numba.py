"""The box QP's projected Newton iteration (`box_qp`) as one compiled host loop (numba).

``min_gamma -c^T gamma + 1/2 gamma^T H gamma`` over ``0 <= gamma <= upper``. Each iteration, as in
`box_qp._projected_newton`: the coordinates at a bound whose gradient pushes outward are held; the others
move along two directions, Newton's on the free block (``H_FF + r I``, Cholesky) and the projected gradient's;
the best point of the two projection arcs ``P(gamma + t d)`` is kept if it lowers ``f``. What differs is the
search along an arc: instead of a fixed grid of 62 trial lengths (each an ``O(B^2)`` quadratic form), the arc's
exact minimum. ``f(P(gamma + t d))`` is a piecewise quadratic in ``t`` whose pieces end where a coordinate
reaches its bound; walking the breakpoints in order and updating the quadratic's coefficients with one column
of ``H`` per breakpoint gives every piece's minimum in ``O(B)`` (an exact projected search, as in Moré and
Toraldo 1989); the minimizing piece's quadratic is then solved again from fresh sums (`_piece_minimum`). An
iteration costs one Cholesky factorization of the free block and ``O(B^2)`` besides, and no numpy call (timings
against the numpy loop: `docs/benchmarks/box_qp.md`), and it runs on one thread, so it never competes with
torch's threads for the cores.
"""

from __future__ import annotations

import numpy as np

from ...kernels import _numba
from ...kernels.step.box_qp_tolerance import RIDGE_FLOOR as _RIDGE_FLOOR

# sums may be reordered (vectorized dot products); infinities keep their meaning (the arcs' last piece)
_jit = _numba.jit(fastmath={"reassoc", "contract"})


def available() -> bool:
    return _numba.available()


@_jit
def _cholesky_free(H, free, k, ridge, L):
    """``L[:k, :k]``: the lower Cholesky factor of ``H[free, free] + ridge I`` (``free[:k]`` the indices). False if
    a pivot is not positive (the block is singular to rounding)."""
    for j in range(k):
        fj = free[j]
        s = H[fj, fj] + ridge
        for m in range(j):
            s -= L[j, m] * L[j, m]
        if not s > 0.0:
            return False
        d = np.sqrt(s)
        L[j, j] = d
        for i in range(j + 1, k):
            s = H[free[i], fj]
            for m in range(j):
                s -= L[i, m] * L[j, m]
            L[i, j] = s / d
    return True


@_jit
def _newton_direction(grad, free, k, L, direction, x):
    """``direction``: ``-(H_FF + r I)^{-1} grad_F`` on the free coordinates (``L`` its factor), 0 elsewhere."""
    for i in range(k):  # L y = -grad_F
        s = -grad[free[i]]
        for m in range(i):
            s -= L[i, m] * x[m]
        x[i] = s / L[i, i]
    for i in range(k - 1, -1, -1):  # L^T x = y
        s = x[i]
        for m in range(i + 1, k):
            s -= L[m, i] * x[m]
        x[i] = s / L[i, i]
    direction[:] = 0.0
    for i in range(k):
        direction[free[i]] = x[i]


@_jit
def _arc_minimum(H, grad, gamma, upper, d, Ha, Hb, tau, ids):
    """The step length ``t >= 0`` minimizing ``f(P(gamma + t d))`` (0 if nothing lowers ``f``).

    On the piece between two breakpoints ``gamma + Delta(t)``, ``Delta(t) = a + t b``: ``a`` holds the moves of
    the coordinates already at their bound, ``b`` the direction of the others. With ``g = grad``,
    ``f(gamma + Delta) - f(gamma) = g.a + a.Ha/2 + t (g.b + a.Hb) + t^2 b.Hb/2``. When coordinate i reaches its
    bound, ``a_i`` becomes its move ``s_i`` and ``b_i`` becomes 0; the scalars change through ``Ha_i``, ``Hb_i``
    and ``H_ii`` and the vectors ``Ha``, ``Hb`` by one column of ``H``."""
    B = gamma.shape[0]
    n = 0
    for i in range(B):
        if d[i] > 0.0:
            tau[n] = (upper[i] - gamma[i]) / d[i]
        elif d[i] < 0.0:
            tau[n] = -gamma[i] / d[i]
        else:
            continue
        ids[n] = i
        n += 1
    order = np.argsort(tau[:n])
    gb = 0.0
    for i in range(B):
        s = 0.0
        for j in range(B):
            s += H[i, j] * d[j]
        Hb[i] = s
        Ha[i] = 0.0
        gb += grad[i] * d[i]
    bHb = 0.0
    for i in range(B):
        bHb += d[i] * Hb[i]
    ga = 0.0
    aHa = 0.0
    aHb = 0.0
    t_lo = 0.0
    best_t = 0.0
    best = 0.0
    best_lo = 0.0
    best_hi = 0.0
    for p in range(n + 1):
        t_hi = tau[order[p]] if p < n else np.inf
        if t_hi > t_lo:
            slope = gb + aHb
            if bHb > 0.0:
                t = min(max(-slope / bHb, t_lo), t_hi)
            else:
                t = t_hi if slope < 0.0 else t_lo
            if np.isfinite(t):
                value = ga + 0.5 * aHa + t * slope + 0.5 * t * t * bHb
                if value < best:
                    best = value
                    best_t = t
                    best_lo = t_lo
                    best_hi = t_hi
        if p == n:
            break
        i = ids[order[p]]
        s = (upper[i] if d[i] > 0.0 else 0.0) - gamma[i]
        di = d[i]
        hii = H[i, i]
        aHb += -di * Ha[i] + s * Hb[i] - s * di * hii
        aHa += 2.0 * s * Ha[i] + s * s * hii
        bHb += -2.0 * di * Hb[i] + di * di * hii
        ga += grad[i] * s
        gb -= grad[i] * di
        for j in range(B):  # H is symmetric: row i is column i, contiguous
            Ha[j] += H[i, j] * s
            Hb[j] -= H[i, j] * di
        t_lo = max(t_lo, t_hi)
    if best_t > best_lo and best_t < best_hi:
        best_t = _piece_minimum(H, grad, gamma, upper, d, best_lo, best_hi, Ha, Hb, tau)
    return best_t


@_jit
def _piece_minimum(H, grad, gamma, upper, d, t_lo, t_hi, a, Hb, clipped):
    """The minimum of ``f(P(gamma + t d))`` over ``[t_lo, t_hi]``, a piece of the arc, from its coefficients summed
    afresh. The walk's running sums cancel (``g.b + a.Hb`` near 0 at an interior minimum), so its ``t`` can be off
    by 1e-13 relative; solving the piece's quadratic again keeps the answer a smooth function of ``(c, H)``, as the
    numpy and torch iterations' exact Newton point is (``a``, ``Hb``, ``clipped``: scratch)."""
    B = gamma.shape[0]
    for i in range(B):  # the coordinates at their bound on the piece: a_i = the move there, b_i = 0
        a[i] = 0.0
        clipped[i] = 0.0
        if d[i] > 0.0 and (upper[i] - gamma[i]) / d[i] <= t_lo:
            a[i] = upper[i] - gamma[i]
            clipped[i] = 1.0
        elif d[i] < 0.0 and -gamma[i] / d[i] <= t_lo:
            a[i] = -gamma[i]
            clipped[i] = 1.0
    for i in range(B):
        s = 0.0
        for j in range(B):
            s += H[i, j] * (d[j] - clipped[j] * d[j])
        Hb[i] = s
    slope = 0.0
    curvature = 0.0
    for i in range(B):
        if clipped[i] == 0.0:
            slope += grad[i] * d[i]
            curvature += d[i] * Hb[i]
        else:
            slope += a[i] * Hb[i]
    if not curvature > 0.0:
        return t_hi if slope < 0.0 else t_lo
    return min(max(-slope / curvature, t_lo), t_hi)


@_jit
def _gradient(c, H, gamma, grad):
    """``grad = H gamma - c``."""
    B = gamma.shape[0]
    for i in range(B):
        s = 0.0
        for j in range(B):
            s += H[i, j] * gamma[j]
        grad[i] = s - c[i]


@_jit
def _change(H, grad, gamma, trial):
    """``f(trial) - f(gamma) = grad.D + D.HD/2`` with ``D = trial - gamma``: computed from the move, not as a
    difference of the two values, so a decrease far below ``|f|``'s rounding still registers (near the optimum of
    a singular problem the last moves are that small)."""
    B = gamma.shape[0]
    change = 0.0
    for i in range(B):
        di = trial[i] - gamma[i]
        if di == 0.0:
            continue
        s = 0.0
        for j in range(B):
            s += H[i, j] * (trial[j] - gamma[j])
        change += di * (grad[i] + 0.5 * s)
    return change


@_jit
def projected_newton(c, H, upper, max_iter, tol):
    """``gamma (B,)``, the minimizer of the box QP to ``tol`` (the gradient of the free coordinates at most
    ``tol max|c|`` plus ``_RIDGE_FLOOR`` times the ridge's resolution, `box_qp.box_qp`). c ``(B,)``, H ``(B, B)``
    symmetric PSD, upper ``(B,)`` >= 0; float64 arrays."""
    B = c.shape[0]
    ridge = 1e-13 * np.abs(np.diag(H)).max() + 1e-300
    scale = tol * np.abs(c).max()
    gamma = np.zeros(B)
    grad = -c.copy()
    free = np.empty(B, np.int64)
    ids = np.empty(B, np.int64)
    L = np.empty((B, B))
    x = np.empty(B)
    d = np.empty(B)
    tau = np.empty(B)
    Ha = np.empty(B)
    Hb = np.empty(B)
    trial = np.empty(B)
    best = np.empty(B)
    for _ in range(max_iter):
        projected = 0.0
        gmax = 0.0
        k = 0
        for i in range(B):
            gmax = max(gmax, gamma[i])
            if not ((gamma[i] <= 0.0 and grad[i] >= 0.0) or (gamma[i] >= upper[i] and grad[i] <= 0.0)):
                projected = max(projected, abs(grad[i]))
                free[k] = i
                k += 1
        if projected <= scale + _RIDGE_FLOOR * ridge * gmax:
            break
        best_change = 0.0
        for arc in range(2):  # 0: projected gradient, 1: Newton
            if arc == 0:
                d[:] = 0.0
                for m in range(k):
                    d[free[m]] = -grad[free[m]]
            elif _cholesky_free(H, free, k, ridge, L):
                _newton_direction(grad, free, k, L, d, x)
            else:
                continue
            t = _arc_minimum(H, grad, gamma, upper, d, Ha, Hb, tau, ids)
            if not t > 0.0:
                continue
            for i in range(B):  # a coordinate past its breakpoint lands exactly on its bound
                if d[i] > 0.0:
                    trial[i] = upper[i] if t >= (upper[i] - gamma[i]) / d[i] else min(gamma[i] + t * d[i], upper[i])
                elif d[i] < 0.0:
                    trial[i] = 0.0 if t >= -gamma[i] / d[i] else max(gamma[i] + t * d[i], 0.0)
                else:
                    trial[i] = gamma[i]
            change = _change(H, grad, gamma, trial)
            if change < best_change:
                best_change = change
                best[:] = trial
        if not best_change < 0.0:  # no descent along either arc
            break
        gamma[:] = best
        _gradient(c, H, gamma, grad)
    return gamma
