"""Bisecting search, Algorithm 1 of Choi et al. (2016), batched across examples.

Each round queries the lambda-oracle once per still-active example, intersects the Lemma 3 intervals
``H`` and ``G`` that must hold ``h(y*)`` and ``g(y*)``, and moves lambda up when ``g(y') <= h(y') / lam``
and down otherwise; the midpoint of the remaining lambda interval is queried next. What the paper
leaves open, settled here: while the interval is unbounded above lambda doubles; intervals count
as empty past a relative tolerance; the D.1 stop (the same point at both ends of the lambda interval:
by Lemma 4 nothing in between can differ) and a cap on the calls end a search too. No exactness
guarantee exists for any lambda-oracle search (Thm 1); the Lemma 5 certificate says how far it may be.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._validation import check_positive_int, check_real
from .arguments import check_per_example
from .result import Incumbent, SearchResult


def bisecting_search(oracle, lam0: Optional[torch.Tensor] = None, *, max_calls: int = 50,
                     tol: float = 1e-9) -> SearchResult:
    """Args:
        oracle: a `TableOracle` or `StructureOracle` (its lambda-oracle is used).
        lam0: ``(B,)`` starting multipliers (a warm start, e.g. each example's previous best), default 1.
        max_calls: oracle calls per example at most.
        tol: relative tolerance of the interval tests.
    """
    check_positive_int("max_calls", max_calls)
    tol = check_real("tol", tol)
    best = Incumbent(oracle)
    B = oracle.batch_size
    dev = best.phi.device
    f64 = dict(dtype=torch.float64, device=dev)
    lam = torch.ones(B, **f64) if lam0 is None else check_per_example("lam0", lam0, B, dev, positive=True).clone()
    lo, hi = torch.zeros(B, **f64), torch.full((B,), torch.inf, **f64)
    h_lo, h_hi = torch.zeros(B, **f64), torch.full((B,), torch.inf, **f64)
    g_lo, g_hi = torch.zeros(B, **f64), torch.full((B,), torch.inf, **f64)
    at_lo = torch.full((B, 2), torch.nan, **f64)  # the point returned at each end of the lambda interval
    at_hi = torch.full((B, 2), torch.nan, **f64)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    for _ in range(max_calls):
        if not bool(active.any()):
            break
        ans = oracle(lam, active)
        best.offer(ans, active)
        best.certify(ans, lam, active)
        h, g = ans.h, ans.g
        u_lo, u_hi = torch.minimum(h, lam * g), torch.maximum(h, lam * g)
        v_lo, v_hi = torch.minimum(g, h / lam), torch.maximum(g, h / lam)
        h_lo = torch.where(active, torch.maximum(h_lo, u_lo), h_lo)
        h_hi = torch.where(active, torch.minimum(h_hi, u_hi), h_hi)
        g_lo = torch.where(active, torch.maximum(g_lo, v_lo), g_lo)
        g_hi = torch.where(active, torch.minimum(g_hi, v_hi), g_hi)
        up = g <= h / lam
        point = torch.stack([h, g], 1)
        lo = torch.where(active & up, lam, lo)
        hi = torch.where(active & ~up, lam, hi)
        at_lo = torch.where((active & up).unsqueeze(1), point, at_lo)
        at_hi = torch.where((active & ~up).unsqueeze(1), point, at_hi)
        empty = (h_lo > h_hi + tol * (1 + h_hi.abs())) | (g_lo > g_hi + tol * (1 + g_hi.abs()))
        same_ends = (at_lo == at_hi).all(1)  # D.1 (NaN until both ends were queried)
        narrow = torch.isfinite(hi) & (hi - lo <= tol * hi)
        active = active & ~empty & ~same_ends & ~narrow
        lam = torch.where(active, torch.where(torch.isinf(hi), 2 * lam, 0.5 * (lo + hi)), lam)
    return best.result()
