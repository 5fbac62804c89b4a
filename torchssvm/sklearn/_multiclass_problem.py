"""The multiclass SSVM's dual problem with the joint feature map ``one-hot(y) (x) x`` held as ``x`` alone.

`FeatureTableProblem` holds ``phi(x_i, y)`` for every class, ``n K (K D)`` numbers; here ``w`` is read as a
``(K, D)`` matrix and every product of the contract factors through ``x``: ``theta_i = W x_i``,
``Phi_i z = z (x) x_i`` and ``<Phi_a z_a, Phi_b z_b> = <z_a, z_b> <x_a, x_b>`` (``n D`` numbers)."""

from __future__ import annotations

import torch

from .._validation import check_square_sums
from ..optim.problems import FeatureTableProblem


class MulticlassTableProblem(FeatureTableProblem):
    """Args: ``x (n, D)`` float features (with a column of ones for a bias), ``truth (n,)`` long labels in
    ``[0, K)``, ``K`` classes; the 0/1 loss. ``w`` is ``W (K, D)`` row-major."""

    def __init__(self, x: torch.Tensor, truth: torch.Tensor, K: int):
        n, D = x.shape
        check_square_sums("X", x)  # else ||psi||^2 = inf and every step size 0: a run that never moves
        self.device = x.device
        self.x = x.to(self.dtype)
        truth = truth.long()
        self.losses = 1.0 - torch.nn.functional.one_hot(truth, K).to(self.dtype)
        self.n, self.K, self.D, self.d, self.m = n, K, D, K * D, K
        self.label_bound = K
        self.label_width = 1
        self.truth = truth.unsqueeze(1)
        self.weight = torch.zeros(self.d, dtype=self.dtype, device=self.device)

    def potentials(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.x[idx] @ w.view(self.K, self.D).T

    def joint_features(self, idx, z, width=None):
        return (z.unsqueeze(2) * self.x[idx].unsqueeze(1)).reshape(z.shape[0], self.d)

    def gram(self, idx_a, z_a, idx_b=None, z_b=None):
        if idx_b is None:
            idx_b, z_b = idx_a, z_a
        return (z_a @ z_b.T) * (self.x[idx_a] @ self.x[idx_b].T)

    def sqnorm(self, idx, z):
        return (z * z).sum(1) * (self.x[idx] * self.x[idx]).sum(1)

    def accumulate(self, w, idx, z, coef):
        w.view(self.K, self.D).add_((z * coef.to(self.dtype).unsqueeze(1)).T @ self.x[idx])
