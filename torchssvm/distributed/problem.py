"""A dual problem whose examples are split across the ranks of a process group (docs/distributed.md).

Rank r holds examples ``[offset_r, offset_r + n_r)`` of the n of the whole problem as its own `DualProblem` (its
data, in its own local indices ``0..n_r-1``); ``w`` is replicated. `ShardedProblem` wraps that local problem with
what the solvers need beyond it: the global n, the offsets, which rank holds a global example, and the collectives
(`Collectives`)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Union

import torch

from .._device import host_to_device
from ..data.token_features import TokenFeatures
from ..kernels.step.sampling_torch import splitmix64
from ..optim.problems import ChainProblem, DualProblem, FeatureTableProblem
from .comm import Collectives


class ShardedProblem:
    """``ShardedProblem(problem, process_group=None, *, timeout=None)``: this rank's shard of a dual problem.

    Args:
        problem: the rank's `DualProblem` over its ``n_r >= 1`` examples (e.g. the `ChainProblem` of a
            `LinearChainModel` and this rank's `shard_dataset`).
        process_group: the ranks that hold the shards (default: the world group; torch.distributed must be
            initialized).
        timeout: seconds each collective may wait (`Collectives`); None: the process group's timeout.

    Building it is a collective: every rank of the group builds its own at the same point. The shards' sizes are
    all-gathered once; rank r's examples are the global ``offset_r + j``, ``j < n_r``, in rank order. The ranks'
    problems must have the same ``d`` (a ValueError otherwise).

    Attributes: ``local`` (the rank's `DualProblem`), ``n`` (global), ``n_local``, ``offset``, ``sizes`` (the n_r of
    every rank), ``offsets`` (their running sums, ``W + 1``), ``rank``, ``world_size``, ``comm``.
    """

    def __init__(self, problem: DualProblem, process_group=None, *, timeout: Union[float, timedelta, None] = None):
        if not isinstance(problem, DualProblem):
            raise TypeError(f"problem must be a DualProblem (the rank's shard), got {type(problem).__name__}")
        self.local = problem
        self.comm = Collectives(process_group, timeout=timeout)
        self.rank, self.world_size = self.comm.rank, self.comm.world_size
        chain = isinstance(problem, ChainProblem)
        self.sparse_chain = chain and problem.sparse  # the B > 1 step sends the batch's attributes, not rows
        x = problem.x if self.sparse_chain else None
        mine = [problem.n, problem.d, x.ids.shape[2] if x is not None else 0, x is not None and x.values is not None]
        shape = self.comm.all_gather(torch.tensor(mine, dtype=torch.float64, device=problem.device))
        sizes, ds = shape[:, 0].long().tolist(), shape[:, 1].long().tolist()
        if len(set(ds)) > 1:
            raise ValueError(f"problem: the ranks' problems have different numbers of parameters d = {ds} (rank r "
                             "at index r): every shard must be of one model")
        # a sparse chain: the most attributes per token of any shard, and whether they carry values (all or none)
        self.attributes = int(shape[:, 2].max())
        self.attribute_values = bool(shape[0, 3])
        if len(set(shape[:, 3].tolist())) > 1:
            raise ValueError(f"problem: some ranks' attributes carry values and others' do not ({shape[:, 3].tolist()}"
                             ", rank r at index r): every shard must be of one data set")
        self.sizes = sizes
        self.offsets = [0]
        for s in sizes:
            self.offsets.append(self.offsets[-1] + s)
        self.n = self.offsets[-1]
        self.offset = self.offsets[self.rank]
        self.n_local = problem.n
        self._ends = torch.tensor(self.offsets[1:], dtype=torch.long)
        # a chain's batch is padded to its longest sentence, whose rows' rounding follows it (dense), and whose
        # tokens a sparse batch's exchange lays out: every example's length
        self._lengths = None
        if chain:
            self._lengths = self.gather(problem.lengths.to(torch.long)).cpu()

    @property
    def d(self) -> int:
        return self.local.d

    @property
    def device(self) -> torch.device:
        return self.local.device

    @property
    def comm_bytes(self) -> int:
        """Bytes of the tensors this rank passed to collectives so far."""
        return self.comm.bytes

    # -- where the examples are -------------------------------------------------------------------
    def owner(self, idx: torch.Tensor) -> torch.Tensor:
        """``(B,)`` long: the rank that holds each global example of ``idx (B,)`` (on the host)."""
        return torch.searchsorted(self._ends, idx.cpu(), right=True)

    def local_index(self, idx: torch.Tensor) -> torch.Tensor:
        """Global examples of this rank ``idx (B,)`` (on the host) as indices of the local problem."""
        return idx.cpu() - self.offset

    # -- collectives ---------------------------------------------------------------------------------
    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """``(n, ...)``: every rank's ``local (n_r, ...)`` values of its examples in global order (one all-gather)."""
        if local.shape[0] != self.n_local:
            raise ValueError(f"gather takes this rank's {self.n_local} values along dim 0, got shape "
                             f"{tuple(local.shape)}")
        return self.comm.all_gather_cat(local, self.sizes)

    def check_same(self, **settings) -> None:
        """Raise a ValueError naming the first of ``settings`` (numbers or None) that differs between the ranks:
        every rank must build its solver alike."""
        names = list(settings)
        values = torch.tensor([math.nan if settings[k] is None else float(settings[k]) for k in names],
                              dtype=torch.float64, device=self.device)
        table = self.comm.all_gather(values).cpu()
        for j, name in enumerate(names):
            column = table[:, j]
            same = bool((column == column[0]).all()) or bool(column.isnan().all())
            if not same:
                raise ValueError(f"{name} differs between the ranks ({column.tolist()}, rank r at index r): every "
                                 "rank must build the solver with the same settings")

    def check_replicated(self, name: str, tensor: torch.Tensor, maxima=()) -> list:
        """Raise a RuntimeError if ``tensor`` (replicated: the same bits on every rank) differs between the ranks,
        and return the largest value over the ranks of each number of ``maxima`` (e.g. the seconds spent, so that
        every rank takes the same decision on a time budget).

        One all-gather of ``2 + len(maxima)`` numbers per rank, not of the tensor: two 64-bit fingerprints of its
        bits (`_fingerprints`: wrapping sums of the entries' bits mixed with their positions), which differ whenever
        one entry's bits differ and, for several differences, each collide with probability about ``2^-64``. Only
        when they differ does a second collective (the max of ``(tensor, -tensor)``) measure by how much, for the
        error."""
        flat = tensor.reshape(-1).to(torch.float64).contiguous()
        extra = host_to_device(torch.tensor([float(x) for x in maxima], dtype=torch.float64), flat.device)
        # the fingerprints travel as the float64 of their bits: an all-gather copies bits, it adds nothing
        table = self.comm.all_gather(torch.cat([_fingerprints(flat).view(torch.float64), extra]))
        prints = table[:, :2].contiguous().view(torch.int64)
        differ = (prints != prints[:1]).any().to(torch.float64).view(1)
        values = torch.cat([differ, table[:, 2:].amax(0)]).tolist()  # the one read from the device
        if values[0]:
            k = flat.numel()
            both = self.comm.all_reduce(torch.cat([flat, -flat]), op="max")
            spread = float((both[:k] + both[k:]).abs().max()) if k else 0.0
            raise RuntimeError(f"{name} differs between the ranks (by up to {spread:.3g}): the replicated "
                               "computation diverged (ranks with different arithmetic, or a rank that skipped a step)")
        return values[1:]

    # -- the blocks in w-space -----------------------------------------------------------------------
    def batch_width(self, idx: torch.Tensor):
        """The padded length one process gives a batch of the global examples ``idx (B,)`` (a dense chain: their
        longest sentence, from the lengths all-gathered when built), or None for problems without one."""
        if self._lengths is None:
            return None
        return int(self._lengths[idx.cpu()].max())

    def static_width(self):
        """The padded length of a host-free batch on one process (`ChainProblem.static_block_index`): the whole
        data set's longest sentence; None for problems without one."""
        return None if self._lengths is None else int(self._lengths.max())

    def joint_features(self, idx: torch.Tensor, z: torch.Tensor, width=None) -> torch.Tensor:
        """``(B, d)``: ``Phi_b z_b`` of the local blocks ``idx (B,)`` with ``z (B, m_r)``: the rows the mini-batch
        step exchanges (docs/distributed.md), computed as the problem's own `gram` computes them on one process, so
        that they are its bits: a dense chain pads the rows' sentences to ``width`` (`batch_width` of the whole
        batch), explicit tables take their own product; any other problem goes through `DualProblem.accumulate`,
        one block at a time (the same values to rounding)."""
        p = self.local
        if self._lengths is not None and not self.sparse_chain:
            return p.joint_features(idx, z, width)
        if isinstance(p, FeatureTableProblem):  # the factor of its gram
            return p.joint_features(idx, z)
        out = torch.zeros(idx.shape[0], p.d, dtype=torch.float64, device=p.device)
        one = torch.ones(1, dtype=torch.float64, device=p.device)
        for b in range(idx.shape[0]):
            p.accumulate(out[b], idx[b: b + 1], z[b: b + 1], one)
        return out

    # -- a sparse chain's batch: its attributes and directions, not its rows ----------------------------------
    def sparse_size(self, idx: torch.Tensor) -> int:
        """Floats that `sparse_pack` writes for the global examples ``idx (B,)`` of a sparse chain: per token (of
        their lengths) its ``A`` attribute ids, their ``A`` values (when the data set has them) and its ``K`` unary
        direction values, per block its tail (transition, start and end: ``L``)."""
        return int(self._lengths[idx.cpu()].sum()) * self._token_width() + idx.shape[0] * self._tail_width()

    def _token_width(self) -> int:
        return self.attributes * (2 if self.attribute_values else 1) + self.local.K

    def _tail_width(self) -> int:
        slices = self.local.parameter_slices()
        return sum(b - a for name, (a, b, _) in slices.items() if name in ("transition", "start", "end"))

    def sparse_pack(self, out: torch.Tensor, idx: torch.Tensor, mine: torch.Tensor, local_idx: torch.Tensor,
                    z: torch.Tensor) -> None:
        """Write this rank's blocks of the batch ``idx (B,)`` (global) into ``out`` (`sparse_size` floats, zero
        elsewhere): the blocks at positions ``mine`` of the batch, local indices ``local_idx``, with directions ``z
        (B_r, m_r)`` (`ChainProblem.sparse_batch`). The ids travel as ``id + 1`` (0: none; exact in float64 below
        2^53), so that a sum over ranks of one owner's values and zeros leaves the owner's bits."""
        lengths = self._lengths[idx.cpu()].to(out.device)
        A, K, L = self.attributes, self.local.K, self._tail_width()
        S = int(lengths.sum())
        tokens = out[: S * self._token_width()].view(S, -1)
        tails = out[S * self._token_width():].view(idx.shape[0], L)
        x, u, tail = self.local.sparse_batch(local_idx, z)
        T = u.shape[1]
        valid = torch.arange(T, device=out.device).unsqueeze(0) < lengths[mine].unsqueeze(1)
        # the batch's tokens in order (block, position): the rows of this rank's blocks
        slot = torch.cumsum(lengths, 0) - lengths
        rows = (slot[mine].unsqueeze(1) + torch.arange(T, device=out.device).unsqueeze(0))[valid]
        Ar = x.ids.shape[2]
        tokens[rows, :Ar] = (x.ids[valid] + 1).to(torch.float64)
        if self.attribute_values:
            tokens[rows, A: A + Ar] = x.values[valid].to(torch.float64)
        tokens[rows, tokens.shape[1] - K:] = u[valid].to(torch.float64)
        tails[mine] = tail.to(torch.float64)

    def sparse_unpack(self, buf: torch.Tensor, idx: torch.Tensor):
        """``(x, u, tail)`` of the whole batch ``idx (B,)`` from the summed buffer of `sparse_pack`: its sentences
        padded to the batch's longest (`batch_width`, as one process pads them), ``-1`` ids and zeros beyond their
        lengths; what `ChainProblem.sparse_batch_gram` takes."""
        p = self.local
        lengths = self._lengths[idx.cpu()].to(buf.device)
        A, K, B = self.attributes, p.K, idx.shape[0]
        S, T = int(lengths.sum()), self.batch_width(idx)
        tokens = buf[: S * self._token_width()].view(S, -1)
        valid = torch.arange(T, device=buf.device).unsqueeze(0) < lengths.unsqueeze(1)
        ids = torch.full((B, T, A), -1, dtype=torch.long, device=buf.device)
        ids[valid] = tokens[:, :A].to(torch.long) - 1
        values = None
        if self.attribute_values:
            values = torch.zeros(B, T, A, dtype=p.dtype, device=buf.device)
            values[valid] = tokens[:, A: 2 * A].to(p.dtype)
        # u and the tail as views of a fresh (B, m) in the layout of one process on the whole data set (its m, its
        # padded length): a BLAS product's rounding can follow its operands' strides and alignment
        T_all, L = int(self._lengths.max()), self._tail_width()
        z = torch.zeros(B, T_all * K + K * K + 2 * K, dtype=p.dtype, device=buf.device)
        u = z[:, : T_all * K].view(B, T_all, K)[:, :T]
        u[valid] = tokens[:, tokens.shape[1] - K:].to(p.dtype)
        tail = z[:, T_all * K: T_all * K + L]
        tail.copy_(buf[S * self._token_width():].view(B, L))
        return TokenFeatures(ids, values), u, tail

    # -- a mini-batch spread over ranks: one all-reduce gives every rank every block ------------------------
    def exchange(self, idx: torch.Tensor, mine: torch.Tensor, local_idx, z, columns, n_columns: int,
                 totals=None, width=None):
        """Every rank's blocks of a mini-batch of the global examples ``idx (B,)`` on every rank, in one all-reduce
        (sum) of a buffer in which each rank writes its blocks' values and zeros elsewhere (a sum of one value and
        zeros is that value's bits): the blocks at positions ``mine (B_r,)`` of the batch, local indices
        ``local_idx`` (None when this rank holds none of them) with directions ``z (B_r, m_r)``, and
        ``columns (B_r, n_columns)`` of per-block numbers (step bounds, gains, ...), then ``totals`` (a 1-d float64
        tensor summed over the ranks: counters). ``mine`` may instead be a ``(B,)`` bool mask, with ``local_idx``,
        ``z`` and ``columns`` given for every position and kept where it is True (the host-free step: no host
        read, no shape that depends on values; dense rows only).

        The blocks travel as their rows ``Phi_b z_b`` (``B d`` floats, `joint_features`, padded to ``width``,
        default the batch's longest sentence) or, on a chain of sparse attributes, as what determines them
        (`sparse_pack`: ``sparse_size`` floats, never ``d`` per block). Returns ``(batch, columns (n_columns, B),
        totals)`` with ``batch`` an `ExchangedBatch`, whose Gram matrix and update of ``w`` are one process's
        products."""
        B, d = idx.shape[0], self.d
        D = self.sparse_size(idx) if self.sparse_chain else B * d
        t = 0 if totals is None else totals.numel()
        buf = torch.zeros(D + n_columns * B + t, dtype=torch.float64, device=self.device)
        part = buf[:D]
        cols = buf[D: D + n_columns * B].view(n_columns, B)
        if mine.dtype == torch.bool:
            rows = self.joint_features(local_idx, z, width)
            part.view(B, d).copy_(torch.where(mine.unsqueeze(1), rows, 0.0))
            cols.copy_(torch.where(mine, columns.to(torch.float64).T, 0.0))
        elif local_idx is not None:
            if self.sparse_chain:
                self.sparse_pack(part, idx, mine, local_idx, z)
            else:
                part.view(B, d)[mine] = self.joint_features(local_idx, z, width or self.batch_width(idx))
            cols[:, mine] = columns.to(torch.float64).T
        if t:
            buf[D + n_columns * B:] = totals
        self.comm.all_reduce(buf)
        return ExchangedBatch(self, idx, part), cols, buf[D + n_columns * B:]

    def __repr__(self) -> str:
        return (f"ShardedProblem({type(self.local).__name__}, rank {self.rank} of {self.world_size}, examples "
                f"[{self.offset}, {self.offset + self.n_local}) of {self.n})")


def _fingerprints(flat: torch.Tensor) -> torch.Tensor:
    """``(2,)`` int64: ``sum_k mix(bits_k ^ mix(k + s))`` (``mix``: SplitMix64's finalizer; wrapping, mod 2^64)
    of the bits of ``flat`` (float64) for two seeds ``s``. An integer sum, so every rank and every order of
    summation gives the same value for the same bits; ``mix`` is a bijection, so a change of one entry always
    changes both; for changes of several entries the changed terms are pseudo-random, and each fingerprint
    collides with probability about ``2^-64``."""
    bits = flat.view(torch.int64)
    k = torch.arange(bits.numel(), dtype=torch.int64, device=bits.device)
    return torch.stack([splitmix64(bits ^ splitmix64(k + seed)).sum()
                        for seed in (0x5851F42D4C957F2D, 0x2545F4914F6CDD1D)])


class ExchangedBatch:
    """The blocks of a mini-batch after `ShardedProblem.exchange`, the same on every rank: ``gram()``, the ``(B, B)``
    matrix ``<Phi_b z_b, Phi_c z_c>``, and ``accumulate(w, coef)``, ``w += sum_b coef_b Phi_b z_b``; the products
    the problem makes on one process (`ChainProblem.gram` and `accumulate` on the dense rows; on a sparse chain
    `ChainProblem.sparse_batch_gram` and `sparse_batch_accumulate` on the unpacked batch, laid out as one process
    lays it out)."""

    def __init__(self, sharded: ShardedProblem, idx: torch.Tensor, part: torch.Tensor):
        self.problem = sharded.local
        if sharded.sparse_chain:
            self.rows = None
            self.x, self.u, self.tail = sharded.sparse_unpack(part, idx)
            self._attribute_rows = None
        else:
            self.rows = part.view(idx.shape[0], sharded.d)

    def gram(self) -> torch.Tensor:
        if self.rows is not None:
            return self.rows @ self.rows.T
        G, self._attribute_rows = self.problem.sparse_batch_gram(self.x, self.u, self.tail)
        return G

    def accumulate(self, w: torch.Tensor, coef: torch.Tensor) -> None:
        if self.rows is not None:
            w.addmv_(self.rows.T, coef.to(torch.float64))
        else:
            self.problem.sparse_batch_accumulate(w, self.x, self.u, self.tail, coef, rows=self._attribute_rows)
