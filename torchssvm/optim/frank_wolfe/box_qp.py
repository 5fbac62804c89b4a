"""The B x B box QP of the coordinated mini-batch step (docs/design.md, "The exact mini-batch step").

``min_gamma  f(gamma) = -c^T gamma + 1/2 gamma^T H gamma   s.t.  0 <= gamma <= upper``, with ``H``
positive semi-definite. For ``B = 1`` the answer is the closed-form line search of Osokin et al. (2016)
(section 1.5): ``clip(c / H, 0, upper)``.

Two solvers, both monotone from ``gamma = 0`` (so ``f <= 0`` and the dual never increases):

- ``"newton"`` (default): projected Newton. Where it runs (`_host_solver`):
  - with numba, on the host as one compiled loop (`box_qp_numba`: the arcs' exact minima; fastest at every B
    we measured on the CPU, 5.5x numpy's loop at B = 64 and 2.4x torch's at B = 256), for CPU inputs of any size
    and device inputs up to ``_NUMBA_DEVICE_MAX_B`` blocks, from one copy of the inputs;
  - without numba, in numpy on the host up to ``_NUMPY_MAX_B`` blocks;
  - otherwise on the device of the inputs: a fixed-size batched linear solve and a batched search along the
    projection arc per iteration, no Python loop over B.
  Each returns the QP's optimum to ``tol`` (in 3.5 steps on average on the OCR mini-batch QPs we measured),
  at least as good as any number of coordinate sweeps. The host-free step (``sync_free=True``) runs the device
  iteration a fixed number of times, on CUDA as Triton kernels (`kernels.step.box_qp_triton`: five launches and the
  Cholesky solve per iteration, the same iteration to rounding).
- ``"sweeps"``: exact coordinate minimization (Gauss-Seidel sweeps in index order) on the host, the
  reference of docs/design.md.
"""

from __future__ import annotations

import numpy as np
import torch

from ..._device import host_to_device
from ...kernels import box_qp_newton
from ...kernels.step.box_qp_tolerance import RIDGE_FLOOR as _RIDGE_FLOOR
from ...kernels.step.box_qp_torch import _ARC
from ...kernels.step.box_qp_torch import projected_newton_torch as _projected_newton

METHODS = ("newton", "sweeps")


# Without numba, problems up to this size run the numpy twin of the iteration on the host: on the CPU torch's
# per-operation overhead dominates there; above it numpy's OpenBLAS solve goes multi-threaded, and its spinning
# threads compete with torch's for the cores (docs/benchmarks/box_qp.md).
_NUMPY_MAX_B = 64

# With numba, device problems up to this size are solved on the host (one copy of (c, H, upper), one wait): the
# compiled loop is fast there, where the device iteration launches a few dozen small kernels per iteration and
# reads its stop flag every `box_qp_torch._DEVICE_CHECK_EVERY` iterations; above it the host's O(B^3)
# factorization grows while a GPU's does not (docs/benchmarks/box_qp.md, host_free_step.md).
_NUMBA_DEVICE_MAX_B = 256


def _host_solver(B: int, device: torch.device):
    """The host function that solves a ``B``-block QP whose inputs are on ``device``, or None for the torch
    iteration on the device."""
    from . import box_qp_numba  # here: importing numba costs 0.2 s, paid by the first QP, not by `import torchssvm`

    if box_qp_numba.available() and (device.type == "cpu" or B <= _NUMBA_DEVICE_MAX_B):
        return box_qp_numba.projected_newton
    if B <= _NUMPY_MAX_B:
        return _projected_newton_numpy
    return None


def box_qp(c: torch.Tensor, H: torch.Tensor, upper: torch.Tensor, *, method: str = "newton", max_iter: int = 50,
           tol: float = 1e-12, sync_free: bool = False, unconverged: torch.Tensor | None = None,
           backend: str = "auto") -> torch.Tensor:
    """Args:
        c ``(B,)``, H ``(B, B)`` PSD, upper ``(B,)`` >= 0 (float64 on any device).
        method: ``"newton"`` or ``"sweeps"``.
        max_iter: Newton iterations or coordinate sweeps.
        tol: ``"newton"`` stops when the gradient of every coordinate not held at a bound (the KKT residual) is
            at most ``tol max|c|`` (plus the resolution of its ridged Newton systems, `_RIDGE_FLOOR`), which is free
            of the problem's scale; ``"sweeps"`` stops when every coordinate move is at most ``tol (1 + max|c|)``.
        sync_free: ``"newton"`` on the inputs' device without the host reading anything (for ``B = 1`` the closed
            form): all ``max_iter`` iterations are launched, an iterate that meets the tolerance (or finds no
            descent) staying frozen, so the answer is the one of the same iteration that stops, from a fixed
            sequence of kernels (which a CUDA graph can replay). ``"sweeps"`` runs on the host (``B = 1``: the
            closed form on the device, as for ``"newton"``).
        unconverged: with ``sync_free``, a 0-dim integer tensor on the device to which 1 is added when the
            iteration ends short of the tolerance (``max_iter`` reached while still descending): a counter the
            caller reads when it reads anyway.
        backend: the form of the ``sync_free`` iteration (the backend table's ``"box_qp_newton"``): ``"torch"``
            (`kernels.projected_newton_torch`, about 45 launches per iteration plus the solve's) or ``"triton"``
            (`kernels.step.box_qp_triton`: five launches per iteration plus the Cholesky solve's, the same
            iteration to rounding); ``"auto"``: Triton on CUDA (`kernels.box_qp_newton`).

    Returns ``gamma (B,)`` on the device of ``c``. A zero-curvature coordinate with a positive gain
    goes to its upper bound."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    B = c.shape[0]
    if sync_free and (method == "newton" or B == 1):
        c, H, upper = (t.to(torch.float64) for t in (c, H, upper))
        if B == 1:  # `_coordinate` as tensor work
            h = H.reshape(1)
            return torch.where(h > 0, torch.minimum((c / h).clamp_min(0.0), upper), torch.where(c > 0, upper, 0.0))
        gamma, running = box_qp_newton(c, H, upper, max_iter, tol, backend=backend)
        if unconverged is not None:
            unconverged.add_(running.to(unconverged.dtype))
        return gamma
    if B == 1:
        g = _coordinate(float(c[0]), float(H.reshape(-1)[0]), float(upper[0]))
        return torch.tensor([g], dtype=torch.float64, device=c.device)
    if method == "sweeps":
        return _sweeps(c, H, upper, max_iter, tol)
    solve = _host_solver(B, c.device)
    if solve is not None:
        if c.device.type == "cpu":
            host = [np.ascontiguousarray(t.detach().to(torch.float64).numpy()) for t in (c, H, upper)]
        else:  # one copy to the host: c, upper and H packed in a single tensor
            packed = torch.cat([c.reshape(1, B), upper.reshape(1, B), H.reshape(B, B)]).detach()
            packed = packed.to(device="cpu", dtype=torch.float64).numpy()
            host = [packed[0], packed[2:], packed[1]]
        gamma = torch.from_numpy(solve(*host, max_iter, tol))
        return gamma if c.device.type == "cpu" else host_to_device(gamma, c.device)
    return _projected_newton(c.to(torch.float64), H.to(torch.float64), upper.to(torch.float64), max_iter, tol)


def qp_objective(c: torch.Tensor, H: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``f(gamma) = -c^T gamma + 1/2 gamma^T H gamma`` for ``gamma (..., B)``."""
    return -(gamma * c).sum(-1) + 0.5 * ((gamma @ H) * gamma).sum(-1)


def _projected_newton_numpy(c, H, upper, max_iter, tol):
    """`_projected_newton` on numpy arrays, step for step (the CPU path)."""
    B = c.shape[0]
    arc = _ARC.numpy()
    ridge = 1e-13 * float(np.abs(np.diagonal(H)).max()) + 1e-300
    scale = tol * float(np.abs(c).max())
    gamma = np.zeros(B)
    grad = -c
    f = 0.0
    for _ in range(max_iter):
        bind = ((gamma <= 0) & (grad >= 0)) | ((gamma >= upper) & (grad <= 0))
        if float(np.abs(np.where(bind, 0.0, grad)).max()) <= scale + _RIDGE_FLOOR * ridge * float(gamma.max()):
            break
        free = (~bind).astype(np.float64)
        M = H * free[None, :] * free[:, None] + np.diag(1.0 - free + ridge)
        moves = np.stack([np.linalg.solve(M, -grad * free), -grad * free])
        targets, rooms = _rooms_numpy(gamma, moves, upper)
        t = np.concatenate([_first_breakpoints_numpy(rooms)[:, None] * arc, [[1.0], [0.0]]], 1)
        trials = _trial_points_numpy(gamma, t, moves, targets, rooms, upper)
        with np.errstate(invalid="ignore", over="ignore"):
            values = np.nan_to_num(-(trials @ c) + 0.5 * ((trials @ H) * trials).sum(1), nan=np.inf)
        best = int(np.argmin(values))
        if not values[best] < f:
            break
        gamma, f = trials[best], float(values[best])
        grad = H @ gamma - c
    return gamma


def _rooms_numpy(gamma, moves, upper):
    """`box_qp_torch._rooms` in numpy: the bound each coordinate heads for and the step that reaches it."""
    targets = np.where(moves > 0, upper, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        room = (targets - gamma) / moves
        return targets, np.where(room > 0, room, np.inf)


def _first_breakpoints_numpy(rooms):
    t = rooms.min(1)
    return np.where(np.isfinite(t), t, 1.0)


def _trial_points_numpy(gamma, steps, moves, targets, rooms, upper):
    """`box_qp_torch._trial_points` in numpy: ``(R A, B)`` projected trials, a coordinate whose breakpoint the step
    reaches exactly on its bound."""
    with np.errstate(invalid="ignore", over="ignore"):
        trials = np.clip(gamma + steps[:, :, None] * moves[:, None, :], 0.0, upper)
    reached = (steps[:, :, None] >= rooms[:, None, :]) & np.isfinite(rooms)[:, None, :]
    return np.where(reached, targets[:, None, :], trials).reshape(-1, gamma.shape[0])


def _sweeps(c, H, upper, max_sweeps, tol):
    B = c.shape[0]
    cn = c.detach().cpu().to(torch.float64).numpy()
    un = upper.detach().cpu().to(torch.float64).numpy()
    Hn = H.detach().cpu().to(torch.float64).numpy()
    scale = tol * (1.0 + float(np.abs(cn).max()))
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
        if moved <= scale:
            break
    return torch.from_numpy(gamma).to(c.device)


def _coordinate(r: float, h: float, upper: float) -> float:
    if h > 0:
        return min(max(r / h, 0.0), upper)
    return upper if r > 0 else 0.0
