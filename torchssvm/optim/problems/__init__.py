"""Problems: (model, dataset) pairs seen by the dual solvers in marginal coordinates.

To add a structure to the solvers, subclass `DualProblem` next to `ChainProblem` and register it in
`make_problem`.
"""

from __future__ import annotations

from .base import DualProblem
from .chain import ChainProblem
from .mixture_tree import MixtureSpatialTreeProblem, MixtureTreeTheta
from .multilabel import MultiLabelProblem
from .slack import SlackRescaledProblem
from .table import FeatureTableProblem
from .tree import SpatialTreeProblem, SpatialTreeTheta

RESCALINGS = ("margin", "slack")


def make_problem(model, dataset=None, structure=None, *, backend: str = "auto",
                 rescaling: str = "margin") -> DualProblem:
    """A `DualProblem` for ``(model, dataset)``; a `DualProblem` passed as ``model`` is used as is.
    ``rescaling="slack"`` wraps it in `SlackRescaledProblem` (the slack-rescaled SSVM; Choi et al., 2016)."""
    if rescaling not in RESCALINGS:
        raise ValueError(f"rescaling must be one of {RESCALINGS}, got {rescaling!r}")
    if isinstance(model, DualProblem):
        # the problem holds its own structure and kernels' backend: others given here would be ignored
        if dataset is not None:
            raise ValueError("dataset must be None when model is already a DualProblem")
        if structure is not None:
            raise ValueError(f"structure must be None when model is already a DualProblem (which holds its own "
                             f"task loss), got {structure!r}")
        own = getattr(model, "backend", None)
        if backend != "auto" and own is not None and backend != own:
            raise ValueError(f"backend={backend!r} differs from the problem's own backend={own!r}: build the problem "
                             "with it")
        problem = model
    else:
        from ...models import LinearChainModel

        if not isinstance(model, LinearChainModel):
            raise TypeError(f"model must be a LinearChainModel or a DualProblem (e.g. FeatureTableProblem), "
                            f"got {type(model).__name__}")
        if dataset is None:
            raise ValueError("dataset is required with a LinearChainModel")
        problem = ChainProblem(model, dataset, structure, backend=backend)
    if rescaling == "slack" and not isinstance(problem, SlackRescaledProblem):
        problem = SlackRescaledProblem(problem)
    return problem


def rescaling_of(problem: DualProblem) -> str:
    """The ``rescaling`` that `make_problem` built ``problem`` with."""
    return "slack" if isinstance(problem, SlackRescaledProblem) else "margin"


__all__ = ["DualProblem", "ChainProblem", "FeatureTableProblem", "MultiLabelProblem",
           "SlackRescaledProblem", "SpatialTreeProblem", "SpatialTreeTheta", "MixtureSpatialTreeProblem",
           "MixtureTreeTheta", "make_problem", "rescaling_of", "RESCALINGS"]
