"""Block-coordinate Frank-Wolfe on a sharded dual problem (docs/distributed.md).

Every rank draws the same global blocks (the single-process sampler and generator, on the replicated block gaps);
the ranks that hold them compute them (`BCFW._update`, unchanged, on their local indices); the step sizes of the
exact mini-batch step (Lacoste-Julien et al., 2013, for one block; docs/design.md, "The exact mini-batch step", for
B) are solved from the blocks of every rank, and ``v`` moves identically on every rank.
"""

from __future__ import annotations

import numbers
from datetime import timedelta
from typing import Optional, Union

import torch

from ..optim.frank_wolfe.bcfw import BCFW, SAMPLINGS, STEPS
from ..optim.frank_wolfe.box_qp import METHODS as QP_METHODS
from ..optim.frank_wolfe.box_qp import box_qp
from .dual_solver import ShardedSolver, as_sharded


class DistributedBCFW(ShardedSolver, BCFW):
    """``DistributedBCFW(model, shard, lam, ..., process_group=None)``: `BCFW` on the rank's shard of the examples.

    Args:
        model, dataset: the rank's `LinearChainModel` and its shard of the training set (`shard_dataset`), or the
            rank's `DualProblem` (``dataset`` None), or a `ShardedProblem`.
        process_group: the ranks (default: the world group; torch.distributed must be initialized).
        timeout: seconds each collective may wait (`Collectives`); None: the process group's timeout.
        lam, sampling, step, cache_size, cache_factor, cache_nu, gap_check_every, batch_size, qp_method,
            qp_max_iter, box, seed, writer, structure, backend, rescaling: as `BCFW`, the same on every rank
            (checked when built). ``host_free`` and ``cuda_graph`` must stay off (not on shards yet).

    With the same seed and ``batch_size`` the iterates are those of `BCFW` on the whole data set: bitwise when each
    drawn batch lies on one rank (always for ``batch_size=1``), on dense chains, whose update of ``v`` is the
    product of the exchanged rows, and on chains of sparse attributes, whose batches travel as their attributes and
    directions (never ``d`` floats per block) from which every rank rebuilds the Gram matrix and the update with the
    problem's own methods; to rounding on other problems (docs/distributed.md). Reports, ``w`` and the
    counters are the same on every rank; ``z``, ``ell`` and the atoms are this rank's blocks. Give a ``writer``
    on one rank only.
    """

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, process_group=None,
                 timeout: Union[float, timedelta, None] = None, sampling: str = "uniform", step: str = "fw",
                 cache_size: int = 0, cache_factor: float = 0.25, cache_nu: float = 0.01, gap_check_every: int = 10,
                 batch_size: int = 1, qp_method: str = "newton", qp_max_iter: Optional[int] = None, box=None,
                 seed: int = 0, host_free: Optional[bool] = None, cuda_graph: Optional[bool] = None, writer=None,
                 structure=None, backend: str = "auto", rescaling: str = "margin"):
        if host_free or cuda_graph:
            raise ValueError("host_free and cuda_graph are not available on shards yet (docs/distributed.md)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
        sharded = as_sharded(model, dataset, structure, backend, rescaling, process_group, timeout)
        # the local solver's checks of batch_size are against its shard: the global batch is checked below
        super().__init__(sharded.local, None, lam, sampling=sampling, step=step, cache_size=cache_size,
                         cache_factor=cache_factor, cache_nu=cache_nu, gap_check_every=gap_check_every,
                         batch_size=1, qp_method=qp_method, qp_max_iter=qp_max_iter, box=box, seed=seed,
                         host_free=False, cuda_graph=False, writer=writer, backend=backend, rescaling=rescaling)
        if batch_size > sharded.n:
            raise ValueError(f"batch_size must be <= n = {sharded.n}, got {batch_size}")
        sharded.check_same(n=sharded.n, lam=self.lam, seed=self.seed, batch_size=batch_size,
                           sampling=SAMPLINGS.index(sampling), step=STEPS.index(step), cache_size=cache_size,
                           cache_factor=cache_factor, cache_nu=cache_nu, gap_check_every=gap_check_every,
                           qp_method=QP_METHODS.index(qp_method), qp_max_iter=self.qp_max_iter,
                           box=None if self.box is None else float(torch.stack(self.box).nan_to_num().sum()))
        self._attach(sharded)
        self.batch_size = batch_size
        # the single-process sampler's state: its generator after the first-visit order of all n blocks
        self.generator = torch.Generator().manual_seed(self.seed)
        self.first_visit = torch.randperm(self.n, generator=self.generator)
        p = self.problem
        max_loss = sharded.gather(p.max_loss(torch.arange(p.n, device=p.device)).to(torch.float64))
        self.global_gap = float(max_loss.sum()) / self.n
        self._gaps_global = self.block_gaps  # `block_gaps` but while `_local_update` shows this rank's range of it
        self._batch = None  # (the drawn blocks, the positions of this rank's among them, the counters before)
        self._moved = None  # (local blocks, direction, step sizes) of the owner's single-process move

    # -- one step: the owners compute, every rank moves ---------------------------------------------------
    @torch.no_grad()
    def _update(self, host_idx: torch.Tensor, idx: Optional[torch.Tensor] = None) -> None:
        """The step of the global blocks ``host_idx (B,)`` drawn on every rank (`BCFW._sample`): the batch's owner
        takes the single-process step and broadcasts ``v`` when one rank holds it all, else every rank computes its
        blocks and `_exchange` solves the step from all of them."""
        if idx is not None:
            raise RuntimeError("DistributedBCFW has no host-free step")
        sh = self.shard
        owner = sh.owner(host_idx)
        before = (self.oracle_calls, self.cache_hits, self.visits)
        first = int(owner[0])
        # a sparse chain's batch of B > 1 blocks always goes through `_exchange`: every rank, the owner included,
        # builds its Gram matrix from the same tensors, laid out as one process lays them out
        spread = sh.sparse_chain and sh.world_size > 1 and host_idx.shape[0] > 1
        if bool((owner == first).all()) and not spread:
            self._moved = None
            if first == sh.rank:
                self._local_update(sh.local_index(host_idx))
            try:
                self._share_owned(first, host_idx, before)
            finally:
                self._moved = None
            return
        mine = (owner == sh.rank).nonzero().squeeze(1)
        self._batch = (host_idx, mine, before)
        try:
            if mine.numel():
                self._local_update(sh.local_index(host_idx[mine]))
            else:
                self._exchange(None, None, None, None)
        finally:
            self._batch = None

    def _local_update(self, local_idx: torch.Tensor) -> None:
        """`BCFW._update` of this rank's blocks ``local_idx`` (local indices), reading and writing their gaps in the
        global vector through a view of this rank's range."""
        lo = self.shard.offset
        with self._swapped("block_gaps", self._gaps_global[lo: lo + self.shard.n_local]):
            super()._update(local_idx)

    def _counters(self, before, delta) -> None:
        self.oracle_calls, self.cache_hits, self.visits = (b + int(x) for b, x in zip(before, delta))

    def _share_owned(self, src: int, host_idx: torch.Tensor, before) -> None:
        """After the single-process step of rank ``src``, which holds every block of ``host_idx``: one broadcast of
        its ``v``, the batch's block gaps and its counters' increments (``8 (d + B + 3)`` bytes); on a sparse chain
        of what moved ``v`` instead (`_share_owned_sparse`)."""
        if self.shard.sparse_chain:
            return self._share_owned_sparse(src, host_idx, before)
        d, B = self.v.numel(), host_idx.shape[0]
        buf = torch.empty(d + B + 3, dtype=torch.float64, device=self.v.device)
        if src == self.shard.rank:
            buf[:d] = self.v
            buf[d: d + B] = self.block_gaps[host_idx.to(self.block_gaps.device)]
            buf[d + B:] = torch.tensor([a - b for a, b in zip((self.oracle_calls, self.cache_hits, self.visits),
                                                              before)], dtype=torch.float64)
        self.shard.comm.broadcast(buf, src)
        if src != self.shard.rank:
            self.v.copy_(buf[:d])
            self._sync_w()
            self.block_gaps[host_idx.to(self.block_gaps.device)] = buf[d: d + B]
            self._counters(before, buf[d + B:].tolist())

    def _share_owned_sparse(self, src: int, host_idx: torch.Tensor, before) -> None:
        """`_share_owned` on a sparse chain: the owner broadcasts the batch's attributes and directions
        (`ShardedProblem.sparse_pack`), the coefficients ``gamma / (lam n)`` of its move (none when it did not move:
        a zero step), the block gaps and the counters (``8 (sparse_size + 2 B + 4)`` bytes, not ``8 d``); every
        other rank moves ``v`` with the problem's own `ChainProblem.sparse_batch_accumulate`, the owner's bits."""
        sh = self.shard
        if sh.world_size == 1:  # the owner is every rank: nothing to send
            return
        B, dev = host_idx.shape[0], self.v.device
        S = sh.sparse_size(host_idx)
        buf = torch.zeros(S + 2 * B + 4, dtype=torch.float64, device=dev)
        coef, gaps, counts = buf[S: S + B], buf[S + B: S + 2 * B], buf[S + 2 * B:]
        if src == sh.rank:
            if self._moved is not None:
                idx, direction, gamma = self._moved
                sh.sparse_pack(buf[:S], host_idx, torch.arange(B, device=dev), idx, direction)
                coef.copy_(gamma / (self.lam * self.n))
                counts[3] = 1.0
            gaps.copy_(self.block_gaps[host_idx.to(dev)])
            counts[:3] = torch.tensor([a - b for a, b in zip((self.oracle_calls, self.cache_hits, self.visits),
                                                             before)], dtype=torch.float64)
        sh.comm.broadcast(buf, src)
        if src != sh.rank:
            if counts[3] > 0:
                x, u, tail = sh.sparse_unpack(buf[:S], host_idx)
                self.problem.sparse_batch_accumulate(self.v, x, u, tail, coef)
                self._sync_w()
            self.block_gaps[host_idx.to(dev)] = gaps
            self._counters(before, counts[:3].tolist())

    def _step_sizes(self, idx, direction, c, upper, host_free):
        if self._batch is None:  # the whole batch is this rank's: the single-process step
            return super()._step_sizes(idx, direction, c, upper, host_free)
        return self._exchange(idx, direction, c, upper)

    def _move(self, idx, direction, gamma) -> None:
        if self._batch is None:
            self._moved = (idx, direction, gamma)  # what a sparse chain's owner sends (`_share_owned_sparse`)
            super()._move(idx, direction, gamma)
        # else `_exchange` has moved v by every rank's blocks

    def _exchange(self, idx, direction, c, upper) -> torch.Tensor:
        """The step of a batch spread over ranks; returns this rank's step sizes (``(B_r,)``, in its order).

        Every owner writes its blocks' rows ``Phi_b d_b`` (`ShardedProblem.joint_features`: the rows one process
        computes), ``c_b``, ``u_b`` and the block gaps into one buffer of ``B d + 3 B + 3`` floats, zero elsewhere
        (its last three: the counters' increments); one all-reduce (sum, exact: one non-zero term per entry) gives
        every rank the same ``P (B, d)``. Every rank then solves ``min_{0 <= gamma <= u} -c^T gamma + 1/2 gamma^T H
        gamma`` with ``H = P P^T / (lam n^2)`` and applies ``v += P^T gamma / (lam n)``: the products
        `ChainProblem.gram` and `accumulate` make on one process, on the same (contiguous) rows.

        On a chain of sparse attributes the buffer holds instead what determines the rows, ``sparse_size`` floats
        (`ShardedProblem.sparse_pack`: the batch's token attributes, unary directions and tails), and every rank
        builds ``H`` and the update with `ChainProblem.sparse_batch_gram` and `sparse_batch_accumulate` on the
        unpacked batch (`sparse_unpack`), laid out as one process lays it out: the bits of one process."""
        host_idx, mine, before = self._batch
        sh = self.shard
        B, d, dev = host_idx.shape[0], self.v.numel(), self.v.device
        # the blocks' part: dense rows P (B, d), or a sparse chain's attributes and directions (`sparse_pack`)
        D = sh.sparse_size(host_idx) if sh.sparse_chain else B * d
        buf = torch.zeros(D + 3 * B + 3, dtype=torch.float64, device=dev)
        P = buf[:D] if sh.sparse_chain else buf[:D].view(B, d)
        c_all, upper_all, gaps = (buf[D + k * B: D + (k + 1) * B] for k in range(3))
        counts = buf[D + 3 * B:]
        rows = mine.to(dev)
        if idx is not None:
            if sh.sparse_chain:
                sh.sparse_pack(P, host_idx, rows, idx, direction)
            else:
                P[rows] = sh.joint_features(idx, direction, sh.batch_width(host_idx))
            c_all[rows] = c.to(torch.float64)
            upper_all[rows] = upper.to(torch.float64)
            gaps[rows] = self.block_gaps[idx]  # this rank's view (`_local_update`)
        counts.copy_(torch.tensor([a - b for a, b in zip((self.oracle_calls, self.cache_hits, self.visits), before)],
                                  dtype=torch.float64))
        sh.comm.all_reduce(buf)
        self._gaps_global[host_idx.to(dev)] = gaps
        self._counters(before, counts.tolist())
        n, lam = self.n, self.lam
        if sh.sparse_chain:  # the batch's Gram matrix and update by the problem's own methods, as one process
            x, u, tail = sh.sparse_unpack(P, host_idx)
            gram, attribute_rows = self.problem.sparse_batch_gram(x, u, tail)
        else:
            gram = P @ P.T
        curvature = gram / (lam * n * n)
        gamma = box_qp(c_all, curvature, upper_all, method=self.qp_method, max_iter=self.qp_max_iter,
                       unconverged=self._qp_unconverged)
        if sh.sparse_chain:
            self.problem.sparse_batch_accumulate(self.v, x, u, tail, gamma / (lam * n), rows=attribute_rows)
        else:
            self.v.addmv_(P.T, (gamma / (lam * n)).to(torch.float64))
        self._sync_w()
        return gamma[rows.to(gamma.device)]

    # -- reports ---------------------------------------------------------------------------------------------
    def _report(self, exact: bool) -> dict:
        self._check_replicas()
        return super()._report(exact)

    def rescale_lambda(self, lam_new: float):
        raise self._not_yet("rescale_lambda (the regularization path)")
