"""The host-free step's box QP as Triton kernels (`kernels.step.box_qp_triton`): the torch iteration to rounding,
the host projected Newton's optimum, a fixed number of launches and no host read (the simulated CUDA device)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import needs_triton
from torchssvm.kernels.step.box_qp_tolerance import RIDGE_FLOOR

import torchssvm as ts
from torchssvm.optim.frank_wolfe.box_qp import _projected_newton, box_qp, qp_objective
from torchssvm.testing import simulated_cuda

pytestmark = needs_triton()


def _triton(c, H, u, max_iter, chunk=1024):
    from torchssvm.kernels.step.box_qp_triton import projected_newton_triton

    return projected_newton_triton(c, H, u, max_iter, 1e-12, RIDGE_FLOOR, chunk=chunk)


def _qp(B, rank, seed, *, zero_rows=0, zero_upper=0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, rank, generator=g, dtype=torch.float64) + shift * torch.randn(1, rank, generator=g,
                                                                                      dtype=torch.float64)
    X[:zero_rows] = 0.0  # zero curvature: a positive gain sends the coordinate to its bound
    c = torch.randn(B, generator=g, dtype=torch.float64)
    u = torch.rand(B, generator=g, dtype=torch.float64)
    u[B - zero_upper:] = 0.0
    return c, X @ X.T, u


def _fixture():
    qp = json.loads((Path(__file__).parent / "fixtures" / "box_qp_late_bcfw.json").read_text())
    return tuple(torch.tensor(qp[k], dtype=torch.float64) for k in ("c", "H", "upper"))


PROBLEMS = {
    "two-blocks": lambda: _qp(2, 1, 5),
    "full-rank": lambda: _qp(33, 40, 0),
    "rank-deficient": lambda: _qp(70, 6, 1),
    "correlated": lambda: _qp(50, 20, 2, shift=3.0),
    "zero-curvature-and-zero-bounds": lambda: _qp(40, 10, 3, zero_rows=4, zero_upper=5),
    "no-gain": lambda: (-_qp(20, 20, 4)[0].abs(), *_qp(20, 20, 4)[1:]),
    "late-bcfw-fixture": _fixture,
}


def _kkt(c, H, u, gamma):
    grad = H @ gamma - c
    bind = ((gamma <= 0) & (grad >= 0)) | ((gamma >= u) & (grad <= 0))
    return float(torch.where(bind, 0.0, grad).abs().max())


@pytest.mark.parametrize("name", sorted(PROBLEMS))
@pytest.mark.parametrize("chunk", [1024, 16])
def test_triton_box_qp_is_the_torch_iteration_to_rounding(name, chunk):
    """After 1, 2 and 5 iterations: the torch iteration's iterate (to 1e-9 of the box), its objective (to 1e-12) and
    its stop flag; always feasible and never above 0. ``chunk=16`` runs the single programs' loops over B in several
    rounds."""
    c, H, u = PROBLEMS[name]()
    for it in (1, 2, 5):
        ref, ref_running = _projected_newton(c, H, u, it, 1e-12, check_every=0, with_flag=True)
        gamma, running = _triton(c, H, u, it, chunk)
        f, f_ref = float(qp_objective(c, H, gamma)), float(qp_objective(c, H, ref))
        assert abs(f - f_ref) <= 1e-12 * max(abs(f_ref), 1e-300), (it, f, f_ref)
        torch.testing.assert_close(gamma, ref, rtol=0, atol=1e-9 * max(float(u.max()), 1e-300))
        assert bool(running) == bool(ref_running) and running.dtype == torch.bool and running.dim() == 0
        assert bool((gamma >= 0).all() and (gamma <= u).all()) and f <= 0.0


def test_triton_box_qp_reaches_the_host_newtons_optimum():
    """To the tolerance of the host's projected Newton (the compiled loop, or numpy's without numba): the same
    objective to 1e-12, a KKT point, and the flag down once converged. Like the torch iteration it tries a grid of
    lengths along each arc where the compiled loop takes the arc's exact minimum, so with zero-curvature
    coordinates it needs more iterations (20 here, where the others need at most 12)."""
    from torchssvm.optim.frank_wolfe import box_qp_numba
    from torchssvm.optim.frank_wolfe.box_qp import _projected_newton_numpy

    host = box_qp_numba.projected_newton if box_qp_numba.available() else _projected_newton_numpy
    for (c, H, u), iterations in ((_fixture(), 12), (_qp(60, 60, 7), 12), (_qp(45, 30, 8, shift=2.0), 12),
                                  (_qp(30, 12, 9, zero_rows=3), 20)):
        ref = torch.from_numpy(host(*(np.ascontiguousarray(t.numpy()) for t in (c, H, u)), 50, 1e-12))
        gamma, running = _triton(c, H, u, iterations)
        f, f_ref = float(qp_objective(c, H, gamma)), float(qp_objective(c, H, ref))
        assert f <= f_ref + 1e-12 * abs(f_ref), (f, f_ref)
        assert _kkt(c, H, u, gamma) <= 1e-9 * float(c.abs().max())
        assert not bool(running)


def test_triton_box_qp_launches_seven_per_iteration_and_never_waits():
    """On the simulated device: no host read, and per iteration five kernels and the Cholesky's two calls (the
    factorization, the triangular solves), where the torch iteration launches about sixty
    (`test_bcfw_host_free.test_host_free_step_launches_are_counted`)."""
    c, H, u = _qp(40, 20, 0)
    counts = {}
    for be in ("triton", "torch"):
        for it in (2, 4):
            flag = torch.zeros((), dtype=torch.long)
            with simulated_cuda() as mode:
                args = [t.to("cuda") for t in (c, H, u, flag)]
                before, syncs = mode.launches, mode.syncs
                gamma = box_qp(*args[:3], sync_free=True, max_iter=it, unconverged=args[3], backend=be)
                assert mode.syncs == syncs
                counts[be, it] = mode.launches - before
                gamma, flag = gamma.cpu(), args[3].cpu()
            ref, running = _projected_newton(c, H, u, it, 1e-12, check_every=0, with_flag=True)
            torch.testing.assert_close(gamma, ref, rtol=0, atol=1e-12)
            assert int(flag) == int(running)
    assert (counts["triton", 4] - counts["triton", 2]) / 2 == 7
    assert (counts["torch", 4] - counts["torch", 2]) / 2 >= 40


def _gradient_arc_step(c, H, u):
    """The best trial of the projected-gradient arc from ``gamma = 0`` (the first iteration without a Newton move)."""
    from torchssvm.kernels.step.box_qp_torch import _ARC, _first_breakpoints, _rooms, _trial_points

    zero = torch.zeros_like(c)
    descent = torch.where(c > 0, c, 0.0).unsqueeze(0)  # -P grad at gamma = 0: grad = -c, bound where c <= 0
    targets, rooms = _rooms(zero, descent, u)
    trials = _trial_points(zero, _first_breakpoints(rooms).unsqueeze(1) * _ARC, descent, targets, rooms, zero, u)
    return trials[torch.argmin(((0.5 * trials @ H - c) * trials).sum(1))]


@pytest.mark.parametrize("form", ["torch", "triton"])
def test_a_newton_move_whose_cholesky_failed_is_not_taken(form, monkeypatch):
    """The Newton direction comes with the Cholesky's flag (`box_qp_torch.cholesky_solve_ex`); where it is set, the
    iteration takes no Newton move, even a good one, and the projected-gradient arc takes the step (the host loop's
    rule). A full-rank QP whose first Newton step beats the gradient arc, with the flag forced either way."""
    from torchssvm.kernels.step import box_qp_torch, box_qp_triton

    c, H, u = _qp(30, 40, 0)
    gradient_step = _gradient_arc_step(c, H, u)
    real = box_qp_torch.cholesky_solve_ex
    results = {}
    for info in (0, 1):
        def flagged(M, b, info=info):
            return real(M, b)[0], torch.tensor(info, dtype=torch.int32)

        monkeypatch.setattr(box_qp_torch if form == "torch" else box_qp_triton, "cholesky_solve_ex", flagged)
        if form == "torch":
            results[info] = box_qp_torch.projected_newton_torch(c, H, u, 1, 1e-12, check_every=0)
        else:
            results[info] = _triton(c, H, u, 1)[0]
    objective = lambda x: float((0.5 * x @ H - c) @ x)  # noqa: E731
    assert objective(results[0]) < objective(gradient_step) - 1e-6  # the Newton move wins when it may
    torch.testing.assert_close(results[1], gradient_step, rtol=0, atol=1e-12)


def test_the_cholesky_flags_a_matrix_below_positive_definite_and_both_forms_agree():
    """An H below PSD by more than the ridge (rounding in a Gram matrix, larger): the factorization's flag is set
    on the first free-free matrix, and the torch iteration and the Triton kernels still give the same descent."""
    from torchssvm.kernels.step.box_qp_torch import cholesky_solve_ex, projected_newton_torch

    g = torch.Generator().manual_seed(7)
    a = torch.randn(30, generator=g, dtype=torch.float64)
    H = torch.outer(a, a) - 1e-9 * torch.eye(30, dtype=torch.float64)
    c, u = torch.randn(30, generator=g, dtype=torch.float64), torch.rand(30, generator=g, dtype=torch.float64)
    free = (c > 0).double()
    ridge = 1e-13 * H.diagonal().abs().max()
    M = H * free[:, None] * free[None, :] + torch.diag(torch.where(free > 0, 0.0, 1.0) + ridge)
    assert free.sum() >= 2 and int(cholesky_solve_ex(M, c)[1]) != 0
    for it in (1, 5):
        gamma = projected_newton_torch(c, H, u, it, 1e-12, check_every=0)
        torch.testing.assert_close(_triton(c, H, u, it)[0], gamma, rtol=0, atol=1e-12)
        assert ((0.5 * gamma @ H - c) @ gamma) < 0 and (gamma >= 0).all() and (gamma <= u).all()
    torch.testing.assert_close(projected_newton_torch(c, H, u, 1, 1e-12, check_every=0), _gradient_arc_step(c, H, u),
                               rtol=0, atol=1e-15)


def test_bcfw_host_free_step_with_the_triton_qp():
    """The host-free BCFW step with ``backend="triton"`` on the simulated device: no host read inside a step, the
    torch run's duals to rounding, and the certificate identity."""
    ds = ts.data.synthetic_chain("train", 32, num_labels=4, num_features=6, seed=1)
    reports = {}
    for be in ("triton", "torch"):
        with simulated_cuda() as mode:
            s = ts.optim.BCFW(ts.LinearChainModel(6, 4, dtype=torch.float64, device="cuda"), ds.to("cuda"),
                              lam=0.01, batch_size=8, seed=0, backend=be, host_free=True, qp_max_iter=4,
                              cuda_graph=False, sampling="gap", step="pairwise", cache_size=3, gap_check_every=0)
            s.step()
            before = mode.syncs
            reports[be] = s.step()
            assert mode.syncs - before == 1  # the pass's report
            gap = s.duality_gap()
        assert abs(gap["primal"] - gap["dual"] - gap["gap"]) <= 1e-10 * max(1.0, abs(gap["primal"]))
    assert reports["triton"]["dual"] == pytest.approx(reports["torch"]["dual"], rel=1e-9)


def test_triton_box_qp_at_a_size_of_many_tiles():
    """B = 300: a 10 x 10 grid of the prepare kernel's tiles, ten column tiles of trial points, the last partly
    masked; the torch iteration's iterate after two iterations, to rounding."""
    c, H, u = _qp(300, 40, 11)
    ref, ref_running = _projected_newton(c, H, u, 2, 1e-12, check_every=0, with_flag=True)
    gamma, running = _triton(c, H, u, 2)
    torch.testing.assert_close(gamma, ref, rtol=0, atol=1e-9 * float(u.max()))
    f, f_ref = float(qp_objective(c, H, gamma)), float(qp_objective(c, H, ref))
    assert abs(f - f_ref) <= 1e-12 * abs(f_ref) and bool(running) == bool(ref_running)


def _rounding_leaves_off_its_bound(seed):
    """``(gamma, moves (2, B), upper)`` where ``gamma + t_b move`` rounds the coordinate that defines the Newton
    arc's first breakpoint ``t_b`` to a few ulps inside the box (as happens for about one random move in twenty)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(1000):
        gamma = torch.rand(8, generator=g, dtype=torch.float64) * 0.7
        u = torch.rand(8, generator=g, dtype=torch.float64) + 0.7
        moves = torch.randn(2, 8, generator=g, dtype=torch.float64)
        target = torch.where(moves[0] > 0, u, 0.0)
        room = torch.where((target - gamma) / moves[0] > 0, (target - gamma) / moves[0], torch.inf)
        i = int(room.argmin())
        if float((gamma[i] + room[i] * moves[0, i]).clamp(0.0, u[i])) != float(target[i]):
            return gamma, moves, u
    raise AssertionError("no such move found")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trial_points_put_every_coordinate_the_step_reaches_on_its_bound(seed):
    """At each trial step length, the coordinates whose breakpoints the step reaches are exactly on their bounds in
    the torch iteration, its numpy twin and the Triton kernel; the others are the clipped ``gamma + t move`` of all
    three to rounding (fused or not). Without it the coordinate that defines ``t_b`` was left a few ulps inside the
    box (on the moves chosen here), outside the next iteration's binding set, and the iteration spent steps on it."""
    import triton
    from torchssvm.kernels.step import box_qp_torch as tw
    from torchssvm.kernels.step.box_qp_triton import _ROWS, _TILE, ARC, _qp_trials_kernel

    from torchssvm.optim.frank_wolfe.box_qp import _rooms_numpy, _trial_points_numpy

    gamma, moves, u = _rounding_leaves_off_its_bound(seed)
    B = gamma.shape[0]
    targets, rooms = tw._rooms(gamma, moves, u)
    steps = torch.zeros(2, ARC, dtype=torch.float64)
    steps[:, :-2] = tw._first_breakpoints(rooms).unsqueeze(1) * tw._ARC[:-1]
    steps[0, -1] = 1.0  # the Newton arc's t = 1 (the kernel's last row; 0 on the gradient arc)
    lo = torch.zeros_like(u)
    forms = {"torch": tw._trial_points(gamma, steps, moves, targets, rooms, lo, u)}
    nt, nr = _rooms_numpy(gamma.numpy(), moves.numpy(), u.numpy())
    forms["numpy"] = torch.from_numpy(_trial_points_numpy(gamma.numpy(), steps.numpy(), moves.numpy(), nt, nr,
                                                          u.numpy()))
    trials = torch.empty(2 * ARC, B, dtype=torch.float64)
    _qp_trials_kernel[(triton.cdiv(B, _TILE),)](gamma, moves[0].contiguous(), torch.zeros((), dtype=torch.int32),
                                                moves[1].contiguous(), u, trials, B,
                                                ARC=ARC, ROWS=_ROWS, TILE=_TILE, CHUNK=8)
    forms["triton"] = trials
    reached = ((steps.unsqueeze(2) >= rooms.unsqueeze(1)) & (rooms < torch.inf).unsqueeze(1)).reshape(-1, B)
    on_bound = targets.unsqueeze(1).expand(2, ARC, B).reshape(-1, B)
    naive = (gamma + steps.unsqueeze(2) * moves.unsqueeze(1)).clamp(lo, u).reshape(-1, B)
    assert bool((naive[reached] != on_bound[reached]).any())  # the case the test is about
    for name, x in forms.items():
        assert torch.equal(x[reached], on_bound[reached]), name
        torch.testing.assert_close(x[~reached], naive[~reached], rtol=0, atol=1e-15 * float(u.max()))
        assert bool(((x >= 0) & (x <= u)).all()), name
