"""The multi-label SSVM of a linear pairwise model on dense features, in marginal coordinates.

Potentials of example i (`MultiLabel`): ``unary = x_i W + b`` (``W (D, K)``, ``b (K)``) and one shared
interaction per edge ``pairwise (E)``. The block vector is ``z = [unary marginals (K) | edge marginals (E)]``
(``m = K + E``) and ``Phi_i z = [x_i z_u^T | z_u | z_p]``, so Gram matrices factor as
``<x_a, x_b> <z_ua, z_ub> + <z_ua, z_ub> + <z_pa, z_pb>``. Oracles enumerate the ``2^K`` labellings
(`MultiLabel`, ``K <= 16``): loss-augmented decoding, and the exact slack oracle, so the slack-rescaled
SSVM (`SlackRescaledProblem`) is available too.
"""

from __future__ import annotations

import torch

from ..._validation import check_square_sums
from ...structures.multilabel import MultiLabel, MultiLabelPotentials
from .base import DualProblem


class MultiLabelProblem(DualProblem):
    """Args:
        x: ``(n, D)`` float features.
        y: ``(n, K)`` 0 / 1 labels.
        structure: a `MultiLabel` with K labels (edges and loss normalization); default ``MultiLabel(K)``.
        bias: learn a per-label bias ``b``.

    ``w = [W (D K, row-major) | b (K) | pairwise (E)]``; `weights` splits it.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, structure: MultiLabel = None, *, bias: bool = True):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
            raise ValueError("x must be a (n, D) float tensor")
        n, D = x.shape
        if n == 0:
            raise ValueError("x is empty")
        if not isinstance(y, torch.Tensor) or y.dim() != 2 or y.shape[0] != n or y.is_floating_point():
            raise ValueError(f"y must be a ({n}, K) integer tensor of 0 / 1 labels")
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError("y must hold only 0 / 1")
        if not torch.isfinite(x).all():
            raise ValueError("x holds NaN or Inf")
        check_square_sums("x", x)
        K = y.shape[1]
        self.structure = structure if structure is not None else MultiLabel(K)
        if not isinstance(self.structure, MultiLabel) or self.structure.num_labels != K:
            raise ValueError(f"structure must be a MultiLabel with {K} labels, got {self.structure!r}")
        self.device = x.device
        self.x = x.to(self.dtype)
        self.K, self.D, self.E = K, D, self.structure.num_edges
        self.bias = bool(bias)
        self.n, self.m = n, K + self.E
        self.label_bound = 2  # each label on or off
        self.d = D * K + (K if self.bias else 0) + self.E
        self.label_width = K
        self.truth = y.long().to(self.device)
        self.weight = torch.zeros(self.d, dtype=self.dtype, device=self.device)

    def parameter_slices(self) -> dict:
        DK, K = self.D * self.K, self.K
        out = {"weight": (0, DK, (self.D, K))}
        if self.bias:
            out["bias"] = (DK, DK + K, (K,))
        if self.E:
            out["pairwise"] = (self.d - self.E, self.d, (self.E,))
        return out

    def weights(self, w: torch.Tensor):
        """``(W (D, K), b (K) or None, pairwise (E) or None)`` views of ``w``."""
        s = self.parameter_slices()
        part = {k: w[a:b].view(shape) for k, (a, b, shape) in s.items()}
        return part["weight"], part.get("bias"), part.get("pairwise")

    def write_model(self, w: torch.Tensor) -> None:
        self.weight.copy_(w)

    # -- the contract ---------------------------------------------------------------------------
    def potentials(self, w: torch.Tensor, idx: torch.Tensor) -> MultiLabelPotentials:
        W, b, pw = self.weights(w)
        unary = self.x[idx] @ W
        if b is not None:
            unary = unary + b
        return MultiLabelPotentials(unary, pw)

    def oracle(self, theta, idx):
        # the structure's unchecked tier: the data were checked when the problem was built
        fast, truth = self.structure.unchecked, self.truth[idx]
        lw = torch.ones(idx.shape[0], dtype=self.dtype, device=self.device)
        labels, value = fast.max_oracle(theta, truth, loss_weight=lw, backend="torch")
        H = value - fast.score(theta, truth)
        return labels, fast.task_loss(labels, truth), H

    def slack_oracle(self, theta, idx):
        fast, truth = self.structure.unchecked, self.truth[idx]
        labels, value = fast.slack_max_oracle(theta, truth, backend="torch")
        return labels, fast.task_loss(labels, truth), value.to(self.dtype)

    def decode(self, theta, idx):
        return self.structure.unchecked.decode(theta, backend="torch")

    def labels_score(self, theta, idx, labels):
        B, C, K = labels.shape
        pot = MultiLabelPotentials(theta.unary.repeat_interleave(C, 0), theta.pairwise)
        return self.structure.unchecked.score(pot, labels.reshape(B * C, K).clamp_min(0)).view(B, C)

    def task_loss(self, idx, labels):
        B, C, K = labels.shape
        truth = self.truth[idx].repeat_interleave(C, 0)
        return self.structure.unchecked.task_loss(labels.reshape(B * C, K), truth).view(B, C)

    def _marginals(self, y):
        m = self.structure.marginals(y, dtype=self.dtype)
        return m.unary if m.pairwise is None else torch.cat([m.unary, m.pairwise], 1)

    def corner(self, idx, labels):
        return self._marginals(self.truth[idx]) - self._marginals(labels)

    def corner_difference(self, idx, labels, other):
        return self._marginals(other) - self._marginals(labels)  # 0/1 marginals: exact

    def inner(self, theta, z):
        out = (theta.unary * z[:, : self.K]).sum(1)
        if self.E:
            out = out + z[:, self.K :] @ theta.pairwise
        return out

    def gram(self, idx_a, z_a, idx_b=None, z_b=None):
        if idx_b is None:
            idx_b, z_b = idx_a, z_a
        ua, ub = z_a[:, : self.K], z_b[:, : self.K]
        uu = ua @ ub.T
        G = (self.x[idx_a] @ self.x[idx_b].T) * uu
        if self.bias:
            G = G + uu
        if self.E:
            G = G + z_a[:, self.K :] @ z_b[:, self.K :].T
        return G

    def sqnorm(self, idx, z):
        u = z[:, : self.K]
        uu = (u * u).sum(1)
        out = (self.x[idx] * self.x[idx]).sum(1) * uu
        if self.bias:
            out = out + uu
        if self.E:
            out = out + (z[:, self.K :] ** 2).sum(1)
        return out

    def accumulate(self, w, idx, z, coef):
        W, b, pw = self.weights(w)
        zc = z * coef.to(self.dtype).unsqueeze(1)
        u = zc[:, : self.K]
        W.add_(self.x[idx].T @ u)
        if b is not None:
            b.add_(u.sum(0))
        if pw is not None:
            pw.add_(zc[:, self.K :].sum(0))

    def max_loss(self, idx):
        return self.structure.unchecked.max_task_loss(self.truth[idx]).to(self.dtype)
