"""GDMM for multi-label problems: a pairwise binary MRF over K labels (Yen et al., 2016).

`GDMM` builds this solver when its model is a `MultiLabelProblem` (``GDMM(problem, lam=..., rho=...)``; ``lam = 1 /
(C n)`` with the paper's C and the n examples, `GDMM.from_C` takes C). Every
example i has one unigram factor per label k (2 states) and one pairwise factor per edge e = (k, l) of the
structure (4 states 00, 01, 10, 11; "full" is the fully connected model of the paper). The scores are
``<W_k, x_i> + b_k`` for ``y_k = 1`` and ``v_e`` for ``(y_k, y_l) = (1, 1)``; every other state scores 0.

Duals (the shifted simplex of eq. 11, truth entry in ``[0, C]``, the others ``<= 0``, sum 0):

- unigram: 2 states, so one number ``a_ik in [0, C]``: ``alpha_ik(truth) = a``, ``alpha_ik(other) = -a``;
  with ``s_ik = 2 y_ik - 1`` the dual of state 1 is ``s_ik a_ik``, so ``W_k = sum_i x_i s_ik a_ik``,
  ``b_k = sum_i s_ik a_ik``.
- pairwise: ``beta_ie`` over the 4 states, ``v_e = sum_i beta_ie(11)``.

Both sides of the consistency constraint ``M beta_ie = alpha_ik`` are 2-vectors that sum to 0, so each
message is ``(-mu, mu)`` with the scalar ``mu = beta(1.) - s_ik a_ik + lam`` (``beta(1.)``: the mass of the
states with ``y_k = 1``) and ``||m||^2 = 2 mu^2``. The augmented Lagrangian (eq. 12) is
``L = G + rho sum (mu^2 - lam^2)`` with ``G = 1/2 (||W||^2 + ||b||^2 + ||v||^2) - sum_ik c_k a_ik`` (``c_k``:
the Hamming cost of label k).

One outer iteration (`step`):

1. unigram pass over the examples in a random order, ``batch_size`` examples at a time: the K unigram
   factors of one example share nothing (different columns of ``W``, different messages), so each gets its
   exact 1-D block minimization ``a <- clip(a - g / h, 0, C)``, ``g = s (<W_k, x_i> + b_k) - c_k - 2 rho s
   sum_e mu``, ``h = ||x_i||^2 + 1 + 2 rho deg_k``.
2. pairwise pass, the same way: the pairwise factors of one example share nothing either (different
   ``v_e``, different messages). ``bigram_update="step"`` (the default, the reference code's update):
   ``pair_steps`` projected steps with ``Q = 1 + 4 rho`` (an upper bound on the largest eigenvalue of the
   factor's Hessian ``e_11 e_11^T + 2 rho (M_1^T M_1 + M_2^T M_2)``), each followed by its exact line
   search. ``bigram_update="exact"``: the exact block minimization over the 4 states (that Hessian is not a
   multiple of the identity, so this is the small QP of `shifted_simplex_qp`). On Yeast neither was
   consistently faster (gdmm_findings.md).
3. the multiplier step ``lam += eta (beta(1.) - s a)`` on every edge side (``eta = 0``: Soft-BCFW).

Examples of one batch share ``W`` / ``b`` (unigram) or ``v`` (pairwise); their steps are scaled jointly by
the exact B x B box QP of the Lagrangian (as in the chain solver), so the Lagrangian never increases and
``batch_size = 1`` is the sequential algorithm.

The factorwise oracle over a factor's 2 or 4 states is exact and trivial; the search that matters is over
factors (Alg. 3 of the paper): ``fmo="exact"`` visits every factor of an example, ``fmo="sampled"`` visits
the active factors (nonzero dual) and one of ``nu`` random blocks of the others (Yen et al., 2016, "for
many binary factors, partition the factors and search one block"). The exact primal needs exact decoding
(`MultiLabel` enumerates, ``K <= 16``): for larger K, ``primal_every`` must be 0; training has no such limit.

The LP relaxation of a loopy (e.g. fully connected) model is not tight: GDMM converges to the optimum of
the relaxed SSVM, whose value is at least the exact optimum (and at least the exact primal at its own
``w``). On a tree (or no edges) the two coincide.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._validation import check_seed
from ...kernels import project_shifted_simplex
from ...structures.multilabel import MAX_ENUMERATION_LABELS
from .._state import check_range
from ..frank_wolfe.box_qp import box_qp
from ..problems import MultiLabelProblem
from .gdmm import GDMM
from .shifted_simplex_qp import shifted_simplex_qp

# state s = 2 y_k + y_l of a pairwise factor: the sign of its message on each side
_SIDE1 = (-1.0, -1.0, 1.0, 1.0)
_SIDE2 = (-1.0, 1.0, -1.0, 1.0)


class MultiLabelGDMM(GDMM, problem_type=MultiLabelProblem):
    """GDMM on a `MultiLabelProblem` (use ``GDMM(problem, ...)``, which returns this class).

    Takes the arguments of `GDMM` (``lam = 1 / (C n)`` over the n examples); ``model`` is the `MultiLabelProblem`
    (dataset None). ``bigram_search`` must stay ``"auto"`` (pairwise factors have 4 states); ``structure`` comes
    from the problem. And:

    Args:
        bigram_update: ``"step"`` (``pair_steps`` projected steps, each with its exact line search) or
            ``"exact"`` (the exact block minimization of each pairwise factor, `shifted_simplex_qp`).
        pair_steps: with ``bigram_update="step"``, projected steps per pairwise factor and pass.

    Reports as `GDMM`, with ``active_unigram`` / ``active_bigram`` the mean number of unigram / pairwise
    factors per example with a nonzero dual, and ``visits_unigram`` / ``visits_bigram`` the mean number of
    factors visited per example and pass.
    """

    def __init__(self, model, dataset=None, lam: Optional[float] = None, *, C: Optional[float] = None,
                 rho: float = 0.1, eta: float = 1.0,
                 fmo: str = "exact", nu: int = 1, batch_size: int = 1, bigram_search: str = "auto",
                 structure=None, primal_every: int = 1, drop_tol: float = 1e-12, seed: int = 0, writer=None,
                 backend: str = "auto", bigram_update: str = "step", pair_steps: int = 1):
        if not isinstance(model, MultiLabelProblem):
            raise TypeError(f"model must be a MultiLabelProblem, got {type(model).__name__}")
        if dataset is not None:
            raise ValueError("dataset must be None with a MultiLabelProblem (it holds the data)")
        if structure is not None:
            raise ValueError("structure must be None with a MultiLabelProblem (it holds its structure)")
        if backend != "auto":
            raise ValueError(f"backend={backend!r} applies to chains only (multi-label decoding enumerates)")
        if not isinstance(pair_steps, int) or isinstance(pair_steps, bool) or pair_steps < 1:
            raise ValueError(f"pair_steps must be an int >= 1, got {pair_steps!r}")
        if pair_steps != 1 and bigram_update != "step":
            raise ValueError(f"pair_steps={pair_steps} needs bigram_update='step' (the exact update has no steps)")
        if bigram_search != "auto":
            raise ValueError(f"bigram_search={bigram_search!r} applies to chains only; pairwise multi-label "
                             "factors have 4 states")
        self._check_args(lam, C, rho, eta, fmo, nu, batch_size, primal_every, drop_tol, bigram_update)
        self.bigram_update = bigram_update
        p = self.problem = model
        if p.structure.class_weights is not None:
            raise ValueError("GDMM needs a Hamming loss without class weights")
        if primal_every and p.K > MAX_ENUMERATION_LABELS:
            raise ValueError(f"primal_every must be 0 for K = {p.K} > {MAX_ENUMERATION_LABELS}: the exact primal "
                             "needs exact decoding (MultiLabel enumerates 2^K labellings)")
        if nu > p.K or (p.E and nu > p.E):  # the blocks split the labels and the pairs: none may be empty
            raise ValueError(f"nu must be <= K = {p.K}" + (f" and <= E = {p.E}" if p.E else "") +
                             f" (nu blocks split the labels and the pairs), got {nu}")
        self.fmo, self.nu, self.batch_size = fmo, nu, batch_size
        self.primal_every, self.drop_tol, self.writer = primal_every, float(drop_tol), writer
        self.K, self.n, self.device, self.E = p.K, p.n, p.device, p.E
        self._set_regularization()
        f64, dev = torch.float64, self.device
        self.x = p.x.to(f64)
        self.x_sqnorm = (self.x * self.x).sum(1) + (1.0 if p.bias else 0.0)
        y = p.truth
        self.sign = (2 * y - 1).to(f64)  # s_ik
        self.cost = p.structure.label_costs(y, f64)  # c_ik (the same for every i without class weights)
        self.pairs = p.structure.edges.to(dev)
        k1, k2 = self.pairs[:, 0], self.pairs[:, 1]
        self.deg = torch.zeros(self.K, dtype=f64, device=dev)
        self.deg.index_add_(0, self.pairs.reshape(-1), torch.ones(2 * self.E, dtype=f64, device=dev))
        self.truth_pair = 2 * y[:, k1] + y[:, k2] if self.E else y.new_zeros(self.n, 0)  # (n, E) state index
        self.side1 = torch.tensor(_SIDE1, dtype=f64, device=dev)
        self.side2 = torch.tensor(_SIDE2, dtype=f64, device=dev)

        self.a = torch.zeros(self.n, self.K, dtype=f64, device=dev)
        self.beta = torch.zeros(self.n, self.E, 4, dtype=f64, device=dev)
        self.lam1 = torch.zeros(self.n, self.E, dtype=f64, device=dev)
        self.lam2 = torch.zeros(self.n, self.E, dtype=f64, device=dev)
        self.W = torch.zeros(p.D, self.K, dtype=f64, device=dev)
        self.b = torch.zeros(self.K, dtype=f64, device=dev)
        self.v = torch.zeros(self.E, dtype=f64, device=dev)
        self.generator = torch.Generator(device="cpu").manual_seed(check_seed(seed))
        self.label_blocks = torch.randperm(self.K, generator=self.generator).to(dev).tensor_split(nu)
        self.pair_blocks = torch.randperm(self.E, generator=self.generator).to(dev).tensor_split(nu)
        self.pair_steps = pair_steps
        self.index = None
        self.iterations, self.seconds = 0, 0.0
        self.eta_total = 0.0  # sum of eta over the iterations: the multipliers' bound (`_check_multipliers`)
        self.fmo_calls = {"unigram": 0, "bigram": 0}
        self.fmo_visits = {"unigram": 0, "bigram": 0}
        self.inner = {"bigram": 0}
        self.last_primal = None
        self._write_model()

    # -- w(alpha) -------------------------------------------------------------------------------
    def flat_w(self) -> torch.Tensor:
        """``w = [W (D K, row-major) | b | v]`` in `MultiLabelProblem`'s layout."""
        parts = [self.W.reshape(-1)]
        if self.problem.bias:
            parts.append(self.b)
        if self.E:
            parts.append(self.v)
        return torch.cat(parts).to(self.problem.dtype)

    # -- messages -------------------------------------------------------------------------------
    def _messages(self, ex: torch.Tensor):
        """``mu1, mu2 (B, E)``: the scalar messages of both sides of every pairwise factor of examples ``ex``."""
        beta = self.beta[ex]
        alpha1 = self.sign[ex] * self.a[ex]  # the dual of state 1 of each unigram factor
        mu1 = beta[..., 2] + beta[..., 3] - alpha1[:, self.pairs[:, 0]] + self.lam1[ex]
        mu2 = beta[..., 1] + beta[..., 3] - alpha1[:, self.pairs[:, 1]] + self.lam2[ex]
        return mu1, mu2

    def _block_mask(self, active: torch.Tensor, blocks) -> torch.Tensor:
        """Factors to visit: every one (exact), or the active ones and one random block (sampled)."""
        if self.fmo == "exact":
            return torch.ones_like(active)
        block = blocks[int(torch.randint(self.nu, (1,), generator=self.generator))]
        visit = active.clone()
        visit[:, block] = True
        return visit

    # -- the two passes -------------------------------------------------------------------------
    def _update_unigrams(self, ex: torch.Tensor) -> None:
        B, K = ex.shape[0], self.K
        a, s = self.a[ex], self.sign[ex]
        x = self.x[ex]
        theta = x @ self.W + (self.b if self.problem.bias else 0.0)
        msg = torch.zeros(B, K, dtype=torch.float64, device=self.device)
        if self.E:
            mu1, mu2 = self._messages(ex)
            msg.index_add_(1, self.pairs[:, 0], mu1).index_add_(1, self.pairs[:, 1], mu2)
        g = s * theta - self.cost[ex] - 2.0 * self.rho * s * msg
        h = self.x_sqnorm[ex].unsqueeze(1) + 2.0 * self.rho * self.deg
        visit = self._block_mask(a > 0, self.label_blocks)
        self.fmo_calls["unigram"] += B
        self.fmo_visits["unigram"] += int(visit.sum())
        d = ((a - g / h).clamp(0.0, self.C) - a) * visit
        if B > 1:
            dal = s * d  # the step of each state-1 dual
            gram = x @ x.t() + (1.0 if self.problem.bias else 0.0)
            H = gram * (dal @ dal.t())
            H.diagonal().add_(2.0 * self.rho * (d * d * self.deg).sum(1))
            gamma = box_qp(-(g * d).sum(1), H, torch.ones(B, dtype=torch.float64, device=self.device))
            d = d * gamma.unsqueeze(1)
        dal = s * d
        self.W.add_(x.t() @ dal)
        if self.problem.bias:
            self.b.add_(dal.sum(0))
        a = a + d
        self.a[ex] = a.masked_fill(a.abs() <= self.drop_tol, 0.0)

    def _update_pairs(self, ex: torch.Tensor) -> None:
        B = ex.shape[0]
        beta, top = self.beta[ex], self.truth_pair[ex]
        mu1, mu2 = self._messages(ex)
        g = self.rho * (mu1.unsqueeze(2) * self.side1 + mu2.unsqueeze(2) * self.side2)
        g[..., 3] += self.v
        visit = self._block_mask((beta != 0).any(2), self.pair_blocks)
        self.fmo_calls["bigram"] += B
        self.fmo_visits["bigram"] += int(visit.sum())
        if self.bigram_update == "exact":
            flat = (B * self.E, 4)
            mask = visit.reshape(-1, 1).expand(flat)
            d, info = shifted_simplex_qp(beta.reshape(flat), g.reshape(flat), self._pair_hessian(), mask,
                                         top.reshape(-1), self.C)
            d = d.view_as(beta)
            self.inner["bigram"] += int(info["iterations"].sum())
        else:
            d = self._pair_steps(beta, g, top, visit)
        if B > 1:
            d11 = d[..., 3]
            r1, r2 = d[..., 2] + d[..., 3], d[..., 1] + d[..., 3]
            H = d11 @ d11.t()
            H.diagonal().add_(2.0 * self.rho * (r1 * r1 + r2 * r2).sum(1))
            gamma = box_qp(-(g * d).sum((1, 2)), H, torch.ones(B, dtype=torch.float64, device=self.device))
            d = d * gamma.view(B, 1, 1)
        self.v.add_(d[..., 3].sum(0))
        beta = beta + d
        self.beta[ex] = beta.masked_fill(beta.abs() <= self.drop_tol, 0.0)

    def _pair_hessian(self) -> torch.Tensor:
        """``e_11 e_11^T + 2 rho (M_1^T M_1 + M_2^T M_2)`` (4, 4): the Hessian of the Lagrangian along one pairwise
        factor's dual (``M_1 = (0, 0, 1, 1)``, ``M_2 = (0, 1, 0, 1)``: the states with ``y_k = 1``, ``y_l = 1``)."""
        m1, m2 = (self.side1 + 1) / 2, (self.side2 + 1) / 2
        H = 2.0 * self.rho * (torch.outer(m1, m1) + torch.outer(m2, m2))
        H[3, 3] += 1.0
        return H

    def _pair_steps(self, beta, g, top, visit):
        """``pair_steps`` projected steps on each visited factor's own quadratic, each with its exact line search;
        returns their sum ``d (B, E, 4)``."""
        Q = 1.0 + 4.0 * self.rho
        flat = (beta.shape[0] * self.E, 4)
        radius = torch.full((flat[0],), self.C, dtype=torch.float64, device=self.device)
        top_flat = top.reshape(-1)
        mask = visit.unsqueeze(2)
        d = torch.zeros_like(beta)
        for _ in range(self.pair_steps):
            new = project_shifted_simplex((beta + d - g / Q).reshape(flat), top_flat, None, radius, backend="torch")
            step = (new.view_as(beta) - beta - d) * mask
            r1, r2 = step[..., 2] + step[..., 3], step[..., 1] + step[..., 3]
            curv = step[..., 3] ** 2 + 2.0 * self.rho * (r1 * r1 + r2 * r2)
            slope = (g * step).sum(2)
            t = torch.where(curv > 0, (-slope / curv.clamp_min(1e-300)).clamp(0.0, 1.0), torch.ones_like(curv))
            step = step * t.unsqueeze(2)
            d = d + step
            r1, r2 = step[..., 2] + step[..., 3], step[..., 1] + step[..., 3]
            g = g + self.rho * (r1.unsqueeze(2) * self.side1 + r2.unsqueeze(2) * self.side2)
            g[..., 3] += step[..., 3]
        return d

    @torch.no_grad()
    def _residuals(self, ex: torch.Tensor):
        mu1, mu2 = self._messages(ex)
        return mu1 - self.lam1[ex], mu2 - self.lam2[ex]

    @torch.no_grad()
    def _multiplier_step(self, chunk: int = 4096) -> float:
        """``lam += eta (beta(1.) - s a)`` on both sides of every pairwise factor; returns the mean L1 norm of
        the residual 2-vector per side (``2 |r|``)."""
        if not self.E:
            return 0.0
        total = 0.0
        for s in range(0, self.n, chunk):
            ex = torch.arange(s, min(s + chunk, self.n), device=self.device)
            r1, r2 = self._residuals(ex)
            total += 2.0 * float(r1.abs().sum() + r2.abs().sum())
            if self.eta:
                self.lam1[ex] += self.eta * r1
                self.lam2[ex] += self.eta * r2
        return total / (2 * self.n * self.E)

    # -- objectives -----------------------------------------------------------------------------
    def dual_objective(self) -> float:
        """``G = 1/2 (||W||^2 + ||b||^2 + ||v||^2) - sum_ik c_k a_ik`` (C form)."""
        sq = float((self.W * self.W).sum() + (self.v * self.v).sum())
        if self.problem.bias:
            sq += float((self.b * self.b).sum())
        return 0.5 * sq - float((self.cost * self.a).sum())

    def lagrangian(self, chunk: int = 4096) -> float:
        """``L = G + rho sum (mu^2 - lam^2)`` over both sides of every pairwise factor (eq. 12)."""
        extra = 0.0
        for s in range(0, self.n if self.E else 0, chunk):
            ex = torch.arange(s, min(s + chunk, self.n), device=self.device)
            mu1, mu2 = self._messages(ex)
            extra += float((mu1 ** 2 + mu2 ** 2 - self.lam1[ex] ** 2 - self.lam2[ex] ** 2).sum())
        return self.dual_objective() + self.rho * extra

    # -- loop (`GDMM.step` calls these) ----------------------------------------------------------
    def _passes(self) -> None:
        """The unigram pass, then the pairwise pass, over the examples in random orders."""
        B = self.batch_size
        for chunk in torch.randperm(self.n, generator=self.generator).to(self.device).split(B):
            self._update_unigrams(chunk)
        if self.E:
            for chunk in torch.randperm(self.n, generator=self.generator).to(self.device).split(B):
                self._update_pairs(chunk)

    def _active_sizes(self) -> dict:
        return {"active_unigram": float((self.a != 0).sum()) / self.n,
                "active_bigram": float((self.beta != 0).any(2).sum()) / self.n}

    # -- certificates -----------------------------------------------------------------------------
    def _tight(self) -> bool:
        """The local relaxation is exact on a forest of label pairs only: on a loopy structure (``"full"``) the
        dual of a feasible iterate bounds the relaxed SSVM, whose optimum may exceed the exact one, and the exact
        primal at ``w`` may fall below it (``gap_estimate < 0``)."""
        parent = list(range(self.K))

        def root(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for k, l in self.pairs.tolist():
            a, b = root(k), root(l)
            if a == b:
                return False
            parent[a] = b
        return True

    # -- state ----------------------------------------------------------------------------------
    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """``a`` in ``[0, C]``; each ``beta_ie`` on its shifted simplex (truth state in ``[0, C]``, the others
        ``<= 0``, sum 0); ``W = sum_i x_i (s_i a_i)^T``, ``b = sum_i s_i a_i`` and ``v = sum_i beta_i(11)``
        recomputed; the multipliers 0 with ``eta_total = 0``, else bounded by ``4 C eta_total`` (a scalar per side)."""
        C = c["C"]
        check_range("a", c["a"], 0.0, C, tol=1e-9 * C, what="a unigram dual lies in [0, C]")
        if self.E:
            self._check_shifted_simplex("beta", None, c["beta"], 4, C, top=self.truth_pair)
        dal = self.sign * c["a"]
        rec = {"W": self.x.t() @ dal, "v": c["beta"][..., 3].sum(0),
               "b": dal.sum(0) if self.problem.bias else torch.zeros_like(self.b)}
        drops = self.drop_tol * c["iterations"]
        self._check_tables(c, rec, C, {"W": drops * float(self.x.abs().sum(0).max()) if self.x.numel() else 0.0,
                                       "v": drops * self.n, "b": drops * self.n})
        self._check_multipliers(c, ("lam1", "lam2"), rows_sum_zero=False)

    _state_tensors = ("a", "beta", "lam1", "lam2", "W", "b", "v")
    _sparse_state = ()
    _block_orders = ("label_blocks", "pair_blocks")
