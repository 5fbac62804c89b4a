"""One BLAS thread for the calling thread around steps made of tiny matrix products.

A per-example step (BCFW with ``batch_size=1``, the paper's algorithm; SSG) multiplies one example's features by
the weights, ``(T, D) @ (D, K)`` with T a few tokens: a few thousand multiply-adds. MKL, torch's BLAS on x86, still
forks its OpenMP team for each such product, twice, and joins it: 3,756 fork-joins in one OCR-small BCFW pass at
``batch_size=1`` on two threads, 2,512 in an SSG pass. On an idle machine that costs a little (the pass is no faster
than on one thread); on a busy one libgomp's threads spin at every join while their partner waits to be scheduled,
and the pass took 3-4x longer than on one thread (docs/benchmarks/contention.md).

`sequential_blas` sets MKL's thread count *for the calling thread only* (``mkl_set_num_threads_local``) to 1 and
puts the previous value back after: the user's settings (torch's and OpenMP's counts, MKL's global count, another
thread's) are untouched, and torch's own parallel loops keep their threads. The products of a step of at most
`SMALL_STEP_BLOCKS` blocks then run without a fork: 0 fork-joins per BCFW pass at ``batch_size=1``, 6 per SSG pass.
Without MKL (another BLAS, or none found) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from pathlib import Path
from typing import Iterator, Optional

import torch

# Steps of at most this many blocks run their products on one BLAS thread. Measured on OCR-small, two cores, two
# torch threads: at 1, 2 and 4 blocks a step's products are a few hundred thousand multiply-adds or fewer, and one
# thread was as fast on an idle machine and 1.7-3.4x faster beside a busy process; at 16 the Gram matrix and the
# unary products gain from two threads on an idle machine (docs/benchmarks/contention.md).
SMALL_STEP_BLOCKS = 4

_UNSET = object()
_functions = _UNSET


def _mkl():
    """``(set_local, get_max)``: MKL's C functions ``MKL_Set_Num_Threads_Local`` and ``MKL_Get_Max_Threads`` from the
    MKL linked into torch, or None (no MKL, or its symbols not exported)."""
    global _functions
    if _functions is not _UNSET:
        return _functions
    _functions = None
    if not torch.backends.mkl.is_available():
        return None
    lib_dir = Path(torch.__file__).resolve().parent / "lib"
    names = {"win32": ["torch_cpu.dll"], "darwin": ["libtorch_cpu.dylib"]}.get(sys.platform, ["libtorch_cpu.so"])
    for name in names:
        try:
            lib = ctypes.CDLL(str(lib_dir / name))  # the loaded library itself: one MKL state
            set_local, get_max = lib.MKL_Set_Num_Threads_Local, lib.MKL_Get_Max_Threads
        except (OSError, AttributeError):
            continue
        set_local.argtypes, set_local.restype = [ctypes.c_int], ctypes.c_int
        get_max.argtypes, get_max.restype = [], ctypes.c_int
        _functions = (set_local, get_max)
        break
    return _functions


def blas_threads() -> Optional[int]:
    """The threads MKL would use for a product on the calling thread (its thread-local count where set, else the
    global one), or None without MKL."""
    mkl = _mkl()
    return None if mkl is None else int(mkl[1]())


@contextlib.contextmanager
def sequential_blas(enabled: bool = True) -> Iterator[None]:
    """MKL's products on one thread inside, for the calling thread; the previous thread-local setting (or none)
    back after, also on an exception. ``enabled=False``, or no MKL: nothing changes."""
    mkl = _mkl() if enabled else None
    if mkl is None:
        yield
        return
    previous = mkl[0](1)  # the previous thread-local count, 0 where none was set (0 unsets it again)
    try:
        yield
    finally:
        mkl[0](previous)


def small_step(batch_size: int, device) -> bool:
    """Whether a step of ``batch_size`` blocks on ``device`` runs its products on one BLAS thread."""
    return batch_size <= SMALL_STEP_BLOCKS and torch.device(device).type == "cpu"
