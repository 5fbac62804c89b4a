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


# A marker recorded when the counted block ends: the waits that start after it (the final synchronize below, and
# any the profiler makes itself when it stops) are not the block's.
END_MARKER = "torchssvm::count_cuda_waits_end"


def count_waits(names) -> collections.Counter:
    """``Counter`` of the names in ``names`` (profiler event names) that are `WAIT_CALLS`."""
    return collections.Counter(name for name in names if name in WAIT_CALLS)


def count_waits_before_marker(events) -> collections.Counter:
    """`count_waits` of the profiler ``events`` (with ``name`` and ``time_range.start``) that start before the
    first `END_MARKER` event (all of them without one)."""
    events = list(events)
    ends = [e.time_range.start for e in events if e.name == END_MARKER]
    end = min(ends) if ends else float("inf")
    return count_waits(e.name for e in events if e.time_range.start < end)


@contextlib.contextmanager
def count_cuda_waits() -> Iterator[collections.Counter]:
    """Count the waiting runtime calls made inside the block, by name, from a `torch.profiler` trace. Yields a
    ``Counter`` filled when the block exits (the ``torch.cuda.synchronize()`` that closes the trace, and any wait
    of the profiler's own, come after `END_MARKER` and are not counted)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    counts: collections.Counter = collections.Counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield counts
        with record_function(END_MARKER):
            pass
        torch.cuda.synchronize()
    counts.update(count_waits_before_marker(prof.events()))
