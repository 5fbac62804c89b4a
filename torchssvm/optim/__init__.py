"""Dual solvers for the convex SSVM, shaped like ``torch.optim``: ``solver.step()``, ``state_dict()``.

- `BCFW`: block-coordinate Frank-Wolfe with gap sampling, pairwise / away steps, caching, box
  constraints and exact mini-batches (``bcfw.py``).
- `NSlackCuttingPlane`: SVM-struct's n-slack cutting plane, the working-set QP by accelerated projected
  gradient on the block-simplex projection kernel (``cutting_plane.py``).
- `FrankWolfe` (batch) and `SSG` (stochastic subgradient): the papers' baselines; `Pegasos`, a
  ``torch.optim`` optimizer for the primal with any loss (e.g. the slack-rescaled hinge).
- `regularization_path`, `grid_search`: the epsilon-approximate path of note 001 section 2.8.
- ``problems/``: how a (model, dataset) pair is seen in marginal coordinates; add new structures there.
"""

from .bcfw import BCFW
from .cutting_plane import NSlackCuttingPlane
from .dual_solver import DualSolver
from .frank_wolfe import FrankWolfe
from .pegasos import Pegasos
from .problems import (
                       ChainProblem,
                       DualProblem,
                       FeatureTableProblem,
                       MultiLabelProblem,
                       SlackRescaledProblem,
                       make_problem,
)
from .regularization_path import RegularizationPath, grid_search, regularization_path
from .ssg import SSG

__all__ = ["BCFW", "NSlackCuttingPlane", "MultiLabelProblem",
           "FrankWolfe", "SSG", "Pegasos", "DualSolver", "DualProblem", "ChainProblem", "FeatureTableProblem",
           "SlackRescaledProblem", "make_problem", "RegularizationPath", "regularization_path", "grid_search"]
