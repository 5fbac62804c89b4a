"""Block-coordinate Frank-Wolfe on a sharded dual problem (docs/distributed.md).

Every rank draws the same global blocks (the single-process sampler and generator, on the replicated block gaps);
the ranks that hold them compute them (`BCFW._update`, unchanged, on their local indices); the step sizes of the
exact mini-batch step (Lacoste-Julien et al., 2013, for one block; docs/design.md, "The exact mini-batch step", for
B) are solved from the blocks of every rank, and ``v`` moves identically on every rank.
"""

from __future__ import annotations

import math
import numbers
from datetime import timedelta
from typing import Optional, Union

import torch

from ..optim.frank_wolfe.bcfw import BCFW, HOST_FREE_MIN_BATCH, SAMPLINGS, STEPS
from ..optim.frank_wolfe.box_qp import METHODS as QP_METHODS
from ..optim.frank_wolfe.box_qp import box_qp
from ..optim.problems import ChainProblem, FeatureTableProblem
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
            (checked when built).
        host_free: the step without host reads (`_device_step`: every rank computes a fixed-size batch of
            ``batch_size`` of its blocks, the drawn ones it holds and unchanged fillers; docs/distributed.md).
            Default: as `BCFW` (on a device from B = 512), when every shard holds at least ``batch_size``
            examples (required when True), the problem is a dense chain or an explicit table (refused when True:
            a sparse chain's exchange is sized by the batch's tokens, which the host reads; slack-rescaled and
            tree problems build their rows block by block, with host reads) and, on CUDA, ``timeout`` is None
            (refused when True: NCCL's wait with a timeout blocks the host).
        cuda_graph: not on shards (a ValueError): capturing the step's collectives has not been verified.

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
        if cuda_graph:
            raise ValueError("cuda_graph is not available on shards: capturing the step's collectives (NCCL in a "
                             "CUDA graph) has not been verified (docs/distributed.md)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
        sharded = as_sharded(model, dataset, structure, backend, rescaling, process_group, timeout)
        smallest = min(sharded.sizes)
        # NCCL's wait with a timeout blocks the host until the collective is done (without one, the stream waits)
        blocking = sharded.comm.timeout is not None and sharded.device.type == "cuda"
        # the problems whose batch rows are one product, without host reads (others build them block by block)
        local = sharded.local
        fixed_rows = isinstance(local, FeatureTableProblem) or (isinstance(local, ChainProblem) and not local.sparse)
        if host_free is None:
            host_free = sharded.device.type != "cpu" and batch_size >= HOST_FREE_MIN_BATCH and \
                smallest >= batch_size and fixed_rows and not blocking
        elif host_free and blocking:
            raise ValueError("host_free: on CUDA a collective waited with the solver's timeout= blocks the host at "
                             "every step; give the process group's timeout instead (init_process_group(timeout=...), "
                             "which NCCL's watchdog enforces)")
        elif host_free and sharded.sparse_chain:
            raise ValueError("host_free: a chain of sparse attributes exchanges its batch's tokens, whose number the "
                             "host reads at each step; use host_free=False")
        elif host_free and not fixed_rows:
            raise ValueError(f"host_free: the batch rows of a {type(local).__name__} (slack rescaling, trees) are "
                             "built one block at a time, with host reads; on shards the host-free step takes dense "
                             "chains and explicit tables: use host_free=False")
        elif host_free and smallest < batch_size:
            raise ValueError(f"host_free needs every shard to hold at least batch_size = {batch_size} examples (each "
                             f"rank computes a batch of that size); the smallest holds {smallest}")
        # the local solver's checks of batch_size are against its shard: the global batch is checked below
        super().__init__(sharded.local, None, lam, sampling=sampling, step=step, cache_size=cache_size,
                         cache_factor=cache_factor, cache_nu=cache_nu, gap_check_every=gap_check_every,
                         batch_size=1, qp_method=qp_method, qp_max_iter=qp_max_iter, box=box, seed=seed,
                         host_free=bool(host_free), cuda_graph=False, writer=writer, backend=backend,
                         rescaling=rescaling)
        if batch_size > sharded.n:
            raise ValueError(f"batch_size must be <= n = {sharded.n}, got {batch_size}")
        sharded.check_same(n=sharded.n, lam=self.lam, seed=self.seed, batch_size=batch_size,
                           host_free=self.host_free,
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
        if self.host_free:  # the device sampler's first tier, of all n blocks
            self._first_rank = self._first_visit_ranks().to(p.device)
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
        if idx is not None:  # the host-free step is `_device_step`'s
            raise RuntimeError("DistributedBCFW: the host-free step goes through _device_step")
        B = host_idx.shape[0]
        unread = self._visits_unread
        self._step_of(host_idx)
        if self._misses is not None and self.cache_size > 0:
            # on a device the cache's misses are counted there (on each rank, for its blocks: summed at the report,
            # `_count_misses`); the visits they are of are the whole batch, on every rank
            self._visits_unread = unread + B

    def _step_of(self, host_idx: torch.Tensor) -> None:
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

    # -- the host-free step: fixed shapes, no host read --------------------------------------------------------
    @torch.no_grad()
    def _device_step(self, B: int, draw) -> None:
        """The host-free step of ``B`` blocks (`BCFW._host_free_step` keeps the counters, the same on every rank).

        Every rank draws the same ``B`` global blocks on the device (`BCFW._sample_device_at` on the replicated
        gaps). Which of them a rank holds is known on the device only, so each rank runs `BCFW._update` on ``B`` of
        its own blocks in the batch's order: position b is the drawn block when the rank holds it (``live``), else
        a filler, a distinct local block that was not drawn (from its first ``min(n_r, 2 B)`` blocks; every shard
        holds at least ``B``). A filler's state (``z``, ``l``, its atoms, its block gap) is restored after the step,
        its step size is 0, its row is not sent, and its block gap is set to ``inf`` during the step so that it
        misses the cache, whose miss counter then drops the fillers' count; so the step is the single-process one
        on the drawn blocks. `_free_exchange` solves it from every rank's live rows."""
        sh, p = self.shard, self.problem
        drawn = self._sample_device_at(B, draw)
        if sh.world_size == 1:  # every block is this rank's: one process's step, nothing to send
            BCFW._update(self, None, p.static_block_index(drawn))
            self._moved = None  # (what `_move` keeps for a sparse chain's broadcast: none here)
            return
        lo, n_r = sh.offset, sh.n_local
        live = (drawn >= lo) & (drawn < lo + n_r)
        local = torch.where(live, drawn - lo, 0)
        window = min(n_r, 2 * B)
        inside = live & (local < window)
        taken = torch.zeros(window, dtype=torch.long, device=drawn.device)
        taken.index_put_((torch.where(inside, local, 0),), inside.long(), accumulate=True)
        free = torch.argsort(taken, stable=True)  # the window's undrawn blocks first, in order
        filler = free[(torch.cumsum((~live).long(), 0) - 1).clamp_min(0)]
        idx = p.static_block_index(torch.where(live, local, filler))
        gaps = self._gaps_global[lo: lo + n_r]
        saved = {"z": self.z[idx], "ell": self.ell[idx], "gaps": gaps[idx]}  # copies (advanced indexing)
        store = self.atoms
        if store is not None:
            saved.update({k: getattr(store, k)[idx] for k in ("labels", "loss", "alpha", "count", "alpha_valid")})
        gaps[idx] = torch.where(live, saved["gaps"], math.inf)
        self._batch = ("free", drawn, live)
        try:
            with self._swapped("block_gaps", gaps):
                BCFW._update(self, None, idx)
        finally:
            self._batch = None
        if self._misses is not None and store is not None and self.cache_size > 0:
            self._misses -= (~live).sum()

        def restore(t, old):
            mask = live.view(-1, *([1] * (old.dim() - 1)))
            t[idx] = torch.where(mask, t[idx], old)

        restore(self.z, saved["z"])
        restore(self.ell, saved["ell"])
        restore(gaps, saved["gaps"])
        if store is not None:
            for k in ("labels", "loss", "alpha", "count", "alpha_valid"):
                restore(getattr(store, k), saved[k])

    def _free_exchange(self, idx, direction, c, upper) -> torch.Tensor:
        """`_exchange` of the host-free step: every rank computes all ``B`` positions and keeps its live ones
        (`_device_step`): `ShardedProblem.exchange` with a mask, one all-reduce of ``B d + 3 B`` floats (a fixed
        size); then the single-process host-free step on the batch: a dense chain's rows padded to the data set's
        longest sentence (`ChainProblem.static_block_index`), ``H = P P^T / (lam n^2)``, `box_qp` without host
        reads, ``v += P^T gamma / (lam n)``. Returns this rank's step sizes, 0 at its fillers."""
        _, drawn, live = self._batch
        sh = self.shard
        B, d = drawn.shape[0], self.v.numel()
        n, lam = self.n, self.lam
        if B == 1:  # one process's B = 1 step (`sqnorm`, `accumulate`): the owner's, whose v travels
            gamma = torch.where(live, BCFW._step_sizes(self, idx, direction, c, upper, True), 0.0)
            moved = self.v.clone()
            self.problem.accumulate(moved, idx, direction, gamma / (lam * n))
            buf = torch.cat([torch.where(live, moved, 0.0), torch.where(live, self.block_gaps[idx], 0.0)])
            sh.comm.all_reduce(buf)
            self.v.copy_(buf[:d])
            self._gaps_global[drawn] = buf[d:]
            self._sync_w()
            return gamma
        # the block gaps: this rank's view (`_device_step`)
        columns = torch.stack([c.to(torch.float64), upper.to(torch.float64), self.block_gaps[idx]], 1)
        batch, (c_all, upper_all, gaps), _ = sh.exchange(drawn, live, idx, direction, columns, 3,
                                                         width=sh.static_width())
        self._gaps_global[drawn] = gaps
        gamma = box_qp(c_all, batch.gram() / (lam * n * n), upper_all, method=self.qp_method,
                       max_iter=self.qp_max_iter, sync_free=True, unconverged=self._qp_unconverged,
                       backend=self.backend)
        batch.accumulate(self.v, gamma / (lam * n))
        self._sync_w()
        return torch.where(live, gamma, 0.0)

    def _sum_misses(self) -> None:
        """On a device each rank counts its own blocks' cache misses (`BCFW._misses`, read with the report): sum
        them over the ranks in place, on the device (one all-reduce of one integer), before the counters read them,
        so that every rank's counters are the same."""
        self.shard.comm.all_reduce(self._misses)

    def _extra_state(self) -> dict:
        if self._misses is not None and self._visits_unread:  # as `BCFW._extra_state` reads them (the same on
            self._sum_misses()                                  # every rank: the visits are the batches')
        return super()._extra_state()

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
        if isinstance(self._batch[0], str):  # ("free", drawn, live): the host-free step
            return self._free_exchange(idx, direction, c, upper)
        return self._exchange(idx, direction, c, upper)

    def _move(self, idx, direction, gamma) -> None:
        if self._batch is None:
            self._moved = (idx, direction, gamma)  # what a sparse chain's owner sends (`_share_owned_sparse`)
            super()._move(idx, direction, gamma)
        # else `_exchange` has moved v by every rank's blocks

    def _exchange(self, idx, direction, c, upper) -> torch.Tensor:
        """The step of a batch spread over ranks; returns this rank's step sizes (``(B_r,)``, in its order).

        One `ShardedProblem.exchange` (an all-reduce of ``B d + 3 B + 3`` floats on a dense chain, of
        ``sparse_size + 3 B + 3`` on a sparse one) gives every rank the batch's blocks, their ``c_b``, ``u_b`` and
        block gaps, and the counters' increments. Every rank then solves ``min_{0 <= gamma <= u} -c^T gamma + 1/2
        gamma^T H gamma`` with ``H = G / (lam n^2)``, ``G`` the batch's Gram matrix, and applies ``v += sum_b gamma_b
        Phi_b d_b / (lam n)``: the products one process makes (`ExchangedBatch`), so its bits."""
        host_idx, mine, before = self._batch
        sh = self.shard
        n, lam = self.n, self.lam
        rows = mine.to(self.v.device)
        columns = None if idx is None else torch.stack([c.to(torch.float64), upper.to(torch.float64),
                                                        self.block_gaps[idx]], 1)  # gaps: this rank's view
        counts = torch.tensor([a - b for a, b in zip((self.oracle_calls, self.cache_hits, self.visits), before)],
                              dtype=torch.float64, device=self.v.device)
        batch, (c_all, upper_all, gaps), counts = sh.exchange(host_idx, rows, idx, direction, columns, 3, counts)
        self._gaps_global[host_idx.to(gaps.device)] = gaps
        self._counters(before, counts.tolist())
        gamma = box_qp(c_all, batch.gram() / (lam * n * n), upper_all, method=self.qp_method,
                       max_iter=self.qp_max_iter, unconverged=self._qp_unconverged)
        batch.accumulate(self.v, gamma / (lam * n))
        self._sync_w()
        return gamma[rows.to(gamma.device)]

    # -- reports ---------------------------------------------------------------------------------------------
    def _report(self, exact: bool) -> dict:
        self._check_replicas()
        if self._misses is not None:
            self._sum_misses()
        return super()._report(exact)

    @torch.no_grad()
    def rescale_lambda(self, lam_new: float) -> torch.Tensor:
        """`BCFW.rescale_lambda` on shards (Osokin et al., 2016, Prop. 1): every rank rescales its blocks and atoms,
        and the block gaps and the global gap move by ``(1 - rho) delta`` with ``delta (n,)`` all-gathered in global
        order (returned, the same on every rank); a collective, with the same ``lam_new`` on every rank (checked)."""
        sh = self.shard
        sh.check_same(lam_new=float(lam_new))
        lam_old, gap_old = self.lam, self.global_gap
        # the base moves this rank's gaps and the global gap by its blocks' delta: both are redone over every rank
        with self._swapped("block_gaps", torch.zeros(sh.n_local, dtype=torch.float64, device=self.problem.device)):
            delta = sh.gather(super().rescale_lambda(lam_new))
        rho = self.lam / lam_old
        self.block_gaps.add_((1 - rho) * delta)
        self.global_gap = gap_old + (1 - rho) * float(delta.sum())
        return delta

    def _block_inner(self) -> torch.Tensor:
        """``<theta_i(w), z_i>`` of this rank's blocks ``(n_r,)``."""
        with self._swapped("n", self.shard.n_local):
            return super()._block_inner()
