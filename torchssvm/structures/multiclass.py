"""Multiclass classification as the simplest structure: one factor with K states."""

from __future__ import annotations

from typing import Sequence

import torch

from .._validation import POTENTIAL_INF_HINT, check_finite, check_float_dtype, check_labels, check_tensor
from .base import Structure, compute_dtype, logsumexp_scaled, truth_unless_violated


def _no_lengths(lengths) -> None:
    if lengths is not None:
        raise ValueError("lengths must be None for Multiclass (every example has one label)")


class Multiclass(Structure):
    """Output space ``{0..K-1}``; potentials are scores ``(B, K)``, labels ``(B,)`` long.

    Task loss: 0/1, weighted by ``class_weights[y]`` of the true class when given. The loss-augmented
    oracle is ``argmax_k scores[k] + loss_weight * c[y] * [k != y]`` (ties: smallest index).
    """

    potential_names = ("scores",)
    has_slack_oracle = has_log_partition = has_table_oracle = has_max_task_loss = True

    def __init__(self, num_classes: int, *, class_weights=None):
        super().__init__(num_classes, class_weights)

    @property
    def num_classes(self) -> int:
        return self.num_labels

    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        _no_lengths(lengths)
        check_tensor("scores", potentials, ndim=2, floating=True)
        B, K = potentials.shape
        if K != self.num_labels:
            raise ValueError(f"scores has {K} classes in its last dimension, expected {self.num_labels}")
        check_finite({"scores": potentials}, POTENTIAL_INF_HINT)
        if target is not None:
            target = check_labels(target_name, target, (B,), K, potentials.device)
        return potentials, None, target

    def _max_oracle(self, scores, lengths, target, loss_weight, backend):
        s = scores.detach().to(compute_dtype([scores]))
        if target is not None:
            cost = (self._class_weight(target, torch.float64) * loss_weight).to(s.dtype)
            wrong = torch.ones_like(s, dtype=torch.bool).scatter_(1, target.unsqueeze(1), False)
            s = s + torch.where(wrong, cost.unsqueeze(1), 0.0)  # where: an inf cost gives +inf, not inf * 0 = NaN
        value, y_hat = s.max(dim=1)
        return y_hat, value

    def _slack_max_oracle(self, scores, lengths, target, backend, margin=1.0):
        """``(y_hat, max(0, max_k Delta(y, k) (margin + s_k - s_y)))`` by enumeration; ``y`` when nothing violates
        (``margin`` 1 but for the overflow guard's scaling, `Structure._slack_max_oracle`)."""
        s = scores.detach().to(compute_dtype([scores]))
        gold = s.gather(1, target.unsqueeze(1))
        cost = self._class_weight(target, s.dtype).unsqueeze(1)
        wrong = torch.ones_like(s, dtype=torch.bool).scatter_(1, target.unsqueeze(1), False)
        value, y_hat = torch.where(wrong, cost * (margin + s - gold), 0.0).max(dim=1)
        return truth_unless_violated(y_hat, value, target)

    def _score(self, scores, y, lengths) -> torch.Tensor:
        return scores.gather(1, y.unsqueeze(1)).squeeze(1)

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        _no_lengths(lengths)
        check_tensor("y", y, ndim=1)
        y = check_labels("y", y, tuple(y.shape), self.num_labels, y.device)
        y_hat = check_labels("y_hat", y_hat, tuple(y.shape), self.num_labels, y.device)
        return self._task_loss(y_hat, y, None)

    def _task_loss(self, y_hat, y, lengths) -> torch.Tensor:
        return self._class_weight(y, torch.float64) * (y_hat != y)

    def marginals(self, y, lengths=None, *, dtype=torch.float32) -> torch.Tensor:
        """One-hot ``(B, K)``."""
        check_float_dtype(dtype)
        _no_lengths(lengths)
        check_tensor("y", y, ndim=1)
        y = check_labels("y", y, tuple(y.shape), self.num_labels, y.device)
        return torch.nn.functional.one_hot(y, self.num_labels).to(dtype)

    def log_partition(self, potentials, lengths=None) -> torch.Tensor:
        """``logsumexp_k scores[k]`` per example (softmax cross-entropy = log_partition - score)."""
        return super().log_partition(potentials, lengths)

    def _score_bound(self, tensors, mags, aug):
        return mags.get("scores", 0.0) + aug

    def _log_partition(self, scores, lengths, scale=1.0) -> torch.Tensor:
        return logsumexp_scaled(scores.to(compute_dtype([scores])), 1, scale)

    def _labelling_table(self, scores, target):
        labels = torch.arange(self.num_labels, device=scores.device)
        cost = self._class_weight(target, torch.float64).unsqueeze(1)
        return labels, scores.detach().to(torch.float64), cost * (labels.unsqueeze(0) != target.unsqueeze(1)), target

    def _max_task_loss(self, target, lengths) -> torch.Tensor:
        w = self._class_weight(target, torch.float64)
        return w if self.num_labels > 1 else torch.zeros_like(w)

    def tensors(self, potentials):
        return (potentials,)

    def from_tensors(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return tensors[0]

    def marginal_vjp(self, y, weight, potentials, lengths, needs, dtype=None):
        if not needs[0]:
            return (None,)
        g = torch.zeros_like(potentials, dtype=dtype or potentials.dtype)
        return (g.scatter_(1, y.unsqueeze(1), weight.to(g.dtype).unsqueeze(1)),)
