"""Pragam and Pragam-b (Zhang et al., 2010): Nesterov's excessive-gap technique on the binary
hinge-loss SVM, with an exact duality gap that falls as ``O(1/k^2)``.

Objective (eq. 20-22, the library's convention):

    J(w) = lam/2 ||w||^2 + min_b (1/n) sum_i [1 - y_i (<x_i, w> + b)]_+

with the bias ``b`` only for Pragam-b (``bias=True``; Pragam fixes ``b = 0``). In our ``X (n, d)`` layout
``A = -Y X`` and ``g(alpha) = -sum_i alpha_i`` on

    Q2 = [0, 1/n]^n                              (Pragam)
    Q2 = {alpha in [0, 1/n]^n : y^T alpha = 0}   (Pragam-b: the bias is the multiplier of y^T alpha = 0)

and the adjoint (18) is the standard SVM dual ``D(alpha) = sum_i alpha_i - 1/(2 lam) ||X^T Y alpha||^2``. The three
maps (23)-(25), derived for this layout:

    alpha_mu(w) = argmax_{Q2} sum_i alpha_i (1 - y_i <x_i, w>) - mu/2 ||alpha||^2 = Proj_Q2((1 - Y X w) / mu)
    w(alpha)    = argmin_w -w^T X^T Y alpha + lam/2 ||w||^2                    = X^T Y alpha / lam
    v(alpha)    = Proj_Q2(alpha + grad D(alpha) / L),   grad D(alpha) = 1 - Y X w(alpha)

``Proj_Q2`` is ``clip(., 0, 1/n)`` without the bias and the box-plus-one-equality projection of App. B
(`torchssvm.kernels.project_box_equality_torch` with ``sigma = y``, ``z = 0``, unit weights) with it.

Algorithm 1: ``alpha_{-1}`` random in Q2 (seeded), ``w_0 = w(alpha_{-1})``, ``alpha_0 = v(alpha_{-1})``; then with
``tau_k = 2/(k+3)``: ``beta_k = (1-tau_k) alpha_k + tau_k alpha_{mu_k}(w_k)``, ``w_{k+1} = (1-tau_k) w_k +
tau_k w(beta_k)``, ``alpha_{k+1} = v(beta_k)``, ``mu_{k+1} = (1-tau_k) mu_k`` from ``mu_0 = 2L``, i.e.
``mu_k = 4L/((k+1)(k+2))`` (used in closed form). Rate (26): ``J(w_k) - D(alpha_k) <= mu_k D2 =
4 L D2/((k+1)(k+2))`` with ``D2 = max_{Q2} ||alpha||^2/2 = 1/(2n)`` and ``L = sigma_max(X)^2 / lam`` the
Lipschitz constant of grad D.

Bookkeeping: we keep ``w_hat = w(alpha_k)`` (so ``D(alpha_k) = sum alpha_k - lam/2
||w_hat||^2``), ``X w_k`` (so ``J(w_k)`` is free) and use ``w(beta_k) = (1-tau_k) w_hat + tau_k w(alpha_mu)``:
four passes over X per iteration, ``X^T (y alpha_mu)``, ``X w(beta_k)``, ``X^T (y alpha_{k+1})`` and
``X w_{k+1}``, each computed afresh (no recursively updated products), so the reported gap is exactly
``J(w_k) - D(alpha_k)`` in float64.
"""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from ..._validation import shape_or_type
from .._state import check_close, check_range
from ..dual_solver import _check_lam
from ..solver import Solver

# Safety factor on the Lanczos estimate of sigma_max(X)^2: the Ritz value is a lower bound that 50 steps bring
# to ~1e-8 relative on the data we tried (Gaussian 2000 x 1000 included); 1% on top makes L an upper bound.
L_SAFETY = 1.01


def best_bias(scores: torch.Tensor, y: torch.Tensor):
    """``(b, value)``: a minimizer of ``F(b) = (1/n) sum_i [1 - y_i (s_i + b)]_+`` and ``F(b)``, exactly.

    ``F`` is convex piecewise linear with breakpoints ``c_i = y_i (1 - y_i s_i)`` (where term i vanishes): for
    ``y_i = +1`` the term is ``[c_i - b]_+``, for ``y_i = -1`` it is ``[b - c_i]_+``. Sorting the breakpoints and
    suffix / prefix sums give F at all of them in ``O(n log n)``; a breakpoint minimizes F (with one class only, the
    extreme breakpoint makes every term 0). Ties go to the smallest minimizing breakpoint; the value is recomputed
    directly at it.

    Args: ``scores (n,)`` (``<x_i, w>``), ``y (n,)`` in {-1, +1}, float64.
    """
    r = 1.0 - y * scores
    c, order = torch.sort(y * r)
    pos = y[order] > 0
    zero = torch.zeros_like(c)
    cp = torch.where(pos, c, zero)
    npos = pos.to(c.dtype)
    # sum_{i >= j, y=+1} (c_i - c_j) + sum_{i <= j, y=-1} (c_j - c_i)
    suf_sum = torch.flip(torch.cumsum(torch.flip(cp, [0]), 0), [0])
    suf_cnt = torch.flip(torch.cumsum(torch.flip(npos, [0]), 0), [0])
    pre_sum = torch.cumsum(torch.where(pos, zero, c), 0)
    pre_cnt = torch.cumsum(1.0 - npos, 0)
    F = (suf_sum - c * suf_cnt) + (c * pre_cnt - pre_sum)
    b = c[torch.argmin(F)]
    return float(b), float((r - y * b).clamp_min(0).mean())


class Pragam(Solver):
    """``solver = Pragam(X, y, lam)``; ``solver.step()`` runs one iteration of Algorithm 1 and returns its report.

    Args:
        X: ``(n, d)`` float features, dense, or a sparse COO / CSR tensor (used through ``torch.mv``); any
            device, the solver computes in float64 on it.
        y: ``(n,)`` labels in {-1, +1} (any numeric dtype), on X's device.
        lam: the regularization ``lam > 0`` of ``lam/2 ||w||^2 + (1/n) sum_i hinge_i``.
        bias: False: Pragam (no bias, Q2 a box); True: Pragam-b (unregularized bias, ``y^T alpha = 0``).
        L: the Lipschitz constant of grad D, or None: ``L_SAFETY * theta / lam`` with ``theta`` the largest Ritz
            value of ``power_iters`` Lanczos steps on ``X^T X`` from a seeded random start (the power iteration's
            Krylov space; a lower bound of ``sigma_max(X)^2``), ``1 / lam`` when X is 0. Pass
            ``torch.linalg.matrix_norm(X, 2) ** 2 / lam`` for a guaranteed bound. An L below the Rayleigh quotient
            ``||A w||^2 / (lam ||w||^2)`` of ``w_0`` or of an iterate is not one: refused there (a ValueError).
        power_iters: Lanczos steps for L (2 passes over X each).
        seed: seeds the start of the L estimate and ``alpha_{-1}``.
        writer: a TensorBoard ``SummaryWriter``: scalars under ``pragam/`` (``pragam_b/`` with the bias) per
            iteration.
        backend: backend of the Pragam-b projection (`torchssvm.kernels.backends`).

    Attributes: ``w (d,)``, ``b`` (float, the minimizing bias at ``w``; 0 without bias), ``alpha (n,)`` (in Q2),
    ``w_hat = w(alpha)``, ``L``, ``mu``, ``iteration`` (k), ``passes`` (matrix-vector products with X or X^T so
    far, the L estimate and the initialization included), ``seconds`` (solver time so far).
    """

    tag_name: Optional[str] = None  # the TensorBoard tag of a subclass (default: pragam / pragam_b)

    def __init__(self, X, y, lam, *, bias: bool = False, L: Optional[float] = None, power_iters: int = 50,
                 seed: int = 0, writer=None, backend: str = "auto"):
        t0 = time.perf_counter()
        self.X, self.Xt = self._check_X(X)
        self.n, self.d = self.X.shape
        self.device = self.X.device
        self.y = self._check_y(y)
        self.lam = _check_lam(lam)
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {type(bias).__name__}")
        self.bias = bias
        if isinstance(power_iters, bool) or not isinstance(power_iters, int) or power_iters < 1:
            raise ValueError(f"power_iters must be an int >= 1, got {power_iters!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if writer is not None and not callable(getattr(writer, "add_scalar", None)):
            raise TypeError("writer must have an add_scalar method (a SummaryWriter), or be None")
        self.writer = writer
        from ...kernels import resolve

        resolve("project_box_equality", backend, self.device)  # a bad name, or a form the device lacks, fails
        self.backend = backend
        self.tag = self.tag_name or ("pragam_b" if bias else "pragam")
        self.D2 = 1.0 / (2 * self.n)
        self.passes = 0
        gen = torch.Generator().manual_seed(seed)
        self._L_estimated = L is None
        if L is None:
            self.L = self._estimate_L(power_iters, gen)
        else:
            if isinstance(L, bool) or not isinstance(L, (int, float)) or not (L > 0 and math.isfinite(L)):
                raise ValueError(f"L must be a positive finite number or None, got {L!r}")
            self.L = float(L)

        # Algorithm 1, line 1
        alpha = self._project(torch.rand(self._dual_shape, generator=gen, dtype=torch.float64).to(self.device)
                              / self.n)
        self.w = self._XTv(self._adjoint(alpha)) / self.lam  # w_0 = w(alpha_{-1})
        self.Xw = self._Xv(self.w)  # X w_0 = X w(alpha_{-1}): also grad D(alpha_{-1})
        self._check_L(self.L, self.w, self.Xw, "L")  # a given L far too small fails here, not at a resume
        self.alpha = self._project(alpha + self._margins(self.Xw) / self.L)  # alpha_0 = v(alpha_{-1})
        self.w_hat = self._XTv(self._adjoint(self.alpha)) / self.lam
        self.iteration = 0
        self.b = 0.0
        self.seconds = 0.0
        r = self._report()
        self.seconds = time.perf_counter() - t0
        self.last_report = {**r, "time": self.seconds}
        # iterate 0 is logged by the first `step`, not here: a solver built to resume a run has logged it already

    # -- validation -----------------------------------------------------------------------------
    @staticmethod
    def _check_X(X):
        if not isinstance(X, torch.Tensor):
            raise TypeError(f"X must be a torch.Tensor of shape (n, d), got {type(X).__name__}")
        if X.dim() != 2 or X.shape[0] < 1 or X.shape[1] < 1:
            raise ValueError(f"X must have shape (n, d) with n, d >= 1, got {tuple(X.shape)}")
        if not X.dtype.is_floating_point:
            raise TypeError(f"X must be a floating-point tensor, got dtype {X.dtype}")
        if X.layout == torch.strided:
            X = X.to(torch.float64)
            if not bool(torch.isfinite(X).all()):
                raise ValueError("X contains NaN or Inf")
            return X, X.t()
        if X.layout not in (torch.sparse_coo, torch.sparse_csr):
            raise ValueError(f"X must be dense, sparse COO or sparse CSR, got layout {X.layout}")
        X = (X.to_sparse_coo() if X.layout == torch.sparse_csr else X).coalesce().to(torch.float64)
        if not bool(torch.isfinite(X.values()).all()):
            raise ValueError("X contains NaN or Inf")
        return X, X.t().coalesce()

    def _check_label_tensor(self, y, what: str) -> None:
        """``y`` is a ``(n,)`` tensor on X's device of a real dtype (``what``: the labels it must hold)."""
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y must be a torch.Tensor of shape ({self.n},), got {type(y).__name__}")
        if tuple(y.shape) != (self.n,):
            raise ValueError(f"y must have shape ({self.n},) (one label per row of X), got {tuple(y.shape)}")
        if y.device != self.device:
            raise ValueError(f"y is on {y.device} but X is on {self.device}")
        if y.dtype == torch.bool or y.is_complex():
            raise TypeError(f"y must hold {what}, got dtype {y.dtype}")

    def _check_y(self, y) -> torch.Tensor:
        self._check_label_tensor(y, "the numbers -1 and +1")
        y = y.to(torch.float64)
        if not bool(((y == 1) | (y == -1)).all()):
            raise ValueError("y must hold only the labels -1 and +1")
        return y

    # -- the problem: A, b and Q2 (the hooks `MulticlassPragam` overrides) --------------------------
    @property
    def _dual_shape(self) -> tuple:
        return (self.n,)

    @property
    def _primal_shape(self) -> tuple:
        return (self.d,)

    def _lin(self, scores: torch.Tensor) -> torch.Tensor:
        """``A w`` from the scores ``X w``: ``y * s`` (so the margins ``b - A w`` are ``1 - y s``)."""
        return self.y * scores

    def _adjoint(self, alpha: torch.Tensor) -> torch.Tensor:
        """``u`` with ``A^T alpha = X^T u``: ``y * alpha``."""
        return self.y * alpha

    def _margins(self, scores: torch.Tensor) -> torch.Tensor:
        """``b - A w`` (``grad D`` at the alpha with ``w(alpha) = w``) from the scores ``X w``."""
        return 1.0 - self._lin(scores)

    def _dual_linear(self, alpha: torch.Tensor) -> float:
        """``<b, alpha>``."""
        return float(alpha.sum())

    # -- linear algebra -------------------------------------------------------------------------
    def _Xv(self, v: torch.Tensor) -> torch.Tensor:
        self.passes += 1
        return torch.mv(self.X, v) if v.dim() == 1 else self.X @ v

    def _XTv(self, u: torch.Tensor) -> torch.Tensor:
        self.passes += 1
        return torch.mv(self.Xt, u) if u.dim() == 1 else self.Xt @ u

    def _estimate_L(self, steps: int, gen: torch.Generator) -> float:
        """``L_SAFETY * theta / lam``: theta the top Ritz value of ``steps`` Lanczos steps on ``A^T A`` (``X^T X``
        for the binary SVM, where ``y_i^2 = 1``)."""
        q = torch.randn(self._primal_shape, generator=gen, dtype=torch.float64).to(self.device)
        q = q / q.norm()
        q_prev = torch.zeros_like(q)
        beta = 0.0
        diag, off = [], []
        for _ in range(min(steps, q.numel())):
            u = self._XTv(self._adjoint(self._lin(self._Xv(q))))
            a = float((q * u).sum())
            diag.append(a)
            u = u - a * q - beta * q_prev
            beta = float(u.norm())
            if beta <= 1e-12 * max(abs(x) for x in diag):  # invariant subspace: theta is exact
                break
            off.append(beta)
            q_prev, q = q, u / beta
        off = off[: len(diag) - 1]
        T = torch.diag(torch.tensor(diag, dtype=torch.float64))
        if off:
            e = torch.tensor(off, dtype=torch.float64)
            T = T + torch.diag(e, 1) + torch.diag(e, -1)
        theta = float(torch.linalg.eigvalsh(T)[-1])
        return L_SAFETY * theta / self.lam if theta > 0 else 1.0 / self.lam

    def _project(self, m: torch.Tensor) -> torch.Tensor:
        """``Proj_Q2(m)`` for ``m (n,)``."""
        if not self.bias:
            return m.clamp(0.0, 1.0 / self.n)
        from ...kernels import project_box_equality_torch, resolve

        if resolve("project_box_equality", self.backend, m.device) == "triton":  # unchecked: the arguments are ours
            from ...kernels.projections.box_equality_triton import MAX_BLOCK, project_box_equality_triton

            if self.n <= MAX_BLOCK:
                return project_box_equality_triton(m.unsqueeze(0), 0.0, 1.0 / self.n, self.y, 0.0)[0]
        return project_box_equality_torch(m.unsqueeze(0), 0.0, 1.0 / self.n, self.y, 0.0)[0]

    # -- values (monitoring: not counted in passes) ----------------------------------------------
    @property
    def mu(self) -> float:
        """``mu_k = 4L/((k+1)(k+2))``, the closed form of ``mu_0 = 2L``, ``mu_{k+1} = (1 - tau_k) mu_k``."""
        k = self.iteration
        return 4.0 * self.L / ((k + 1) * (k + 2))

    def w_of_alpha(self, alpha: torch.Tensor) -> torch.Tensor:
        """``w(alpha) = X^T Y alpha / lam`` ``(d,)`` (eq. 24)."""
        return torch.mv(self.Xt, self.y * alpha.to(self.device, torch.float64)) / self.lam

    def dual_value(self, alpha: torch.Tensor) -> float:
        """``D(alpha) = sum_i alpha_i - 1/(2 lam) ||X^T Y alpha||^2`` (eq. 18 and 22) for ``alpha (n,)`` in Q2."""
        w = self.w_of_alpha(alpha)
        return float(alpha.to(torch.float64).sum()) - 0.5 * self.lam * float(w @ w)

    def _primal_from_scores(self, w: torch.Tensor, scores: torch.Tensor):
        if self.bias:
            b, risk = best_bias(scores, self.y)
        else:
            b, risk = 0.0, float((1.0 - self.y * scores).clamp_min(0).mean())
        return 0.5 * self.lam * float(w @ w) + risk, b

    def primal_value(self, w: torch.Tensor) -> float:
        """``J(w)`` for ``w (d,)``, the bias minimized exactly (`best_bias`) for Pragam-b."""
        w = w.to(self.device, torch.float64)
        return self._primal_from_scores(w, torch.mv(self.X, w))[0]

    def _report(self) -> dict:
        primal, self.b = self._primal_from_scores(self.w, self.Xw)
        dual = self._dual_linear(self.alpha) - 0.5 * self.lam * float((self.w_hat * self.w_hat).sum())
        k = self.iteration
        return {"primal": primal, "dual": dual, "gap": primal - dual, "gap_exact": True,
                "bound": 4.0 * self.L * self.D2 / ((k + 1) * (k + 2)), "iteration": k, "passes": self.passes,
                "time": self.seconds, "mu": self.mu, "b": self.b}

    # -- loop -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> dict:
        """One iteration of Algorithm 1 (lines 3-4) from ``(w_k, alpha_k)`` to ``(w_{k+1}, alpha_{k+1})``; returns
        the report of iterate k+1: ``primal = J(w_{k+1})``, ``dual = D(alpha_{k+1})``, ``gap`` (their exact
        difference), ``gap_exact``, ``bound = 4 L D2/((k+2)(k+3))``, ``iteration``, ``passes``, ``time``, ``mu``
        and ``b``."""
        t0 = time.perf_counter()
        k, lam = self.iteration, self.lam
        if k == 0:
            self._log(self.last_report)
        tau = 2.0 / (k + 3)
        a_mu = self._project(self._margins(self.Xw) / self.mu)  # alpha_{mu_k}(w_k), eq. 23
        w_beta = (1 - tau) * self.w_hat + tau * (self._XTv(self._adjoint(a_mu)) / lam)  # w(beta_k) by linearity
        beta = (1 - tau) * self.alpha + tau * a_mu
        alpha = self._project(beta + self._margins(self._Xv(w_beta)) / self.L)  # v(beta_k), eq. 25
        w = (1 - tau) * self.w + tau * w_beta
        Xw = self._Xv(w)
        # every iterate's Rayleigh quotient bounds L from below: a run never saves a state whose L its load refuses
        # (checked before the iterates are set: a refused step leaves iterate k, its pass count too)
        try:
            self._check_L(self.L, w, Xw, "L")
        except ValueError:
            self.passes -= 3  # this step's products with X and X^T
            raise
        self.alpha, self.w, self.Xw = alpha, w, Xw
        self.w_hat = self._XTv(self._adjoint(self.alpha)) / lam
        self.iteration = k + 1
        r = self._report()
        self.seconds += time.perf_counter() - t0
        self.last_report = r = {**r, "time": self.seconds}
        self._log(r)
        return r

    def report(self) -> dict:
        """The report of the current iterate (as the last `step` returned it; after construction, iterate 0)."""
        return dict(self.last_report)

    # -- loop (`Solver`): Solver.fit(max_iter, gap_tol, time_budget, callback) ------------------------------------
    limit_integer = True
    report_keys = ("primal", "dual", "gap", "bound", "mu", "passes", "time")

    def _progress(self) -> int:
        return self.iteration

    def _log_step(self, r: dict) -> int:
        return r["iteration"]

    def _log_extra(self, r: dict, step: int) -> None:
        self.writer.add_scalar(f"{self.tag}/exact_gap", r["gap"], step)

    # -- prediction -----------------------------------------------------------------------------
    def _check_new_X(self, X) -> torch.Tensor:
        """``X (m, d)`` on the solver's device, as float64."""
        if not isinstance(X, torch.Tensor) or X.dim() != 2 or X.shape[1] != self.d:
            raise ValueError(f"X must be a tensor of shape (m, {self.d}), got {shape_or_type(X)}")
        if X.device != self.device:
            raise ValueError(f"X is on {X.device} but the solver is on {self.device}")
        return X.to(torch.float64)

    def decision_function(self, X) -> torch.Tensor:
        """``X w + b`` ``(m,)`` float64 for ``X (m, d)`` (dense or sparse, on the solver's device)."""
        return torch.mv(self._check_new_X(X), self.w) + self.b

    def predict(self, X) -> torch.Tensor:
        """Labels in {-1, +1} ``(m,)`` (int64; a score of exactly 0 gives +1)."""
        f = self.decision_function(X)
        return torch.where(f >= 0, 1, -1).to(torch.int64)

    # -- state (`Solver`) ------------------------------------------------------------------------
    _state_tensors = ("alpha", "w", "w_hat", "Xw")
    _state_scalars = ("iteration", "passes", "seconds", "L", "b")

    def _config(self) -> dict:
        """A state is bound to the same X, y, lam and bias (lam and bias are checked; the sizes by the tensors)."""
        return {"lam": self.lam, "bias": self.bias}

    def _scalar_types(self) -> dict:
        return {"iteration": int, "passes": int, "seconds": float, "L": float, "b": float}

    def _extra_state(self) -> dict:
        return {"n": self.n, "d": self.d, "last_report": dict(self.last_report)}

    def _data(self) -> dict:
        """The features and labels a state is bound to (a sparse X by its coalesced indices and values)."""
        X = self.X
        if X.layout == torch.strided:
            return {"X": X, "y": self.y}
        return {"X_indices": X.indices(), "X_values": X.values(), "X_shape": str(tuple(X.shape)), "y": self.y}

    def _set_state(self, checked: dict) -> None:
        checked.pop("last_report")
        report = checked.pop("_report")
        super()._set_state(checked)
        self.last_report = report  # recomputed from the loaded iterates (`_check_consistency`)

    def _checked_state(self, state: dict) -> dict:
        out = super()._checked_state(state)
        out["last_report"] = dict(state["last_report"]) if state.get("last_report") else None
        if not (out["L"] > 0 and math.isfinite(out["L"])):
            raise ValueError(f"state_dict['L'] must be a finite number > 0, got {out['L']!r}")
        if not math.isfinite(out["b"]):
            raise ValueError(f"state_dict['b'] must be finite, got {out['b']!r}")
        return out

    # the rounding between a product computed afresh and the saved one (the same operations on the same device: 0)
    consistency_rtol = 1e-9

    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """Recomputed from the saved iterates (two passes over X): ``alpha`` in ``Q2``; ``w_hat = w(alpha)``
        (eq. 24); ``Xw = X w``; ``b`` the minimizing bias at ``w``; ``L`` at least the Rayleigh quotient
        ``||A w||^2 / (lam ||w||^2)`` of ``w`` (``L lam >= ||A||^2``); ``passes >= 4
        iteration``; the saved last report (``primal``, ``dual``, ``gap``) that of these iterates. Any ``w`` with
        its ``Xw`` gives a true report (``primal`` is ``J(w)`` and ``dual`` is ``D(alpha)``)."""
        rtol, lam = self.consistency_rtol, self.lam
        alpha, w, w_hat, Xw = c["alpha"], c["w"], c["w_hat"], c["Xw"]
        for key in ("alpha", "w", "w_hat", "Xw"):
            if not bool(torch.isfinite(c[key]).all()):
                raise ValueError(f"state_dict[{key!r}] holds Inf: the state is corrupt")
        top = 1.0 / self.n
        check_range("alpha", alpha, 0.0, top, tol=1e-12 * top, what="alpha lies in Q2: [0, 1/n] per entry")
        self._check_Q2(alpha)
        passes = self.passes
        try:
            w_rec = self._XTv(self._adjoint(alpha)) / lam
            Xw_rec = self._Xv(w)
        finally:
            self.passes = passes  # a check, not the solver's work
        check_close("w_hat", w_hat, w_rec, float(w_rec.abs().max()), rtol, "w(alpha) = X^T Y alpha / lam")
        check_close("Xw", Xw, Xw_rec, float(Xw_rec.abs().max()), rtol, "X w")
        if c["passes"] < 4 * c["iteration"]:
            raise ValueError(f"state_dict['passes'] = {c['passes']} is below 4 per iteration ({c['iteration']})")
        self._check_L(c["L"], w, Xw_rec)
        primal, b = self._primal_from_scores(w, Xw)
        if b != c["b"] and not math.isclose(b, c["b"], rel_tol=rtol, abs_tol=rtol):
            raise ValueError(f"state_dict['b'] = {c['b']!r} is not the minimizing bias at w ({b!r})")
        saved = c["last_report"]
        held = (self.iteration, self.passes, self.seconds, self.L, self.w, self.alpha, self.w_hat, self.Xw, self.b)
        try:  # the report of the loaded iterates, as `_report` makes it (it reads the attributes, L included)
            self.iteration, self.passes, self.seconds, self.L = c["iteration"], c["passes"], c["seconds"], c["L"]
            self.w, self.alpha, self.w_hat, self.Xw = w, alpha, w_hat, Xw
            report = {**self._report(), "time": c["seconds"]}
        finally:
            (self.iteration, self.passes, self.seconds, self.L, self.w, self.alpha, self.w_hat, self.Xw,
             self.b) = held
        if saved:
            for key in ("primal", "dual", "gap", "iteration", "b"):
                if key in saved and not (saved[key] == report[key] or math.isclose(
                        saved[key], report[key], rel_tol=rtol, abs_tol=rtol * (abs(report["primal"]) + 1))):
                    raise ValueError(f"state_dict['last_report'][{key!r}] = {saved[key]!r} is not that of the "
                                     f"saved iterates ({report[key]!r})")
        c["_report"] = report

    def _check_Q2(self, alpha: torch.Tensor) -> None:
        if self.bias:
            dot = float(self.y @ alpha)
            if abs(dot) > 1e-9 / self.n * max(1.0, math.sqrt(self.n)):
                raise ValueError(f"state_dict['alpha'] has y^T alpha = {dot:.3g}, not 0 (Q2 of Pragam-b)")

    def _check_L(self, L: float, w: torch.Tensor, Xw: torch.Tensor, name: str = "state_dict['L']") -> None:
        """``L`` must be at least the Rayleigh quotient ``||A w||^2 / (lam ||w||^2)`` of ``w`` (a lower bound of the
        Lipschitz constant ``||A||^2 / lam``): the steps and the reported ``bound`` assume it is one. ``A w`` comes
        from ``X w``: no pass over X."""
        ww = float((w * w).sum())
        if ww > 0:
            Aw = self._lin(Xw)
            rayleigh = float((Aw * Aw).sum()) / (self.lam * ww)
            if L * (1 + 1e-9) < rayleigh:
                fix = ("a larger power_iters (the estimate)" if self._L_estimated else "L=None (an estimate)") + \
                    " or L = torch.linalg.matrix_norm(X, 2) ** 2 / lam"
                raise ValueError(f"{name} = {L!r} is below ||A w||^2 / (lam ||w||^2) = {rayleigh!r}: not the "
                                 "Lipschitz constant ||A||^2 / lam of grad D, which the steps and the reported bound "
                                 f"assume; pass {fix}")
