"""The pieces of `Solver`'s loop and logging (`solver.py`): the checks of a ``fit``'s limits, the TensorBoard
scalars."""

from __future__ import annotations

import math
import numbers


def check_limits(*, integer: tuple = (), **limits) -> None:
    """The stopping limits of a ``fit`` (``max_iter=..., gap_tol=...``; None: no limit): each a number ``>= 0``,
    not NaN (``inf``: no limit), and an int for the names in ``integer``; else a TypeError / ValueError naming it.
    A negative ``max_iter`` or ``time_budget`` ran one step; a float ``max_iter = 2.5`` ran three."""
    for name, value in limits.items():
        if value is None:
            continue
        kind = numbers.Integral if name in integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TypeError(f"{name} must be {'an int' if name in integer else 'a number'} or None, got {value!r}")
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def log_scalars(writer, tag: str, report: dict, keys, step: int) -> None:
    """``writer.add_scalar(f"{tag}/{key}", ...)`` for the finite entries of ``report`` named in ``keys``."""
    if writer is None:
        return
    for key in keys:
        value = report.get(key)
        if value is not None and math.isfinite(value):
            writer.add_scalar(f"{tag}/{key}", value, step)
