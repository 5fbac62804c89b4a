"""Oracles: each exists as a pure-torch twin and a Triton kernel, chosen by ``backend=``.

``backend="auto"`` runs Triton on CUDA tensors when triton imports, torch otherwise;
``"torch"`` and ``"triton"`` force one (``"triton"`` on CPU tensors needs ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import os

import torch

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


__all__ = ["viterbi", "viterbi_torch", "slack_viterbi", "slack_viterbi_torch", "resolve_backend", "triton_available",
           "BACKENDS"]
