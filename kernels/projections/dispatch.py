"""Projections: onto simplices (shifted or not) and onto a box cut by one equality; each dispatched to its torch or
Triton twin by the backend table (`backends.resolve`), the arguments validated first."""

from __future__ import annotations

import torch

from torchssvm._validation import shape_or_type

from ..backends import resolve
from .box_equality_torch import project_box_equality_torch
from .simplex_torch import project_simplex_torch


def _check_simplex_args(v, mask, radius):
    if not isinstance(v, torch.Tensor) or v.dim() != 2 or not v.is_floating_point() or v.shape[1] == 0:
        raise ValueError(f"v must be a (B, M) float tensor with M >= 1, got {shape_or_type(v)}")
    if not torch.isfinite(v).all():
        raise ValueError("v holds NaN or Inf")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.shape != v.shape or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor of shape {tuple(v.shape)}")
        if not bool(mask.any(1).all()):
            raise ValueError("mask leaves a row without any valid entry: its simplex is empty (infeasible)")
    if radius is not None:
        if not isinstance(radius, torch.Tensor) or radius.shape != (v.shape[0],):
            raise ValueError(f"radius must be a ({v.shape[0]},) tensor")
        if not bool((radius > 0).all()) or not torch.isfinite(radius).all():
            raise ValueError("radius must be finite and > 0 (an empty or degenerate simplex is infeasible)")


@torch.no_grad()
def project_simplex(v, mask=None, radius=None, backend: str = "auto"):
    """Euclidean projection of each row of ``v (B, M)`` onto ``{x >= 0, sum x = radius_b}`` over its valid
    entries (``mask``); see `project_simplex_torch`. Inputs are validated (a row without valid entries or
    a radius <= 0 is infeasible and raises)."""
    _check_simplex_args(v, mask, radius)
    if resolve("project_simplex", backend, v.device) == "triton":
        from .simplex_triton import MAX_BLOCK, project_simplex_triton

        if v.shape[1] <= MAX_BLOCK or backend == "triton":  # "auto": longer rows go to the torch twin
            return project_simplex_triton(v, mask, radius)
    return project_simplex_torch(v, mask, radius)


@torch.no_grad()
def project_shifted_simplex(u, top, mask=None, radius=None, backend: str = "auto"):
    """Euclidean projection of each row of ``u (B, M)`` onto the shifted simplex of GDMM (Yen et al., 2016)
    ``{a : a_j <= cap_j, sum_j a_j = 0}`` over the valid entries (``mask``), with ``cap_j = radius_b`` at the
    entry ``top[b]`` (the truth, the only one allowed above 0) and ``cap_j = 0`` elsewhere.

    With ``b = cap - a`` the set is the simplex ``{b >= 0, sum b = radius}``, so this is `project_simplex`
    of ``cap - u`` (sort-based, batched; Triton on CUDA). ``top (B,)`` long must index a valid entry;
    invalid entries get 0; ``radius (B,)`` > 0 or None (1)."""
    if not isinstance(u, torch.Tensor) or u.dim() != 2 or not u.is_floating_point():
        raise ValueError(f"u must be a (B, M) float tensor, got {shape_or_type(u)}")
    B, M = u.shape
    if not isinstance(top, torch.Tensor) or top.shape != (B,) or top.is_floating_point():
        raise ValueError(f"top must be a ({B},) integer tensor")
    if B and (int(top.min()) < 0 or int(top.max()) >= M):
        raise ValueError(f"top must index a column in [0, {M})")
    if mask is not None and isinstance(mask, torch.Tensor) and mask.shape == u.shape and mask.dtype == torch.bool:
        if B and not bool(mask.gather(1, top.unsqueeze(1)).all()):
            raise ValueError("top must index a valid (masked-in) entry of every row")
    if radius is None:
        radius = torch.ones(B, dtype=u.dtype, device=u.device)
    elif not isinstance(radius, torch.Tensor) or radius.shape != (B,):
        raise ValueError(f"radius must be a ({B},) tensor")
    cap = torch.zeros_like(u).scatter_(1, top.unsqueeze(1), radius.to(u.dtype).unsqueeze(1))
    b = project_simplex(cap - u, mask, radius, backend=backend)
    a = cap - b
    return a if mask is None else a * mask


def _box_equality_rows(name, t, B, n, like):
    """``t`` (a number, ``(n,)`` or ``(B, n)`` tensor) as a ``(B, n)`` tensor, or an error naming ``name``."""
    if isinstance(t, bool) or not isinstance(t, (torch.Tensor, int, float)):
        raise TypeError(f"{name} must be a number or a tensor of shape ({B}, {n}) or ({n},), got {type(t).__name__}")
    if not isinstance(t, torch.Tensor):
        return torch.full((B, n), float(t), dtype=like.dtype, device=like.device)
    if tuple(t.shape) not in ((B, n), (n,)):
        raise ValueError(f"{name} must have shape ({B}, {n}) or ({n},), got {tuple(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but m is on {like.device}")
    if not t.is_floating_point() or t.dtype != like.dtype:
        raise TypeError(f"{name} must have m's dtype {like.dtype}, got {t.dtype}")
    return t.expand(B, n)


def _check_box_equality_args(m, lower, upper, sigma, z, d2):
    if not isinstance(m, torch.Tensor) or m.dim() != 2 or not m.is_floating_point() or m.shape[1] == 0:
        raise ValueError(f"m must be a (B, n) float tensor with n >= 1, got {shape_or_type(m)}")
    B, n = m.shape
    if not bool(torch.isfinite(m).all()):
        raise ValueError("m holds NaN or Inf")
    lo = _box_equality_rows("lower", lower, B, n, m)
    hi = _box_equality_rows("upper", upper, B, n, m)
    s = _box_equality_rows("sigma", sigma, B, n, m)
    for name, t in (("lower", lo), ("upper", hi)):
        if bool(torch.isnan(t).any()):
            raise ValueError(f"{name} holds NaN")
    if bool((lo == torch.inf).any()) or bool((hi == -torch.inf).any()):
        raise ValueError("lower must be < inf and upper > -inf (infeasible box)")
    if bool((lo > hi).any()):
        raise ValueError("lower must be <= upper (an empty box is infeasible)")
    if not bool(torch.isfinite(s).all()) or bool((s == 0).any()):
        raise ValueError("sigma must be finite and nonzero")
    if d2 is not None:
        d = _box_equality_rows("d2", d2, B, n, m)
        if not bool(torch.isfinite(d).all()) or not bool((d > 0).all()):
            raise ValueError("d2 must be finite and > 0")
    if isinstance(z, bool) or not isinstance(z, (torch.Tensor, int, float)):
        raise TypeError(f"z must be a number or a ({B},) tensor, got {type(z).__name__}")
    if isinstance(z, torch.Tensor):
        if tuple(z.shape) != (B,):
            raise ValueError(f"z must have shape ({B},), got {tuple(z.shape)}")
        if z.device != m.device:
            raise ValueError(f"z is on {z.device} but m is on {m.device}")
        if not z.is_floating_point() or z.dtype != m.dtype:
            raise TypeError(f"z must have m's dtype {m.dtype}, got {z.dtype}")
        zt = z
    else:
        zt = torch.full((B,), float(z), dtype=m.dtype, device=m.device)
    if not bool(torch.isfinite(zt).all()):
        raise ValueError("z holds NaN or Inf")
    # feasible iff sum_i min(s_i l_i, s_i u_i) <= z <= sum_i max(s_i l_i, s_i u_i) (Zhang et al., 2010, App. B)
    pos = s > 0
    sl, su = s * lo, s * hi
    zmin = torch.where(pos, sl, su).sum(1)
    zmax = torch.where(pos, su, sl).sum(1)
    scale = torch.where(torch.isfinite(sl), sl.abs(), 0).sum(1) + torch.where(torch.isfinite(su), su.abs(), 0).sum(1)
    tol = 16 * torch.finfo(m.dtype).eps * (scale + zt.abs())
    bad = (zt < zmin - tol) | (zt > zmax + tol)
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise ValueError(f"z is infeasible: row {r} has z = {float(zt[r])} outside [{float(zmin[r])}, "
                         f"{float(zmax[r])}] = [sum min(sigma l, sigma u), sum max(sigma l, sigma u)]")


@torch.no_grad()
def project_box_equality(m, lower, upper, sigma, z, d2=None, backend: str = "auto"):
    """Per row of ``m (B, n)``, the minimizer of ``1/2 sum_i d2_i (x_i - m_i)^2`` over ``{lower <= x <= upper,
    sum_i sigma_i x_i = z}`` (Zhang et al., 2010, App. B); see `project_box_equality_torch` for the contract. ``lower``,
    ``upper``, ``sigma`` and ``d2`` are ``(B, n)``, ``(n,)`` (shared by all rows) or numbers, ``z`` is ``(B,)`` or a
    number. Inputs are validated: shapes, dtypes and devices, NaN, ``sigma == 0``, ``d2 <= 0``, ``lower > upper``
    and an infeasible ``z`` raise."""
    _check_box_equality_args(m, lower, upper, sigma, z, d2)
    if resolve("project_box_equality", backend, m.device) == "triton":
        from .box_equality_triton import MAX_BLOCK, project_box_equality_triton

        if m.shape[1] <= MAX_BLOCK or backend == "triton":
            return project_box_equality_triton(m, lower, upper, sigma, z, d2)
    return project_box_equality_torch(m, lower, upper, sigma, z, d2)
