"""Batch Frank-Wolfe on a sharded dual problem (Lacoste-Julien et al., 2013, Alg. 2; Osokin et al., 2016, App. H
Alg. 8; docs/distributed.md): each rank calls the oracle on its blocks, the corner's ``v_s`` is all-reduced and the
block gaps all-gathered, and every rank takes the same line-searched step."""

from __future__ import annotations

import time
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

    @torch.no_grad()
    def step(self) -> dict:
        """One pass: the oracle on this rank's blocks (its chunks), then ``v_s`` summed over the ranks (one
        all-reduce of ``d`` floats) and the gaps and hinge terms all-gathered; the line search
        ``gamma = clip(gap / (lam ||v - v_s||^2), 0, 1)`` and the move are then the same on every rank."""
        t0 = time.perf_counter()
        p, n, lam, sh = self.problem, self.n, self.lam, self.shard
        corners = torch.empty_like(self.z)
        s_ell = torch.empty_like(self.ell)
        gaps = torch.empty_like(self.ell)
        hinge = torch.empty_like(self.ell)
        v_s = torch.zeros_like(self.v)
        done = 0
        for idx in p.chunks(self.chunk):
            theta = p.potentials(self.w, idx)
            labels, loss, H = p.oracle(theta, idx)
            H = H.clamp_min(0)
            corners[idx] = p.corner(idx, labels)
            s_ell[idx] = loss / n
            hinge[idx] = H
            gaps[idx] = (p.inner(theta, self.z[idx]) + H) / n - self.ell[idx]
            p.accumulate(v_s, idx, corners[idx], torch.full((idx.shape[0],), 1.0 / (lam * n), dtype=torch.float64,
                                                              device=p.device))
            done += idx.shape[0]
            self._tick("pass", done, p.n)
        sh.comm.all_reduce(v_s)
        both = sh.gather(torch.stack([gaps, hinge], 1))
        self.oracle_calls += n
        self.block_gaps = both[:, 0].contiguous()
        gap = float(self.block_gaps.sum())
        primal = 0.5 * lam * float(self.w @ self.w) + float(both[:, 1].sum()) / n
        dual = self.dual_value()
        diff = self.v - v_s
        denom = lam * float(diff @ diff)
        gamma = min(max(gap / denom, 0.0), 1.0) if denom > 0 else (1.0 if gap > 0 else 0.0)
        if self._hold_below is not None and gap <= self._hold_below:
            gamma = 0.0
        if gamma > 0:
            self.z.mul_(1 - gamma).add_(corners, alpha=gamma)
            self.ell.mul_(1 - gamma).add_(s_ell, alpha=gamma)
            self.v.mul_(1 - gamma).add_(v_s, alpha=gamma)
            self._sync_w()
        self.steps_done += 1
        p.write_model(self.w)
        self.seconds += time.perf_counter() - t0
        self._check_replicas()
        self.last_exact = {"primal": primal, "gap": gap, "passes": self.oracle_calls / n}
        r = {"primal": primal, "dual": dual, "gap": gap, "gap_exact": True, "step_size": gamma,
             "passes": self.oracle_calls / n, "oracle_calls": self.oracle_calls, "time": self.seconds}
        self._log(r)
        return r
