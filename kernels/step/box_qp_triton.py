"""The mini-batch step's B x B box QP, projected Newton on the device in a fixed sequence of a few launches per
iteration. Twin of the torch iteration `box_qp_torch.projected_newton_torch` (with ``check_every=0``):
the same iteration (Bertsekas 1982; the binding set, the ridged free-free Newton system, the Newton and the
projected-gradient arcs tried at the step lengths ``t_b 2^j``, ``j = -30..30``, ``0`` and, for Newton, ``1``), to
rounding: the sums run in another order, and products may be fused.

``min_gamma -c^T gamma + 1/2 gamma^T H gamma`` s.t. ``0 <= gamma <= upper``; the iterate starts at 0 and never
increases ``f``; one that meets the tolerance (or finds no descent) stays frozen, so all ``max_iter`` iterations
run without the host reading anything, and a CUDA graph can replay them.

Per iteration, where the torch twin launches about 45 small kernels plus the solve's:

1. ``_qp_prepare_kernel`` (tiles of ``H``): the binding set, ``M = H_FF + r I`` with the bound coordinates' rows
   and columns replaced by the identity (plus the ridge), and the projected descent ``-P grad``;
2. ``box_qp_torch.cholesky_solve_ex(M, descent)``: the Newton direction (the vendor's Cholesky and two triangular
   solves; its error flag is read by the next kernel, not by the host);
3. ``_qp_trials_kernel`` (column tiles): both arcs' first breakpoints (a reduction over all ``B``, repeated by
   each program: cheaper than a launch) and the ``2 x 63`` projected trial points, the Newton move 0 where the
   factorization failed;
4. ``trials @ H``: one matrix product;
5. ``_qp_values_kernel`` (one program per trial): ``f`` at each trial;
6. ``_qp_select_kernel`` (one program): the best trial, the update of ``gamma``, ``grad = H gamma - c`` (the
   best trial's row of the product) and ``f``, and the stop test of the next iteration.

``_qp_init_kernel`` (one program) starts the iteration: ``gamma = 0``, ``grad = -c``, the ridge
``r = 1e-13 max|diag H| + 1e-300``, the tolerance ``tol max|c|`` and the first stop test.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from .box_qp_torch import cholesky_solve_ex

ARC = 63  # trial step lengths per arc: t_b 2^j for j = -30..30, then 0, then 1 (Newton) or 0 (gradient)
_ROWS = 64  # ARC rounded up to a power of two
_TILE = 32
_CHUNK = 1024
# The init and trial kernels hold more vectors per round of their loops over B: at 1,024 entries Triton 3.6 spilled
# 16 B a thread in the trial kernel and 8 B in the init kernel on sm_90; at 512 neither on sm_90
# (docs/benchmarks/triton_compile.md).
_SMALL_CHUNK = 512
_DBL_MAX = tl.constexpr(1.7976931348623157e308)


@triton.jit
def _stop_test(g, gr, u):
    """The binding set and the projected gradient of `box_qp_torch._stop_test`."""
    bind = ((g <= 0.0) & (gr >= 0.0)) | ((g >= u) & (gr <= 0.0))
    return bind, tl.where(bind, 0.0, gr)


@triton.jit(do_not_specialize=["tol_bits", "floor_bits", "ridge_bits"])
def _qp_init_kernel(c_ptr, H_ptr, upper_ptr, gamma_ptr, grad_ptr, state_ptr, running_ptr, B, tol_bits, floor_bits,
                    ridge_bits, CHUNK: tl.constexpr):
    """state = [f, ridge, scale, floor]; running = the first stop test at gamma = 0. The float constants travel as
    their float64 bits (`_bits`): Triton types a float argument, and a literal within float32's range, as float32."""
    tol = tol_bits.to(tl.float64, bitcast=True)
    ridge_floor = floor_bits.to(tl.float64, bitcast=True)
    ridge_rel = ridge_bits.to(tl.float64, bitcast=True)
    offs = tl.arange(0, CHUNK)
    dmax = tl.zeros([CHUNK], dtype=tl.float64)
    cmax = tl.zeros([CHUNK], dtype=tl.float64)
    pmax = tl.zeros([CHUNK], dtype=tl.float64)
    for start in range(0, B, CHUNK):
        j = start + offs
        jm = j < B
        c = tl.load(c_ptr + j, mask=jm, other=0.0)
        u = tl.load(upper_ptr + j, mask=jm, other=0.0)
        d = tl.load(H_ptr + j.to(tl.int64) * (B + 1), mask=jm, other=0.0)
        g = tl.zeros([CHUNK], dtype=tl.float64)
        gr = -c
        tl.store(gamma_ptr + j, g, mask=jm)
        tl.store(grad_ptr + j, gr, mask=jm)
        _, proj = _stop_test(g, gr, u)
        dmax = tl.maximum(dmax, tl.abs(d))
        cmax = tl.maximum(cmax, tl.abs(c))
        pmax = tl.maximum(pmax, tl.where(jm, tl.abs(proj), 0.0))
    ridge = ridge_rel * tl.max(dmax, 0) + 1e-300  # 1e-300: outside float32's range, a float64 literal
    scale = tol * tl.max(cmax, 0)
    floor = ridge_floor * ridge
    tl.store(state_ptr, 0.0)
    tl.store(state_ptr + 1, ridge)
    tl.store(state_ptr + 2, scale)
    tl.store(state_ptr + 3, floor)
    tl.store(running_ptr, (tl.max(pmax, 0) > scale).to(tl.int32))  # max(gamma) = 0: no floor yet


@triton.jit
def _qp_prepare_kernel(H_ptr, gamma_ptr, grad_ptr, upper_ptr, state_ptr, M_ptr, descent_ptr, B,
                       TILE: tl.constexpr):
    """One ``TILE x TILE`` tile of ``M``; the programs of the first column of tiles write the descent."""
    pr = tl.program_id(0)
    pc = tl.program_id(1)
    r = pr * TILE + tl.arange(0, TILE)
    c = pc * TILE + tl.arange(0, TILE)
    rm = r < B
    cm = c < B
    ridge = tl.load(state_ptr + 1)
    bind_r, proj_r = _stop_test(tl.load(gamma_ptr + r, mask=rm, other=0.0), tl.load(grad_ptr + r, mask=rm, other=0.0),
                                tl.load(upper_ptr + r, mask=rm, other=0.0))
    bind_c, _ = _stop_test(tl.load(gamma_ptr + c, mask=cm, other=0.0), tl.load(grad_ptr + c, mask=cm, other=0.0),
                           tl.load(upper_ptr + c, mask=cm, other=0.0))
    free_r = tl.where(bind_r, 0.0, 1.0)
    free_c = tl.where(bind_c, 0.0, 1.0)
    at = r.to(tl.int64)[:, None] * B + c[None, :]
    mask = rm[:, None] & cm[None, :]
    m = tl.load(H_ptr + at, mask=mask, other=0.0) * (free_r[:, None] * free_c[None, :])
    diag = tl.where(bind_r, 1.0 + ridge, ridge)
    m = tl.where(r[:, None] == c[None, :], m + diag[:, None], m)
    tl.store(M_ptr + at, m, mask=mask)
    if pc == 0:
        tl.store(descent_ptr + r, -proj_r, mask=rm)


@triton.jit
def _breakpoint(g, u, move, jm):
    """Per coordinate: the step length at which ``g + t move`` reaches the bound it heads for (+inf if none)."""
    moving = move != 0.0  # a zero move reaches nothing (dividing by 1 instead keeps the interpreter quiet)
    room = (tl.where(move > 0, u, 0.0) - g) / tl.where(moving, move, 1.0)
    return tl.where(jm & moving & (room > 0), room, float("inf"))


@triton.jit
def _project(x, s, g, u, move, cm):
    """``x (ROWS, TILE) = g + s move``, projected on ``[0, u]``: clipped, a NaN kept (its value is NaN, which is no
    candidate) as torch's clamp does, and a coordinate whose breakpoint the step ``s`` reaches put exactly on its
    bound (`box_qp_torch._trial_points`: rounding would leave the one that defines ``t_b`` a few ulps inside)."""
    x = tl.where(x != x, x, tl.minimum(tl.maximum(x, 0.0), u[None, :]))
    room = _breakpoint(g, u, move, cm)
    reached = (s[:, None] >= room[None, :]) & (room < float("inf"))[None, :]
    return tl.where(reached, tl.where(move > 0, u, 0.0)[None, :], x)


@triton.jit
def _qp_trials_kernel(gamma_ptr, newton_ptr, info_ptr, descent_ptr, upper_ptr, trials_ptr, B,
                      ARC: tl.constexpr, ROWS: tl.constexpr, TILE: tl.constexpr, CHUNK: tl.constexpr):
    """The trial points of both arcs for one tile of columns: ``trials[m ARC + a] = clip(gamma + t_{m,a} move_m)``;
    the Newton move is 0 where its Cholesky factorization failed (``info != 0``, `box_qp_torch.newton_direction`)."""
    newton_ok = tl.load(info_ptr) == 0
    offs = tl.arange(0, CHUNK)
    t0 = tl.full([CHUNK], float("inf"), tl.float64)
    t1 = tl.full([CHUNK], float("inf"), tl.float64)
    for start in range(0, B, CHUNK):
        j = start + offs
        jm = j < B
        g = tl.load(gamma_ptr + j, mask=jm, other=0.0)
        u = tl.load(upper_ptr + j, mask=jm, other=0.0)
        n = tl.where(newton_ok, tl.load(newton_ptr + j, mask=jm, other=0.0), 0.0)
        t0 = tl.minimum(t0, _breakpoint(g, u, n, jm))
        t1 = tl.minimum(t1, _breakpoint(g, u, tl.load(descent_ptr + j, mask=jm, other=0.0), jm))
    tb0 = tl.min(t0, 0)
    tb1 = tl.min(t1, 0)
    tb0 = tl.where(tb0 < float("inf"), tb0, 1.0)
    tb1 = tl.where(tb1 < float("inf"), tb1, 1.0)
    a = tl.arange(0, ROWS)
    # 2^(a - 30), exactly, for a = 0..60
    pow2 = (tl.full([ROWS], 1, tl.int64) << tl.minimum(a, 60).to(tl.int64)).to(tl.float64) * 9.313225746154785e-10
    s0 = tl.where(a <= 60, tb0 * pow2, tl.where(a == ARC - 1, 1.0, 0.0))
    s1 = tl.where(a <= 60, tb1 * pow2, 0.0)
    col = tl.program_id(0) * TILE + tl.arange(0, TILE)
    cm = col < B
    g = tl.load(gamma_ptr + col, mask=cm, other=0.0)
    u = tl.load(upper_ptr + col, mask=cm, other=0.0)
    n = tl.where(newton_ok, tl.load(newton_ptr + col, mask=cm, other=0.0), 0.0)
    d = tl.load(descent_ptr + col, mask=cm, other=0.0)
    mask = (a < ARC)[:, None] & cm[None, :]
    at = a.to(tl.int64)[:, None] * B + col[None, :]
    x0 = g[None, :] + s0[:, None] * n[None, :]
    x1 = g[None, :] + s1[:, None] * d[None, :]
    x0 = _project(x0, s0, g, u, n, cm)
    x1 = _project(x1, s1, g, u, d, cm)
    tl.store(trials_ptr + at, x0, mask=mask)
    tl.store(trials_ptr + ARC * B + at, x1, mask=mask)


@triton.jit
def _qp_values_kernel(trials_ptr, TH_ptr, c_ptr, values_ptr, B, CHUNK: tl.constexpr):
    """``f(x) = sum_j x_j ((H x)_j / 2 - c_j)`` at one trial; NaN (a trial past float64's range) is +inf, +-inf the
    largest finite values, as torch's ``nan_to_num(nan=inf)``."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float64)
    for start in range(0, B, CHUNK):
        j = start + offs
        jm = j < B
        x = tl.load(trials_ptr + t * B + j, mask=jm, other=0.0)
        hx = tl.load(TH_ptr + t * B + j, mask=jm, other=0.0)
        acc += (0.5 * hx - tl.load(c_ptr + j, mask=jm, other=0.0)) * x
    v = tl.sum(acc, 0)
    v = tl.where(v == float("inf"), _DBL_MAX, v)
    v = tl.where(v == -float("inf"), -_DBL_MAX, v)
    tl.store(values_ptr + t, tl.where(v != v, float("inf"), v))


@triton.jit
def _qp_select_kernel(values_ptr, trials_ptr, TH_ptr, c_ptr, upper_ptr, gamma_ptr, grad_ptr, state_ptr, running_ptr,
                      B, TRIALS: tl.constexpr, CHUNK: tl.constexpr):
    """Takes the best trial when it lowers ``f`` and the iterate still runs; then the stop test of the next
    iteration: ``running &= max|P grad| > scale + floor max(gamma)``."""
    k = tl.arange(0, TRIALS)
    vals = tl.load(values_ptr + k, mask=k < 2 * 63, other=float("inf"))
    best = tl.argmin(vals, 0, tie_break_left=True)
    value = tl.min(vals, 0)
    f = tl.load(state_ptr)
    run = (tl.load(running_ptr) != 0) & (value < f)
    row = best.to(tl.int64) * B
    offs = tl.arange(0, CHUNK)
    pmax = tl.zeros([CHUNK], dtype=tl.float64)
    gmax = tl.zeros([CHUNK], dtype=tl.float64)
    for start in range(0, B, CHUNK):
        j = start + offs
        jm = j < B
        g = tl.load(gamma_ptr + j, mask=jm, other=0.0)
        gr = tl.load(grad_ptr + j, mask=jm, other=0.0)
        if run:
            g = tl.load(trials_ptr + row + j, mask=jm, other=0.0)
            gr = tl.load(TH_ptr + row + j, mask=jm, other=0.0) - tl.load(c_ptr + j, mask=jm, other=0.0)
            tl.store(gamma_ptr + j, g, mask=jm)
            tl.store(grad_ptr + j, gr, mask=jm)
        _, proj = _stop_test(g, gr, tl.load(upper_ptr + j, mask=jm, other=0.0))
        pmax = tl.maximum(pmax, tl.where(jm, tl.abs(proj), 0.0))
        gmax = tl.maximum(gmax, tl.where(jm, g, 0.0))
    descending = tl.max(pmax, 0) > tl.load(state_ptr + 2) + tl.load(state_ptr + 3) * tl.max(gmax, 0)
    # every warp has read f (above) before any thread writes it: the program's warps meet here
    tl.debug_barrier()
    if run:
        tl.store(state_ptr, value)
    tl.store(running_ptr, (run & descending).to(tl.int32))


def _bits(x: float) -> int:
    """The int64 with the bits of the float64 ``x``."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def projected_newton_triton(c: torch.Tensor, H: torch.Tensor, upper: torch.Tensor, max_iter: int, tol: float,
                            ridge_floor: float, chunk: int = _CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gamma (B,), running ())``: ``max_iter`` projected Newton iterations of the box QP from ``gamma = 0``
    (float64 ``c (B,)``, ``H (B, B)`` PSD, ``upper (B,)``), and whether the last iterate is still short of the
    tolerance ``tol max|c| + ridge_floor r max(gamma)`` (a 0-dim bool tensor), without a host read.
    ``2 + 7 max_iter`` launches (the factorization and the triangular solves counted as one each). ``chunk``: the
    entries a single program reads per round of its loops over ``B`` (a power of two; small ones let the tests run
    those loops on small problems)."""
    B = c.shape[0]
    dev = c.device
    c, upper = c.contiguous(), upper.contiguous()
    H = H.contiguous()
    gamma = torch.empty(B, dtype=torch.float64, device=dev)
    grad = torch.empty_like(gamma)
    descent = torch.empty_like(gamma)
    state = torch.empty(4, dtype=torch.float64, device=dev)
    running = torch.empty((), dtype=torch.int32, device=dev)
    M = torch.empty(B, B, dtype=torch.float64, device=dev)
    trials = torch.empty(2 * ARC, B, dtype=torch.float64, device=dev)
    TH = torch.empty_like(trials)
    values = torch.empty(2 * ARC, dtype=torch.float64, device=dev)
    chunk = min(chunk, triton.next_power_of_2(B))
    small = min(chunk, _SMALL_CHUNK)
    tiles = triton.cdiv(B, _TILE)
    _qp_init_kernel[(1,)](c, H, upper, gamma, grad, state, running, B, _bits(tol), _bits(ridge_floor), _bits(1e-13),
                          CHUNK=small)
    for _ in range(max_iter):
        _qp_prepare_kernel[(tiles, tiles)](H, gamma, grad, upper, state, M, descent, B, TILE=_TILE)
        newton, info = cholesky_solve_ex(M, descent)
        _qp_trials_kernel[(tiles,)](gamma, newton, info, descent, upper, trials, B, ARC=ARC, ROWS=_ROWS, TILE=_TILE,
                                    CHUNK=small)
        torch.mm(trials, H, out=TH)
        _qp_values_kernel[(2 * ARC,)](trials, TH, c, values, B, CHUNK=chunk)
        _qp_select_kernel[(1,)](values, trials, TH, c, upper, gamma, grad, state, running, B, TRIALS=2 * _ROWS,
                                CHUNK=chunk, num_warps=8)
    return gamma, running != 0
