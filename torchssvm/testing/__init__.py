"""Tools for testing code that targets a GPU on a machine without one."""

from .simulated_cuda import SimulatedCuda, SimulatedCudaTensor, simulated_cuda

__all__ = ["SimulatedCuda", "SimulatedCudaTensor", "simulated_cuda"]
