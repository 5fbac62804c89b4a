"""The B x B box QP of the coordinated mini-batch step (DESIGN.md, "Mini-batches of blocks, exactly").

``min_gamma  -c^T gamma + 1/2 gamma^T H gamma   s.t.  0 <= gamma <= upper``, with ``H`` positive
semi-definite. For ``B = 1`` the answer is the closed-form line search of note 001 (section 1.5):
``clip(c / H, 0, upper)``.
"""

from __future__ import annotations

import numpy as np
import torch


def box_qp(c: torch.Tensor, H: torch.Tensor, upper: torch.Tensor, *, max_sweeps: int = 50,
           tol: float = 1e-12) -> torch.Tensor:
    """Exact coordinate minimization (Gauss-Seidel sweeps in index order) from ``gamma = 0``.

    Every coordinate step is an exact 1-D minimization, so the objective never increases and stays
    ``<= 0`` (its value at 0). Stops when no coordinate moves by more than ``tol`` in a sweep or after
    ``max_sweeps`` sweeps. A zero-curvature coordinate with a positive gain goes to its upper bound.
    """
    B = c.shape[0]
    if B == 1:
        g = _coordinate(float(c[0]), float(H.reshape(-1)[0]), float(upper[0]))
        return torch.tensor([g], dtype=torch.float64, device=c.device)
    cn = c.detach().cpu().to(torch.float64).numpy()
    un = upper.detach().cpu().to(torch.float64).numpy()
    Hn = H.detach().cpu().to(torch.float64).numpy()
    gamma = np.zeros(B)
    grad = -cn.copy()  # H gamma - c
    for _ in range(max_sweeps):
        moved = 0.0
        for b in range(B):
            h = Hn[b, b]
            r = -(grad[b] - h * gamma[b])  # c_b - sum_{a != b} H_ba gamma_a
            new = _coordinate(r, h, un[b])
            delta = new - gamma[b]
            if delta != 0.0:
                gamma[b] = new
                grad += Hn[:, b] * delta
                moved = max(moved, abs(delta))
        if moved <= tol:
            break
    return torch.from_numpy(gamma).to(c.device)


def _coordinate(r: float, h: float, upper: float) -> float:
    if h > 0:
        return min(max(r / h, 0.0), upper)
    return upper if r > 0 else 0.0
