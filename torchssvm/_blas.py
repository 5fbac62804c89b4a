"""One BLAS thread for the calling thread around steps made of tiny matrix products.

A per-example step (BCFW with ``batch_size=1``, the paper's algorithm; SSG) multiplies one example's features by
the weights, ``(T, D) @ (D, K)`` with T a few tokens: a few thousand multiply-adds. MKL, torch's BLAS on x86, still
forks its OpenMP team for each such product, twice, and joins it: 3,756 fork-joins in one OCR-small BCFW pass at
``batch_size=1`` on two threads, 2,512 in an SSG pass. On an idle machine that costs a little (the pass is no faster
than on one thread); on a busy one libgomp's threads spin at every join while their partner waits to be scheduled,
and the pass took 3.6-66x longer than without busy processes (docs/benchmarks/contention.md).

`sequential_blas` sets MKL's thread count *for the calling thread only* to 1 (MKL's C function
``MKL_Set_Num_Threads_Local(int)``; the lower-case ``mkl_set_num_threads_local`` exported beside it is the Fortran
interface, which takes a pointer) and puts the previous value back after: the user's settings (torch's and OpenMP's
counts, MKL's global count, another thread's) are untouched, and torch's own parallel loops keep their threads.
The steps `small_step` selects then run their products without a fork: 0 fork-joins per BCFW pass at
``batch_size=1`` to 4 on OCR-small, none in an SSG pass but for its primal evaluation after it. Without MKL
(another BLAS, or none found) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Iterator, Optional

import torch

# Steps of at most this many blocks, whose weights times blocks is at most SMALL_STEP_WORK, run their products on one
# BLAS thread: a step's products are then about T * SMALL_STEP_WORK multiply-adds or fewer (a million for words of
# T = 14 letters), a fraction of a millisecond on one core. Measured on OCR-small (d = 4,082), two cores, two torch
# threads: at 1, 2 and 4 blocks one thread was as fast within the noise on an idle machine and 1.9-50x faster beside
# busy processes; from 16 blocks the Gram matrix and the unary products gain from two threads on an idle machine
# (docs/benchmarks/contention.md). The work bound keeps large models (d in the millions) on MKL's team.
SMALL_STEP_BLOCKS = 4
SMALL_STEP_WORK = 2**16

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
    try:
        # torch's own extension, already loaded: its symbol lookup goes through the libraries it was loaded with, so
        # this is the MKL torch calls (opening libtorch_cpu by a path could load a second copy with its own state)
        lib = ctypes.CDLL(torch._C.__file__)
        # the C interface, by value (not the Fortran ``mkl_set_num_threads_local``, by reference)
        set_local, get_max = lib.MKL_Set_Num_Threads_Local, lib.MKL_Get_Max_Threads
    except (OSError, AttributeError):
        return None
    set_local.argtypes, set_local.restype = [ctypes.c_int], ctypes.c_int
    get_max.argtypes, get_max.restype = [], ctypes.c_int
    _functions = (set_local, get_max)
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


def small_step(batch_size: int, d: int, device) -> bool:
    """Whether a step of ``batch_size`` blocks of a problem with ``d`` weights on ``device`` runs its products on one
    BLAS thread: at most `SMALL_STEP_BLOCKS` blocks, ``batch_size * d`` at most `SMALL_STEP_WORK`, on the CPU."""
    return (batch_size <= SMALL_STEP_BLOCKS and batch_size * d <= SMALL_STEP_WORK
            and torch.device(device).type == "cpu")
