"""Dual solvers for the convex SSVM, shaped like ``torch.optim``: ``solver.step()``, ``state_dict()``.

- `BCFW`: block-coordinate Frank-Wolfe with gap sampling, pairwise / away steps, caching, box
  constraints and exact mini-batches (``bcfw.py``).
- `NSlackCuttingPlane`: SVM-struct's n-slack cutting plane, the working-set QP by pairwise block moves (default)
  or per-block FISTA on the block-simplex projection kernel (``qp_step="projected"``; ``cutting_plane.py``).
- `OneSlackCuttingPlane` (SVM-struct's 1-slack, ``one_slack.py``) and `BMRM` (qp-bmrm / ls-bmrm, ``bmrm.py``):
  cutting-plane models of a risk oracle (``risks.py``: any SSVM, the binary hinge), the model QP by
  ``simplex_qp.py``.
- `KernelCuttingPlane`: the kernel SSVM (binary, multiclass) by 1-slack cuts, exact or sampled (seed 004's
  linear- and constant-time algorithms), Mercer kernels in ``mercer.py``.
- `GDMM`: dual-decomposed learning with factorwise oracles for large label sets (seed 002, ``gdmm.py``;
  its sublinear bigram oracle in ``factor_oracles.py``); on a `MultiLabelProblem` it is the pairwise
  multi-label solver of ``gdmm_multilabel.py``.
- `FrankWolfe` (batch) and `SSG` (stochastic subgradient): the papers' baselines; `Pegasos`, a
  ``torch.optim`` optimizer for the primal with any loss (e.g. the slack-rescaled hinge).
- `regularization_path`, `grid_search`: the epsilon-approximate path of note 001 section 2.8.
- ``problems/``: how a (model, dataset) pair is seen in marginal coordinates; add new structures there.
"""

from .bcfw import BCFW
from .bmrm import BMRM
from .cutting_plane import NSlackCuttingPlane
from .dual_solver import DualSolver
from .frank_wolfe import FrankWolfe
from .gdmm import GDMM
from .gdmm_multilabel import MultiLabelGDMM  # registers the variant that GDMM(MultiLabelProblem) builds
from .kernel_cutting_plane import KernelCuttingPlane
from .one_slack import OneSlackCuttingPlane
from .pegasos import Pegasos
from .pragam import Pragam
from .pragam_multiclass import MulticlassPragam
from .problems import (
                       ChainProblem,
                       DualProblem,
                       FeatureTableProblem,
                       MixtureSpatialTreeProblem,
                       MultiLabelProblem,
                       SlackRescaledProblem,
                       SpatialTreeProblem,
                       make_problem,
)
from .regularization_path import RegularizationPath, grid_search, regularization_path
from .risks import HingeRisk, MaxOfLinearRisk, StructuredRisk
from .ssg import SSG

__all__ = ["BCFW", "GDMM", "MultiLabelGDMM", "NSlackCuttingPlane", "OneSlackCuttingPlane", "BMRM", "StructuredRisk",
           "HingeRisk", "MaxOfLinearRisk", "KernelCuttingPlane", "Pragam", "MulticlassPragam", "MultiLabelProblem",
           "FrankWolfe", "SSG", "Pegasos", "DualSolver", "DualProblem", "ChainProblem", "FeatureTableProblem",
           "SlackRescaledProblem", "SpatialTreeProblem", "MixtureSpatialTreeProblem", "make_problem",
           "RegularizationPath",
           "regularization_path", "grid_search"]
