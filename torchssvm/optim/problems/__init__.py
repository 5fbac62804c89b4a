"""Problems: (model, dataset) pairs seen by the dual solvers in marginal coordinates.

To add a structure to the solvers, subclass `DualProblem` next to `ChainProblem` and register it in
`make_problem`.
"""

from __future__ import annotations

from .base import DualProblem
from .chain import ChainProblem
from .table import FeatureTableProblem


def make_problem(model, dataset=None, structure=None, *, backend: str = "auto") -> DualProblem:
    """A `DualProblem` for ``(model, dataset)``; a `DualProblem` passed as ``model`` is returned as is."""
    if isinstance(model, DualProblem):
        if dataset is not None:
            raise ValueError("dataset must be None when model is already a DualProblem")
        return model
    from ...models import LinearChainModel

    if isinstance(model, LinearChainModel):
        if dataset is None:
            raise ValueError("dataset is required with a LinearChainModel")
        return ChainProblem(model, dataset, structure, backend=backend)
    raise TypeError(f"model must be a LinearChainModel or a DualProblem (e.g. FeatureTableProblem), "
                    f"got {type(model).__name__}")


__all__ = ["DualProblem", "ChainProblem", "FeatureTableProblem", "make_problem"]
