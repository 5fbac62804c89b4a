"""Cutting planes and bundles: SVM-struct's n-slack (`NSlackCuttingPlane`) and 1-slack (`OneSlackCuttingPlane`)
cutting planes and `BMRM`, over risk oracles (`risks`), the model QPs by `simplex_qp`."""

from .bmrm import BMRM
from .n_slack import NSlackCuttingPlane
from .one_slack import OneSlackCuttingPlane
from .risks import HingeRisk, MaxOfLinearRisk, StructuredRisk

__all__ = ["BMRM", "NSlackCuttingPlane", "OneSlackCuttingPlane", "HingeRisk", "MaxOfLinearRisk", "StructuredRisk"]
