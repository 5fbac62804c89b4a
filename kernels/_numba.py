"""numba, when installed: the compiled CPU twins (`distance_transform_numba`, `torchssvm.optim.gdmm.gdmm_numba`,
`torchssvm.optim.frank_wolfe.box_qp_numba`).

``numba`` is None when it does not import; the twins' functions are then plain Python and ``available()``
is False, so ``"auto"`` choices keep the torch code.

Threads: a ``parallel=True`` kernel runs on ``min(torch.get_num_threads(), numba.get_num_threads())`` threads, and
no call changes either setting (numba's start used to reset torch's: docs/benchmarks/contention.md).
"""

from __future__ import annotations

import functools
import threading

try:
    import numba
except Exception:  # not installed (or broken)
    numba = None


def available() -> bool:
    return numba is not None


def jit(parallel: bool = False, fastmath=False):
    """``numba.njit`` with an on-disk cache (compiled once per machine), or a no-op without numba; a ``parallel``
    kernel is wrapped by `_Parallel` (its threads follow torch's, the caller's settings are kept). ``fastmath``:
    numba's flags, e.g. ``{"reassoc", "contract"}`` to let LLVM reorder sums and fuse multiply-adds (vectorized
    dot products; results change at rounding level, infinities and NaNs keep their meaning)."""
    if numba is None:
        return lambda fn: fn
    njit = numba.njit(cache=True, nogil=True, parallel=parallel, fastmath=fastmath)
    return (lambda fn: _Parallel(njit(fn))) if parallel else njit


prange = numba.prange if numba is not None else range


_launched = False
_launch_lock = threading.Lock()


def _launch() -> None:
    """Start numba's threading layer once without touching the caller's OpenMP settings.

    numba's ``omp`` layer, at its start (the first parallel call, ``numba.get_num_threads`` or
    ``numba.set_num_threads``), calls ``omp_set_num_threads(NUMBA_NUM_THREADS)`` and ``omp_set_nested(1)``; the
    symbols resolve to the libgomp torch loaded, so torch's intra-op thread count (``torch.get_num_threads()``)
    and the nesting limit of its OpenMP pool were reset to numba's (docs/benchmarks/contention.md). Both are read
    before the start and put back after it."""
    global _launched
    if _launched:
        return
    import torch

    with _launch_lock:
        if _launched:
            return
        from torchssvm._threads import _openmp

        omp = _openmp()  # the OpenMP runtime torch reads, found before numba changes anything
        threads, levels = torch.get_num_threads(), _omp_max_active_levels()
        numba.get_num_threads()  # starts the layer
        if torch.get_num_threads() != threads:
            # back on the calling thread's OpenMP count, which is what numba changed and torch reads;
            # torch.set_num_threads would also record the count for every thread that starts torch's pool later,
            # which `torchssvm._threads.one_thread` (a count of 1 for one step) could not put back if the start
            # happens inside it
            if omp is not None:
                omp[0](threads)
            else:
                torch.set_num_threads(threads)
        if levels is not None and _omp_max_active_levels() != levels:
            _omp("omp_set_max_active_levels")(levels)
        _launched = True


def _omp(name: str):
    """The OpenMP runtime's function ``name`` as the process resolves it (torch's libgomp here), or None."""
    import ctypes

    try:
        return getattr(ctypes.CDLL(None), name)
    except Exception:  # no such symbol, or no process-wide handle (Windows)
        return None


def _omp_max_active_levels():
    get = _omp("omp_get_max_active_levels")
    return None if get is None or _omp("omp_set_max_active_levels") is None else int(get())


def threads() -> int:
    """The threads a parallel loop gets: torch's count, at most numba's own (``numba.set_num_threads``, default
    ``NUMBA_NUM_THREADS``), so that either setting of the user's caps the loops."""
    import torch

    _launch()
    return max(1, min(torch.get_num_threads(), numba.get_num_threads()))


class _Parallel:
    """A ``parallel=True`` kernel (``.dispatcher``) called on `threads` threads: numba's thread count (thread-local)
    is set for the call and put back after it, so the caller's settings, torch's and numba's, stay as they were."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher
        functools.update_wrapper(self, dispatcher.py_func)

    def __call__(self, *args):
        _launch()
        before = numba.get_num_threads()
        n = threads()
        if n == before:
            return self.dispatcher(*args)
        numba.set_num_threads(n)
        try:
            return self.dispatcher(*args)
        finally:
            numba.set_num_threads(before)


def serial_or_parallel(serial, parallel, batch: int, work: int, min_work: int):
    """``parallel`` (a `jit` ``parallel=True`` kernel: on `threads` threads) for a batch of more than one item with
    at least ``min_work`` work, else ``serial``: below that, starting the threads costs more than they save."""
    if batch > 1 and work >= min_work:
        return parallel
    return serial
