"""Projection onto a box with one linear equality by median search, Algorithm 2 of Zhang et al. (2010, App. B), the
``O(n)`` method of Pardalos & Kovoor (1990); a one-row numpy reference for `project_box_equality_torch`.

Same problem and change of variables as `kernels.box_equality_torch`: find the root
``lam`` of ``f(lam) = sum_i clip(lam / dbar_i^2, l'_i, u'_i) - z'``. Each finite kink ``t_e`` carries a
change of slope ``ds_e`` and of offset ``do_e`` (lower kink of i: ``+1/dbar_i^2``, ``-l'_i``; upper kink:
``-1/dbar_i^2``, ``+u'_i``), so ``f(t) = C + S t - z'`` with ``(C, S)`` summed over the kinks ``<= t`` on top of
the state left of every kink. The search keeps a bracket ``(lo, hi)`` of the root and the set ``K`` of kinks
strictly inside it, with the kinks ``<= lo`` folded into ``(C, S)``: evaluating ``f`` at the median of ``K``
then costs ``O(|K|)``, and the median and every kink equal to it leave ``K`` (so duplicate kinks cannot
stall the search: ``K`` at least halves each round, ``O(n)`` in all with ``np.partition``). When ``K`` is
empty f is linear on ``(lo, hi)`` and its root is ``(z' - C) / S`` (step 3 of Algorithm 2, the interpolation
between the two last kinks), with ``(C, S)`` recomputed once, ``O(n)``, from the coordinates clipped and free on
``(lo, hi)`` (the running sums lose digits to ``+inv - inv`` cancellation); ``S = 0`` is a flat segment, where
every ``lam`` gives the same ``x``.
"""

from __future__ import annotations

import math

import numpy as np


def _row(t, n: int) -> np.ndarray:
    a = np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t, dtype=np.float64)
    return np.broadcast_to(a, (n,))


def box_equality_median(m, lower, upper, sigma, z, d2=None) -> np.ndarray:
    """Args:
        m: ``(n,)`` the point to project (array-like or a CPU tensor).
        lower, upper, sigma: ``(n,)`` or numbers (``+-inf`` bounds allowed, ``sigma != 0``).
        z: a number.
        d2: ``(n,)``, a number or None (1): the weights ``d_i^2 > 0``.

    Returns ``x (n,)`` float64, the minimizer of ``1/2 sum_i d2_i (x_i - m_i)^2`` over
    ``{lower <= x <= upper, sum_i sigma_i x_i = z}``. Inputs are not checked; the problem must be feasible."""
    m = np.asarray(m.detach().cpu().numpy() if hasattr(m, "detach") else m, dtype=np.float64).reshape(-1)
    n = m.shape[0]
    lo_x, hi_x, s = _row(lower, n), _row(upper, n), _row(sigma, n)
    inv = s * s if d2 is None else s * s / _row(d2, n)
    pos = s > 0
    with np.errstate(invalid="ignore"):
        lp = np.where(pos, s * (lo_x - m), s * (hi_x - m))
        up = np.where(pos, s * (hi_x - m), s * (lo_x - m))
    zp = float(z) - float(np.sum(s * m))
    a, b = lp / inv, up / inv
    fa, fb = np.isfinite(a), np.isfinite(b)
    t = np.concatenate([a[fa], b[fb]])
    ds = np.concatenate([inv[fa], -inv[fb]])
    do = np.concatenate([-lp[fa], up[fb]])
    C = float(np.sum(lp[fa]))
    S = float(np.sum(inv[~fa]))
    lo, hi = -math.inf, math.inf
    while t.size:
        med = np.partition(t, t.size // 2)[t.size // 2]
        crossed = t <= med
        dC, dS = float(np.sum(do[crossed])), float(np.sum(ds[crossed]))
        if C + dC + (S + dS) * med - zp >= 0:
            hi, keep = med, t < med
        else:
            lo, keep = med, t > med
            C, S = C + dC, S + dS
        t, ds, do = t[keep], ds[keep], do[keep]
    # the final linear piece from the clipped / free coordinates of (lo, hi), not from the running (C, S): the
    # slope accumulated as +inv - inv over folded kinks loses digits when the free slope is small
    at_lower, at_upper = a >= hi, b <= lo
    free = ~(at_lower | at_upper)
    S = float(np.sum(inv[free]))
    if S > 0:
        C = float(np.sum(lp[at_lower])) + float(np.sum(up[at_upper]))
        lam = min(max((zp - C) / S, lo), hi)
    else:
        lam = lo if math.isfinite(lo) else hi
    v = lam * inv
    x = m + np.minimum(np.maximum(v, lp), up) / s
    x = np.where(v <= lp, np.where(pos, lo_x, hi_x), x)
    x = np.where(v >= up, np.where(pos, hi_x, lo_x), x)
    return np.minimum(np.maximum(x, lo_x), hi_x)
