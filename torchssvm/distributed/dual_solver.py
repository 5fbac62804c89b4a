"""What the sharded dual solvers share (docs/distributed.md): the global n, the replicated block gaps, the exact gap
pass and the dual reduced across ranks, the replica check, and the state of each rank.

`ShardedSolver` goes before the single-process solver in the bases of a distributed solver
(``class DistributedBCFW(ShardedSolver, BCFW)``); the solver is built on the rank's local problem and then calls
`_attach`. From then on its ``n`` is the global n (every ``1/n`` of the dual is the whole problem's), its ``z``,
``ell`` and atoms are the rank's blocks in local indices, and ``block_gaps (n,)`` is global and the same on every
rank."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Union

import torch

from ..optim._state import check_close
from ..optim.dual_solver import exact_block_gaps
from ..optim.problems import make_problem
from ..optim.solver import explain_older_state
from .checkpoint import MANIFEST, load_sharded, save_sharded
from .problem import ShardedProblem


def as_sharded(model, dataset, structure, backend: str, rescaling: str, process_group,
               timeout: Union[float, timedelta, None]) -> ShardedProblem:
    """The `ShardedProblem` of this rank: ``model`` itself when it is one, else the local `DualProblem` of
    ``(model, dataset)`` (`make_problem`: a `LinearChainModel` and this rank's shard, or a `DualProblem`) over
    ``process_group``."""
    if isinstance(model, ShardedProblem):
        if dataset is not None:
            raise ValueError("dataset must be None when model is already a ShardedProblem")
        if process_group is not None or timeout is not None:
            raise ValueError("process_group and timeout must be None when model is already a ShardedProblem "
                             "(which holds its own)")
        return model
    local = make_problem(model, dataset, structure, backend=backend, rescaling=rescaling)
    return ShardedProblem(local, process_group, timeout=timeout)


class ShardedSolver:
    """Mixin of the distributed dual solvers; see the module docstring."""

    shard: ShardedProblem

    def _attach(self, sharded: ShardedProblem) -> None:
        """Make the solver, built on ``sharded.local``, the rank's part of the solver of the whole problem."""
        self.shard = sharded
        self.n = sharded.n
        self.block_gaps = torch.full((self.n,), math.inf, dtype=torch.float64, device=self.problem.device)

    @contextmanager
    def _swapped(self, name: str, value):
        """Attribute ``name`` set to ``value`` for the ``with`` block (a base method run on other tensors)."""
        old = getattr(self, name)
        setattr(self, name, value)
        try:
            yield
        finally:
            setattr(self, name, old)

    # -- the exact gap pass and the dual, over every rank -----------------------------------------------
    def _full_pass(self, chunk: int = 1024):
        """The exact block gaps and hinge terms ``(n,)`` in global order: `exact_block_gaps` on this rank's blocks
        with the global ``n``, then one all-gather. The same vectors as one process's pass (per block the same
        oracle call and products), so their sums are one process's sums."""
        p = self.problem
        hook = None if self._progress_hook is None else (lambda done, _n: self._tick("gap", done, p.n))
        gaps, hinge = exact_block_gaps(p, self.w, self.z, self.ell, chunk, progress=hook, n=self.n)
        both = self.shard.gather(torch.stack([gaps, hinge], 1))
        return both[:, 0].contiguous(), both[:, 1].contiguous()

    def _dual_tensor(self) -> torch.Tensor:
        """The dual ``D`` with ``sum_i l_i`` over every rank's blocks (``l`` all-gathered: one process's sum)."""
        with self._swapped("ell", self.shard.gather(self.ell)):
            return super()._dual_tensor()

    def _check_replicas(self) -> None:
        """At the end of a step: a RuntimeError if ``v`` (hence ``w``) differs between the ranks
        (`ShardedProblem.check_replicated`), and ``seconds`` the largest of the ranks', so that reports are the same
        on every rank and every rank stops `fit` at the same step on a ``time_budget``."""
        (self.seconds,) = self.shard.check_replicated("v", self.v, maxima=(self.seconds,))

    def fit(self, max_passes=None, gap_tol=None, time_budget=None, *, exact: bool = True, callback=None,
            checkpoint=None, checkpoint_every: int = 1):
        """`DualSolver.fit` on every rank at once (each step is a collective). ``checkpoint`` is a folder seen by
        every rank (the same path on a shared file system): the run resumes from it when it holds a manifest
        (`load_sharded`) and writes it every ``checkpoint_every`` steps and at the end (`save_sharded`: a file per
        rank, then the manifest, the commit point)."""
        return self._fit({"max_passes": max_passes, "gap_tol": gap_tol, "time_budget": time_budget},
                         callback=callback, exact=exact, checkpoint=checkpoint, checkpoint_every=checkpoint_every)

    def _resume_checkpoint(self, checkpoint, every: int) -> None:
        """Resume from the folder ``checkpoint`` when it holds a manifest: every rank must see the same (a
        ValueError on every rank otherwise, before any loads)."""
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise TypeError(f"checkpoint must be a folder path (str or os.PathLike), got {type(checkpoint).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"checkpoint_every must be an int >= 1 (steps), got {every!r}")
        path = Path(checkpoint)
        if path.exists() and not path.is_dir():
            raise ValueError(f"checkpoint must be a folder on shards (a file per rank and a manifest), got the file "
                             f"{os.fspath(path)!r}")
        seen = self.shard.comm.all_gather_object((path / MANIFEST).exists())
        if len(set(seen)) > 1:
            raise ValueError(f"checkpoint {os.fspath(path)!r}: ranks {[r for r, s in enumerate(seen) if s]} see its "
                             f"manifest and ranks {[r for r, s in enumerate(seen) if not s]} do not: the folder must "
                             "be on a file system every rank shares")
        if seen[0]:
            load_sharded(self, path)

    def _save_checkpoint(self, checkpoint) -> None:
        save_sharded(self, checkpoint)

    # -- state: one per rank -------------------------------------------------------------------------------
    def _shard_record(self) -> dict:
        sh = self.shard
        return {"rank": sh.rank, "world_size": sh.world_size, "sizes": list(sh.sizes)}

    def state_dict(self) -> dict:
        """This rank's state: `DualSolver.state_dict` of its blocks (``z``, ``ell``, atoms; the fingerprint of its
        shard's data) and of the replicated part (``v``, the block gaps, the sampler), with ``"shard"``: its rank,
        the world size and every rank's number of examples. A state resumes on the same rank of a process group of
        the same world size over the same shards."""
        s = super().state_dict()
        s["shard"] = self._shard_record()
        return s

    def load_state_dict(self, state: dict) -> None:
        """Resume this rank from its `state_dict`; a collective: every rank loads its own at the same point.

        Checked as `Solver.load_state_dict` checks a state (nothing is set unless every rank's state passes), with
        ``v`` recomputed from the blocks of every rank (one all-reduce of ``d`` floats). A state saved on another
        world size, another rank or other shard sizes is a ValueError naming which; when another rank refuses its
        state, this rank raises a ValueError saying so."""
        checked, error = None, None
        try:
            self._check_shard_record(state)
            checked = self._checked_state(state)
        except ValueError as e:
            error = explain_older_state(state, e)
        self._agree(error)
        error = None
        try:
            self._check_consistency(checked)
        except ValueError as e:
            error = explain_older_state(state, e)
        self._agree(error)
        self._set_state(checked)

    def _check_shard_record(self, state: dict) -> None:
        saved = state.get("shard") if isinstance(state, dict) else None
        if not isinstance(saved, dict):
            raise ValueError("state_dict has no 'shard' record: it was not saved by a distributed solver")
        mine = self._shard_record()
        if saved.get("world_size") != mine["world_size"]:
            raise ValueError(f"state_dict was saved on a process group of world size {saved.get('world_size')!r}; "
                             f"this one has {mine['world_size']}: resume on the same world size")
        if saved.get("rank") != mine["rank"]:
            raise ValueError(f"state_dict is rank {saved.get('rank')!r}'s; this process is rank {mine['rank']}")
        if list(saved.get("sizes", ())) != mine["sizes"]:
            raise ValueError(f"state_dict was saved on shards of {saved.get('sizes')!r} examples; these ranks hold "
                             f"{mine['sizes']}")

    def _agree(self, error) -> None:
        """Raise ``error`` on its rank, and a ValueError on the others, if any rank has one (one all-reduce)."""
        flag = torch.tensor([0.0 if error is None else 1.0 + self.shard.rank], dtype=torch.float64,
                            device=self.problem.device)
        worst = int(self.shard.comm.all_reduce(flag, op="max"))
        if error is not None:
            raise error
        if worst:
            raise ValueError(f"rank {worst - 1} refused its state_dict (its error says why): no rank loaded its state")

    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """``v = w_0 + (1/(lam n)) sum_i Phi_i z_i`` over the blocks of every rank (the sum all-reduced: a
        collective, run before any check can raise), then the single-process checks of this rank's blocks
        (`DualSolver._check_consistency` and the solver's own) with ``v`` replaced by what they recompute from this
        rank's blocks alone."""
        p, n = self.problem, self.n
        kw = {"dtype": torch.float64, "device": p.device}
        part = torch.zeros(p.d, **kw)
        local = p.initial_w().to(torch.float64).clone()  # as the base recomputes it, from this rank's blocks
        for idx in p.chunks():
            coef = torch.full((idx.shape[0],), 1.0 / (self.lam * n), **kw)
            p.accumulate(part, idx, c["z"][idx], coef)
            p.accumulate(local, idx, c["z"][idx], coef)
        self.shard.comm.all_reduce(part)
        v_rec = p.initial_w().to(torch.float64) + part
        scale = max(float(c["v"].abs().max()), float(v_rec.abs().max())) if c["v"].numel() else 0.0
        check_close("v", c["v"], v_rec, scale, self.consistency_rtol,
                    "w_0 + (1/(lam n)) sum_i Phi_i z_i of the blocks z of every rank")
        super()._check_consistency({**c, "v": local})
