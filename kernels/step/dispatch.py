"""The mini-batch BCFW step's kernels: the device sampler's keys, the cache test with the away atoms, the host-free
step's box QP and the end of the step; each dispatched to its torch, Triton or numba twin by the backend table
(`backends.resolve`)."""

from __future__ import annotations

import torch

from ..backends import resolve
from .atoms_select_torch import select_atoms_torch
from .block_step_torch import STEP_TYPES, apply_block_step_torch
from .box_qp_tolerance import RIDGE_FLOOR
from .box_qp_torch import projected_newton_torch
from .sampling_torch import sampling_keys_torch


@torch.no_grad()
def select_atoms(a_H, count, a_labels, a_loss, a_alpha, idx, base, ell, gaps, labels, loss, H, n: int, factor,
                 floor: float, misses, away: bool, backend: str = "auto", params=None):
    """The BCFW step's cache test and away atoms: dispatch to `select_atoms_torch` or `select_atoms_triton`
    (bitwise equal; see the twin for the contract). ``params``: ``[factor or 0, floor]`` already on the device,
    for the Triton form (no copy from the host: a CUDA graph can replay it)."""
    if resolve("select_atoms", backend, a_H.device) == "triton":
        from .atoms_select_triton import select_atoms_triton

        return select_atoms_triton(a_H, count, a_labels, a_loss, a_alpha, idx, base, ell, gaps, labels, loss, H, n,
                                   factor, floor, misses, away, params)
    return select_atoms_torch(a_H, count, a_labels, a_loss, a_alpha, idx, base, ell, gaps, labels, loss, H, n,
                              factor, floor, misses, away)


@torch.no_grad()
def apply_block_step(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha=None, alpha_valid=None, step: str = "fw",
                     s_slot=None, away=None, upper=None, kind=None, backend: str = "auto") -> None:
    """The end of a mini-batch BCFW step, in place (``z``, ``l`` and the atoms' weights): dispatch to
    `apply_block_step_torch`, `apply_block_step_triton` (one launch instead of about twenty) or
    `apply_block_step_numba` (one CPU loop); bitwise equal."""
    if step not in STEP_TYPES:
        raise ValueError(f"step must be one of {STEP_TYPES}, got {step!r}")
    if alpha is not None:
        needed = {"alpha_valid": alpha_valid, "s_slot": s_slot}
        if step != "fw":
            needed.update(away=away, upper=upper)
        if step == "away":
            needed["kind"] = kind
        missing = [name for name, t in needed.items() if t is None]
        if missing:
            raise ValueError(f"{', '.join(missing)} must be given with alpha for {step!r} steps")
    be = resolve("apply_block_step", backend, z.device)
    if be == "numba" and backend == "auto" and not all(t.is_contiguous() and t.dtype == torch.float64
                                                      for t in (z, ell) + (() if alpha is None else (alpha,))):
        be = "torch"  # the compiled loop writes contiguous float64 storage in place
    if be == "triton":
        from .block_step_triton import apply_block_step_triton

        return apply_block_step_triton(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, alpha_valid, step,
                                       s_slot, away, upper, kind)
    if be == "numba":
        from .block_step_numba import apply_block_step_numba

        return apply_block_step_numba(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, alpha_valid, step,
                                      s_slot, away, upper, kind)
    return apply_block_step_torch(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, alpha_valid, step, s_slot,
                                  away, upper, kind)


@torch.no_grad()
def box_qp_newton(c: torch.Tensor, H: torch.Tensor, upper: torch.Tensor, max_iter: int, tol: float,
                  backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """``(gamma (B,), running ())``: ``max_iter`` projected Newton iterations of ``min -c^T gamma + 1/2 gamma^T H
    gamma`` over ``0 <= gamma <= upper`` (float64, ``H`` PSD) from ``gamma = 0``, an iterate frozen once it meets the
    tolerance, without the host reading anything; ``running``: a 0-dim bool tensor, True when the last iterate is
    still short of it. Dispatch to `projected_newton_torch` (about 45 launches per iteration plus the solve's) or
    `projected_newton_triton` (five plus the solve's; the same iteration to rounding). The contract:
    ``optim.frank_wolfe.box_qp.box_qp(..., sync_free=True)``."""
    if resolve("box_qp_newton", backend, c.device) == "triton":
        from .box_qp_triton import projected_newton_triton

        return projected_newton_triton(c, H, upper, max_iter, tol, RIDGE_FLOOR)
    return projected_newton_torch(c, H, upper, max_iter, tol, check_every=0, with_flag=True)


@torch.no_grad()
def sampling_keys(gaps, first_rank, seed: int, counter, n: int, device, backend: str = "auto") -> torch.Tensor:
    """``(n,)`` float64 keys of the host-free step's draw ``counter`` (an int, or a 0-dim int64 tensor on ``device``)
    of generator ``seed``, whose ``B`` largest are the blocks drawn: uniforms (``gaps`` None) or the three tiers of
    gap sampling (``gaps (n,)``, ``first_rank (n,)``). Dispatch to `sampling_keys_torch` (about twenty to
    thirty-five launches) or `sampling_keys_triton` (one; the same uniforms bit for bit, the gap keys to the
    rounding of ``log``). The sampler: ``optim.frank_wolfe.device_sampling``."""
    if resolve("sampling_keys", backend, torch.device(device)) == "triton":
        from .sampling_triton import sampling_keys_triton

        return sampling_keys_triton(gaps, first_rank, seed, counter, n, device)
    return sampling_keys_torch(gaps, first_rank, seed, counter, n, device)
