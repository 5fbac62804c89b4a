"""The mini-batch BCFW step"s bookkeeping: the cache test with the away atoms, the cache insertion and the end of the
step; the torch, Triton and numba twins and their dispatchers (`dispatch`)."""

from .dispatch import apply_block_step, select_atoms

__all__ = ["select_atoms", "apply_block_step"]
