"""The n-slack cutting plane on a sharded dual problem (docs/distributed.md).

Each rank separates its own examples and holds their working sets; the working-set QP makes the moves of one
process: every rank draws the same block order (the replicated generator), the owners of a mini-batch's blocks
compute their moves (`NSlackCuttingPlane._qp_moves`, unchanged, on their local indices), and the step lengths are
solved from the rows of every rank as `DistributedBCFW` solves a spread mini-batch. The separation pass's hinge
terms and block gaps, and the QP's Frank-Wolfe gap, are all-gathered per block and summed in one process's order.
"""

from __future__ import annotations

import numbers
from datetime import timedelta
from typing import Callable, Union

import torch

from ..optim.cutting_planes.n_slack import QP_STEPS, NSlackCuttingPlane
from ..optim.frank_wolfe.box_qp import box_qp
from .dual_solver import ShardedSolver, as_sharded


class DistributedNSlackCuttingPlane(ShardedSolver, NSlackCuttingPlane):
    """``DistributedNSlackCuttingPlane(model, shard, lam, ..., process_group=None)``: `NSlackCuttingPlane` on the
    rank's shard of the examples.

    Args:
        model, dataset, process_group, timeout: as `DistributedBCFW`.
        lam, separation, eps, inactive_after, qp_max_iter, qp_tol, qp_step, qp_batch, qp_inner, chunk, seed, writer,
            structure, backend, rescaling: as `NSlackCuttingPlane`, the same on every rank (checked when built; a
            callable ``separation`` is called on this rank's problem and local indices).

    Each `step` separates this rank's examples (their cuts go to their working sets), then solves the working-set
    QP with the single-process block order and step lengths. Within a pass ``w`` moves as one process's: bitwise on
    dense chains (a mini-batch on one rank is its single-process step, a spread one the products of the same rows).
    Each pass ends by recomputing ``v`` from every working set (`NSlackCuttingPlane._sync_duals`), a sum over every
    example, which is summed per rank and all-reduced: from there ``w`` equals one process's to rounding (1e-12
    relative), and the reports, the exact gap and the working sets' sizes follow it. Reports and ``w`` are the same
    on every rank; ``z``, ``ell`` and the working sets are this rank's blocks.
    """

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, process_group=None,
                 timeout: Union[float, timedelta, None] = None, separation: Union[str, Callable] = "exact",
                 eps: float = 1e-3, inactive_after: int = 50, qp_max_iter: int = 200, qp_tol: float = 0.1,
                 qp_step: str = "pairwise", qp_batch: int = 64, qp_inner: int = 100, chunk: int = 1024, seed: int = 0,
                 writer=None, structure=None, backend: str = "auto", rescaling: str = "margin"):
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
        sharded = as_sharded(model, dataset, structure, backend, rescaling, process_group, timeout)
        super().__init__(sharded.local, None, lam, separation=separation, eps=eps, inactive_after=inactive_after,
                         qp_max_iter=qp_max_iter, qp_tol=qp_tol, qp_step=qp_step, qp_batch=qp_batch,
                         qp_inner=qp_inner, chunk=chunk, seed=seed, writer=writer, backend=backend,
                         rescaling=rescaling)
        sharded.check_same(n=sharded.n, lam=self.lam, seed=seed, eps=self.eps, inactive_after=inactive_after,
                           qp_max_iter=qp_max_iter, qp_tol=qp_tol, qp_step=QP_STEPS.index(qp_step),
                           qp_batch=qp_batch, qp_inner=qp_inner, chunk=chunk,
                           separation=0 if separation == "exact" else 1)
        self._attach(sharded)

    def _sum(self, *values: float) -> list:
        """``values`` summed over the ranks (one all-reduce)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.problem.device)
        return self.shard.comm.all_reduce(t).tolist()

    # -- the separation pass -------------------------------------------------------------------------------
    def _separate(self):
        """This rank's separation (its cuts stay pending here), then the hinge terms and block gaps ``(n,)`` in
        global order (one all-gather: the vectors one process sums) and the number of cuts found (one all-reduce)."""
        hinge, gaps, pending, added, t_sep = super()._separate()
        both = self.shard.gather(torch.stack([gaps, hinge], 1))
        (added,) = self._sum(added)
        return both[:, 1].contiguous(), both[:, 0].contiguous(), pending, int(added), t_sep

    def _add_cuts(self, pending) -> None:
        """Add this rank's cuts, then widen every rank's working sets to the most slots of any rank: one process's
        slot count (a block's slots, hence every reduction over them, are then those of one process)."""
        super()._add_cuts(pending)
        C = self.used.shape[1]
        widest = int(self.shard.comm.all_reduce(torch.tensor([float(C)], dtype=torch.float64,
                                                             device=self.problem.device), op="max"))
        if widest > C:
            self._widen(widest - C)

    def _pass_totals(self, removed: int):
        """The cuts removed and held over every rank (one all-reduce), after the replica check, which also gives
        every rank the largest clock of any (`ShardedSolver._check_replicas`)."""
        self.seconds, self.separation_seconds = self.shard.check_replicated(
            "v", self.v, maxima=(self.seconds, self.separation_seconds))
        removed, held = super()._pass_totals(removed)
        removed, held = self._sum(removed, held)
        return int(removed), held

    # -- the working-set QP ----------------------------------------------------------------------------------
    def _qp_gap(self) -> float:
        """The QP's Frank-Wolfe gap: every rank's per-block gaps all-gathered, then summed in one process's chunks."""
        p = self.problem
        local = torch.cat([self._qp_block_gaps(idx) for idx in p.chunks(self.chunk)])
        gaps, total = self.shard.gather(local), 0.0
        for s in range(0, self.n, self.chunk):
            total += float(gaps[s: s + self.chunk].sum())
        return total / self.n

    @torch.no_grad()
    def _qp_batch_step(self, host_idx: torch.Tensor) -> None:
        """The coordinated step of the global blocks ``host_idx``: a mini-batch held by one rank is its single-process
        step, then ``v`` is broadcast (``d`` floats); a spread one goes through `ShardedProblem.exchange`, as a
        spread BCFW mini-batch does (one all-reduce of every move and gain: ``B (d + 1)`` floats of rows on a dense
        chain, the moves' attributes and directions on a sparse one), and every rank solves the same box QP and
        moves ``v`` by the same products."""
        sh, p = self.shard, self.problem
        owner = sh.owner(host_idx)
        first = int(owner[0])
        # a sparse chain's batch always goes through the exchange: every rank, the owner included, builds its Gram
        # matrix and update from the same tensors, laid out as one process lays them out (as `DistributedBCFW`)
        spread = sh.sparse_chain and sh.world_size > 1
        if bool((owner == first).all()) and not spread:
            if first == sh.rank:
                super()._qp_batch_step(sh.local_index(host_idx).to(p.device))
            sh.comm.broadcast(self.v, first)
            if first != sh.rank:
                self._sync_w()
            return
        n, lam, dev = self.n, self.lam, self.v.device
        mine = (owner == sh.rank).nonzero().squeeze(1).to(dev)
        local = moves = None
        if mine.numel():
            local = sh.local_index(host_idx[mine.cpu()]).to(p.device)
            used, move, gain, dz = moves = self._qp_moves(local)
        batch, (gain_all,), _ = sh.exchange(host_idx, mine, local, None if moves is None else dz,
                                           None if moves is None else gain.unsqueeze(1), 1)
        if not bool((gain_all > 0).any()):
            return
        gamma = box_qp(gain_all.clamp_min(0), batch.gram() / (lam * n * n), torch.ones_like(gain_all))
        if moves is not None:
            g = gamma[mine].unsqueeze(1)
            self.alpha[local] = (self.alpha[local] + g * move).clamp_min(0) * used
        batch.accumulate(self.v, gamma / (lam * n))
        self._sync_w()

    def _primal_w(self, alpha: torch.Tensor, corners) -> torch.Tensor:
        """``v`` from the working sets of every rank: this rank's sum, all-reduced (one all-reduce of ``d``
        floats; it rounds as the ranks' partial sums do, not as one process's sum over every example)."""
        return self.shard.comm.all_reduce(super()._primal_w(alpha, corners))
