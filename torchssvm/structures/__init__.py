"""Output structures. To add one, subclass `Structure` (base.py; its docstring says what a structure implements)
in a new file and export it here."""

from .base import CAPABILITIES, Structure, Unchecked
from .chain import Chain, ChainPotentials
from .hierarchy import Hierarchy
from .mixture_tree import MixtureSpatialTree, MixtureTreePotentials
from .multiclass import Multiclass
from .multilabel import MultiLabel, MultiLabelPotentials
from .tree import SpatialTree, SpatialTreePotentials, Tree, TreePotentials

__all__ = ["Structure", "Unchecked", "CAPABILITIES", "Chain", "ChainPotentials", "Hierarchy", "Multiclass",
           "MultiLabel", "MultiLabelPotentials", "Tree", "TreePotentials", "SpatialTree", "SpatialTreePotentials",
           "MixtureSpatialTree", "MixtureTreePotentials"]
