"""What the solvers outside `DualSolver` share: the `fit` loop and the TensorBoard scalars."""

from __future__ import annotations

import math


def run_steps(step, stop, callback=None) -> list:
    """Call ``step()`` until ``stop(report)`` is true; ``callback(report)`` after each. Returns the reports."""
    history = []
    while True:
        r = step()
        history.append(r)
        if callback is not None:
            callback(r)
        if stop(r):
            return history


def log_scalars(writer, tag: str, report: dict, keys, step: int) -> None:
    """``writer.add_scalar(f"{tag}/{key}", ...)`` for the finite entries of ``report`` named in ``keys``."""
    if writer is None:
        return
    for key in keys:
        value = report.get(key)
        if value is not None and math.isfinite(value):
            writer.add_scalar(f"{tag}/{key}", value, step)
