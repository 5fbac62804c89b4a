"""The mini-batch BCFW step's kernels: the device sampler's keys, the cache test with the away atoms, the cache
insertion, the host-free step's box QP and the end of the step; the torch, Triton and numba twins and their
dispatchers (`dispatch`)."""

from .dispatch import apply_block_step, box_qp_newton, sampling_keys, select_atoms

__all__ = ["select_atoms", "apply_block_step", "box_qp_newton", "sampling_keys"]
