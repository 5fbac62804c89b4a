"""Frank-Wolfe on the SSVM dual: block-coordinate (`BCFW`, with gap sampling, pairwise / away steps, a cache of
atoms and exact mini-batches) and batch (`FrankWolfe`); the mini-batch step's box QP (`box_qp`, its compiled
twin `box_qp_numba`), its atom store (`atoms`) and its device sampler (`device_sampling`)."""

from .batch import FrankWolfe
from .bcfw import BCFW

__all__ = ["BCFW", "FrankWolfe"]
