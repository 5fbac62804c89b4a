"""Mercer kernels on feature rows, evaluated in blocks on the tensors' device (GEMM-shaped).

``k(a, b)`` for ``a (p, D)`` and ``b (q, D)`` is a ``(p, q)`` matrix:

- ``"rbf"``: ``exp(-gamma ||a - b||^2)``, i.e. scikit-learn's ``gamma``; Yu & Joachims's (2008) ``sigma^2`` is
  ``gamma = 1 / sigma^2``. The whole exponent is one GEMM over augmented rows,
  ``[a, ||a||^2, 1] . [2 gamma b, -gamma, -gamma ||b||^2]``, after centring both sides on b's mean (the
  distance is translation invariant, and centring shrinks the norms whose difference cancels), then one
  in-place clamp and one in-place exp: faster than the expanded ``||a||^2 + ||b||^2 - 2 a b^T`` (five full-size
  temporaries), and exact to rounding where the expanded form in float32 is not. The exponent is floored where
  exp would return a subnormal number, which x86 CPUs compute an order of magnitude slower (narrow kernels,
  Checkers at gamma = 20, are mostly such entries): at ``-80`` in float32 and half precision
  (entries below ``exp(-80) ~ 1.8e-35`` come back as that value) and at ``-700`` in float64 (``1e-304``). The
  float64 floor is far enough that a decision function far from every training point keeps the sign of the
  true expansion; the float32 one may not (there every entry is the floor and f is a vote of the weights).
- ``"linear"``: ``a b^T``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

KERNELS = ("rbf", "linear")
EXPONENT_FLOOR = {torch.float64: -700.0}  # other dtypes: -80 (float32's subnormals start at exp(-87.3))


class MercerKernel:
    """Args:
        name: ``"rbf"`` or ``"linear"``.
        gamma: the RBF width (> 0); None: ``1 / (D var(x))`` of the first data seen (scikit-learn's "scale").

    ``kernel(a, b, dtype=None)`` returns the ``(p, q)`` block, computed in ``dtype`` (default: the promoted
    dtype of a and b); ``evaluations`` counts the entries computed."""

    def __init__(self, name: str = "rbf", gamma: Optional[float] = None):
        if name not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {name!r}")
        if gamma is not None and not (isinstance(gamma, (int, float)) and not isinstance(gamma, bool) and gamma > 0
                                      and math.isfinite(gamma)):
            raise ValueError(f"gamma must be a finite number > 0 or None, got {gamma!r}")
        self.name, self.gamma, self.evaluations = name, None if gamma is None else float(gamma), 0

    def fit_scale(self, x: torch.Tensor) -> None:
        """Set ``gamma = 1 / (D var(x))`` when it was not given, ``var`` the population variance of all entries
        (scikit-learn's ``gamma="scale"``)."""
        if self.name == "rbf" and self.gamma is None:
            var = float(x.double().var(correction=0))
            self.gamma = 1.0 / (x.shape[1] * var) if var > 0 else 1.0

    def __call__(self, a: torch.Tensor, b: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The ``(p, q)`` block ``k(a, b)``, computed in ``dtype`` (default: the promoted dtype of a and b)."""
        dtype = torch.promote_types(a.dtype, b.dtype) if dtype is None else dtype
        a, b = a.to(dtype), b.to(dtype)
        self.evaluations += a.shape[0] * b.shape[0]
        if self.name == "linear":
            return a @ b.T
        shift = b.mean(0) if b.shape[0] else b.new_zeros(b.shape[1])
        a, b = a - shift, b - shift
        an, bn = (a * a).sum(1, keepdim=True), (b * b).sum(1, keepdim=True)
        g = self.gamma
        left = torch.cat([a, an, torch.ones_like(an)], 1)
        right = torch.cat([(2 * g) * b, torch.full_like(bn, -g), -g * bn], 1)
        return (left @ right.T).clamp_(EXPONENT_FLOOR.get(dtype, -80.0), 0.0).exp_()
