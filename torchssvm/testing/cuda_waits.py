"""Counting, on a real GPU, the CUDA runtime calls that make the host wait: the check of what `simulated_cuda`
counts on a CPU (docs/benchmarks/host_syncs.md)."""

from __future__ import annotations

import collections
import contextlib
from typing import Iterator

import torch

# Runtime calls that return only when the device has caught up (a blocking ``cudaMemcpy`` included; torch's own
# blocking copies are ``cudaMemcpyAsync`` followed by ``cudaStreamSynchronize``).
WAIT_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def count_waits(names) -> collections.Counter:
    """``Counter`` of the names in ``names`` (profiler event names) that are `WAIT_CALLS`."""
    return collections.Counter(name for name in names if name in WAIT_CALLS)


@contextlib.contextmanager
def count_cuda_waits() -> Iterator[collections.Counter]:
    """Count the waiting runtime calls made inside the block, by name, from a `torch.profiler` trace. Yields a
    ``Counter`` filled when the block exits (after a final ``torch.cuda.synchronize()``, not counted)."""
    from torch.profiler import ProfilerActivity, profile

    counts: collections.Counter = collections.Counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield counts
        torch.cuda.synchronize()
    counts.update(count_waits(e.name for e in prof.events()))
    counts["cudaDeviceSynchronize"] -= 1  # the one above
    counts += collections.Counter()  # drop counts at zero
