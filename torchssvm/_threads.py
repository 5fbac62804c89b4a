"""Small solver steps on one thread, for the calling thread only: no OpenMP fork-join per tiny operation.

A per-example or small mini-batch step (BCFW with ``batch_size`` up to 8, SSG) is made of operations of a few
thousand to a few hundred thousand elements: one word's ``(T, D) @ (D, K)`` unary product, the gather of B words'
features, their joint features, a B x B Gram matrix, numba loops over B words. MKL forks its OpenMP team for
products as small as the first (twice each), and torch's own loops fork one above 32,768 elements: 3,756 fork-joins
in an OCR-small BCFW pass at ``batch_size=1`` on two threads, 313 at ``batch_size=8``, 2,512 in an SSG pass. On an
idle machine that buys at most a few percent; on a busy one libgomp's threads spin at every join while their partner
waits to be scheduled, and the pass took 3.6-66x longer than without busy processes (docs/benchmarks/contention.md).

`one_thread` runs such a step with one thread *for the calling thread only*:

- OpenMP's thread count (``omp_set_num_threads``, which sets the ``nthreads-var`` internal control variable of the
  calling thread's data environment, OpenMP 5.2, chapter 2), the count torch's parallel loops read
  (``at::get_num_threads()`` is ``omp_get_max_threads()`` with torch's OpenMP backend), and with them the numba
  kernels' (`torchssvm.kernels._numba.threads` takes torch's);
- MKL's (``MKL_Set_Num_Threads_Local(int)``, MKL's C function; the lower-case ``mkl_set_num_threads_local``
  exported beside it is the Fortran interface, which takes a pointer).

Both previous values are put back after, also on an exception. ``torch.set_num_threads`` is not used: it also
records the count process-wide, for every thread that starts torch's pool later, so a scope around a step would be
a change of the user's settings that other threads could see. The user's settings (torch's count as read after the
step, MKL's global count, another thread's counts, numba's) are untouched. The OpenMP runtime is the one torch's
loops read (checked once: setting its count must move ``torch.get_num_threads()``; a runtime preloaded in front of
torch's libgomp is found first). Without MKL, or with no OpenMP runtime torch reads, the part that does not apply
does nothing.

What runs inside: the solver's step, and with it the methods of a user's own `DualProblem` subclass (its oracle
sees ``torch.get_num_threads() == 1``); the progress hook and the TensorBoard writer run outside. One thread instead
of a team can change the rounding of a product or a sum (a team splits some sums), so the iterates are those of one
thread; whether a step is small depends only on the batch size, the problem's sizes and the device, so runs stay
reproducible and a resumed run continues bitwise.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Iterator, Optional

import torch

# Steps of at most this many blocks, whose blocks times (weights + block coordinates) are at most SMALL_STEP_WORK,
# run on one thread. On OCR-small (d = 4,082 weights, m = 1,092 block coordinates), two cores, two torch threads, an
# idle machine: passes at 1-8 blocks a step were as fast on one thread within the noise (8 blocks: 1.01x the time on
# two), at 16 blocks 1.09x slower, at 32 1.22x, at 64 1.37x; beside busy processes one thread was 1.9-50x faster
# (docs/benchmarks/contention.md). The work bound keeps large models (d in the tens of thousands and more) and long
# sequences (m grows with T) on their threads: 8 OCR words are 41,392.
SMALL_STEP_BLOCKS = 8
SMALL_STEP_WORK = 2**16

_UNSET = object()
_mkl_functions = _UNSET
_omp_functions = _UNSET


def _symbols(lib, *names):
    """The functions ``names`` of the ctypes library ``lib``, or None where one is missing."""
    try:
        return tuple(getattr(lib, name) for name in names)
    except AttributeError:
        return None


def _torch_extension():
    """torch's own extension as a ctypes library: its symbol lookup goes through the libraries it was loaded with
    (its MKL, its libgomp), or None."""
    try:
        return ctypes.CDLL(torch._C.__file__)
    except OSError:
        return None


def _mkl():
    """``(set_local, get_max)``: MKL's ``MKL_Set_Num_Threads_Local`` and ``MKL_Get_Max_Threads``, or None."""
    global _mkl_functions
    if _mkl_functions is _UNSET:
        lib = _torch_extension() if torch.backends.mkl.is_available() else None
        found = None if lib is None else _symbols(lib, "MKL_Set_Num_Threads_Local", "MKL_Get_Max_Threads")
        if found is not None:
            found[0].argtypes, found[0].restype = [ctypes.c_int], ctypes.c_int
            found[1].argtypes, found[1].restype = [], ctypes.c_int
        _mkl_functions = found
    return _mkl_functions


def _moves_torch(found) -> bool:
    """Whether ``found = (omp_set_num_threads, omp_get_max_threads)`` is the runtime torch's loops read: setting its
    count moves ``torch.get_num_threads()``. Its own count is put back after."""
    before, own = torch.get_num_threads(), int(found[1]())  # torch's lazy start on this thread comes first
    found[0](before + 1)
    try:
        return torch.get_num_threads() == before + 1
    finally:
        found[0](own)


def _openmp():
    """``(set, get)``: ``omp_set_num_threads`` and ``omp_get_max_threads`` of the OpenMP runtime torch's parallel
    loops read, or None where torch's parallel backend is not OpenMP or no runtime found moves torch's count. The
    process's global symbols come first (an OpenMP runtime preloaded in front of torch's libgomp, such as the
    ``libiomp5`` of ``torch.backends.xeon.run_cpu``, is the one torch calls), then torch's extension's own."""
    global _omp_functions
    if _omp_functions is _UNSET:
        _omp_functions = None
        if "parallel backend: OpenMP" in torch.__config__.parallel_info():
            try:
                candidates = [ctypes.CDLL(None)]
            except (OSError, TypeError):  # no process-wide handle (Windows)
                candidates = []
            candidates.append(_torch_extension())
            for lib in candidates:
                found = None if lib is None else _symbols(lib, "omp_set_num_threads", "omp_get_max_threads")
                if found is None:
                    continue
                found[0].argtypes, found[0].restype = [ctypes.c_int], None
                found[1].argtypes, found[1].restype = [], ctypes.c_int
                if _moves_torch(found):
                    _omp_functions = found
                    break
    return _omp_functions


def blas_threads() -> Optional[int]:
    """The threads MKL would use for a product on the calling thread (its thread-local count where set, else the
    global one), or None without MKL."""
    mkl = _mkl()
    return None if mkl is None else int(mkl[1]())


@contextlib.contextmanager
def one_thread(enabled: bool = True) -> Iterator[None]:
    """Torch's parallel loops, numba's kernels and MKL's products on one thread inside, for the calling thread;
    the previous counts back after, also on an exception (an interrupt included: both are set inside the ``try``).
    ``enabled=False``: nothing changes."""
    if not enabled:
        yield
        return
    omp, mkl = _openmp(), _mkl()
    omp_before = mkl_before = None
    try:
        if omp is not None:
            # torch initialises each thread's count lazily, on its first parallel call; done here first, that
            # cannot overwrite the 1 inside the scope
            torch.get_num_threads()
            omp_before = int(omp[1]())
            omp[0](1)
        if mkl is not None:
            mkl_before = mkl[0](1)  # the previous thread-local count, 0 where none was set (0 unsets it again)
        yield
    finally:
        try:
            if mkl_before is not None:
                mkl[0](mkl_before)
        finally:
            if omp_before is not None:
                omp[0](omp_before)


def small_step(batch_size: int, d: int, m: int, device) -> bool:
    """Whether a step of ``batch_size`` blocks of a problem with ``d`` weights and blocks of ``m`` coordinates on
    ``device`` runs on one thread (`one_thread`): at most `SMALL_STEP_BLOCKS` blocks, ``batch_size * (d + m)`` at most
    `SMALL_STEP_WORK`, on the CPU. ``m`` grows with a block's size (a chain's ``T K + K^2 + 2K``), so long sequences
    keep their threads."""
    return (batch_size <= SMALL_STEP_BLOCKS and batch_size * (d + m) <= SMALL_STEP_WORK
            and torch.device(device).type == "cpu")
