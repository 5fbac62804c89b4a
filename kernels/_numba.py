"""numba, when installed: the compiled CPU twins (`distance_transform_numba`, `torchssvm.optim.gdmm.gdmm_numba`,
`torchssvm.optim.frank_wolfe.box_qp_numba`).

``numba`` is None when it does not import; the twins' functions are then plain Python and ``available()``
is False, so ``"auto"`` choices keep the torch code.
"""

from __future__ import annotations

try:
    import numba
except Exception:  # not installed (or broken)
    numba = None


def available() -> bool:
    return numba is not None


def jit(parallel: bool = False, fastmath=False):
    """``numba.njit`` with an on-disk cache (compiled once per machine), or a no-op without numba. ``fastmath``:
    numba's flags, e.g. ``{"reassoc", "contract"}`` to let LLVM reorder sums and fuse multiply-adds (vectorized
    dot products; results change at rounding level, infinities and NaNs keep their meaning)."""
    if numba is None:
        return lambda fn: fn
    return numba.njit(cache=True, nogil=True, parallel=parallel, fastmath=fastmath)


prange = numba.prange if numba is not None else range


def set_threads() -> None:
    """Let the parallel loops use as many threads as torch does (at most numba's own limit)."""
    import torch

    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def serial_or_parallel(serial, parallel, batch: int, work: int, min_work: int):
    """``parallel`` (its threads set by `set_threads`) for a batch of more than one item with at least ``min_work``
    work, else ``serial``: below that, starting the threads costs more than they save."""
    if batch > 1 and work >= min_work:
        set_threads()
        return parallel
    return serial
