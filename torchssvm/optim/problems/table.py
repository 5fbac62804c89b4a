"""An SSVM given by explicit tables: ``phi(x_i, y)`` and ``L_i(y)`` for every one of K outputs.

The smallest exact instance of `DualProblem`: every output space is enumerable, so tests can compare the
solvers with brute force, and constructions from the papers (the toy example of Osokin et al., 2016, App. C) are a
few lines. The block vector of example i is ``z_i = e_{y_i} - mu_i`` in ``R^K``.
"""

from __future__ import annotations

import torch

from ..._validation import check_square_sums
from .base import DualProblem


class FeatureTableProblem(DualProblem):
    """Args:
        features: ``(n, K, d)`` float, ``phi(x_i, y)`` for ``y = 0..K-1``.
        losses: ``(n, K)`` float, ``L_i(y) >= 0`` with ``L_i(y_i) = 0``.
        truth: ``(n,)`` long, the true outputs ``y_i``.

    The parameters live in ``self.weight`` (``(d,)``, written by the solvers).
    """

    def __init__(self, features: torch.Tensor, losses: torch.Tensor, truth: torch.Tensor):
        if not isinstance(features, torch.Tensor) or features.dim() != 3:
            raise ValueError(f"features must be a (n, K, d) tensor, got "
                             f"{tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)}")
        n, K, d = features.shape
        if n == 0 or K == 0 or d == 0:
            raise ValueError(f"features must have n, K, d >= 1, got shape {tuple(features.shape)}")
        if not isinstance(losses, torch.Tensor) or losses.shape != (n, K):
            raise ValueError(f"losses must have shape ({n}, {K}), got "
                             f"{tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses)}")
        if not isinstance(truth, torch.Tensor) or truth.shape != (n,) or truth.is_floating_point():
            raise ValueError(f"truth must be a ({n},) integer tensor")
        if truth.numel() and (int(truth.min()) < 0 or int(truth.max()) >= K):
            raise ValueError(f"truth holds labels outside [0, {K})")
        if not torch.isfinite(features).all() or not torch.isfinite(losses).all():
            raise ValueError("features and losses must be finite")
        check_square_sums("features", features)
        if (losses < 0).any():
            raise ValueError("losses must be >= 0")
        truth = truth.long()
        if (losses.gather(1, truth.unsqueeze(1)) != 0).any():
            raise ValueError("losses must be 0 at the true output (L_i(y_i) = 0)")
        self.device = features.device
        self.features = features.to(self.dtype)
        self.losses = losses.to(self.dtype)
        self.n, self.K, self.d, self.m = n, K, d, K
        self.label_bound = K
        self.label_width = 1
        self.truth = truth.unsqueeze(1)
        self.weight = torch.zeros(d, dtype=self.dtype, device=self.device)

    @classmethod
    def slack_rescaled(cls, features: torch.Tensor, losses: torch.Tensor, truth: torch.Tensor) -> FeatureTableProblem:
        """The slack-rescaled SSVM of the same tables (Choi et al., 2016, eq. 4) as a margin-rescaled one.

        ``max_y L(y) (1 - <w, psi(y)>) = max_y L(y) - <w, L(y) psi(y)>``: margin rescaling with the scaled
        joint features ``psi~(y) = L(y) psi(y)`` , i.e. ``phi~(y) = phi(y_i) -
        L(y) (phi(y_i) - phi(y))``. Every solver then runs unchanged; a BCFW corner is
        ``w_s = L(y) psi(y) / (lam n)``, ``l_s = L(y) / n``, and the duality gap is the slack objective's."""
        base = cls(features, losses, truth)  # validates
        gold = base.features.gather(1, base.truth.unsqueeze(2).expand(-1, 1, base.d))  # (n, 1, d)
        scaled = gold - base.losses.unsqueeze(2) * (gold - base.features)
        return cls(scaled, losses, truth)

    def write_model(self, w: torch.Tensor) -> None:
        self.weight.copy_(w)

    def potentials(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.features[idx] @ w

    def oracle(self, theta: torch.Tensor, idx: torch.Tensor):
        value = self.losses[idx] + theta
        best, y = value.max(1)  # ties: the first maximum
        truth_score = theta.gather(1, self.truth[idx]).squeeze(1)
        return y.unsqueeze(1), self.losses[idx].gather(1, y.unsqueeze(1)).squeeze(1), best - truth_score

    def slack_oracle(self, theta: torch.Tensor, idx: torch.Tensor):
        loss = self.losses[idx]
        truth_score = theta.gather(1, self.truth[idx])
        value, y = (loss * (1 + theta - truth_score)).max(1)  # the truth scores 0: value >= 0
        return y.unsqueeze(1), loss.gather(1, y.unsqueeze(1)).squeeze(1), value

    def decode(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return theta.argmax(1).unsqueeze(1)

    def labels_score(self, theta, idx, labels):
        return theta.gather(1, labels[:, :, 0].clamp_min(0))  # -1: an unused slot

    def task_loss(self, idx, labels):
        return self.losses[idx].gather(1, labels[:, :, 0].clamp_min(0))

    def corner(self, idx, labels):
        B = idx.shape[0]
        z = torch.zeros(B, self.K, dtype=self.dtype, device=self.device)
        rows = torch.arange(B, device=self.device)
        z[rows, self.truth[idx, 0]] += 1.0
        z[rows, labels[:, 0]] -= 1.0
        return z

    def inner(self, theta, z):
        return (theta * z).sum(1)

    def joint_features(self, idx, z, width=None):
        """``(B, d)``: the rows ``Phi_b z_b = sum_y z_b(y) phi(x_b, y)`` that `gram` multiplies (``width`` unused:
        a table has no padding)."""
        return torch.einsum("bkd,bk->bd", self.features[idx], z)

    def gram(self, idx_a, z_a, idx_b=None, z_b=None):
        pa = self.joint_features(idx_a, z_a)
        pb = pa if idx_b is None else self.joint_features(idx_b, z_b)
        return pa @ pb.T

    def sqnorm(self, idx, z):
        p = self.joint_features(idx, z)
        return (p * p).sum(1)

    def accumulate(self, w, idx, z, coef):
        w.add_(torch.einsum("bkd,bk->d", self.features[idx], z * coef.to(self.dtype).unsqueeze(1)))

    def max_loss(self, idx):
        return self.losses[idx].max(1).values

    def block_losses(self, idx, z):
        # L_i(y) = <losses_i, e_y>: sum_y alpha(y) L_i(y) = <losses_i, e_{y_i} - z_i>
        losses = self.losses[idx]
        return losses.gather(1, self.truth[idx]).squeeze(1) - (losses * z).sum(1)

    # the simplex is the whole marginal polytope of one label
    block_violation_exact = True

    def block_violation(self, idx, z):
        # mu_i = e_{y_i} - z_i in the simplex: entries in [0, 1], summing to 1 (z_i sums to 0)
        mu = -z
        mu[torch.arange(z.shape[0], device=z.device), self.truth[idx, 0]] += 1.0
        return torch.maximum((mu - 1).clamp_min(0).amax(1), (-mu).clamp_min(0).amax(1)).maximum(z.sum(1).abs())
