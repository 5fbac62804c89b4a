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

from .._state import AGE_CAUSE, check_close, check_range
from ..dual_solver import _check_lam
from ..problems import DualProblem, rescaling_of
from ..solver import Solver
from .risks import StructuredRisk
from .simplex_qp import simplex_qp

VARIANTS = ("qp", "ls")


def _scalar(x) -> torch.Tensor:
    return torch.tensor(float(x), dtype=torch.float64)


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
    ``qp_iterations``, ``passes``, ``oracle_calls``, ``time``, ``converged`` (never on a NaN primal or ``eps``).

    State (`state_dict`): the bundle (``cuts``, ``offsets``, ``alpha``, ``age``), ``w``, ``model_value``, the best
    iterate with the cut made there (``w_best``, ``best_primal``, ``best_cut``, ``best_offset``), the counters and
    the data's fingerprint; `load_state_dict` recomputes the identities between them (`_check_consistency`).
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
        # the cut made at w_best, tight there: best_primal = lam/2 ||w_best||^2 + best_offset - <w_best, best_cut>,
        # which a loaded state must satisfy (`_check_consistency`)
        self.best_cut = torch.zeros(r.d, **kw)
        self.best_offset = 0.0
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
            self.best_cut, self.best_offset = g.to(self.best_cut).clone(), float(c)
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
             "qp_seconds": self.qp_seconds, "converged": bool(eps_t <= self.eps)}  # False on NaN
        self._log(r)
        return r

    # -- loop (`Solver`) -------------------------------------------------------------------------
    limit_name = "max_passes"
    requires_limit = False  # `fit` with no limit runs to BMRM's own stop, ``eps_t <= eps`` (``converged``)
    report_keys = ("primal", "dual", "gap", "eps", "passes", "oracle_calls", "cuts", "time")

    def _progress(self) -> float:
        return self.oracle_calls / self.n

    def fit(self, max_passes: Optional[float] = None, gap_tol: Optional[float] = None,
            time_budget: Optional[float] = None, *, callback=None, checkpoint=None, checkpoint_every: int = 1) -> list:
        """Call `step` until a report is ``converged`` (``eps_t <= eps``), the certified gap of the
        evaluated iterate is ``<= gap_tol``, ``max_passes`` risk evaluations (from the start of training) or
        ``time_budget`` seconds are spent. Returns the reports; ``callback(report)`` after each. The model is left
        at ``w_best``, the evaluated iterate of lowest primal, whose gap both stops certify (``self.w`` stays the
        next iterate, so that `step` can go on). The loop is `Solver._fit` (a limit that stops the run short of
        ``gap_tol`` warns: `ConvergenceWarning`; ``checkpoint``: resume from / write that file)."""
        return self._fit({"max_passes": max_passes, "gap_tol": gap_tol, "time_budget": time_budget},
                         callback=callback, checkpoint=checkpoint, checkpoint_every=checkpoint_every)

    def _after_fit(self) -> None:
        # The stops certify the best iterate: eps_t is its gap, and gap_t = J(w_t) - J_{t-1}(w_t) >= J(w_best) -
        # J_{t-1}(w_t) bounds its gap too; the last QP's w_{t+1} was never evaluated.
        self.risk.write_model(self.w_best)

    # -- state (`Solver`) ------------------------------------------------------------------------
    _state_tensors = ("w", "w_best", "best_cut", "cuts", "offsets", "alpha", "age")
    _state_scalars = ("model_value", "best_primal", "best_offset", "qp_solved", "oracle_calls", "steps_done",
                      "seconds", "qp_seconds")
    # the rounding between identities the state keeps, relative to their scale: w and model_value are recomputed from
    # alpha and the cuts by the same operations (0 on the CPU); best_primal sums the risk pass's terms in another
    # order (best_rtol)
    consistency_rtol = 1e-12
    best_rtol = 1e-10

    def _config(self) -> dict:
        """The settings a state is bound to (`_state.check_config`): its cuts are of this objective only (a cut of
        the margin-rescaled risk does not bound the slack-rescaled one from below, nor the reverse)."""
        problem = getattr(self.risk, "problem", None)
        rescaling = rescaling_of(problem) if isinstance(problem, DualProblem) else None
        return {"n": self.n, "d": self.d, "lam": self.lam, "variant": self.variant, "rescaling": rescaling}

    def _sealed(self) -> tuple:
        # a cut (g_k, c_k) bounds the risk from below because it was made by the oracle at some w; the state keeps no
        # labellings to make it again, so the cuts are sealed: w, model_value and best_primal are recomputed from them
        return ("cuts", "offsets", "best_cut", "best_offset")

    def _state_shape(self, key: str, state: dict) -> tuple:
        t = state["cuts"].shape[0] if isinstance(state["cuts"], torch.Tensor) else -1  # the saved bundle's size
        return (self.d,) if key in ("w", "w_best", "best_cut") else ((t, self.d) if key == "cuts" else (t,))

    def _data(self) -> dict:
        """The risk's data (`risks`); a risk oracle of the user's without ``fingerprint_data``: none."""
        data = getattr(self.risk, "fingerprint_data", None)
        return data() if data is not None else {}

    def _bundle_size_ok(self, t: int, steps: int) -> bool:
        """Whether a bundle of ``t`` cuts can follow ``steps`` steps: one cut per step ("ls": the aggregate)."""
        return t == min(steps, 1) if self.variant == "ls" else t == steps

    def _alpha_total(self) -> str:
        return "eq"  # qp-bmrm's weights sum to 1 (the 1-slack solver's to at most 1)

    def _age_bound(self) -> int:
        return 1  # ages stay 0 (the 1-slack solver ages and drops cuts)

    def _empty_model(self, c: dict) -> None:
        """``w`` and ``model_value`` of a state without cuts: the start."""
        check_close("w", c["w"], self.risk.initial_w().to(c["w"]), 0.0, 1.0, "the starting point (no cut yet)")
        if c["model_value"] != -math.inf:
            raise ValueError(f"state_dict['model_value'] must be -inf before the first cut, got {c['model_value']!r}")

    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """The identities of the bundle, recomputed without an oracle (Zhang et al., 2010, eq. 10): one cut per step
        and ``oracle_calls = n steps``; offsets ``c_k`` in the risk's range (`offset_range`); ``alpha`` in the
        simplex (qp-bmrm: ``sum = 1``; 1-slack: ``<= 1``); ``w = (1/lam) sum_k alpha_k g_k`` and ``model_value =
        sum_k alpha_k c_k - 1/(2 lam) ||sum_k alpha_k g_k||^2``; ``best_primal = lam/2 ||w_best||^2 + best_offset -
        <w_best, best_cut>`` (the cut made at w_best is tight there), at least ``model_value`` (weak duality) and at
        least the bundle's model at w_best (the cuts under-estimate the risk); ages as `_remove_inactive` leaves
        them."""
        rtol, lam, n = self.consistency_rtol, self.lam, self.n
        w, w_best, cuts, offsets, alpha, age = (c[k] for k in ("w", "w_best", "cuts", "offsets", "alpha", "age"))
        t, steps = cuts.shape[0], c["steps_done"]
        if c["oracle_calls"] != steps * n:
            raise ValueError(f"state_dict['oracle_calls'] = {c['oracle_calls']} is not n steps_done = {steps * n} (one "
                             "risk evaluation of n examples per step)")
        if not self._bundle_size_ok(t, steps):
            raise ValueError(f"state_dict['cuts'] holds {t} cuts, which {steps} steps of this solver cannot leave")
        if not 0.0 <= c["qp_seconds"] <= c["seconds"] * (1 + 1e-9) + 1e-9:
            raise ValueError(f"state_dict['qp_seconds'] = {c['qp_seconds']!r} must lie in [0, seconds]")
        for key in ("w", "w_best", "best_cut", "cuts", "offsets", "alpha"):
            if not bool(torch.isfinite(c[key]).all()):
                raise ValueError(f"state_dict[{key!r}] holds Inf: the state is corrupt")
        offset_range = getattr(self.risk, "offset_range", None)
        lo, hi = offset_range() if offset_range is not None else (-math.inf, math.inf)
        top = max(abs(lo), abs(hi), 1.0) if math.isfinite(lo) and math.isfinite(hi) else 1.0
        check_range("offsets", offsets, lo, hi, tol=rtol * top, what="the range of the risk's cut offsets")
        check_range("alpha", alpha, 0.0, 1.0, tol=rtol, what="the cuts' weights lie in the simplex")
        total = float(alpha.sum())
        if t and (abs(total - 1.0) > rtol * max(t, 1) if self._alpha_total() == "eq" else total > 1.0 + rtol * t):
            raise ValueError(f"state_dict['alpha'] sums to {total!r}, not " +
                             ("1" if self._alpha_total() == "eq" else "at most 1") + ": the state is corrupt")
        bound = self._age_bound()
        check_range("age", age.to(torch.float64), 0, bound - 1, what=f"ages lie in [0, {bound - 1}]",
                    **({"cause": AGE_CAUSE} if hasattr(self, "inactive_after") else {}))
        if bound > 1 and t and not bool(((age == 0) == (alpha > 0)).all()):
            raise ValueError("state_dict['age'] disagrees with alpha: a cut's age is 0 exactly when its weight is > 0 "
                             "(`_remove_inactive` after each QP)")
        if t:
            v = alpha @ cuts
            w_rec = v / lam
            check_close("w", w, w_rec, float(w_rec.abs().max()), rtol, "(1/lam) sum_k alpha_k g_k of the cuts")
            lin, quad = float(alpha @ offsets), 0.5 * float(v @ v) / lam
            check_close("model_value", _scalar(c["model_value"]), _scalar(lin - quad),
                        abs(lin) + quad, rtol, "sum_k alpha_k c_k - 1/(2 lam) ||sum_k alpha_k g_k||^2")
        else:
            self._empty_model(c)
        best = c["best_primal"]
        if steps == 0:
            if best != math.inf:
                raise ValueError(f"state_dict['best_primal'] must be inf before the first step, got {best!r}")
            check_close("w_best", w_best, w, 0.0, 1.0, "w (no step yet)")
            return
        if not math.isfinite(best):
            raise ValueError(f"state_dict['best_primal'] must be finite after a step, got {best!r}")
        check_range("best_offset", _scalar(c["best_offset"]), lo, hi,
                    tol=rtol * top, what="the range of the risk's cut offsets")
        reg, dot = 0.5 * lam * float(w_best @ w_best), float(w_best @ c["best_cut"])
        check_close("best_primal", _scalar(best), _scalar(reg + float(c["best_offset"]) - dot),
                    reg + abs(float(c["best_offset"])) + abs(dot), self.best_rtol,
                    "lam/2 ||w_best||^2 + best_offset - <w_best, best_cut> (the cut made at w_best)")
        model = float(c["model_value"])
        if model > best + self.best_rtol * (abs(best) + abs(model)):
            raise ValueError(f"state_dict['model_value'] = {model!r} exceeds best_primal = {best!r}: a lower bound of "
                             "the optimum above a primal value")
        if t:
            at_best = reg + max(float((offsets - cuts @ w_best).max()), self._model_floor())
            if at_best > best + self.best_rtol * (abs(best) + abs(at_best) + float((cuts @ w_best).abs().max())):
                raise ValueError(f"state_dict['best_primal'] = {best!r} is below the bundle's model at w_best "
                                 f"({at_best!r}): the cuts under-estimate the risk")

    def _model_floor(self) -> float:
        return -math.inf  # the 1-slack model also has xi >= 0

    def _set_state(self, checked: dict) -> None:
        super()._set_state(checked)
        self.risk.write_model(self.w)
