"""Pragam for the multiclass (Crammer-Singer) hinge SVM: the excessive-gap scheme of Zhang et al. (2010) (
sections 2.1-2.3) with ``Q2`` a product of simplices, as the paper's section 1 remarks for "few-piece" risks.

Objective, ``W (d, K)``, labels ``y_i in {0, ..., K-1}``, 0/1 margin ``Delta_ik = [k != y_i]``:

    J(W) = lam/2 ||W||^2 + (1/n) sum_i max_k [Delta_ik + <x_i, w_k> - <x_i, w_{y_i}>]

(no bias; the `FeatureTableProblem` of the multiclass SSVM with one-hot class blocks has the same
optimum). With ``alpha (n, K)`` in ``Q2 = {alpha_i >= 0, sum_k alpha_ik = 1/n}`` (the rescaled
maximizing distribution of each example), ``(A W)_ik = <x_i, w_{y_i} - w_k>`` and ``b = Delta``:

    J(W) = lam/2 ||W||^2 + max_{Q2} <alpha, b - A W>,      D(alpha) = <Delta, alpha> - 1/(2 lam) ||A^T alpha||^2,
    A^T alpha = X^T U,   U_ik = [k = y_i] sum_j alpha_ij - alpha_ik,      W(alpha) = X^T U / lam,

so the three maps of Algorithm 1 are those of `Pragam` with ``Proj_Q2`` the batched simplex projection
(`torchssvm.kernels.project_simplex`, radius 1/n per row; Triton on CUDA). ``D2 = max_{Q2} ||alpha||^2/2 =
1/(2n)`` (a vertex per row) and ``L = ||A||^2 / lam`` from Lanczos on ``A^T A``, so the certificate (26)
``J(W_k) - D(alpha_k) <= 4 L D2 / ((k+1)(k+2))`` holds at every iterate, as for the binary solver.
"""

from __future__ import annotations

from typing import Optional

import torch

from .pragam import Pragam


class MulticlassPragam(Pragam):
    """``solver = MulticlassPragam(X, y, lam)``: `Pragam` on the Crammer-Singer multiclass hinge.

    Args:
        X: ``(n, d)`` float features, dense or sparse (COO / CSR).
        y: ``(n,)`` integer labels in ``{0, ..., K-1}``.
        lam: the regularization of ``lam/2 ||W||^2 + (1/n) sum_i hinge_i``.
        num_classes: K, or None (``y.max() + 1``).
        L, power_iters, seed, writer, backend: as `Pragam` (``backend`` picks the simplex projection's).

    Attributes: ``w (d, K)`` (the column ``w_k`` scores class k), ``alpha (n, K)``, ``w_hat = W(alpha)``, ``K``
    and the rest of `Pragam`'s. Reports as `Pragam` (``b`` is always 0). TensorBoard tag
    ``pragam_multiclass``.
    """

    tag_name = "pragam_multiclass"

    def __init__(self, X, y, lam, *, num_classes: Optional[int] = None, L: Optional[float] = None,
                 power_iters: int = 50, seed: int = 0, writer=None, backend: str = "auto"):
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                        or num_classes < 2):
            raise ValueError(f"num_classes must be an int >= 2 or None, got {num_classes!r}")
        self._num_classes = num_classes
        super().__init__(X, y, lam, bias=False, L=L, power_iters=power_iters, seed=seed, writer=writer,
                         backend=backend)

    def _check_y(self, y) -> torch.Tensor:
        self._check_label_tensor(y, "integer class labels")
        if y.is_floating_point():
            raise TypeError(f"y must hold integer class labels, got dtype {y.dtype}")
        y = y.long()
        K = int(y.max()) + 1 if self._num_classes is None else self._num_classes
        if int(y.min()) < 0 or int(y.max()) >= K:
            raise ValueError(f"y must hold labels in [0, {K}) (num_classes={K}), got [{int(y.min())}, {int(y.max())}]")
        if K < 2:
            raise ValueError("y holds a single class: pass num_classes >= 2")
        self.K = K
        self.onehot = torch.nn.functional.one_hot(y, K).to(torch.float64)
        self.delta = 1.0 - self.onehot
        return y

    # -- the problem (the hooks of `Pragam`) -----------------------------------------------------
    @property
    def _dual_shape(self) -> tuple:
        return (self.n, self.K)

    @property
    def _primal_shape(self) -> tuple:
        return (self.d, self.K)

    def _lin(self, scores: torch.Tensor) -> torch.Tensor:
        """``(A W)_ik = s_{i y_i} - s_ik`` from the scores ``S = X W (n, K)``."""
        return scores.gather(1, self.y.unsqueeze(1)) - scores

    def _adjoint(self, alpha: torch.Tensor) -> torch.Tensor:
        """``U`` with ``A^T alpha = X^T U``: ``U_ik = [k = y_i] sum_j alpha_ij - alpha_ik``."""
        return self.onehot * alpha.sum(1, keepdim=True) - alpha

    def _margins(self, scores: torch.Tensor) -> torch.Tensor:
        return self.delta - self._lin(scores)

    def _dual_linear(self, alpha: torch.Tensor) -> float:
        return float((self.delta * alpha).sum())

    def _project(self, m: torch.Tensor) -> torch.Tensor:
        from ...kernels import project_simplex

        radius = torch.full((self.n,), 1.0 / self.n, dtype=torch.float64, device=self.device)
        return project_simplex(m, None, radius, backend=self.backend)

    # -- state checks (`Pragam._check_consistency`) -----------------------------------------------
    def _check_Q2(self, alpha: torch.Tensor) -> None:
        rows = alpha.sum(1)
        if not bool(((rows - 1.0 / self.n).abs() <= 1e-12 * self.K / self.n).all()):
            i = int((rows - 1.0 / self.n).abs().argmax())
            raise ValueError(f"state_dict['alpha'] row {i} sums to {float(rows[i])!r}, not 1/n (Q2: a simplex per "
                             "example)")

    # -- values ---------------------------------------------------------------------------------
    def w_of_alpha(self, alpha: torch.Tensor) -> torch.Tensor:
        """``W(alpha) = X^T U / lam`` ``(d, K)``."""
        return (self.Xt @ self._adjoint(alpha.to(self.device, torch.float64))) / self.lam

    def dual_value(self, alpha: torch.Tensor) -> float:
        """``D(alpha) = <Delta, alpha> - lam/2 ||W(alpha)||^2`` for ``alpha (n, K)`` in Q2."""
        w = self.w_of_alpha(alpha)
        return self._dual_linear(alpha.to(self.device, torch.float64)) - 0.5 * self.lam * float((w * w).sum())

    def _primal_from_scores(self, w: torch.Tensor, scores: torch.Tensor):
        risk = float(self._margins(scores).amax(1).mean())
        return 0.5 * self.lam * float((w * w).sum()) + risk, 0.0

    def primal_value(self, w: torch.Tensor) -> float:
        """``J(W)`` for ``W (d, K)``."""
        w = w.to(self.device, torch.float64)
        return self._primal_from_scores(w, self.X @ w)[0]

    # -- prediction -----------------------------------------------------------------------------
    def decision_function(self, X) -> torch.Tensor:
        """The class scores ``X W`` ``(m, K)`` float64 for ``X (m, d)`` (dense or sparse, on the solver's device)."""
        return self._check_new_X(X) @ self.w

    def predict(self, X) -> torch.Tensor:
        """The highest-scoring class ``(m,)`` int64 (ties to the smallest index)."""
        return self.decision_function(X).argmax(1)
