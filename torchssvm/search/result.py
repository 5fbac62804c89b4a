"""What every search returns, and the bookkeeping the searches share."""

from __future__ import annotations

from typing import NamedTuple

import torch


class SearchResult(NamedTuple):
    """Per example: ``labels`` the best labelling found (the truth when none has ``Phi > 0``), its ``phi = h g``
    (>= 0), ``h`` and ``g``; ``calls (B,)`` oracle calls this search made (an oracle reused across searches keeps its
    running total in ``oracle.calls``); ``bound (B,)`` a certified upper bound on ``max_y Phi(y)`` (Choi et al.,
    2016, Lemma 5: ``K(lam)^2 / (4 lam)`` at a queried lambda, or the largest bound of the wedges angular search
    left open), so ``bound - phi`` is the search's gap."""

    labels: torch.Tensor
    phi: torch.Tensor
    h: torch.Tensor
    g: torch.Tensor
    calls: torch.Tensor
    bound: torch.Tensor


class Incumbent:
    """The best labelling so far per example, starting from the truth (``Phi = 0``)."""

    def __init__(self, oracle):
        B = oracle.batch_size
        self.oracle = oracle
        self.calls_before = oracle.calls.clone()
        self.labels = oracle.truth.clone()
        dev = oracle.calls.device
        self.phi = torch.zeros(B, dtype=torch.float64, device=dev)
        self.h = torch.ones(B, dtype=torch.float64, device=dev)
        self.g = torch.zeros(B, dtype=torch.float64, device=dev)
        self.bound = torch.full((B,), torch.inf, dtype=torch.float64, device=dev)

    def offer(self, ans, active: torch.Tensor) -> None:
        """Keep the answers of the ``active`` examples that beat the incumbent (``Phi > 0`` only)."""
        phi = torch.where((ans.h > 0) & (ans.g > 0), ans.h * ans.g, torch.zeros_like(ans.h))
        better = active & ans.found & (phi > self.phi)
        self.labels[better] = ans.labels[better]
        self.phi = torch.where(better, phi, self.phi)
        self.h = torch.where(better, ans.h, self.h)
        self.g = torch.where(better, ans.g, self.g)

    def certify(self, ans, lam: torch.Tensor, active: torch.Tensor) -> None:
        """Lemma 5 at a lambda-oracle answer: ``max_y Phi <= K^2 / (4 lam)``, ``K = max_y h + lam g``."""
        K = ans.h + lam * ans.g
        u = torch.where(lam > 0, K * K / (4 * lam), torch.full_like(K, torch.inf))
        self.bound = torch.where(active, torch.minimum(self.bound, u), self.bound)

    def result(self, bound=None) -> SearchResult:
        b = self.bound if bound is None else bound
        return SearchResult(self.oracle.labelling(self.labels), self.phi, self.h, self.g,
                            self.oracle.calls - self.calls_before,
                            torch.maximum(b, self.phi))
