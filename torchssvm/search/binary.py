"""Binary search on the xi-free bound F-bar (Choi et al., 2016, Lemma 1 and App. D).

``max_y Phi <= min_lam U(lam)``, ``U(lam) = K(lam)^2 / (4 lam)``, ``K(lam) = max_y h + lam g``, is convex
in ``lam`` with ``dU/dlam`` of the sign of ``lam g(y_lam) - h(y_lam)``; bisect on that sign (geometric
midpoints: lambda spans orders of magnitude) inside explicit bounds ``[lam_min, lam_max]``, keep the
best labelling returned, stop by D.1 (the same point at both ends), a relative width or the call cap.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_int, check_real
from .result import Incumbent, SearchResult


def binary_search(oracle, *, lam_min: float = 1e-6, lam_max: float = 1e6, max_calls: int = 50,
                  tol: float = 1e-6) -> SearchResult:
    check_positive_int("max_calls", max_calls)
    lam_min, lam_max = check_real("lam_min", lam_min), check_real("lam_max", lam_max)
    tol = check_real("tol", tol)
    if not 0 < lam_min < lam_max:
        raise ValueError(f"need 0 < lam_min < lam_max, got {lam_min}, {lam_max}")
    best = Incumbent(oracle)
    B = oracle.batch_size
    f64 = dict(dtype=torch.float64, device=best.phi.device)
    lo, hi = torch.full((B,), float(lam_min), **f64), torch.full((B,), float(lam_max), **f64)
    at_lo = torch.full((B, 2), torch.nan, **f64)
    at_hi = torch.full((B, 2), torch.nan, **f64)
    active = torch.ones(B, dtype=torch.bool, device=best.phi.device)
    for _ in range(max_calls):
        if not bool(active.any()):
            break
        lam = torch.sqrt(lo * hi)
        ans = oracle(lam, active)
        best.offer(ans, active)
        best.certify(ans, lam, active)
        up = lam * ans.g < ans.h  # U decreasing here: the minimizer lies above
        point = torch.stack([ans.h, ans.g], 1)
        lo = torch.where(active & up, lam, lo)
        hi = torch.where(active & ~up, lam, hi)
        at_lo = torch.where((active & up).unsqueeze(1), point, at_lo)
        at_hi = torch.where((active & ~up).unsqueeze(1), point, at_hi)
        active = active & ~(at_lo == at_hi).all(1) & (hi > lo * (1 + tol))
    return best.result()
