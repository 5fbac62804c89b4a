"""Searches for the slack-rescaled most violating labelling ``argmax_y h(y) g(y)`` through lambda-oracles
(Choi et al., 2016): bisecting (Alg. 1), binary search on the F-bar bound, angular (Alg. 2, exact with
the constrained oracle) and the Sarawagi-Gupta golden-section baseline. Each is batched across examples
and reports the oracle calls per example and a certified upper bound (their Lemma 5)."""

from .angular import angular_search
from .binary import binary_search
from .bisecting import bisecting_search
from .golden import golden_search
from .oracles import OracleAnswer, StructureOracle, TableOracle
from .result import SearchResult

__all__ = ["angular_search", "bisecting_search", "binary_search", "golden_search", "TableOracle",
           "StructureOracle", "OracleAnswer", "SearchResult"]
