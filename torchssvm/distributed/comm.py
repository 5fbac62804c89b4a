"""The collectives of the sharded solvers over a torch.distributed process group, with the bytes they pass counted
(docs/distributed.md, "What each step communicates"). No transport of our own: gloo on the CPU, NCCL on CUDA."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Optional, Union

import torch
import torch.distributed as dist


def resolve_group(process_group=None):
    """``process_group`` as the collectives take it: None stands for the world group, and stays None. A solver
    must not hold the world group's object: `torch.distributed.destroy_process_group` would then leave it alive
    until the interpreter's exit, where gloo's teardown can abort the process ("terminate called without an active
    exception"). A ValueError when torch.distributed is not initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("process_group: torch.distributed is not initialized: call "
                         "torch.distributed.init_process_group (e.g. in a script launched by torchrun) first")
    return None if process_group is None or process_group is dist.group.WORLD else process_group


class Collectives:
    """The collectives one rank takes part in, over ``process_group`` (default: the world group).

    ``timeout``: seconds (or a ``timedelta``) each collective may wait for the other ranks before it raises; None
    (default) leaves the process group's own timeout (`init_process_group(timeout=...)`). ``bytes`` counts the bytes
    of the tensors this rank passed to collectives, ``calls`` the collectives and ``seconds`` the time spent in them
    (waiting for the other ranks included)."""

    def __init__(self, process_group=None, *, timeout: Union[float, timedelta, None] = None):
        self.group = resolve_group(process_group)
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError("process_group: this process is not a member of it")
        self.world_size = dist.get_world_size(self.group)
        if timeout is not None and not isinstance(timeout, timedelta):
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
                raise ValueError(f"timeout must be a number of seconds > 0, a timedelta or None, got {timeout!r}")
            timeout = timedelta(seconds=float(timeout))
        self.timeout: Optional[timedelta] = timeout
        self.bytes = 0
        self.calls = 0
        self.seconds = 0.0

    def _count(self, *tensors: torch.Tensor) -> None:
        self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        self.calls += 1

    def _wait(self, work, t0: float) -> None:
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(self.timeout)
        finally:
            self.seconds += time.perf_counter() - t0

    def global_rank(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``tensor`` reduced over the ranks in place (``op``: ``"sum"`` or ``"max"``), returned."""
        if self.world_size == 1:  # every collective of a group of one is the identity: nothing sent
            return tensor
        self._count(tensor)
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        t0 = time.perf_counter()
        self._wait(dist.all_reduce(tensor, op=reduce_op, group=self.group, async_op=True), t0)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """``tensor`` of rank ``src`` (a rank of the group) on every rank, in place, returned."""
        if self.world_size == 1:
            return tensor
        self._count(tensor)
        t0 = time.perf_counter()
        self._wait(dist.broadcast(tensor, src=self.global_rank(src), group=self.group, async_op=True), t0)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``(world_size, *tensor.shape)``: every rank's ``tensor`` (of one shape on all ranks), in rank order."""
        if self.world_size == 1:
            return tensor.unsqueeze(0).clone()
        self._count(tensor)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        t0 = time.perf_counter()
        self._wait(dist.all_gather(parts, tensor.contiguous(), group=self.group, async_op=True), t0)
        return torch.stack(parts)

    def all_gather_object(self, obj) -> list:
        """Every rank's picklable ``obj``, in rank order (small objects: fingerprints, counters; not counted)."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        """Wait until every rank reaches this point."""
        if self.world_size == 1:
            return
        t0 = time.perf_counter()
        self._wait(dist.barrier(group=self.group, async_op=True), t0)

    def all_gather_cat(self, tensor: torch.Tensor, sizes) -> torch.Tensor:
        """Every rank's ``tensor`` ``(sizes[r], ...)`` concatenated in rank order along dim 0 (padded to the largest
        size for the collective)."""
        top = max(sizes)
        padded = tensor
        if tensor.shape[0] < top:
            padded = torch.cat([tensor, tensor.new_zeros((top - tensor.shape[0], *tensor.shape[1:]))])
        parts = self.all_gather(padded)
        return torch.cat([parts[r, :s] for r, s in enumerate(sizes)])
