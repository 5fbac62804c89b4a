"""GDMM: dual-decomposed learning with factorwise oracles for large label sets (`GDMM`; `MultiLabelGDMM` on a
`MultiLabelProblem`), its sublinear bigram oracle (`factor_oracles`), the shifted-simplex QP and the compiled
sequential passes (`gdmm_numba`)."""

from .gdmm import GDMM
from .gdmm_multilabel import MultiLabelGDMM  # registers the variant GDMM(MultiLabelProblem) builds

__all__ = ["GDMM", "MultiLabelGDMM"]
