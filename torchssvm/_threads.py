"""Small work on one thread: the solvers' inner steps on the CPU (docs/design.md, "Threads").

A mini-batch step of a few blocks is a few dozen small operations, and with more than one thread each matrix product
and each parallel loop among them opens an OpenMP region (a fork and a join). On an idle machine the regions save
nothing at that size; on a busy one each can cost a scheduler time slice, because libgomp's threads spin while they
wait, and a BCFW pass ran 10-70x slower at 2 threads than at 1 (docs/benchmarks/contention.md). `one_thread_for`
runs such a step on one thread and puts the caller's count back after it, as scikit-learn limits the BLAS pool
inside its own loops (threadpoolctl): every call returns with the user's setting, and every callback sees it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

# The step's size (elements) from which its products gain from more threads on an idle machine: measured on
# OCR-small (m + d = 5,174 per block), where a BCFW step of B <= 64 blocks ran as fast on one thread as on two
# and B = 128 ran 1.6x faster on two (docs/benchmarks/contention.md).
SMALL_WORK = 1 << 19


@contextmanager
def one_thread_for(work: int, device) -> Iterator[None]:
    """Run the ``with`` block on one torch thread (and so the library's numba loops, `kernels._numba.threads`)
    when ``work``, the step's size in elements (``B (m + d)`` for B blocks of size m and d parameters), is below
    `SMALL_WORK` on the CPU; else, or on a device, on the caller's threads. The caller's count is put back after."""
    threads = torch.get_num_threads()
    if threads == 1 or work >= SMALL_WORK or torch.device(device).type != "cpu":
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
