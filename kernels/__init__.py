"""Oracles: each exists as a pure-torch twin and a Triton kernel, chosen by ``backend=``.

``backend="auto"`` runs Triton on CUDA tensors when triton imports, torch otherwise;
``"torch"`` and ``"triton"`` force one (``"triton"`` on CPU tensors needs ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import os

import torch

from .simplex_torch import project_simplex_torch
from .slack_chain_torch import slack_viterbi_torch
from .viterbi_torch import viterbi_torch

BACKENDS = ("auto", "torch", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``backend`` to ``"torch"`` or ``"triton"`` for tensors on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' needs the triton package (pip install torchssvm[triton])")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 (the Triton interpreter)"
            )
    return backend


@torch.no_grad()
def viterbi(unary, transition, start, end, lengths, backend: str = "auto"):
    """Dispatch to `viterbi_torch` or `viterbi_triton`; see `viterbi_torch` for the contract. Inputs are
    not checked here (the structures validate at the boundary)."""
    if resolve_backend(backend, unary.device) == "triton":
        from .viterbi_triton import viterbi_triton

        return viterbi_triton(unary, transition, start, end, lengths)
    return viterbi_torch(unary, transition, start, end, lengths)


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
        raise ValueError(f"v must be a (B, M) float tensor with M >= 1, got "
                         f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
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
        from .simplex_triton import project_simplex_triton

        return project_simplex_triton(v, mask, radius)
    return project_simplex_torch(v, mask, radius)


__all__ = ["project_simplex", "project_simplex_torch",
           "viterbi", "viterbi_torch", "slack_viterbi", "slack_viterbi_torch", "resolve_backend", "triton_available",
           "BACKENDS"]
