"""The Sarawagi & Gupta baseline: golden-section search on the conjugate bound (Sarawagi & Gupta,
2008, as Choi et al., 2016, section 3 restate it), batched across examples.

With the current slack ``xi_i`` of the cutting-plane working set, ``max_{y} h - xi / g`` is bounded by
``min_{lam >= 0} F(lam)``, ``F(lam) = K(lam) - 2 sqrt(xi lam)`` with ``K(lam) = max_y h + lam g`` (the
unconstrained lambda-oracle: the truth keeps ``K >= 1``, a valid if looser bound). ``F`` is
convex; golden-section search on ``[0, lam_max]`` minimizes it with one oracle call per iteration, and
the best ``Phi`` among the returned labellings is the answer. A heuristic: no exactness guarantee.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_positive_int, check_real
from .arguments import check_per_example
from .result import Incumbent, SearchResult

_R = (math.sqrt(5) - 1) / 2  # 0.618...


def golden_search(oracle, xi: torch.Tensor, *, lam_max: float = 1e3, max_calls: int = 50,
                  tol: float = 1e-6) -> SearchResult:
    """Args:
        oracle: a `TableOracle` or `StructureOracle`.
        xi: ``(B,)`` >= 0, each example's current slack.
        lam_max: the right end of the search interval.
        max_calls, tol: call cap, and the relative width at which the interval counts as found.
    """
    check_positive_int("max_calls", max_calls)
    lam_max, tol = check_real("lam_max", lam_max), check_real("tol", tol)
    if lam_max == 0:
        raise ValueError("lam_max must be > 0, got 0.0")
    best = Incumbent(oracle)
    B = oracle.batch_size
    f64 = dict(dtype=torch.float64, device=best.phi.device)
    xi = check_per_example("xi", xi, B, best.phi.device, positive=False)
    active = torch.ones(B, dtype=torch.bool, device=best.phi.device)

    def F(lam):
        ans = oracle(lam, active)
        best.offer(ans, active)
        best.certify(ans, lam, active)
        return ans.h + lam * ans.g - 2 * torch.sqrt(xi * lam)

    a, b = torch.zeros(B, **f64), torch.full((B,), float(lam_max), **f64)
    c, d = b - _R * (b - a), a + _R * (b - a)
    fc = F(c)
    fd = F(d) if max_calls > 1 else fc
    for _ in range(max_calls - 2):
        active = active & (b - a > tol * (1 + b))
        if not bool(active.any()):
            break
        left = fc < fd  # the minimum lies in [a, d]
        b = torch.where(active & left, d, b)
        a = torch.where(active & ~left, c, a)
        new_c, new_d = b - _R * (b - a), a + _R * (b - a)
        lam = torch.where(left, new_c, new_d)
        f = F(lam)
        d, fd = torch.where(active & left, c, d), torch.where(active & left, fc, fd)
        c, fc = torch.where(active & ~left, d, c), torch.where(active & ~left, fd, fc)
        c, fc = torch.where(active & left, lam, c), torch.where(active & left, f, fc)
        d, fd = torch.where(active & ~left, lam, d), torch.where(active & ~left, f, fd)
    return best.result()
