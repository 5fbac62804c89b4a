"""Trees and distance transforms: max-sum on trees with tables, on pictorial-structure trees (with mixtures) by
generalized distance transforms, and the transforms themselves; each dispatched to its torch, Triton or numba twin
by the backend table (`backends.resolve`)."""

from __future__ import annotations

import functools

import torch

from torchssvm._validation import shape_or_type

from ..backends import resolve
from .distance_transform_torch import distance_transform_1d_torch
from .distance_transform_torch import distance_transform_2d as distance_transform_2d_torch
from .tree_torch import (
    cooccurrence_tree_max_sum_torch,
    mixture_tree_max_sum_torch,
    spatial_tree_max_sum_torch,
    tree_max_sum_torch,
    tree_schedule,
)


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
    if resolve("tree_max_sum", backend, unary.device) == "triton":
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
    be = resolve("spatial_tree_max_sum", backend, unary.device, unary, weights, rest)
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
    be = resolve("mixture_tree_max_sum", backend, unary.device, unary, weights, rest, child_scores, parent_scores,
                 cooccurrence)
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
    be = resolve("distance_transform_1d", backend, f.device, f)
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
    be = resolve("distance_transform_2d", backend, f.device, f)
    if be == "numba":
        from .distance_transform_numba import distance_transform_2d_numba

        return distance_transform_2d_numba(f, ax, bx, rx, ay, by, ry)
    gdt_1d = distance_transform_1d_torch
    if be == "triton":
        from .distance_transform_triton import distance_transform_1d_triton as gdt_1d
    return distance_transform_2d_torch(f, ax, bx, rx, ay, by, ry, gdt_1d=gdt_1d)
