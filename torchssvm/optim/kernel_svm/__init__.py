"""The kernel SSVM: `KernelCuttingPlane` (binary, multiclass; 1-slack cuts, exact or sampled) over Mercer kernels
(`mercer`)."""

from .kernel_cutting_plane import KernelCuttingPlane
from .mercer import MercerKernel

__all__ = ["KernelCuttingPlane", "MercerKernel"]
