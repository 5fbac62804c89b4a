"""Bundle methods for regularized risk minimization (BMRM; Zhang et al., 2010, eq. 3-4).

    J(w) = lam/2 ||w||^2 + R(w),     J_t(w) = lam/2 ||w||^2 + max_{k <= t} (c_k - <w, g_k>),

with cuts ``(c_k, g_k)`` from a risk oracle (`torchssvm.optim.cutting_planes.risks`: any SSVM, the binary hinge, or a
max of linear functions). ``w_t = argmin J_t``; ``J_t(w_t) <= min J`` because the cuts under-estimate
``R``, so ``J(w) - J_t(w_t)`` certifies any ``w`` and BMRM's stopping gap is ``eps_t = min_{t' <= t}
J(w_{t'}) - J_t(w_t)`` (eq. 4). In the adjoint (eq. 10), over the simplex of cut weights ``alpha``:

    D_t(alpha) = sum_k alpha_k c_k - 1/(2 lam) ||sum_k alpha_k g_k||^2,   w(alpha) = (1/lam) sum_k alpha_k g_k.

Two forms:

- ``variant="qp"`` (qp-bmrm): the full QP over all cuts every iteration (`simplex_qp`, warm-started).
- ``variant="ls"`` (ls-bmrm): a line search between the current model and the newest cut. The cuts so
  far are aggregated into one, ``(c_bar, g_bar) = sum_k alpha_k (c_k, g_k)``, and only ``alpha`` on the
  segment [aggregate, new cut] is optimized, in closed form: memory ``O(d)``, and in the adjoint the
  Frank-Wolfe step with exact line search (for an SSVM: batch Frank-Wolfe on the dual, Osokin et al., 2016).

Cuts are dense ``(d,)`` vectors (the bundle is ``t x d``). One `step` is one risk evaluation (for an
SSVM: one oracle pass over the n examples) and one QP.
"""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from ..dual_solver import _check_lam
from ..solver import Solver
from .risks import StructuredRisk
from .simplex_qp import simplex_qp

VARIANTS = ("qp", "ls")


def as_risk(model, dataset=None, **kw):
    """A risk oracle (an object with ``cut``) as is, else `StructuredRisk` of ``(model, dataset)``."""
    if hasattr(model, "cut") and hasattr(model, "d"):
        if dataset is not None:
            raise ValueError("dataset must be None when model is a risk oracle")
        return model
    return StructuredRisk(model, dataset, **kw)


class BMRM(Solver):
    """``solver = BMRM(risk_or_model, dataset=None, lam=1e-2, variant="qp")``; ``solver.step()`` evaluates the
    risk at the current ``w`` (one pass), adds the cut and re-solves the model QP.

    Args:
        model: a risk oracle (`risks`), a `DualProblem`, or a linear model with ``dataset``.
        lam: the regularization ``lam > 0``.
        variant: ``"qp"`` or ``"ls"`` (see the module docstring).
        eps: BMRM's stopping gap: `fit` stops when ``eps_t <= eps`` (reported as ``converged``).
        qp_tol: Frank-Wolfe gap of the QP solve, relative to ``eps``.
        writer: a TensorBoard ``SummaryWriter`` or None.
        structure, backend: passed to `StructuredRisk`.

    Reports (`step`): ``primal`` ``J(w_t)`` and ``dual`` ``J_{t-1}(w_t)`` at the iterate the pass evaluated
    (``gap = primal - dual`` certifies ``w_t``; ``dual`` is ``-inf`` before the first cut), ``eps`` =
    ``min_t' J(w_t') - J_t(w_{t+1})`` (BMRM's gap, eq. 4, for the best iterate ``w_best``), ``cuts``,
    ``qp_iterations``, ``passes``, ``oracle_calls``, ``time``, ``converged``.
    """

    tag = "bmrm"

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, variant: str = "qp", eps: float = 1e-3,
                 qp_tol: float = 1e-3, writer=None, structure=None, backend: str = "auto"):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        for name, value in (("eps", eps), ("qp_tol", qp_tol)):
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        kw = {} if hasattr(model, "cut") else {"structure": structure, "backend": backend}
        self.risk = as_risk(model, dataset, **kw)
        self.lam, self.variant, self.eps, self.qp_tol = _check_lam(lam), variant, float(eps), float(qp_tol)
        # the QP's simplex kernels have torch and Triton forms only: "numba" (the oracles' compiled twins) leaves them
        # to "auto"
        self.backend, self.writer = (backend if backend in ("torch", "triton") else "auto"), writer
        r = self.risk
        self.n, self.d = r.n, r.d
        self.w = r.initial_w().to(torch.float64)
        self.w_best = self.w.clone()
        kw = {"dtype": torch.float64, "device": r.device}
        self.cuts = torch.zeros(0, r.d, **kw)  # g_k, (t, d); for "ls" the aggregate only
        self.offsets = torch.zeros(0, **kw)  # c_k
        self.alpha = torch.zeros(0, **kw)
        self.age = torch.zeros(0, dtype=torch.long, device=r.device)
        self.model_value = -math.inf  # J_t(w_{t+1}) after the last QP
        self.qp_solved = True  # whether the last QP reached its tolerance
        self.best_primal = math.inf
        self.oracle_calls = 0
        self.steps_done = 0
        self.seconds = 0.0
        self.qp_seconds = 0.0

    # -- the model QP ---------------------------------------------------------------------------
    def _model(self, alpha):
        """``(w(alpha), D(alpha))`` for the current bundle."""
        v = alpha @ self.cuts
        w = v / self.lam
        return w, float(alpha @ self.offsets) - 0.5 * float(v @ v) / self.lam

    def _solve_qp(self, with_zero_cut: bool = False):
        """Re-solve the adjoint over the bundle (warm start from ``alpha``); returns QP iterations."""
        t = self.cuts.shape[0]
        if self.variant == "ls" and t == 2:  # [aggregate, new]: closed-form line search
            g0, g1 = self.cuts[0], self.cuts[1]
            c0, c1 = float(self.offsets[0]), float(self.offsets[1])
            dg = g1 - g0
            curv = float(dg @ dg) / self.lam
            slope = (c1 - c0) - float(g0 @ dg) / self.lam
            eta = 1.0 if curv <= 0 else min(max(slope / curv, 0.0), 1.0)
            self.cuts = ((1 - eta) * g0 + eta * g1).unsqueeze(0)
            self.offsets = self.offsets.new_tensor([(1 - eta) * c0 + eta * c1])
            self.alpha = self.alpha.new_ones(1)
            self.age = self.age.new_zeros(1)
            return 1
        Q = self.cuts @ self.cuts.T / self.lam
        x0 = self.alpha if self.alpha.numel() == t else None
        tol = self.qp_tol * self.eps
        self.alpha, info = simplex_qp(Q, self.offsets, 1.0, x0, inequality=with_zero_cut, tol=tol,
                                      backend=self.backend)
        self.qp_solved = info["solved"]
        return info["iterations"]

    def _add_cut(self, c: float, g: torch.Tensor) -> None:
        self.cuts = torch.cat([self.cuts, g.to(self.cuts).unsqueeze(0)])
        self.offsets = torch.cat([self.offsets, self.offsets.new_tensor([c])])
        self.alpha = torch.cat([self.alpha, self.alpha.new_zeros(1)])
        self.age = torch.cat([self.age, self.age.new_zeros(1)])

    # -- one iteration --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        risk_value, c, g = self.risk.cut(self.w)
        self.oracle_calls += self.n
        primal = 0.5 * self.lam * float(self.w @ self.w) + risk_value
        dual = self.model_value
        if primal < self.best_primal:
            self.best_primal, self.w_best = primal, self.w.clone()
        self._add_cut(c, g)
        tq = time.perf_counter()
        qp_iter = self._solve_qp()
        self.qp_seconds += time.perf_counter() - tq
        self.w, self.model_value = self._model(self.alpha)
        self.risk.write_model(self.w)
        self.steps_done += 1
        self.seconds += time.perf_counter() - t0
        eps_t = self.best_primal - self.model_value
        r = {"primal": primal, "dual": dual, "gap": primal - dual, "gap_exact": True, "eps": eps_t,
             "best_primal": self.best_primal, "cuts": int(self.cuts.shape[0]), "qp_iterations": qp_iter,
             "passes": self.oracle_calls / self.n, "oracle_calls": self.oracle_calls, "time": self.seconds,
             "qp_seconds": self.qp_seconds, "converged": eps_t <= self.eps}
        self._log(r)
        return r

    # -- loop (`Solver`) -------------------------------------------------------------------------
    limit_name = "max_passes"
    requires_limit = False  # `fit` with no limit runs to BMRM's own stop, ``eps_t <= eps`` (``converged``)
    report_keys = ("primal", "dual", "gap", "eps", "passes", "oracle_calls", "cuts", "time")

    def _progress(self) -> float:
        return self.oracle_calls / self.n

    def fit(self, max_passes: Optional[float] = None, gap_tol: Optional[float] = None,
            time_budget: Optional[float] = None, *, callback=None) -> list:
        """Call `step` until a report is ``converged`` (``eps_t <= eps``), the certified gap of the
        evaluated iterate is ``<= gap_tol``, ``max_passes`` risk evaluations (from the start of training) or
        ``time_budget`` seconds are spent. Returns the reports; ``callback(report)`` after each. The model is left
        at ``w_best``, the evaluated iterate of lowest primal, whose gap both stops certify (``self.w`` stays the
        next iterate, so that `step` can go on). The loop is `Solver._fit` (a limit that stops the run short of
        ``gap_tol`` warns: `ConvergenceWarning`)."""
        return self._fit({"max_passes": max_passes, "gap_tol": gap_tol, "time_budget": time_budget},
                         callback=callback)

    def _after_fit(self) -> None:
        # The stops certify the best iterate: eps_t is its gap, and gap_t = J(w_t) - J_{t-1}(w_t) >= J(w_best) -
        # J_{t-1}(w_t) bounds its gap too; the last QP's w_{t+1} was never evaluated.
        self.risk.write_model(self.w_best)

    # -- state (`Solver`) ------------------------------------------------------------------------
    _state_tensors = ("w", "w_best", "cuts", "offsets", "alpha", "age")
    _state_scalars = ("model_value", "best_primal", "qp_solved", "oracle_calls", "steps_done", "seconds",
                      "qp_seconds")

    def _config(self) -> dict:
        """The settings a state is bound to (`_state.check_config`): its cuts are of this objective only."""
        return {"n": self.n, "d": self.d, "lam": self.lam, "variant": self.variant}

    def _state_shape(self, key: str, state: dict) -> tuple:
        t = state["cuts"].shape[0] if isinstance(state["cuts"], torch.Tensor) else -1  # the saved bundle's size
        return (self.d,) if key in ("w", "w_best") else ((t, self.d) if key == "cuts" else (t,))

    def _set_state(self, checked: dict) -> None:
        super()._set_state(checked)
        self.risk.write_model(self.w)
