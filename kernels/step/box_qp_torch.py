"""The mini-batch step's B x B box QP, projected Newton (Bertsekas 1982) as torch operations on the inputs' device:
the twin of `box_qp_triton`, and the device iteration of ``optim.frank_wolfe.box_qp`` (which has the host's). The
problem, its tolerance and the two solvers' contract: ``optim.frank_wolfe.box_qp.box_qp``.
"""

from __future__ import annotations

import torch

from .box_qp_tolerance import RIDGE_FLOOR

# Step lengths tried along each arc, relative to the arc's first breakpoint t_b (where the first free
# coordinate reaches a bound): t_b * 2^j for j = -30..30, and 0 (keep the iterate). Relative lengths
# matter when H is (nearly) singular: the Newton step is then huge along the null space and only
# lengths near t_b leave the box's interior usable.
_ARC = torch.cat([2.0 ** torch.arange(-30, 31, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])


# Iterations between reads of the stop flag on a device (each read makes the host wait for the device).
_DEVICE_CHECK_EVERY = 4


def _rooms(gamma, moves, upper):
    """``(targets, rooms)``, both ``(R, B)`` for ``moves (R, B)``: the bound each coordinate of ``gamma + t move``
    heads for, and the step length at which it gets there (+inf for a coordinate that does not move or sits on that
    bound already)."""
    # (bound - gamma) / move towards the bound it heads for; a zero move gives +-inf or NaN, which the test
    # room > 0 keeps as +inf or drops, like a move that reaches nothing
    targets = torch.where(moves > 0, upper, 0.0)
    room = (targets - gamma) / moves
    return targets, torch.where(room > 0, room, torch.inf)


def _first_breakpoints(rooms):
    """``(R,)``: per row the step length at which the first moving coordinate reaches a bound it is not on yet (1 if
    none)."""
    t = rooms.min(1).values
    return torch.where(torch.isfinite(t), t, 1.0)


def _trial_points(gamma, steps, moves, targets, rooms, lo, upper):
    """``(R A, B)``: ``P(gamma + t move)`` at the step lengths ``steps (R, A)`` along ``moves (R, B)``, where a
    coordinate whose breakpoint the step reaches lands exactly on its bound. Rounding would otherwise leave the
    coordinate that defines the breakpoint ``t_b`` a few ulps inside the box (``gamma + ((u - gamma) / m) m != u``),
    where the next iteration's binding set misses it and spends iterations on a coordinate that is at its bound."""
    R, B = moves.shape
    x = torch.addcmul(gamma, steps.unsqueeze(2), moves.unsqueeze(1)).clamp_(lo, upper)
    reached = (steps.unsqueeze(2) >= rooms.unsqueeze(1)) & (rooms < torch.inf).unsqueeze(1)
    return torch.where(reached, targets.unsqueeze(1), x).reshape(-1, B)


def _arc_on(device: torch.device) -> torch.Tensor:
    """`_ARC` made on ``device`` by two launches (no copy from the host, which a CUDA graph could not replay)."""
    if device.type == "cpu":
        return _ARC
    steps = torch.arange(-30, 31, dtype=torch.float64, device=device)
    return torch.cat([torch.exp2(steps), torch.zeros(1, dtype=torch.float64, device=device)])


def _stop_test(gamma, grad, upper, scale, floor):
    """``(bind, projected, descending)``: the coordinates held at a bound with the gradient pushing outward, the
    gradient with those zeroed, and whether it is still above the tolerance ``scale + floor max(gamma)`` (the
    ridge's resolution, `RIDGE_FLOOR`)."""
    bind = ((gamma <= 0) & (grad >= 0)) | ((gamma >= upper) & (grad <= 0))
    projected = torch.where(bind, 0.0, grad)
    return bind, projected, projected.abs().amax() > scale + floor * gamma.amax()


def cholesky_solve_ex(M, b):
    """``(x, info)``: ``x (B,) = M^{-1} b`` for the ridged free-free matrix ``M (B, B)`` by Cholesky, and the
    factorization's 0-dim int32 ``info``, nonzero when a pivot was not positive (``M`` singular to rounding: a
    semi-definite ``H_FF`` whose ridge is below the factorization's rounding; ``x`` is then meaningless), without a
    host read (``cholesky_ex``; ``cholesky`` reads its error flag).

    Cholesky rather than LU: ``M`` is symmetric positive definite but for rounding, and on a GPU the vendor's
    Cholesky and its two triangular solves take a third to a fifth of the LU solve's time from B = 256 to 4,096
    (cuSOLVER on an H200, docs/benchmarks/host_free_step.md); the LU was most of the device QP's time."""
    L, info = torch.linalg.cholesky_ex(M)
    return torch.cholesky_solve(b.unsqueeze(1), L).squeeze(1), info


def newton_direction(M, descent):
    """``(B,)``: ``M^{-1} descent`` (`cholesky_solve_ex`), or 0 where the factorization failed: the Newton arc then
    stays at the iterate and the projected-gradient arc takes the step, the host loop's rule
    (``optim.frank_wolfe.box_qp_numba.projected_newton`` skips its Newton arc when ``_cholesky_free`` fails)."""
    x, info = cholesky_solve_ex(M, descent)
    return torch.where(info == 0, x, 0.0)


def projected_newton_torch(c, H, upper, max_iter, tol, check_every=None, with_flag=False,
                           ridge_floor=RIDGE_FLOOR):
    """Projected Newton (Bertsekas 1982) with two arcs per iteration.

    The binding set holds the coordinates at a bound whose gradient pushes outward; the Newton
    direction solves the free-free system (``H_FF + r I``, a tiny ridge ``r`` for the semi-definite
    case) with the bound coordinates fixed, written as one fixed-size ``B x B`` Cholesky solve so
    nothing depends on the set's size (`newton_direction`: no Newton move where the factorization
    fails). Along the Newton arc and along the projected-gradient arc ``P(gamma + t p)`` all trial
    step lengths (``_ARC``, plus ``t = 1`` for Newton) are evaluated at once and the best trial value
    is taken: ``t = 0`` is a trial, so ``f`` never increases, and the gradient arc makes every
    iteration at least a projected-gradient step with a line search.

    ``check_every``: iterations between reads of the stop flag (default: 1 on the CPU, `_DEVICE_CHECK_EVERY` on a
    device; 0: never, all ``max_iter`` iterations run). ``with_flag``: return ``(gamma, running)``, ``running`` a
    0-dim bool tensor, True when the iteration ended on ``max_iter`` still short of the tolerance."""
    B, dev = c.shape[0], c.device
    # On a device the iteration runs without host reads: an iterate that has converged (or found no descent)
    # stays frozen, so reading the stop flag only every few iterations gives the same answer.
    if check_every is None:
        check_every = 1 if dev.type == "cpu" else _DEVICE_CHECK_EVERY
    arc = _arc_on(dev)
    ridge = 1e-13 * torch.diagonal(H).abs().max() + 1e-300
    floor = ridge_floor * ridge
    bound_diag = 1.0 + ridge  # the diagonal of a coordinate held at its bound (plus the ridge)
    scale = tol * c.abs().max()
    neg_c = -c
    gamma = torch.zeros(B, dtype=torch.float64, device=dev)
    grad = neg_c
    f = torch.zeros((), dtype=torch.float64, device=dev)
    lo = torch.zeros_like(upper)
    steps = torch.zeros(2, arc.shape[0] + 1, dtype=torch.float64, device=dev)  # (2, A+1) trial step lengths
    steps[0, -1].fill_(1.0)  # t = 1 on the Newton arc (a fill: assigning a number would copy it from the host)
    running = torch.ones((), dtype=torch.bool, device=dev)
    # Each line is one or two kernels: the iteration is a fixed sequence of about 45 launches plus the solve's,
    # which a device runs without the host (and a CUDA graph replays as one).
    for it in range(max_iter):
        bind, projected, descending = _stop_test(gamma, grad, upper, scale, floor)
        running = running & descending
        if check_every and it % check_every == 0 and not bool(running):
            break
        free = torch.where(bind, 0.0, 1.0)
        M = H * (free.unsqueeze(1) * free.unsqueeze(0))
        M.diagonal().add_(torch.where(bind, bound_diag, ridge))
        descent = -projected
        newton = newton_direction(M, descent)
        moves = torch.stack([newton, descent])  # (2, B): Newton, gradient
        targets, rooms = _rooms(gamma, moves, upper)
        steps[:, :-1] = _first_breakpoints(rooms).unsqueeze(1) * arc
        trials = _trial_points(gamma, steps, moves, targets, rooms, lo, upper)
        # f(x) = sum_j x_j ((H x)_j / 2 - c_j); a trial past float64's range (a Newton step along a direction of
        # zero curvature) is no candidate
        values = torch.nan_to_num((torch.add(neg_c, trials @ H, alpha=0.5) * trials).sum(1), nan=torch.inf)
        best = torch.argmin(values).view(1)  # a tensor index: an int would be read on the host
        value = values.index_select(0, best).squeeze(0)
        running = running & (value < f)
        gamma = torch.where(running, trials.index_select(0, best).squeeze(0), gamma)
        f = torch.where(running, value, f)
        grad = torch.addmv(neg_c, H, gamma)
    if with_flag:
        # the stop test at the last iterate: still above the tolerance (a frozen iterate found no descent, and
        # `running` fell with it)
        return gamma, running & _stop_test(gamma, grad, upper, scale, floor)[2]
    return gamma
