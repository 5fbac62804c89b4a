"""`MulticlassClassifier`: the multiclass SSVM with the 0/1 loss, trained by BCFW on a `FeatureTableProblem`."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._base import DualEstimatorMixin, data_digest
from ._multiclass_problem import MulticlassTableProblem


class MulticlassClassifier(DualEstimatorMixin, ClassifierMixin, BaseEstimator):
    """The multiclass SSVM ``min_w lam/2 ||w||^2 + (1/n) sum_i max_y [1(y != y_i) + <w_y - w_{y_i}, [x_i, 1]>]``
    (Crammer & Singer's multiclass SVM), solved in the dual with a certified gap.

    The joint feature map is ``one-hot(y) (x) [x, 1]`` (``[x]`` without ``fit_intercept``): a `FeatureTableProblem`
    that keeps ``[x, 1]`` only (`MulticlassTableProblem`, ``n (D + 1)`` float64 numbers).

    Parameters:
        lam: regularization > 0 (``C = 1 / (lam n)`` in LIBLINEAR's sum-of-slacks form).
        max_passes: effective passes over the data (from the start of training, also under ``warm_start``).
        gap_tol: stop when the exact duality gap is at most this (None: run ``max_passes``); a run stopped by
            ``max_passes`` short of it warns (`torchssvm.ConvergenceWarning`).
        fit_intercept: learn a per-class bias.
        solver: ``"bcfw"`` (block-coordinate Frank-Wolfe) or ``"fw"`` (batch Frank-Wolfe).
        sampling, step, cache_size, gap_check_every: BCFW's (`torchssvm.optim.BCFW`).
        batch_size: BCFW's blocks per step; ``"auto"``: ``min(n, 16)``.
        warm_start: the next ``fit`` on the same data and settings continues the solver's state.
        random_state: seed of BCFW's sampling (None, an int or a ``RandomState``).

    Attributes: ``classes_``, ``n_features_in_``, ``coef_ (K, D)``, ``intercept_ (K,)``, ``gap_`` (the exact duality
    gap at the end), ``primal_``, ``dual_``, ``n_iter_`` (effective passes).
    """

    def __init__(self, lam=1e-2, max_passes=50, gap_tol=1e-3, *, fit_intercept=True, solver="bcfw",
                 sampling="uniform", step="fw", cache_size=0, gap_check_every=10, batch_size="auto",
                 warm_start=False, random_state=None):
        self.lam = lam
        self.max_passes = max_passes
        self.gap_tol = gap_tol
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.sampling = sampling
        self.step = step
        self.cache_size = cache_size
        self.gap_check_every = gap_check_every
        self.batch_size = batch_size
        self.warm_start = warm_start
        self.random_state = random_state

    def _features(self, X):
        return np.hstack([X, np.ones((X.shape[0], 1))]) if self.fit_intercept else X

    def fit(self, X, y):
        """Fit on ``X (n, D)`` and labels ``y (n,)`` of at least two classes. Returns self."""
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        classes, enc = np.unique(y, return_inverse=True)
        if classes.shape[0] < 2:
            raise ValueError(f"MulticlassClassifier needs samples of at least 2 classes in the data; got "
                             f"{classes.shape[0]} class")
        self.classes_ = classes
        K = classes.shape[0]
        Xb = torch.from_numpy(np.array(self._features(X), dtype=np.float64))
        D1 = Xb.shape[1]

        def make_problem():
            return MulticlassTableProblem(Xb, torch.from_numpy(enc.astype(np.int64)), K)

        solver = self._run_dual(make_problem, data_digest(X, enc, np.array([self.fit_intercept])))
        W = solver.w.detach().cpu().numpy().reshape(K, D1).copy()
        self.coef_ = W[:, : X.shape[1]]
        self.intercept_ = W[:, X.shape[1]] if self.fit_intercept else np.zeros(K)
        return self

    def _scores(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return X @ self.coef_.T + self.intercept_

    def decision_function(self, X):
        """Class scores ``(n, K)``; with two classes ``(n,)``, the second class's score minus the first's."""
        s = self._scores(X)
        return s[:, 1] - s[:, 0] if s.shape[1] == 2 else s

    def predict(self, X):
        """The class of the largest score (the first one on ties)."""
        check_is_fitted(self)
        return self.classes_[self._scores(X).argmax(1)]
