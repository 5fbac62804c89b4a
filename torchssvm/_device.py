"""Moving small host tensors to a device without making the host wait for it (docs/benchmarks/host_syncs.md)."""

from __future__ import annotations

import torch


def host_to_device(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` (on the host) on ``device``, queued behind the device's work rather than waiting for it.

    A plain ``t.to("cuda")`` copies from pageable memory, which CUDA does synchronously: the host first waits
    for everything queued on the stream. A copy from pinned (page-locked) memory with ``non_blocking=True`` is
    queued like a kernel; the pinned buffer is kept alive by torch's host allocator until the copy is done.
    """
    device = torch.device(device)
    if device.type == t.device.type:
        return t.to(device)
    if device.type == "cuda" and torch.backends.cuda.is_built():
        if torch.cuda.is_current_stream_capturing():
            # a graph would replay the copy from a pinned buffer that the host allocator has since reused
            raise RuntimeError("host_to_device inside a CUDA graph capture: pass the values as a device tensor")
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
