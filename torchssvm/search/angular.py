"""Angular search, Algorithm 2 of Choi et al. (2016), reconstructed from the paper's text (its pseudocode box is
missing) and checked against brute force by the tests, batched across examples: one constrained-oracle call per
example per round.

A wedge ``(alpha, beta)`` holds the labellings whose slope ``g / h`` lies between ``beta`` and ``alpha``
(``h, g > 0``). Querying it at ``lam = 1 / sqrt(alpha beta)`` returns ``z``, the best ``h + lam g`` inside
(or nothing: the wedge is dropped). ``z`` and its mirror ``z' = (lam g(z), h(z) / lam)`` split the wedge
at the slope ``gamma = 1 / lam`` into two children ``(s_hi, gamma)`` and ``(gamma, s_lo)`` (``s_hi``,
``s_lo``: the larger and smaller of the slopes of z and z'); Lemma 8 makes dropping the slopes outside
``[s_lo, s_hi]`` safe and makes both outer rays open (z is never returned again); the shared ray is
closed in one child only. Every label in the wedge has ``Phi <= U = (h(z) + lam g(z))^2 / (4 lam)``
(AM-GM and the constrained argmax), the children's bound. Wedges whose bound is at most the incumbent
are skipped without a call; the search stops when the incumbent reaches ``tol`` times the largest open
bound (the paper's 0.999 stop; ``tol=1`` is exact, at most ``2M + 1`` calls by Thm 2).

Queue order: ``"fifo"`` (breadth first, the order Thm 4's anytime bound needs) or ``"priority"`` (the
largest bound first, the paper's suggestion).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from typing import Optional

import torch

from .._validation import check_positive_int
from .arguments import check_per_example
from .result import Incumbent, SearchResult

QUEUES = ("fifo", "priority")


class _Wedge:
    """Slopes between the rays through the points ``alpha = (h, g)`` and ``beta``, with the multiplier
    ``lam = 1 / sqrt(slope(alpha) slope(beta))`` it is queried at and the bound ``ub`` on Phi inside."""

    __slots__ = ("ub", "alpha", "a_closed", "beta", "b_closed", "lam")

    def __init__(self, ub, alpha, a_closed, beta, b_closed):
        self.ub, self.alpha, self.a_closed, self.beta, self.b_closed = ub, alpha, a_closed, beta, b_closed
        self.lam = 1.0 / math.sqrt((alpha[1] / alpha[0]) * (beta[1] / beta[0])) if alpha[0] > 0 else None

    def empty(self) -> bool:
        lhs, rhs = self.alpha[1] * self.beta[0], self.beta[1] * self.alpha[0]  # slope(alpha) vs slope(beta)
        return lhs < rhs or (lhs == rhs and not (self.a_closed and self.b_closed))


class _Queue:
    def __init__(self, kind: str):
        self.kind, self.items, self.tick = kind, (deque() if kind == "fifo" else []), itertools.count()

    def push(self, w: _Wedge) -> None:
        if self.kind == "fifo":
            self.items.append(w)
        else:
            heapq.heappush(self.items, (-w.ub, next(self.tick), w))

    def pop(self) -> _Wedge:
        return self.items.popleft() if self.kind == "fifo" else heapq.heappop(self.items)[2]

    def max_ub(self) -> float:
        if not self.items:
            return 0.0
        return -self.items[0][0] if self.kind == "priority" else max(w.ub for w in self.items)

    def __len__(self) -> int:
        return len(self.items)


def angular_search(oracle, *, lam0: Optional[torch.Tensor] = None, queue: str = "fifo", tol: float = 0.999,
                   max_calls: Optional[int] = None, cache: Optional[torch.Tensor] = None) -> SearchResult:
    """Args:
        oracle: a `TableOracle` (the constrained lambda-oracle is needed).
        lam0: ``(B,)`` first multipliers; default ``H_hat / G_hat`` (the largest margin violation over the
            largest loss; 1 where either is not positive).
        queue: ``"fifo"`` or ``"priority"``.
        tol: stop once the incumbent is at least ``tol`` times every open wedge's bound (in (0, 1]).
        max_calls: oracle calls per example at most (None: until the queue is exhausted or ``tol`` holds;
            for a `TableOracle` of N labellings at most ``2 N + 1``, Thm 2's bound).
        cache: a label cache (Choi et al., 2016), ``(B, C)`` long column indices of the oracle's
            table (-1: empty slot), e.g. earlier most violating labellings (a cutting plane's working
            set). The best of them under the current potentials starts as the incumbent (no oracle
            call), so every wedge whose bound it reaches is discarded unvisited.

    ``bound`` of the result is the largest bound of the wedges left unvisited, whether still open (``max_calls``)
    or closed because the incumbent is within ``tol`` of them (the incumbent when there are none); so
    ``phi <= max_y Phi <= bound`` and, when ``tol`` stopped the search, ``phi >= tol * bound``.
    """
    if queue not in QUEUES:
        raise ValueError(f"queue must be one of {QUEUES}, got {queue!r}")
    if not 0 < tol <= 1:
        raise ValueError(f"tol must be in (0, 1], got {tol}")
    if max_calls is not None:
        check_positive_int("max_calls", max_calls, minimum=0)
    best = Incumbent(oracle)
    B = oracle.batch_size
    dev = best.phi.device
    if cache is not None:
        best.offer(oracle.at(cache), torch.ones(B, dtype=torch.bool, device=dev))
    if lam0 is None:
        H, G = oracle.max_h().to(torch.float64), oracle.max_g().to(torch.float64)
        lam0 = torch.where((H > 0) & (G > 0), H / G.clamp_min(1e-300), torch.ones_like(H))
    else:
        lam0 = check_per_example("lam0", lam0, B, dev, positive=True)
    lam0 = lam0.to(torch.float64).cpu().tolist()
    if max_calls is None and hasattr(oracle, "size"):
        max_calls = 2 * oracle.size + 1  # Thm 2's bound: a guard against rounding, never reached in exact arithmetic
    queues = [_Queue(queue) for _ in range(B)]
    for b in range(B):
        root = _Wedge(math.inf, (0.0, 1.0), True, (1.0, 0.0), False)  # every slope in (0, inf]
        root.lam = float(lam0[b])
        queues[b].push(root)
    phi = best.phi.cpu().tolist()
    calls = [0] * B
    closed_ub = [0.0] * B  # the largest bound of the wedges closed by ``tol``: it stays part of the certificate
    while True:
        picked = {}
        for b in range(B):
            q = queues[b]
            if max_calls is not None and calls[b] >= max_calls:
                continue
            if len(q) and phi[b] > 0 and phi[b] >= tol * q.max_ub():
                closed_ub[b] = max(closed_ub[b], q.max_ub())
                q.items.clear()  # the incumbent is within tol of every open bound: done
            while len(q):
                w = q.pop()
                if w.ub > phi[b]:  # a wedge whose bound the incumbent reaches holds nothing better
                    picked[b] = w
                    break
        if not picked:
            break
        rows = list(picked)
        active = torch.zeros(B, dtype=torch.bool)
        active[rows] = True
        lam = torch.ones(B, dtype=torch.float64)
        alpha = torch.tensor([[0.0, 1.0]], dtype=torch.float64).repeat(B, 1)
        beta = torch.tensor([[1.0, 0.0]], dtype=torch.float64).repeat(B, 1)
        a_closed, b_closed = torch.ones(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool)
        for b, w in picked.items():
            lam[b], a_closed[b], b_closed[b] = w.lam, w.a_closed, w.b_closed
            alpha[b] = torch.tensor(w.alpha, dtype=torch.float64)
            beta[b] = torch.tensor(w.beta, dtype=torch.float64)
        to = dict(device=dev)
        active = active.to(**to)
        ans = oracle.constrained(lam.to(**to), alpha.to(**to), beta.to(**to), alpha_closed=a_closed.to(**to),
                                 beta_closed=b_closed.to(**to), active=active)
        best.offer(ans, active)
        h, g, found = ans.h.cpu().tolist(), ans.g.cpu().tolist(), ans.found.cpu().tolist()
        for b, w in picked.items():
            calls[b] += 1
            if not found[b]:
                continue
            phi[b] = max(phi[b], h[b] * g[b])
            lam_b = w.lam
            z, mirror = (h[b], g[b]), (lam_b * g[b], h[b] / lam_b)  # z' = (lam g(z), h(z) / lam)
            P, Q = (z, mirror) if lam_b * g[b] > h[b] else (mirror, z)  # P: the larger slope
            R = (lam_b, 1.0)  # slope 1 / lam
            K = h[b] + lam_b * g[b]
            ub = K * K / (4 * lam_b)
            if ub <= phi[b]:
                continue
            for child in (_Wedge(ub, P, False, R, False), _Wedge(ub, R, True, Q, False)):
                if not child.empty():
                    queues[b].push(child)
    bound = torch.tensor([max(phi[b], closed_ub[b], queues[b].max_ub()) for b in range(B)], dtype=torch.float64,
                         device=dev)
    return best.result(bound)
