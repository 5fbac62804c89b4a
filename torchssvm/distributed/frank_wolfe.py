"""Batch Frank-Wolfe on a sharded dual problem (Lacoste-Julien et al., 2013, Alg. 2; Osokin et al., 2016, App. H
Alg. 8; docs/distributed.md): each rank calls the oracle on its blocks, the corner's ``v_s`` is all-reduced and the
block gaps all-gathered, and every rank takes the same line-searched step."""

from __future__ import annotations

from datetime import timedelta
from typing import Union

import torch

from ..optim.frank_wolfe.batch import FrankWolfe
from .dual_solver import ShardedSolver, as_sharded


class DistributedFrankWolfe(ShardedSolver, FrankWolfe):
    """``DistributedFrankWolfe(model, shard, lam, ..., process_group=None)``: `FrankWolfe` on the rank's shard.

    Args:
        model, dataset, process_group, timeout: as `DistributedBCFW`.
        lam, chunk, box, writer, structure, backend, rescaling: as `FrankWolfe` (``lam`` the same on every rank).

    Each `step` is one pass over every rank's blocks; its report (the exact gap of the iterate, as `FrankWolfe`'s)
    and ``w`` are the same on every rank, and equal those of `FrankWolfe` on the whole data set to rounding (the
    sum of ``v_s`` over ranks rounds differently from one process's sum over its chunks)."""

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, process_group=None,
                 timeout: Union[float, timedelta, None] = None, chunk: int = 1024, box=None, writer=None,
                 structure=None, backend: str = "auto", rescaling: str = "margin"):
        sharded = as_sharded(model, dataset, structure, backend, rescaling, process_group, timeout)
        super().__init__(sharded.local, None, lam, chunk=chunk, box=box, writer=writer, backend=backend,
                         rescaling=rescaling)
        sharded.check_same(n=sharded.n, lam=self.lam,
                           box=None if self.box is None else float(torch.stack(self.box).nan_to_num().sum()))
        self._attach(sharded)

    def _reduce(self, v_s, gaps, hinge):
        """After the oracle on this rank's blocks: ``v_s`` summed over the ranks (one all-reduce of ``d`` floats),
        the gaps and hinge terms all-gathered; `FrankWolfe.step`'s line search ``gamma = clip(gap / (lam ||v -
        v_s||^2), 0, 1)`` and move are then the same on every rank."""
        self.shard.comm.all_reduce(v_s)
        both = self.shard.gather(torch.stack([gaps, hinge], 1))
        return v_s, both[:, 0].contiguous(), both[:, 1]

    def _after_step(self) -> None:
        self._check_replicas()
