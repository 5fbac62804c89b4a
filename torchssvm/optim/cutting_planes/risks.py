"""Empirical risks as cutting-plane oracles: the value of ``R(w)`` and a cut that is tight at ``w``.

Bundle methods (Zhang et al., 2010, eq. 3) and the 1-slack cutting plane (Yu & Joachims, 2008, Alg. 1) see the risk only
through this oracle. A cut is a pair ``(c, g)`` with

    R(v) >= c - <v, g>  for every v,     R(w) = c - <w, g>  at the query point,

i.e. ``-g`` is a subgradient of ``R`` at ``w`` and ``c = R(w) + <w, g>`` (BMRM's ``a = -g``, ``b = c``).
For a margin-rescaled SSVM (`StructuredRisk`) ``c = (1/n) sum_i L_i(y^_i)`` and ``g = (1/n) sum_i
psi_i(y^_i)``, the 1-slack cut of Yu & Joachims (2008) in our ``psi = phi(y_i) - phi(y)`` sign.

- `StructuredRisk`: any `DualProblem` (chains, multiclass, multi-label, feature tables), one oracle pass.
- `HingeRisk`: the binary hinge ``(1/n) sum_i max(0, 1 - y_i <x_i, w>)``, two matrix-vector products.
- `MaxOfLinearRisk`: ``max_i <a_i, w> + b_i``, the lower-bound instance of Zhang et al. (2010).

Each has ``d``, ``n``, ``device``, ``calls`` (oracle passes so far), ``write_model(w)``, ``fingerprint_data()`` (the
data a solver's state is bound to, `torchssvm.optim.fingerprint`) and ``offset_range()`` (bounds every cut's offset
``c`` obeys: a loaded bundle is checked against them). Each refuses non-finite data up front (a ValueError naming the
argument): a NaN feature would make every cut, and every certificate built on them, NaN.
"""

from __future__ import annotations

import torch

from ..._validation import check_finite, check_positive_int
from ..problems import DualProblem, make_problem


def check_finite_data(named: dict, owner: str) -> None:
    """A ValueError naming the entry of ``named`` (``{name: tensor or tuple of tensors}``) that holds NaN or Inf."""
    flat = {}
    for name, value in named.items():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for i, t in enumerate(items):
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                flat[name if len(items) == 1 else f"{name}[{i}]"] = t
    try:
        check_finite(flat)
    except ValueError as e:
        raise ValueError(f"{owner}: the training data {e}: refused (every cut and certificate would be NaN)") \
            from None


class StructuredRisk:
    """``R(w) = (1/n) sum_i max_y H_i(y; w)`` of a `DualProblem` (or a model and dataset, `make_problem`).

    The cut's ``g`` is a dense ``(d,)`` vector, accumulated block by block (``chunk`` examples per
    oracle call) without building per-example feature vectors."""

    def __init__(self, model, dataset=None, *, structure=None, backend: str = "auto", chunk: int = 1024):
        self.problem = model if isinstance(model, DualProblem) else make_problem(model, dataset, structure,
                                                                                  backend=backend)
        p = self.problem
        check_finite_data(p.fingerprint_data(), "StructuredRisk")
        self.n, self.d, self.device, self.calls = p.n, p.d, p.device, 0
        self.chunk = check_positive_int("chunk", chunk)

    def fingerprint_data(self) -> dict:
        return self.problem.fingerprint_data()

    def offset_range(self) -> tuple:
        """``c = (1/n) sum_i L_i(y^_i)`` lies in ``[0, (1/n) sum_i max_y L_i(y)]``."""
        p = self.problem
        top = sum(float(p.max_loss(idx).to(torch.float64).sum()) for idx in p.chunks(self.chunk))
        return 0.0, top / self.n

    def initial_w(self) -> torch.Tensor:
        return self.problem.initial_w().to(torch.float64)

    def write_model(self, w: torch.Tensor) -> None:
        self.problem.write_model(w)

    @torch.no_grad()
    def cut(self, w: torch.Tensor):
        """``(R(w), c, g (d,))``: one loss-augmented oracle pass over the ``n`` examples."""
        p, n = self.problem, self.n
        g = torch.zeros(self.d, dtype=torch.float64, device=self.device)
        loss_sum, hinge_sum = 0.0, 0.0
        for idx in p.chunks(self.chunk):
            theta = p.potentials(w, idx)
            labels, loss, H = p.oracle(theta, idx)
            p.accumulate(g, idx, p.corner(idx, labels), torch.full_like(loss, 1.0 / n, dtype=torch.float64))
            loss_sum += float(loss.sum())
            hinge_sum += float(H.clamp_min(0).sum())
        self.calls += 1
        c = loss_sum / n
        return hinge_sum / n, c, g


class _ParameterVectorRisk:
    """A risk over a plain parameter vector ``w (d,)`` with no model to write: starts at 0."""

    d: int
    device: torch.device

    def initial_w(self) -> torch.Tensor:
        return torch.zeros(self.d, dtype=torch.float64, device=self.device)

    def write_model(self, w: torch.Tensor) -> None:
        pass


class HingeRisk(_ParameterVectorRisk):
    """``R(w) = (1/n) sum_i max(0, 1 - y_i <x_i, w>)`` (binary SVM without bias), ``x (n, d)``, ``y (n,)`` in
    ``{-1, +1}``. Its cut: ``c = |A| / n``, ``g = (1/n) sum_{i in A} y_i x_i`` with ``A`` the margin
    violators (``y_i <x_i, w> < 1``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] == 0:
            raise ValueError("x must be a non-empty (n, d) tensor")
        if not isinstance(y, torch.Tensor) or y.shape != (x.shape[0],):
            raise ValueError(f"y must be a ({x.shape[0]},) tensor of -1/+1 labels")
        if not bool(((y == 1) | (y == -1)).all()):
            raise ValueError("y must hold only -1 and +1")
        check_finite_data({"x": x}, "HingeRisk")
        self.x = x.to(torch.float64)
        self.y = y.to(torch.float64)
        self.n, self.d = x.shape
        self.device, self.calls = x.device, 0

    def fingerprint_data(self) -> dict:
        return {"x": self.x, "y": self.y}

    def offset_range(self) -> tuple:
        """``c = |A| / n``, the fraction of margin violators, in ``[0, 1]``."""
        return 0.0, 1.0

    @torch.no_grad()
    def cut(self, w: torch.Tensor):
        margin = self.y * (self.x @ w)
        active = (margin < 1).to(torch.float64)
        self.calls += 1
        g = self.x.T @ (active * self.y) / self.n
        return float((1 - margin).clamp_min(0).sum()) / self.n, float(active.sum()) / self.n, g


class MaxOfLinearRisk(_ParameterVectorRisk):
    """``R(w) = max_i <a_i, w> + b_i`` for ``a (k, d)`` and ``b (k,)`` (ties: the first index). With
    ``a = H_d / sqrt(d)`` and ``b = 0`` it is the corrected lower-bound instance of Zhang et al. (2010) (
    section 1.3), where exact BMRM needs ``1 / (2 lam eps)`` iterations."""

    def __init__(self, a: torch.Tensor, b=None):
        if not isinstance(a, torch.Tensor) or a.dim() != 2:
            raise ValueError("a must be a (k, d) tensor")
        self.a = a.to(torch.float64)
        self.b = torch.zeros(a.shape[0], dtype=torch.float64, device=a.device) if b is None else b.to(torch.float64)
        if self.b.shape != (a.shape[0],):
            raise ValueError(f"b must have shape ({a.shape[0]},)")
        check_finite_data({"a": self.a, "b": self.b}, "MaxOfLinearRisk")
        self.n, self.d = 1, a.shape[1]
        self.device, self.calls = a.device, 0

    def fingerprint_data(self) -> dict:
        return {"a": self.a, "b": self.b}

    def offset_range(self) -> tuple:
        """``c = b_i`` of a piece: in ``[min b, max b]``."""
        return float(self.b.min()), float(self.b.max())

    @torch.no_grad()
    def cut(self, w: torch.Tensor):
        values = self.a @ w + self.b
        i = int(values.argmax())
        self.calls += 1
        return float(values[i]), float(self.b[i]), -self.a[i]
