"""Tools for testing code that targets a GPU on a machine without one, and for checking them on one."""

from .cuda_waits import count_cuda_waits
from .simulated_cuda import SimulatedCuda, SimulatedCudaTensor, simulated_cuda

__all__ = ["SimulatedCuda", "SimulatedCudaTensor", "count_cuda_waits", "simulated_cuda"]
