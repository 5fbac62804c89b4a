"""Projection onto a box with one linear equality, batched, in plain torch (sort-based, exact).

Row b solves the diagonal QP of Zhang et al. (2010, App. B):

    min_x 1/2 sum_i d_i^2 (x_i - m_i)^2   s.t.   l_i <= x_i <= u_i,   sum_i sigma_i x_i = z

(``d2`` holds ``d_i^2 > 0``, ``sigma_i != 0`` of either sign, ``l_i <= u_i``, infinite bounds allowed). With
``beta_i = sigma_i (x_i - m_i)`` it becomes ``min 1/2 sum dbar_i^2 beta_i^2`` s.t. ``l'_i <= beta_i <= u'_i``,
``sum beta_i = z' = z - sum sigma_i m_i``, ``dbar_i^2 = d_i^2 / sigma_i^2``; the KKT conditions (27) give
``beta_i = h_i(lam) = clip(lam / dbar_i^2, l'_i, u'_i)`` with ``lam`` the root of the nondecreasing piecewise
linear ``f(lam) = sum_i h_i(lam) - z'`` (30), whose kinks are ``dbar_i^2 l'_i`` and ``dbar_i^2 u'_i``.

Here: sort the (at most 2n) finite kinks, evaluate f at all of them by cumulative sums of the slope and
offset changes (``O(n log n)``, every row at once), take the first kink with ``f >= 0`` and its predecessor
as the bracket ``[lo, hi]`` (no kink strictly inside), and solve the linear piece exactly from the clipped
and free coordinates of that segment (`box_equality_finish_torch`). Infinite bounds give no kink: the slope
of a coordinate unbounded below is there from ``-inf``, one unbounded above never leaves. A flat segment
(``f = 0`` on it) means every coordinate is clipped there, so ``x`` is the same for any ``lam`` on it.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

Bound = Union[torch.Tensor, float]


def _rows(t: Bound, m: torch.Tensor) -> torch.Tensor:
    """``t`` (a number, ``(n,)`` or ``(B, n)``) as a ``(B, n)`` view in ``m``'s dtype."""
    if not isinstance(t, torch.Tensor):
        t = torch.tensor(float(t), dtype=m.dtype, device=m.device)
    return t.to(m.dtype).expand_as(m)


def box_equality_transform(m: torch.Tensor, lower: Bound, upper: Bound, sigma: Bound, z: Bound,
                           d2: Optional[Bound] = None):
    """The change of variables above, one row per row of ``m (B, n)``.

    Returns ``(lp, up, inv, zp)``: the bounds ``l'_i <= beta_i <= u'_i`` ``(B, n)`` (``+-inf`` where a bound
    of ``x`` is infinite), ``inv_i = 1 / dbar_i^2 = sigma_i^2 / d_i^2`` ``(B, n)`` and ``z' (B,)``, so that
    ``h_i(lam) = clip(lam * inv_i, l'_i, u'_i)``."""
    lo, hi, s = _rows(lower, m), _rows(upper, m), _rows(sigma, m)
    pos = s > 0
    lp = torch.where(pos, s * (lo - m), s * (hi - m))
    up = torch.where(pos, s * (hi - m), s * (lo - m))
    inv = s * s if d2 is None else s * s / _rows(d2, m)
    zt = z if isinstance(z, torch.Tensor) else torch.tensor(float(z), dtype=m.dtype, device=m.device)
    zp = zt.to(m.dtype).expand(m.shape[0]) - (s * m).sum(1)
    return lp, up, inv, zp


def box_equality_finish_torch(lp, up, inv, zp, lo, hi) -> torch.Tensor:
    """The exact multiplier ``lam (B,)`` given a bracket ``lo <= lam <= hi`` ``(B,)`` with no kink strictly
    inside (``lo = -inf`` / ``hi = inf`` allowed).

    On the open segment coordinate i sits at ``l'_i`` when its lower kink is ``>= hi``, at ``u'_i`` when its
    upper kink is ``<= lo`` and is free (``beta_i = lam * inv_i``) otherwise, so ``f(lam) = 0`` is the linear
    equation ``sum_lower l'_i + sum_upper u'_i + lam sum_free inv_i = z'``. Without free coordinates f is
    constant there (and 0 by the bracket): any point will do, we take ``lo`` (``hi`` when ``lo = -inf``)."""
    lo, hi = lo.unsqueeze(1), hi.unsqueeze(1)
    zero = torch.zeros_like(lp)
    at_lower = lp / inv >= hi
    at_upper = up / inv <= lo
    free = ~(at_lower | at_upper)
    fixed = torch.where(at_lower, lp, zero).sum(1) + torch.where(at_upper, up, zero).sum(1)
    slope = torch.where(free, inv, zero).sum(1)
    has = slope > 0
    lam = (zp - fixed) / torch.where(has, slope, torch.ones_like(slope))
    lo, hi = lo.squeeze(1), hi.squeeze(1)
    lam = torch.where(has, lam, torch.where(torch.isfinite(lo), lo, hi))
    return torch.maximum(torch.minimum(lam, hi), lo)  # rounding may step a hair outside the segment


def box_equality_multiplier_torch(lp, up, inv, zp) -> torch.Tensor:
    """``lam (B,)``, the root of (30), by sorting the kinks (see the module docstring)."""
    B = lp.shape[0]
    a, b = lp / inv, up / inv  # kinks dbar^2 l', dbar^2 u' (a = -inf / b = inf where unbounded)
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    zero = torch.zeros_like(lp)
    t, order = torch.sort(torch.cat([a, b], 1), 1)
    dslope = torch.cat([torch.where(fa, inv, zero), torch.where(fb, -inv, zero)], 1).gather(1, order)
    doff = torch.cat([torch.where(fa, -lp, zero), torch.where(fb, up, zero)], 1).gather(1, order)
    # left of every finite kink: coordinates with a finite lower kink sit at l', the others are free
    slope = torch.where(fa, zero, inv).sum(1, keepdim=True) + torch.cumsum(dslope, 1)
    off = torch.where(fa, lp, zero).sum(1, keepdim=True) + torch.cumsum(doff, 1)
    finite = torch.isfinite(t)
    f = torch.where(finite, off + slope * torch.where(finite, t, zero.new_zeros(())) - zp.unsqueeze(1), t)
    edge = torch.full((B, 1), math.inf, dtype=lp.dtype, device=lp.device)
    t = torch.cat([-edge, t, edge], 1)
    f = torch.cat([-edge, f, edge], 1)
    k = (f >= 0).to(torch.int32).argmax(1, keepdim=True)  # first kink with f >= 0 (>= 1: f[:, 0] = -inf)
    return box_equality_finish_torch(lp, up, inv, zp, t.gather(1, k - 1).squeeze(1), t.gather(1, k).squeeze(1))


def box_equality_solution(lam, m, lower: Bound, upper: Bound, sigma: Bound, lp, up, inv) -> torch.Tensor:
    """``x (B, n)`` from the multiplier ``lam (B,)``: ``beta = clip(lam * inv, l', u')``, ``x = m + beta / sigma``;
    coordinates at a bound get that bound exactly."""
    lo, hi, s = _rows(lower, m), _rows(upper, m), _rows(sigma, m)
    v = lam.unsqueeze(1) * inv
    beta = torch.maximum(torch.minimum(v, up), lp)
    x = m + beta / s
    pos = s > 0
    x = torch.where(v <= lp, torch.where(pos, lo, hi), x)
    x = torch.where(v >= up, torch.where(pos, hi, lo), x)
    return torch.maximum(torch.minimum(x, hi), lo)


def project_box_equality_torch(m: torch.Tensor, lower: Bound, upper: Bound, sigma: Bound, z: Bound,
                               d2: Optional[Bound] = None) -> torch.Tensor:
    """Args:
        m: ``(B, n)`` float, the points to project (one problem per row).
        lower, upper: the box, ``(B, n)``, ``(n,)`` (the same for every row) or a number; ``+-inf`` allowed.
        sigma: the equality's coefficients, nonzero, ``(B, n)``, ``(n,)`` or a number.
        z: the right-hand sides, ``(B,)`` or a number.
        d2: the weights ``d_i^2 > 0``, ``(B, n)``, ``(n,)``, a number, or None (all 1: Euclidean projection).

    Returns ``x (B, n)`` in ``m``'s dtype: the minimizer of ``1/2 sum_i d2_i (x_i - m_i)^2`` over
    ``{lower <= x <= upper, sum_i sigma_i x_i = z}`` per row. Inputs are not checked (see
    `torchssvm.kernels.project_box_equality`); the problem must be feasible."""
    if m.shape[0] == 0:
        return m.clone()
    lp, up, inv, zp = box_equality_transform(m, lower, upper, sigma, z, d2)
    lam = box_equality_multiplier_torch(lp, up, inv, zp)
    return box_equality_solution(lam, m, lower, upper, sigma, lp, up, inv)
