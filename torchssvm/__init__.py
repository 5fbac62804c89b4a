"""torchssvm: structured SVMs in PyTorch.

    import torchssvm as ts
    loss = ts.StructuredHingeLoss(ts.Chain(num_labels))(potentials, target, lengths)
"""

from . import data, kernels, metrics, optim, recipes, search
from ._validation import debug_enabled, set_debug
from .losses import (
    CRFLoss,
    SlackRescaledHingeLoss,
    StructuredHingeLoss,
    crf_negative_log_likelihood,
    slack_rescaled_hinge_loss,
    structured_hinge_loss,
)
from .models import LinearChainModel, LinearMulticlassModel, TokenFeatures, joint_feature
from .optim.solver import ConvergenceWarning
from .structures import (
    Chain,
    ChainPotentials,
    Hierarchy,
    MixtureSpatialTree,
    MixtureTreePotentials,
    Multiclass,
    MultiLabel,
    MultiLabelPotentials,
    SpatialTree,
    SpatialTreePotentials,
    Structure,
    Tree,
    TreePotentials,
)

__version__ = "0.1.0"

__all__ = [
    "Chain",
    "ChainPotentials",
    "Hierarchy",
    "Multiclass",
    "MultiLabel",
    "MultiLabelPotentials",
    "Structure",
    "Tree",
    "TreePotentials",
    "SpatialTree",
    "SpatialTreePotentials",
    "MixtureSpatialTree",
    "MixtureTreePotentials",
    "StructuredHingeLoss",
    "structured_hinge_loss",
    "SlackRescaledHingeLoss",
    "slack_rescaled_hinge_loss",
    "CRFLoss",
    "crf_negative_log_likelihood",
    "LinearChainModel",
    "LinearMulticlassModel",
    "TokenFeatures",
    "joint_feature",
    "data",
    "kernels",
    "metrics",
    "optim",
    "recipes",
    "search",
    "set_debug",
    "debug_enabled",
    "ConvergenceWarning",
]
