"""The searches' per-example arguments, checked at the boundary (a ValueError or TypeError naming the argument)."""

from __future__ import annotations

import torch

from .._validation import check_tensor


def check_per_example(name: str, value, batch: int, device, *, positive: bool) -> torch.Tensor:
    """``value`` as a float64 ``(batch,)`` tensor on ``device``: finite and ``> 0`` (``positive``) or ``>= 0``.

    A multiplier ``lam <= 0`` or ``inf`` has no meaning in the lambda-oracles; in angular search a negative one
    made the root's bound ``K^2 / (4 lam)`` negative and the certificate false."""
    check_tensor(name, value, ndim=1)
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be a real tensor, got dtype {value.dtype}")
    if value.shape[0] != batch:
        raise ValueError(f"{name} must have shape ({batch},) (one per example), got {tuple(value.shape)}")
    value = value.detach().to(device=device, dtype=torch.float64)
    bad = ~torch.isfinite(value) | ((value <= 0) if positive else (value < 0))
    if bool(bad.any()):
        raise ValueError(f"{name} must be finite and {'> 0' if positive else '>= 0'}, got "
                         f"{value[bad][:4].tolist()} at {bad.nonzero().squeeze(1)[:4].tolist()}")
    return value
