"""The 1-slack cutting plane of SVM-struct (Yu & Joachims, 2008, Alg. 1; Joachims, Finley & Yu, 2009).

One slack ``xi`` for the whole training set; a cut ``(c, g)`` is the average over the examples of the
loss-augmented labellings' losses and joint-feature differences (`risks.StructuredRisk.cut`). The
working-set QP (OP3, in our ``lam`` convention; ``C = 1 / lam`` of Yu & Joachims's (2008) average-slack form)

    min_{w, xi >= 0}  lam/2 ||w||^2 + xi    s.t.  c_k - <w, g_k> <= xi  for every cut k in the working set,

is solved in its adjoint (OP2): ``max sum_k alpha_k c_k - 1/(2 lam) ||sum_k alpha_k g_k||^2`` over
``alpha >= 0, sum alpha <= 1`` (`simplex_qp` with ``inequality=True``; the slack coordinate is the cut
``xi >= 0``). A new cut enters only when ``c - <w, g> > xi + eps`` (the exit test of Alg. 1), and cuts
whose weight stayed 0 for ``inactive_after`` iterations leave (Yu & Joachims, 2008: 20). The QP's
value at ``w`` is a lower bound of the SSVM optimum, so every report's ``gap`` is a certificate.
"""

from __future__ import annotations

import math
import time

import torch

from .._state import check_close
from .bmrm import BMRM


class OneSlackCuttingPlane(BMRM):
    """``solver = OneSlackCuttingPlane(model, dataset, lam=1e-2, eps=1e-3)``; `step` runs one oracle pass and,
    when the cut is violated by more than ``eps``, adds it and re-solves the working-set QP; `fit` runs
    until no cut is added.

    Args: as `BMRM` (no ``variant``), plus ``inactive_after`` (0: never remove cuts).

    Reports: ``primal`` (exact, from the pass), ``dual`` (the working-set QP's value before the new cut),
    ``gap``, ``violation`` ``c - <w, g> - xi``, ``added``, ``cuts``, ``removed``, ``qp_iterations``,
    ``passes``, ``oracle_calls``, ``time``, ``converged`` (no cut added and the working-set QP solved: the
    primal is within ``eps`` of the QP's value, so ``gap <= eps``; a pass that adds no cut to an unsolved QP
    solves it further instead).
    """

    tag = "oneslack"

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, eps: float = 1e-3, inactive_after: int = 20,
                 qp_tol: float = 1e-3, writer=None, structure=None, backend: str = "auto"):
        if not isinstance(inactive_after, int) or isinstance(inactive_after, bool) or inactive_after < 0:
            raise ValueError(f"inactive_after must be an int >= 0, got {inactive_after!r}")
        super().__init__(model, dataset, lam, variant="qp", eps=eps, qp_tol=qp_tol, writer=writer,
                         structure=structure, backend=backend)
        self.inactive_after = inactive_after
        self.model_value = 0.0  # xi >= 0 alone: J_0(w) = lam/2 ||w||^2 >= 0 at w = 0

    def slack(self, w: torch.Tensor) -> float:
        """``xi(w) = max(0, max_k c_k - <w, g_k>)`` over the working set."""
        if self.cuts.shape[0] == 0:
            return 0.0
        return max(0.0, float((self.offsets - self.cuts @ w).max()))

    def _remove_inactive(self) -> int:
        if self.inactive_after == 0 or self.cuts.shape[0] == 0:
            return 0
        self.age = torch.where(self.alpha > 0, torch.zeros_like(self.age), self.age + 1)
        keep = self.age < self.inactive_after
        removed = int((~keep).sum())
        if removed:
            self.cuts, self.offsets = self.cuts[keep], self.offsets[keep]
            self.alpha, self.age = self.alpha[keep], self.age[keep]
        return removed

    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        w = self.w
        risk_value, c, g = self.risk.cut(w)
        self.oracle_calls += self.n
        primal = 0.5 * self.lam * float(w @ w) + risk_value
        dual = self.model_value
        if primal < self.best_primal:
            self.best_primal, self.w_best = primal, w.clone()
            self.best_cut, self.best_offset = g.to(self.best_cut).clone(), float(c)
        violation = risk_value - self.slack(w)
        added = violation > self.eps
        # without a new cut the pass certifies w only if the working-set QP was solved: otherwise go on solving it
        resolve = not added and not self.qp_solved and self.cuts.shape[0] > 0
        qp_iter, removed = 0, 0
        if added or resolve:
            if added:
                self._add_cut(c, g)
            tq = time.perf_counter()
            qp_iter = self._solve_qp(with_zero_cut=True)
            self.qp_seconds += time.perf_counter() - tq
            self.w, self.model_value = self._model(self.alpha)
            self.risk.write_model(self.w)
            removed = self._remove_inactive()
        self.steps_done += 1
        self.seconds += time.perf_counter() - t0
        r = {"primal": primal, "dual": dual, "gap": primal - dual, "gap_exact": True, "violation": violation,
             "added": int(added), "cuts": int(self.cuts.shape[0]), "removed": removed, "qp_iterations": qp_iter,
             "eps": self.best_primal - self.model_value, "best_primal": self.best_primal,
             "passes": self.oracle_calls / self.n, "oracle_calls": self.oracle_calls, "time": self.seconds,
             "qp_seconds": self.qp_seconds,
             # a NaN primal (or violation) certifies nothing: never converged
             "converged": not (added or resolve) and math.isfinite(primal) and math.isfinite(violation)}
        self._log(r)
        return r

    # -- state checks (`BMRM._check_consistency`) -------------------------------------------------
    def _bundle_size_ok(self, t: int, steps: int) -> bool:
        return t <= steps  # at most one cut per step; inactive cuts leave

    def _alpha_total(self) -> str:
        return "le"  # the slack coordinate takes the rest: sum alpha <= 1

    def _age_bound(self) -> int:
        return max(self.inactive_after, 1)  # inactive_after = 0: ages stay 0

    def _empty_model(self, c: dict) -> None:
        """No cut: the start (no cut added yet), or ``w = 0`` (every cut left with weight 0); ``xi >= 0`` alone."""
        w = c["w"]
        start = self.risk.initial_w().to(w)
        if not (torch.equal(w, start) or not bool(w.any())):
            check_close("w", w, start, 0.0, 1.0, "the start or 0 (no cut in the working set)")
        if c["model_value"] != 0.0:
            raise ValueError(f"state_dict['model_value'] must be 0 without cuts (xi >= 0 alone), got "
                             f"{c['model_value']!r}")
