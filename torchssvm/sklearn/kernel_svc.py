"""`KernelSVC`: the kernel SSVM (binary or multiclass, 0/1 loss) by 1-slack cutting planes (`KernelCuttingPlane`)."""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ..optim.kernel_svm import KernelCuttingPlane
from ..optim.kernel_svm.mercer import MercerKernel
from ..optim.solver import ConvergenceWarning
from ._base import check_int, check_positive, data_digest, seed_of


class KernelSVC(ClassifierMixin, BaseEstimator):
    """The kernel SSVM ``min_w lam/2 ||w||^2 + (1/n) sum_i max_y [1(y != y_i) - <w, Psi(x_i, y_i) - Psi(x_i, y)>]``
    over a Mercer kernel (Yu & Joachims, 2008), by `KernelCuttingPlane`. Two classes: the SVM without bias,
    hinge ``max(0, 1 - y f(x))``; more: the multiclass SVM of the joint kernel ``k(x, x') 1(y = y')``.

    Parameters:
        lam: regularization > 0 (OP1's average-slack ``C = 1 / lam``; scikit-learn's ``SVC(C)`` is ``lam = 1 / (C n)``
            in the binary case).
        kernel: ``"rbf"`` (``exp(-gamma ||x - x'||^2)``) or ``"linear"``.
        gamma: the RBF width > 0, or None: ``1 / (D var(X))`` (scikit-learn's ``"scale"``).
        sampling: the cuts: ``"exact"`` (the gap is certified), ``"linear"``, ``"constant"`` or ``"hybrid"``.
        r: draws per sampled cut. eps: the cut violation that stops the run.
        max_iter: cutting-plane iterations (from the start of training); a run stopped by it before the
            stopping rule warns (`torchssvm.ConvergenceWarning`).
        warm_start: the next ``fit`` on the same data and settings continues the cuts and the QP.
        random_state: seed of the sampled cuts.

    Attributes: ``classes_``, ``n_features_in_``, ``support_`` (training indices of the expansion),
    ``support_vectors_``, ``dual_coef_ (S, n_SV)`` (``S = 1`` binary, else K), ``gamma_``, ``gap_`` (``primal_ -
    dual_``: a certificate with ``sampling="exact"``), ``primal_``, ``dual_`` (OP1's), ``n_iter_``.
    """

    def __init__(self, lam=1e-2, *, kernel="rbf", gamma=None, sampling="exact", r=400, eps=1e-3, max_iter=1000,
                 warm_start=False, random_state=None):
        self.lam = lam
        self.kernel = kernel
        self.gamma = gamma
        self.sampling = sampling
        self.r = r
        self.eps = eps
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.random_state = random_state

    def fit(self, X, y):
        """Fit on ``X (n, D)`` and labels ``y (n,)`` of at least two classes. Returns self."""
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        check_positive("lam", self.lam)
        check_int("max_iter", self.max_iter, 1)
        if self.gamma is not None:
            g = self.gamma
            if isinstance(g, bool) or not isinstance(g, numbers.Real) or not (g > 0 and math.isfinite(g)):
                raise ValueError(f"gamma must be a finite number > 0 or None, got {g!r}")
        classes, enc = np.unique(y, return_inverse=True)
        if classes.shape[0] < 2:
            raise ValueError(f"KernelSVC needs samples of at least 2 classes in the data; got {classes.shape[0]} "
                             "class")
        self.classes_ = classes
        K = classes.shape[0]
        key = (data_digest(X, enc), float(self.lam), self.kernel, self.gamma, self.sampling, self.r, self.eps)
        solver = getattr(self, "_solver", None)
        if not (self.warm_start and solver is not None and getattr(self, "_solver_key", None) == key):
            x = torch.from_numpy(np.array(X, dtype=np.float64))
            if K == 2:
                yt = torch.from_numpy(np.where(enc == 1, 1, -1).astype(np.int64))
                solver = KernelCuttingPlane(x, yt, lam=float(self.lam), kernel=self.kernel, gamma=self.gamma,
                                            sampling=self.sampling, r=self.r, eps=self.eps,
                                            seed=seed_of(self.random_state))
            else:
                yt = torch.from_numpy(enc.astype(np.int64))
                solver = KernelCuttingPlane(x, yt, lam=float(self.lam), kernel=self.kernel, gamma=self.gamma,
                                            num_classes=K, sampling=self.sampling, r=self.r, eps=self.eps,
                                            seed=seed_of(self.random_state))
            self._solver, self._solver_key = solver, key
        history = solver.fit(max_iter=self.max_iter)
        if history and not history[-1]["converged"]:
            warnings.warn(f"KernelSVC stopped by max_iter = {self.max_iter} before the cutting-plane stopping rule; "
                          "fit again with a larger max_iter (and warm_start=True) to go on", ConvergenceWarning,
                          stacklevel=2)
        idx, rows = solver._basis_expansion()
        if idx is None:
            idx, rows = torch.zeros(0, dtype=torch.long), torch.zeros(0, solver.F.shape[1], dtype=torch.float64)
        keep = rows.abs().sum(1) > 0
        idx, rows = idx[keep].cpu(), rows[keep].cpu()
        self.support_ = idx.numpy().copy()
        self.support_vectors_ = X[self.support_]
        self.dual_coef_ = rows.numpy().T.copy()
        self.gamma_ = solver.kernel.gamma
        cert = solver.duality_gap()
        self.primal_, self.dual_, self.gap_ = cert["primal"], cert["dual"], cert["gap_estimate"]
        self.n_iter_ = solver.steps_done
        return self

    def decision_function(self, X):
        """``f(x)`` ``(n,)`` with two classes (positive: the second class), else the class scores ``(n, K)``."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        kernel = MercerKernel(self.kernel, self.gamma_)
        sv = torch.from_numpy(np.array(self.support_vectors_, dtype=np.float64))
        f = kernel(torch.from_numpy(np.array(X, dtype=np.float64)), sv, torch.float64) @ torch.from_numpy(
            self.dual_coef_.T.copy())
        f = f.numpy()
        return f[:, 0] if self.classes_.shape[0] == 2 else f

    def predict(self, X):
        """Two classes: the second where ``f(x) > 0``; else the class of the largest score (the first on ties)."""
        f = self.decision_function(X)
        if self.classes_.shape[0] == 2:
            return self.classes_[(f > 0).astype(int)]
        return self.classes_[f.argmax(1)]

    def __getstate__(self):
        state = super().__getstate__()  # BaseEstimator's: a copy of __dict__ with the scikit-learn version
        state.pop("_solver", None)
        state.pop("_solver_key", None)
        return state
