"""Solvers for the convex SSVM, shaped like ``torch.optim``: ``solver.step()``, ``state_dict()``; one sub-package a
family:

- ``frank_wolfe/``: `BCFW`, block-coordinate Frank-Wolfe with gap sampling, pairwise / away steps, caching, box
  constraints and exact mini-batches, and batch `FrankWolfe`; the mini-batch step's box QP, atom store and device
  sampler.
- ``cutting_planes/``: `NSlackCuttingPlane` (SVM-struct's n-slack; the working-set QP by pairwise block moves or
  per-block FISTA), `OneSlackCuttingPlane` (SVM-struct's 1-slack) and `BMRM` (qp-bmrm / ls-bmrm): cutting-plane
  models of a risk oracle (`StructuredRisk` for any SSVM, `HingeRisk`, `MaxOfLinearRisk`), the model QP by
  ``simplex_qp``.
- ``gdmm/``: `GDMM`, dual-decomposed learning with factorwise oracles for large label sets, and on a
  `MultiLabelProblem` the pairwise multi-label solver `MultiLabelGDMM`.
- ``primal/``: `SSG` (stochastic subgradient, the papers' baseline), `Pegasos` (a ``torch.optim`` optimizer for the
  primal with any loss, e.g. the slack-rescaled hinge) and the accelerated `Pragam` / `MulticlassPragam`.
- ``kernel_svm/``: `KernelCuttingPlane`, the kernel SSVM (binary, multiclass) by 1-slack cuts, exact or sampled, over
  Mercer kernels.
- ``problems/``: how a (model, dataset) pair is seen as dual blocks in marginal coordinates; add new structures
  there.
- ``solver.py``: `Solver`, the contract every solver but `Pegasos` follows (``step`` returns the report, one ``fit``
  loop with checkpoints, ``state_dict`` / ``load_state_dict`` from declared state, checked against the data's
  fingerprint and recomputed identities, logging from declared report keys), and `ConvergenceWarning`;
  ``checkpoint.py``: `save_checkpoint` / `load_checkpoint`, atomic files with a digest; ``fingerprint.py``: the
  digest of a training set that binds a state to it.
- ``dual_solver.py``: `DualSolver`, the base of the solvers on dual blocks (BCFW, batch Frank-Wolfe, n-slack), and
  the exact block gaps that certify them; ``regularization_path.py``: the epsilon-approximate regularization path
  (`regularization_path`, `grid_search`).
"""

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .cutting_planes import BMRM, HingeRisk, MaxOfLinearRisk, NSlackCuttingPlane, OneSlackCuttingPlane, StructuredRisk
from .dual_solver import DualSolver
from .frank_wolfe import BCFW, FrankWolfe
from .gdmm import GDMM, MultiLabelGDMM
from .history import History
from .kernel_svm import KernelCuttingPlane
from .primal import SSG, MulticlassPragam, Pegasos, Pragam
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
from .solver import ConvergenceWarning, Solver

__all__ = ["Solver", "ConvergenceWarning", "History", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "BCFW", "GDMM", "MultiLabelGDMM", "NSlackCuttingPlane", "OneSlackCuttingPlane", "BMRM", "StructuredRisk",
           "HingeRisk", "MaxOfLinearRisk", "KernelCuttingPlane", "Pragam", "MulticlassPragam", "MultiLabelProblem",
           "FrankWolfe", "SSG", "Pegasos", "DualSolver", "DualProblem", "ChainProblem", "FeatureTableProblem",
           "SlackRescaledProblem", "SpatialTreeProblem", "MixtureSpatialTreeProblem", "make_problem",
           "RegularizationPath",
           "regularization_path", "grid_search"]
