"""Oracles: each exists as a pure-torch twin and a Triton kernel, chosen by ``backend=``.

``backend="auto"`` runs Triton on CUDA tensors when triton imports, torch otherwise;
``"torch"`` and ``"triton"`` force one (``"triton"`` on CPU tensors needs ``TRITON_INTERPRET=1``).
Viterbi, the chain scores and marginals, the distance transforms (and so the spatial trees) and the BCFW block step
also have a compiled CPU twin, ``"numba"`` (`viterbi_numba`, `chain_score_numba`, `chain_marginals_numba`,
`distance_transform_numba`, `block_step_numba`), which ``"auto"`` picks for CPU tensors when numba imports (the
chain kernels' only for float32 or float64 inputs of one dtype, after the chain scores promote mixed inputs; the
block step's for contiguous float64 duals; the twins take no half types).

A new Triton kernel needs a workload and an `OUTPUTS` entry in `compile_check`, which compiles every kernel
for sm_80 and sm_90 without a GPU (the interpreter never builds one).
"""

from __future__ import annotations

import functools
import os

import torch

from torchssvm._validation import shape_or_type

from .atoms_select_torch import select_atoms_torch
from .block_step_torch import STEP_TYPES, apply_block_step_torch
from .box_equality_median import box_equality_median
from .box_equality_torch import project_box_equality_torch
from .chain_marginals_torch import chain_marginals_torch
from .chain_score_torch import chain_inner_torch, chain_labels_score_torch, chain_score_torch
from .distance_transform_torch import distance_transform_1d_torch
from .distance_transform_torch import distance_transform_2d as distance_transform_2d_torch
from .simplex_torch import project_simplex_torch
from .slack_chain_torch import slack_viterbi_torch
from .tree_torch import (
    TreeSchedule,
    cooccurrence_tree_max_sum_torch,
    mixture_tree_max_sum_torch,
    spatial_tree_max_sum_torch,
    tree_max_sum_torch,
    tree_schedule,
)
from .viterbi_torch import viterbi_torch

BACKENDS = ("auto", "torch", "triton", "numba")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def numba_available() -> bool:
    from .distance_transform_numba import available

    return available()


def resolve_backend(backend: str, device: torch.device, has_numba: bool = False) -> str:
    """Map ``backend`` to ``"torch"``, ``"triton"`` or ``"numba"`` for tensors on ``device``; ``has_numba``:
    whether the operation has a numba twin (Viterbi, the chain scores and marginals, the distance transforms and
    spatial trees, the BCFW block step)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton" if triton_available() else "torch"
        return "numba" if has_numba and device.type == "cpu" and numba_available() else "torch"
    if backend == "numba":
        if not has_numba:
            raise ValueError("backend='numba' exists only for Viterbi, the chain scores and marginals, the distance "
                             "transforms and spatial trees and the BCFW block step")
        if not numba_available():
            raise RuntimeError("backend='numba' needs the numba package (pip install torchssvm[cpu])")
        if device.type != "cpu":
            raise ValueError(f"backend='numba' runs on CPU tensors, got tensors on {device}")
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' needs the triton package (pip install torchssvm[triton])")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 (the Triton interpreter)"
            )
    return backend


_NUMBA_DTYPES = (torch.float32, torch.float64)


def _backend_with_numba(backend: str, device: torch.device, *tensors) -> str:
    """`resolve_backend` for the kernels with numba twins (chains, trees, distance transforms). ``"auto"`` keeps
    torch where the numba twins would not compute what torch does: half types (they take float32 and float64 only)
    and mixed dtypes among the float ``tensors`` (they compute in one dtype, torch promotes); None entries are
    skipped."""
    be = resolve_backend(backend, device, has_numba=True)
    if be == "numba" and backend == "auto":
        dtypes = {t.dtype for t in tensors if t is not None}
        if len(dtypes) != 1 or not dtypes <= set(_NUMBA_DTYPES):
            return "torch"
    return be


def _check_chain_args(unary, lengths=None, labels=None, z=None, num_labels=None, minus=None, *,
                      values: bool = True, everywhere: bool = False) -> None:
    """The chain kernels' arguments (a ValueError / TypeError naming one), before any backend runs: the Triton
    kernels read what the shapes say (a ``z`` without its unary block, labels narrower than ``T`` or a length past
    ``T`` read out of bounds). Shapes always; the values of ``lengths`` (in ``[1, T]``) and ``labels`` (``< K``,
    in every entry with ``everywhere``, else within each length; a negative label is a placeholder the twins
    agree on: no count in the marginals, 0 in the scores) on CPU tensors only, and not twice
    (``values=False``: the numba twins check them in their loop): on a device that check would make the host wait
    in every BCFW step, and the callers (`Chain`, `ChainProblem`) check them at the boundary."""
    if unary is not None:
        if not isinstance(unary, torch.Tensor) or unary.dim() != 3:
            raise ValueError(f"unary must be a (B, T, K) tensor, got {shape_or_type(unary)}")
        B, T, K = unary.shape
    else:
        B, T, K = labels.shape[0], labels.shape[-1], num_labels
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.is_floating_point():
            raise TypeError("labels must be an integer tensor")
        want = 3 if unary is not None else 2
        if labels.dim() != want or labels.shape[0] != B or labels.shape[-1] < T:
            shape = f"({B}, C, >= {T})" if want == 3 else "(B, T)"
            raise ValueError(f"labels must have shape {shape}, got {tuple(labels.shape)}")
    if minus is not None and (not isinstance(minus, torch.Tensor) or minus.shape != labels.shape):
        raise ValueError(f"minus must have the shape of labels {tuple(labels.shape)}")
    if z is not None:
        tail = K * K + 2 * K
        if not isinstance(z, torch.Tensor) or z.dim() != 2 or z.shape[0] != B or z.shape[1] < T * K + tail \
                or (z.shape[1] - tail) % max(K, 1):
            raise ValueError(f"z must have shape ({B}, T' {K} + {tail}) with T' >= {T}, got {shape_or_type(z)}")
    if lengths is not None:
        if not isinstance(lengths, torch.Tensor) or lengths.shape != (B,) or lengths.is_floating_point():
            raise ValueError(f"lengths must be a ({B},) integer tensor")
        if values and lengths.device.type == "cpu" and B:
            lo, hi = (int(v) for v in torch.aminmax(lengths))
            if lo < 1 or hi > T:
                raise ValueError(f"lengths must be in [1, {T}], got a length of {lo if lo < 1 else hi}")
            if labels is not None and labels.device.type == "cpu" and labels.numel():
                for name, t in (("labels", labels),) + (() if minus is None else (("minus", minus),)):
                    if int(t.max()) < K:  # the common case, one reduction (the sequential solver calls this often)
                        continue
                    if not everywhere:
                        inside = torch.arange(t.shape[-1]).unsqueeze(0) < lengths.view(B, *([1] * (t.dim() - 1)))
                        t = t[inside.expand_as(t)]
                    if t.numel() and int(t.max()) >= K:
                        raise ValueError(f"{name} must be < {K}" + ("" if everywhere else " within each length"))


def _promoted(*tensors):
    """The float ``tensors`` (None kept) in their promoted dtype when they mix dtypes: the twins then compute and
    return one dtype (Triton promoted only some inputs, the torch twin others, numba refused)."""
    dtypes = {t.dtype for t in tensors if t is not None}
    if len(dtypes) <= 1:
        return tensors
    dt = functools.reduce(torch.promote_types, dtypes)
    return tuple(None if t is None else t.to(dt) for t in tensors)


@torch.no_grad()
def viterbi(unary, transition, start, end, lengths, backend: str = "auto"):
    """Dispatch to `viterbi_torch`, `viterbi_triton` or `viterbi_numba` (bitwise equal); see `viterbi_torch` for
    the contract. Inputs are not checked here (the structures validate at the boundary)."""
    be = _backend_with_numba(backend, unary.device, unary, transition, start, end)
    if be == "triton":
        from .viterbi_triton import viterbi_triton

        return viterbi_triton(unary, transition, start, end, lengths)
    if be == "numba":
        from .viterbi_numba import viterbi_numba

        return viterbi_numba(unary, transition, start, end, lengths)
    return viterbi_torch(unary, transition, start, end, lengths)


@torch.no_grad()
def chain_labels_score(unary, transition, start, end, labels, lengths, backend: str = "auto", *, check: bool = True):
    """Scores ``(B, C)`` of ``labels (B, C, W)`` under chain potentials with shared transitions: dispatch to
    `chain_labels_score_torch`, `chain_labels_score_triton` (one launch instead of about fifteen) or
    `chain_labels_score_numba` (one compiled loop; equal to rounding; mixed dtypes are promoted first, so every twin
    returns the promoted dtype; ``"auto"`` keeps torch for the per-position
    transitions ``(B, T-1, K, K)`` that the torch twin also takes with one labelling per example). The arguments'
    shapes are checked, and on CPU the values of ``lengths`` and ``labels`` (`_check_chain_args`); ``check=False``
    skips that for callers that validated their data at the boundary (`ChainProblem`, in every solver step)."""
    unary, transition, start, end = _promoted(unary, transition, start, end)
    be = _backend_with_numba(backend, unary.device, unary, transition, start, end)
    if be == "numba" and backend == "auto" and transition.dim() != 2:
        be = "torch"
    if check:
        _check_chain_args(unary, lengths=lengths, labels=labels, values=be != "numba")
    if be == "triton":
        from .chain_score_triton import chain_labels_score_triton

        return chain_labels_score_triton(unary, transition, start, end, labels, lengths)
    if be == "numba":
        from .chain_score_numba import chain_labels_score_numba

        return chain_labels_score_numba(unary, transition, start, end, labels, lengths)
    return chain_labels_score_torch(unary, transition, start, end, labels, lengths)


@torch.no_grad()
def chain_inner(unary, transition, start, end, z, backend: str = "auto", *, check: bool = True):
    """``<theta_b, z_b>`` ``(B,)`` of chain potentials and flat marginals ``z (B, m)``: dispatch to
    `chain_inner_torch`, `chain_inner_triton` (one launch instead of about nine) or `chain_inner_numba` (equal to
    rounding; mixed dtypes are promoted first, so every twin returns the promoted dtype). The shapes are checked
    (`_check_chain_args`; ``check=False``: not, as in `chain_labels_score`)."""
    if check:
        _check_chain_args(unary, z=z)
    unary, transition, start, end, z = _promoted(unary, transition, start, end, z)
    be = _backend_with_numba(backend, unary.device, unary, transition, start, end, z)
    if be == "numba":
        from .chain_score_numba import chain_inner_numba

        return chain_inner_numba(unary, transition, start, end, z)
    if be == "triton":
        from .chain_score_triton import chain_inner_triton

        return chain_inner_triton(unary, transition, start, end, z)
    return chain_inner_torch(unary, transition, start, end, z)


@torch.no_grad()
def select_atoms(a_H, count, a_labels, a_loss, a_alpha, idx, base, ell, gaps, labels, loss, H, n: int, factor,
                 floor: float, misses, away: bool, backend: str = "auto", params=None):
    """The BCFW step's cache test and away atoms: dispatch to `select_atoms_torch` or `select_atoms_triton`
    (bitwise equal; see the twin for the contract). ``params``: ``[factor or 0, floor]`` already on the device,
    for the Triton form (no copy from the host: a CUDA graph can replay it)."""
    if resolve_backend(backend, a_H.device) == "triton":
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
    be = resolve_backend(backend, z.device, has_numba=True)
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
def chain_marginals(labels, lengths, num_labels: int, minus=None, dtype=torch.float64, backend: str = "auto",
                    subtract=None, *, check: bool = True):
    """Flat one-hot marginals ``m(y)`` (or ``m(y) - m(y')``) of chain labellings: dispatch to
    `chain_marginals_torch`, `chain_marginals_triton` or `chain_marginals_numba` (bitwise equal; ``labels`` padded
    with -1 past ``lengths``). ``subtract``
    ``(B, m)`` of ``dtype``: the result minus it (the numba twin does it in the same pass; the FW direction of
    BCFW). The shapes are checked, and on CPU the values of ``lengths`` and ``labels`` (`_check_chain_args`;
    ``check=False``: not, as in `chain_labels_score`)."""
    if subtract is not None and subtract.dtype != dtype:
        raise ValueError(f"subtract must be of dtype {dtype}, got {subtract.dtype}")
    be = resolve_backend(backend, labels.device, has_numba=True)
    if be == "numba" and backend == "auto" and dtype not in _NUMBA_DTYPES:
        be = "torch"
    if check:
        _check_chain_args(None, lengths=lengths, labels=labels, num_labels=num_labels, minus=minus,
                          values=be != "numba", everywhere=True)
    if be == "numba":
        from .chain_marginals_numba import chain_marginals_numba

        return chain_marginals_numba(labels, lengths, num_labels, minus, dtype, subtract)
    if be == "triton":
        from .chain_marginals_triton import chain_marginals_triton

        out = chain_marginals_triton(labels, lengths, num_labels, minus, dtype)
    else:
        out = chain_marginals_torch(labels, lengths, num_labels, minus, dtype)
    return out if subtract is None else out - subtract


@torch.no_grad()
def slack_viterbi(unary, transition, start, end, lengths, target, cost, target_score, backend: str = "auto"):
    """Dispatch to `slack_viterbi_torch` or `slack_viterbi_triton`; see `slack_viterbi_torch` for the
    contract (the exact slack-rescaled chain oracle of seed 000)."""
    if resolve_backend(backend, unary.device) == "triton":
        from .slack_chain_triton import slack_viterbi_triton

        return slack_viterbi_triton(unary, transition, start, end, lengths, target, cost, target_score)
    return slack_viterbi_torch(unary, transition, start, end, lengths, target, cost, target_score)


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
    if resolve_backend(backend, v.device) == "triton":
        from .simplex_triton import MAX_BLOCK, project_simplex_triton

        if v.shape[1] <= MAX_BLOCK or backend == "triton":  # "auto": longer rows go to the torch twin
            return project_simplex_triton(v, mask, radius)
    return project_simplex_torch(v, mask, radius)


@torch.no_grad()
def project_shifted_simplex(u, top, mask=None, radius=None, backend: str = "auto"):
    """Euclidean projection of each row of ``u (B, M)`` onto the shifted simplex of GDMM (note 002 eq. 11)
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
    # feasible iff sum_i min(s_i l_i, s_i u_i) <= z <= sum_i max(s_i l_i, s_i u_i) (note 003 section 2.4)
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
    sum_i sigma_i x_i = z}`` (seed 003 App. B); see `project_box_equality_torch` for the contract. ``lower``,
    ``upper``, ``sigma`` and ``d2`` are ``(B, n)``, ``(n,)`` (shared by all rows) or numbers, ``z`` is ``(B,)`` or a
    number. Inputs are validated: shapes, dtypes and devices, NaN, ``sigma == 0``, ``d2 <= 0``, ``lower > upper``
    and an infeasible ``z`` raise."""
    _check_box_equality_args(m, lower, upper, sigma, z, d2)
    if resolve_backend(backend, m.device) == "triton":
        from .box_equality_triton import MAX_BLOCK, project_box_equality_triton

        if m.shape[1] <= MAX_BLOCK or backend == "triton":
            return project_box_equality_triton(m, lower, upper, sigma, z, d2)
    return project_box_equality_torch(m, lower, upper, sigma, z, d2)


def check_quadratic_weights(name: str, t: torch.Tensor) -> None:
    """Generalized distance transforms need convex costs: a ValueError naming ``name`` if ``t`` has an entry
    < 0 (or NaN)."""
    if t.numel() and not bool((t >= 0).all()):
        raise ValueError(f"{name} must be >= 0 (the quadratic deformation weights of a distance transform)")


def _check_tree_args(unary, parents: tuple, name: str, table, table_name: str, last: tuple) -> None:
    """``unary (B, V, .)`` with V the number of nodes of ``parents`` and ``table`` (``pairwise`` / ``weights``) of
    shape ``(E, *last)`` or ``(B, E, *last)``: the kernels index them by the tree's nodes and edges (a shorter unary
    left labels uninitialised)."""
    V, E = len(parents), len(parents) - 1
    if not isinstance(unary, torch.Tensor) or unary.dim() != 3 or unary.shape[1] != V:
        raise ValueError(f"unary must have shape (B, {V}, K) for the {V} nodes of {name}, got {shape_or_type(unary)}")
    B = unary.shape[0]
    allowed = [(E, *last), (B, E, *last)]
    if not isinstance(table, torch.Tensor) or tuple(table.shape) not in allowed:
        raise ValueError(f"{table_name} must have shape {' or '.join(map(str, allowed))}, got {shape_or_type(table)}")


@torch.no_grad()
def tree_max_sum(unary, pairwise, parents, backend: str = "auto"):
    """Dispatch to `tree_max_sum_torch` or `tree_max_sum_triton` (explicit pairwise tables); see
    `tree_max_sum_torch` for the contract. ``parents`` and the shapes are checked here (the structures validate
    the values)."""
    sched = tree_schedule(parents)
    K = unary.shape[-1] if isinstance(unary, torch.Tensor) else 0
    _check_tree_args(unary, sched.parents, "parents", pairwise, "pairwise", (K, K))
    if resolve_backend(backend, unary.device) == "triton":
        from .tree_triton import tree_max_sum_triton

        return tree_max_sum_triton(unary, pairwise, sched.parents)
    return tree_max_sum_torch(unary, pairwise, sched.parents)


@torch.no_grad()
def spatial_tree_max_sum(unary, weights, rest, parents, height: int, width: int, backend: str = "auto"):
    """Max-sum on a pictorial-structure tree by distance transforms; see `spatial_tree_max_sum_torch`.
    Raises a ValueError naming ``weights`` if a quadratic weight (``weights[..., 1]``, ``weights[..., 3]``)
    is negative."""
    sched = tree_schedule(parents)
    _check_tree_args(unary, sched.parents, "parents", weights, "weights", (4,))
    if not isinstance(rest, torch.Tensor) or tuple(rest.shape) != (len(sched.parents) - 1, 2):
        raise ValueError(f"rest must have shape ({len(sched.parents) - 1}, 2), got {shape_or_type(rest)}")
    if unary.shape[2] != height * width:
        raise ValueError(f"unary must have height * width = {height * width} positions, got {unary.shape[2]}")
    check_quadratic_weights("weights[..., 1] and weights[..., 3]", weights[..., 1::2])
    be = _backend_with_numba(backend, unary.device, unary, weights, rest)
    if be == "triton":
        from .tree_triton import spatial_tree_max_sum_triton

        return spatial_tree_max_sum_triton(unary, weights, rest, sched.parents, height, width)
    if be == "numba":
        from .distance_transform_numba import spatial_tree_max_sum_numba

        return spatial_tree_max_sum_numba(unary, weights, rest, sched.parents, height, width)
    return spatial_tree_max_sum_torch(unary, weights, rest, sched.parents, height, width)


def _check_mixture_args(unary, weights, rest, child_scores, parent_scores, cooccurrence, V, height, width):
    """Shapes and devices of `mixture_tree_max_sum`'s tensors (the compiled twin reads them unchecked); a
    ValueError names the argument."""
    if unary.dim() != 3 or unary.shape[1] != V or unary.shape[2] != height * width:
        raise ValueError(f"unary must have shape (B, {V}, {height * width}), got {tuple(unary.shape)}")
    B, E = unary.shape[0], V - 1
    if weights.dim() not in (3, 4) or weights.shape[-3] != E or weights.shape[-1] != 4 \
            or (weights.dim() == 4 and weights.shape[0] != B):
        raise ValueError(f"weights must have shape ({E}, T, 4) or ({B}, {E}, T, 4), got {tuple(weights.shape)}")
    T = weights.shape[-2]
    shapes = {"rest": (rest, [(E, T, 2)]),
              "child_scores": (child_scores, [(B, E, T, height * width), (B, E, T, 1)]),
              "parent_scores": (parent_scores, [(B, E, T, height * width), (B, E, T, 1)]),
              "cooccurrence": (cooccurrence, [(E, T, T), (B, E, T, T)])}
    for name, (t, allowed) in shapes.items():
        if t is None:
            continue
        if tuple(t.shape) not in allowed:
            raise ValueError(f"{name} must have shape {' or '.join(map(str, allowed))}, got {tuple(t.shape)}")
        if t.device != unary.device:
            raise ValueError(f"{name} must be on unary's device {unary.device}, got {t.device}")


@torch.no_grad()
def mixture_tree_max_sum(unary, weights, rest, parents, height: int, width: int, child_scores=None,
                         parent_scores=None, cooccurrence=None, backend: str = "auto"):
    """Max-sum on a pictorial-structure tree with T mixture types per edge; see `mixture_tree_max_sum_torch`,
    and `cooccurrence_tree_max_sum_torch` for ``cooccurrence (B, E, T, T)`` or ``(E, T, T)`` (returns
    positions ``(B, V)``, types ``(B, E)`` and values ``(B,)``). Raises a ValueError naming ``weights`` if a
    quadratic weight is negative."""
    sched = tree_schedule(parents)
    _check_mixture_args(unary, weights, rest, child_scores, parent_scores, cooccurrence, len(sched.parents),
                        height, width)
    check_quadratic_weights("weights[..., 1] and weights[..., 3]", weights[..., 1::2])
    be = _backend_with_numba(backend, unary.device, unary, weights, rest, child_scores, parent_scores, cooccurrence)
    if be == "numba":
        from .distance_transform_numba import mixture_tree_max_sum_numba

        return mixture_tree_max_sum_numba(unary, weights, rest, sched.parents, height, width, child_scores,
                                          parent_scores, cooccurrence)
    gdt_2d = None
    if be == "triton":
        from .distance_transform_triton import distance_transform_1d_triton

        gdt_2d = functools.partial(distance_transform_2d_torch, gdt_1d=distance_transform_1d_triton)
    if cooccurrence is not None:
        return cooccurrence_tree_max_sum_torch(unary, weights, rest, cooccurrence, sched.parents, height, width,
                                               child_scores, parent_scores, gdt_2d=gdt_2d)
    return mixture_tree_max_sum_torch(unary, weights, rest, sched.parents, height, width, child_scores,
                                      parent_scores, gdt_2d=gdt_2d)


def _check_transform_args(f, ndim: int, params: dict) -> None:
    """``f``: a floating tensor of ``ndim`` dimensions, finite or -inf (an excluded position); each parameter a
    ``(R,)`` tensor of f's dtype on its device (the kernels index them per row, unchecked)."""
    shape = "(R, n)" if ndim == 2 else "(R, H, W)"
    if not isinstance(f, torch.Tensor) or f.dim() != ndim or not f.is_floating_point():
        raise ValueError(f"f must be a floating {shape} tensor, got {shape_or_type(f)}")
    if bool((torch.isnan(f) | (f == torch.inf)).any()):
        raise ValueError("f must hold finite values or -inf (a position no output may take), not NaN or +inf")
    R = f.shape[0]
    for name, t in params.items():
        if not isinstance(t, torch.Tensor) or t.shape != (R,):
            raise ValueError(f"{name} must be a ({R},) tensor (one value per row of f), got {shape_or_type(t)}")
        if t.device != f.device or t.dtype != f.dtype:
            raise ValueError(f"{name} must be on f's device {f.device} with f's dtype {f.dtype}, got {t.device}, "
                             f"{t.dtype}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite")


@torch.no_grad()
def distance_transform_1d(f, a, b, r, backend: str = "auto"):
    """``out[p] = max_q f[q] - a d^2 - b d``, ``d = p - q - r``, per row of ``f (R, n)``, with its argmax; see
    `distance_transform_torch`. ``f`` finite or -inf (a position excluded from every max); ``a, b, r``: ``(R,)``
    of f's dtype, finite; ``a >= 0`` (a ValueError naming ``a``). A row of -inf gives -inf."""
    _check_transform_args(f, 2, {"a": a, "b": b, "r": r})
    check_quadratic_weights("a", a)
    be = _backend_with_numba(backend, f.device, f)
    if be == "triton":
        from .distance_transform_triton import distance_transform_1d_triton

        return distance_transform_1d_triton(f, a, b, r)
    if be == "numba":
        from .distance_transform_numba import distance_transform_1d_numba

        return distance_transform_1d_numba(f, a, b, r)
    return distance_transform_1d_torch(f, a, b, r)


@torch.no_grad()
def distance_transform_2d(f, ax, bx, rx, ay, by, ry, backend: str = "auto"):
    """The separable 2-D transform of ``f (R, H, W)`` (row pass along x, then column pass along y) with its
    flat argmax; see `distance_transform_torch.distance_transform_2d`. ``f`` finite or -inf; the parameters
    ``(R,)`` of f's dtype, finite; ``ax, ay >= 0`` (a ValueError naming them)."""
    _check_transform_args(f, 3, {"ax": ax, "bx": bx, "rx": rx, "ay": ay, "by": by, "ry": ry})
    check_quadratic_weights("ax", ax)
    check_quadratic_weights("ay", ay)
    be = _backend_with_numba(backend, f.device, f)
    if be == "numba":
        from .distance_transform_numba import distance_transform_2d_numba

        return distance_transform_2d_numba(f, ax, bx, rx, ay, by, ry)
    gdt_1d = distance_transform_1d_torch
    if be == "triton":
        from .distance_transform_triton import distance_transform_1d_triton as gdt_1d
    return distance_transform_2d_torch(f, ax, bx, rx, ay, by, ry, gdt_1d=gdt_1d)


__all__ = ["project_simplex", "project_shifted_simplex", "project_simplex_torch", "project_box_equality",
           "project_box_equality_torch", "box_equality_median",
           "viterbi", "viterbi_torch", "chain_score_torch", "chain_labels_score", "chain_labels_score_torch",
           "chain_inner", "chain_inner_torch",
           "chain_marginals", "chain_marginals_torch", "select_atoms", "select_atoms_torch", "apply_block_step",
           "apply_block_step_torch", "slack_viterbi",
           "slack_viterbi_torch", "resolve_backend",
           "triton_available", "numba_available",
           "BACKENDS", "tree_max_sum", "tree_max_sum_torch", "spatial_tree_max_sum", "spatial_tree_max_sum_torch",
           "mixture_tree_max_sum", "mixture_tree_max_sum_torch", "cooccurrence_tree_max_sum_torch",
           "tree_schedule", "TreeSchedule", "distance_transform_1d", "distance_transform_1d_torch",
           "distance_transform_2d", "check_quadratic_weights"]
