"""The dual solvers on a process group (`torchssvm.distributed`, docs/distributed.md): 2 and 4 gloo processes on the
CPU run the sharded solvers on a tiny seeded chain problem (float64), and their iterates, blocks, counters and
certificates are compared with the single-process solvers on the whole data set. A rank that dies makes the others
raise, not hang.

The ranks are processes started by `multiprocessing`'s forkserver (which imports torch once and ends with the test
session); each writes what it saw to a file in ``tmp_path`` and the test process compares. Every rank is joined
with a deadline and killed if still alive."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
import traceback
import warnings
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import torchssvm as ts
from torchssvm.distributed import shard_dataset, shard_range
from torchssvm.optim import BCFW, FrankWolfe

N, LAM, SEED, PASSES = 23, 0.1, 7, 3
# BCFW variants on a dense chain, bitwise equal to one process: a batch on one rank is its single-process step; a
# spread batch is built from the rows one process computes (padded to the batch's longest sentence) and the same
# products (docs/distributed.md)
CASES = {
    "uniform-fw-B1": dict(sampling="uniform", step="fw", batch_size=1),
    "gap-fw-B1-cache": dict(sampling="gap", step="fw", batch_size=1, cache_size=3, gap_check_every=1),
    "uniform-fw-B5": dict(sampling="uniform", step="fw", batch_size=5),
    "gap-pairwise-B4-cache": dict(sampling="gap", step="pairwise", batch_size=4, cache_size=4, gap_check_every=1),
    "uniform-away-B3-box": dict(sampling="uniform", step="away", batch_size=3, box={"transition": (0.0, None)}),
    # the host-free step (`DistributedBCFW._device_step`): every rank computes B of its blocks, fillers included;
    # B = 2 on n = 23 ends each pass with a batch of one (`_free_exchange`'s B = 1 step)
    "free-uniform-away-B3-box": dict(sampling="uniform", step="away", batch_size=3, box={"transition": (0.0, None)},
                                     host_free=True),
    "free-gap-pairwise-B4-cache": dict(sampling="gap", step="pairwise", batch_size=4, cache_size=4,
                                       gap_check_every=1, host_free=True),
    "free-gap-fw-B2-cache": dict(sampling="gap", step="fw", batch_size=2, cache_size=3, gap_check_every=1,
                                 host_free=True),
    # the host step with the cache's misses counted on the device, as on a GPU (`device_counters`: see `_bcfw`)
    "device-counted-gap-fw-B4-cache": dict(sampling="gap", step="fw", batch_size=4, cache_size=3,
                                           gap_check_every=2, device_counters=True),
}
# explicit tables (`FeatureTableProblem`), margin- and slack-rescaled (`SlackRescaledProblem`, whose rows are built
# through `DualProblem.accumulate`): their update of v is not the product of the Gram's rows, so they agree to
# rounding, on a configuration that rounding does not send elsewhere (gap sampling with pairwise steps does: a
# perturbation of 1e-16 in the rows of one process's own run moves its w by 0.27 within two passes)
TABLES = {
    "table-fw-B4": dict(sampling="uniform", step="fw", batch_size=4),
    "table-slack-fw-B3": dict(sampling="uniform", step="fw", batch_size=3, rescaling="slack"),
    "table-free-fw-B4": dict(sampling="uniform", step="fw", batch_size=4, host_free=True),
}
# BCFW on a chain of sparse token attributes (`TokenFeatures`): a batch of B > 1 blocks travels as its attributes and
# its directions in marginal space, from which every rank rebuilds the Gram matrix and the update with the problem's
# own methods, laid out as one process lays them out; a B = 1 step's owner sends the same for its move. Bitwise.
SPARSE = {
    "sparse-uniform-fw-B3": dict(sampling="uniform", step="fw", batch_size=3),
    "sparse-gap-fw-B5-cache": dict(sampling="gap", step="fw", batch_size=5, cache_size=3, gap_check_every=1),
    "sparse-gap-pairwise-B4-cache": dict(sampling="gap", step="pairwise", batch_size=4, cache_size=4,
                                         gap_check_every=1),
    "sparse-uniform-pairwise-B5-cache-binary": dict(sampling="uniform", step="pairwise", batch_size=5, cache_size=2,
                                                    binary=True),
    "sparse-uniform-away-B3": dict(sampling="uniform", step="away", batch_size=3, cache_size=3),
    "sparse-gap-fw-B1-cache": dict(sampling="gap", step="fw", batch_size=1, cache_size=2, gap_check_every=1),
}
FW_STEPS = 3
RTOL = 1e-12


def _data():
    return ts.data.synthetic_chain("train", n=N, num_labels=3, num_features=5, min_length=2, max_length=7, seed=3,
                                   dtype=torch.float64)


def _model(data):
    return ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64)


def _sparse_data(binary: bool = False, n: int = N, num_features: int = 11, seed: int = 4):
    """Seeded sequences of sparse token attributes: lengths 2..7, K = 3 labels, 3 attribute slots per token (some
    empty, -1), with values in [0.5, 1.5) or binary (``binary``)."""
    g = torch.Generator().manual_seed(seed)
    T, A, K = 7, 3, 3
    lengths = torch.randint(2, T + 1, (n,), generator=g)
    ids = torch.randint(0, num_features, (n, T, A), generator=g)
    ids[:, :, 1:] = torch.where(torch.rand(n, T, A - 1, generator=g) < 0.3, -1, ids[:, :, 1:])
    values = torch.rand(n, T, A, generator=g, dtype=torch.float64) + 0.5
    y = torch.randint(0, K, (n, T), generator=g)
    pad = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)
    y[pad], ids[pad] = -1, -1
    x = ts.TokenFeatures(ids, None if binary else values)
    return ts.data.SequenceDataset(x, y, lengths, num_labels=K, num_features=num_features)


def _sparse_model(data):
    return ts.LinearChainModel(data.num_features, data.num_labels, sparse=True, dtype=torch.float64)


def _sparse_case(kw: dict):
    """``(data, solver arguments)`` of a `SPARSE` case."""
    kw = dict(kw)
    return _sparse_data(binary=kw.pop("binary", False)), kw


def _table(rows=None):
    """Seeded tables of 23 examples with 4 outputs and d = 6 (`FeatureTableProblem`), or the examples ``rows`` of
    them (a shard)."""
    g = torch.Generator().manual_seed(5)
    features = torch.randn(N, 4, 6, generator=g, dtype=torch.float64)
    truth = torch.randint(4, (N,), generator=g)
    losses = torch.rand(N, 4, generator=g, dtype=torch.float64)
    losses[torch.arange(N), truth] = 0.0
    rows = slice(None) if rows is None else slice(rows.start, rows.stop)
    return ts.optim.problems.FeatureTableProblem(features[rows], losses[rows], truth[rows])


def _bcfw(make, kw: dict):
    """``make(**kw)``, a `BCFW` or `DistributedBCFW`; with ``device_counters`` the solver counts its cache's misses
    on its device (a 0-dim tensor read with the report) as it does on a GPU, where the step decodes the whole batch
    and takes the answers of the misses: the counting a device run does, on the CPU."""
    kw = dict(kw)
    device_counters = kw.pop("device_counters", False)
    solver = make(**kw)
    if device_counters:
        solver._misses = torch.zeros((), dtype=torch.long)
    return solver


RESCALED = dict(sampling="gap", step="pairwise", batch_size=4, cache_size=4)  # gaps estimated between exact passes


def _rescaled(solver) -> dict:
    """One pass, `rescale_lambda` to ``LAM / 2`` (its ``delta``, the block gaps and global gap it moves), then
    `_trajectory` of 2 passes at ``LAM / 2``."""
    solver.step()
    delta = solver.rescale_lambda(LAM / 2)
    moved = {"delta": delta.clone(), "block_gaps": solver.block_gaps.clone(), "global_gap": solver.global_gap}
    return {**_trajectory(solver, 2), "moved": moved}


def _trajectory(solver, steps: int) -> dict:
    """``w`` after each step, the reports, then the exact `duality_gap` and the blocks of the end."""
    ws, reports = [], []
    for _ in range(steps):
        reports.append({k: v for k, v in solver.step().items() if isinstance(v, (int, float))})
        ws.append(solver.w.clone())
    exact = solver.duality_gap()
    return {"w": torch.stack(ws), "reports": reports, "z": solver.z.clone(), "ell": solver.ell.clone(),
            "exact": {k: exact[k] for k in ("primal", "dual", "gap")}, "block_gaps": exact["block_gaps"].clone()}


@contextmanager
def rank_result(rank: int, out: str):
    """A rank's body: yields the dict it fills, then saves it to ``out/rank{rank}.pt`` with ``ok`` True, or
    ``{"ok": False, "error": <traceback>}`` when the body raised, and leaves the process group."""
    import torch.distributed as dist

    result = {}
    try:
        yield result
        result["ok"] = True
    except BaseException:  # noqa: BLE001 - reported to the test process
        result.clear()
        result.update(ok=False, error=traceback.format_exc())
    finally:
        torch.save(result, Path(out) / f"rank{rank}.pt")
        if dist.is_initialized():
            dist.destroy_process_group()


# -- the ranks (top-level: the spawned processes import this module to find them) ------------------------------------
def _init(rank: int, world_size: int, address: str, timeout_s: float) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def _rank_solvers(rank: int, world_size: int, address: str, out: str) -> None:

    from torchssvm.distributed import DistributedBCFW, DistributedFrankWolfe

    with rank_result(rank, out) as result:
        _init(rank, world_size, address, 60)
        data = _data()
        shard = shard_dataset(data)
        fw = DistributedFrankWolfe(_model(data), shard, lam=LAM)
        result["fw"] = _trajectory(fw, FW_STEPS)
        for name, kw in CASES.items():
            solver = _bcfw(lambda **k: DistributedBCFW(_model(data), shard, lam=LAM, seed=SEED, **k), kw)
            result[name] = _trajectory(solver, PASSES)
            result[name]["comm_bytes"] = solver.shard.comm_bytes
        # Prop. 1's move to lam / 2 after a pass (`rescale_lambda`: delta, the gaps), then two passes at lam / 2
        solver = DistributedBCFW(_model(data), shard, lam=LAM, seed=SEED, **RESCALED)
        result["rescaled"] = _rescaled(solver)
        refused = {}
        for case, make in (
                ("sparse", lambda: DistributedBCFW(_sparse_model(_sparse_data()), shard_dataset(_sparse_data()),
                                                   lam=LAM, batch_size=2, host_free=True)),
                ("small shards", lambda: DistributedBCFW(_model(data), shard, lam=LAM, batch_size=N // world_size + 1,
                                                         host_free=True)),
                ("graph", lambda: DistributedBCFW(_model(data), shard, lam=LAM, batch_size=2, cuda_graph=True)),
                ("slack", lambda: DistributedBCFW(_model(data), shard, lam=LAM, batch_size=2, host_free=True,
                                                  rescaling="slack"))):
            try:
                make()
                refused[case] = "built"
            except ValueError as e:
                refused[case] = str(e)
        result["refused"] = refused
        for name, kw in TABLES.items():
            table = _table(shard_range(N, rank, world_size))
            result[name] = _trajectory(DistributedBCFW(table, lam=LAM, seed=SEED, **kw), PASSES)
        for name, kw in SPARSE.items():
            sparse, kw = _sparse_case(kw)
            solver = DistributedBCFW(_sparse_model(sparse), shard_dataset(sparse), lam=LAM, seed=SEED, **kw)
            result[name] = _trajectory(solver, PASSES)
            result[name]["comm_bytes"] = solver.shard.comm_bytes


# a sparse chain with many parameters (d = 3 * 400,000 + 18): what one update sends against the B d floats of rows
BIG_D, BIG_N, BIG_PASSES = 400_000, 12, 2


def _rank_sparse_bytes(rank: int, world_size: int, address: str, out: str) -> None:
    """Uniform BCFW with B = 4 and B = 1 on the sparse chain of `BIG_D` attributes: the bytes this rank passed to
    collectives in each update (read from the progress hook after each), and ``w`` after each pass."""

    from torchssvm.distributed import DistributedBCFW

    with rank_result(rank, out) as result:
        _init(rank, world_size, address, 60)
        data = _sparse_data(n=BIG_N, num_features=BIG_D, seed=5)
        for B in (4, 1):
            solver = DistributedBCFW(_sparse_model(data), shard_dataset(data), lam=LAM, seed=SEED, batch_size=B,
                                     gap_check_every=0)
            comm, marks = solver.shard.comm, []
            solver.progress = lambda phase, done, total, comm=comm, marks=marks: (
                marks.append(comm.bytes) if phase == "pass" else None)
            ws = []
            for _ in range(BIG_PASSES):
                marks.append(comm.bytes)
                solver.step()
                ws.append(solver.w.clone())
            updates = BIG_N // B
            per_pass = [marks[k * (updates + 1): (k + 1) * (updates + 1)] for k in range(BIG_PASSES)]
            result[B] = {"bytes": [b - a for m in per_pass for a, b in zip(m, m[1:])], "w": torch.stack(ws),
                         "d": solver.problem.d}


def _rank_host_free_syncs(rank: int, world_size: int, address: str, out: str) -> None:
    """The host-free step on the simulated CUDA device (`torchssvm.testing.simulated_cuda`; gloo passes the CPU
    tensors it wraps): the host reads from the device after each step (from the progress hook) and over whole
    passes."""
    from torchssvm.distributed import DistributedBCFW
    from torchssvm.testing import simulated_cuda

    with rank_result(rank, out) as result:
        _init(rank, world_size, address, 60)
        data = ts.data.synthetic_chain("train", 64, num_labels=5, num_features=8, seed=0)
        with simulated_cuda() as mode:
            model = ts.LinearChainModel(8, 5, dtype=torch.float64, device="cuda")
            solver = DistributedBCFW(model, shard_dataset(data).to("cuda"), lam=0.01, batch_size=16, seed=0,
                                     backend="torch", host_free=True, sampling="gap", step="pairwise",
                                     cache_size=4, gap_check_every=2)
            solver.step()  # the first pass visits every block once
            marks = []
            solver.progress = lambda phase, done, total: marks.append(mode.syncs) if phase == "pass" else None
            before, mode.sync_sites = mode.syncs, type(mode.sync_sites)()
            per_step = []
            for _ in range(2):
                marks.append(mode.syncs)
                report = solver.step()
                per_step += [b - a for a, b in zip(marks, marks[1:])]
                marks.clear()
            result.update(per_step=per_step, syncs=mode.syncs - before, sites=dict(mode.sync_sites),
                          device=str(solver.w.device), oracle_calls=report["oracle_calls"])
            try:  # on CUDA a collective waited with a timeout blocks the host (NCCL)
                DistributedBCFW(model, shard_dataset(data).to("cuda"), lam=0.01, batch_size=16, host_free=True,
                                timeout=5)
                result["timeout"] = "built"
            except ValueError as e:
                result["timeout"] = str(e)


def _rank_replicas(rank: int, world_size: int, address: str, out: str) -> None:
    """Rank 1's replicated ``v`` is moved by 1e-9 after the last step of a pass (a rank whose arithmetic drifted);
    the pass's report must raise on every rank."""
    from torchssvm.distributed import DistributedBCFW

    with rank_result(rank, out) as result:
        _init(rank, world_size, address, 60)
        data = _data()
        solver = DistributedBCFW(_model(data), shard_dataset(data), lam=LAM, seed=SEED, batch_size=4)
        solver.step()
        if rank == 1:  # after the pass's last step, before its report (a step broadcasting v would heal it)
            solver.progress = lambda phase, done, total: solver.v[3].add_(1e-9) if done == total else None
        try:
            solver.step()
            result["outcome"] = "returned"
        except RuntimeError as e:
            result["outcome"] = str(e)


def _rank_that_fails(rank: int, world_size: int, address: str, out: str, how: str) -> None:
    """Rank 1 dies (``os._exit``) or stalls for 5 s in the middle of its second pass; the others must raise. The
    solver's collectives wait at most 2 s (``timeout=2``), the group's 20 s."""
    from torchssvm.distributed import DistributedBCFW

    _init(rank, world_size, address, 20)
    data = _data()
    solver = DistributedBCFW(_model(data), shard_dataset(data), lam=LAM, seed=SEED, batch_size=4, timeout=2)
    solver.step()
    if rank == 1:
        fail = (lambda: os._exit(3)) if how == "dies" else (lambda: time.sleep(5))
        solver.progress = lambda phase, done, total: fail() if done == 8 else None
    t0 = time.monotonic()
    try:
        solver.step()
        outcome = "returned"
    except Exception as e:  # noqa: BLE001 - what the collective raised is the test's subject
        outcome = f"raised {type(e).__name__}: {e}"
    Path(out, f"rank{rank}.txt").write_text(f"{time.monotonic() - t0:.3f}\n{outcome}")


def _rank_that_dies(rank: int, world_size: int, address: str, out: str) -> None:
    _rank_that_fails(rank, world_size, address, out, "dies")


def _rank_that_stalls(rank: int, world_size: int, address: str, out: str) -> None:
    _rank_that_fails(rank, world_size, address, out, "stalls")


def _rank_state(rank: int, world_size: int, address: str, out: str) -> None:
    """Save after two passes, go on for two more; a fresh solver resumed from the save goes the same two passes.
    Then states that must be refused on every rank: a manifest of another world size, one rank's file edited."""
    import json

    import torch.distributed as dist

    from torchssvm.distributed import DistributedBCFW, DistributedFrankWolfe, load_sharded, save_sharded

    with rank_result(rank, out) as result:
        _init(rank, world_size, address, 60)
        data = _data()
        shard = shard_dataset(data)
        folder = Path(out) / "state"
        for name, make in (("bcfw", lambda: DistributedBCFW(_model(data), shard, lam=LAM, seed=SEED,
                                                            **CASES["gap-pairwise-B4-cache"])),
                           ("bcfw-free", lambda: DistributedBCFW(_model(data), shard, lam=LAM, seed=SEED,
                                                                 **CASES["free-gap-pairwise-B4-cache"])),
                           ("fw", lambda: DistributedFrankWolfe(_model(data), shard, lam=LAM))):
            solver = make()
            solver.step()
            solver.step()
            save_sharded(solver, folder / name)
            whole = [solver.step()["dual"], solver.step()["dual"], solver.w.clone()]
            resumed = make()
            load_sharded(resumed, folder / name)
            again = [resumed.step()["dual"], resumed.step()["dual"], resumed.w.clone()]
            result[name] = (whole, again)
        # fit(checkpoint=folder): stopped after 2 passes, a fresh solver's fit resumes and ends where one fit ends
        def fit_bcfw(passes, path):
            solver = DistributedBCFW(_model(data), shard, lam=LAM, seed=SEED, **CASES["gap-pairwise-B4-cache"])
            return solver, solver.fit(max_passes=passes, checkpoint=path)

        whole, _ = fit_bcfw(4, folder / "fit-whole")
        fit_bcfw(2, folder / "fit-cut")
        resumed, history = fit_bcfw(4, folder / "fit-cut")
        result["fit"] = (whole.w.clone(), resumed.w.clone(), whole.steps_done, resumed.steps_done, len(history))
        refusals = {}
        manifest = json.loads((folder / "bcfw" / "manifest.json").read_text())
        if rank == 0:
            (folder / "other").mkdir()
            (folder / "other" / "manifest.json").write_text(json.dumps({**manifest, "world_size": 4}))
        dist.barrier()
        for case, load in (("world size", lambda s: load_sharded(s, folder / "other")),
                           ("edited v", lambda s: s.load_state_dict(
                               _edited(s.state_dict()) if rank == 1 else s.state_dict()))):
            solver = DistributedBCFW(_model(data), shard, lam=LAM, seed=SEED, **CASES["gap-pairwise-B4-cache"])
            solver.step()
            before = solver.w.clone()
            try:
                load(solver)
                refusals[case] = "loaded"
            except ValueError as e:
                refusals[case] = str(e)
            assert torch.equal(solver.w, before)  # nothing set
        result["refusals"] = refusals
        # fit's time budget: the ranks' clocks differ (rank 1 is slower), yet all stop after the same step
        solver = DistributedBCFW(_model(data), shard, lam=LAM, seed=SEED, batch_size=4)
        if rank == 1:
            solver.progress = lambda phase, done, total: time.sleep(0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a ConvergenceWarning: stopped by the time budget
            result["budget"] = [r["time"] for r in solver.fit(max_passes=1000, time_budget=0.5, gap_tol=1e-12)]


def _edited(state: dict) -> dict:
    state = dict(state)
    state["v"] = state["v"].clone()
    state["v"][0] += 0.5
    return state


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _spawn(target, world_size: int, out: Path, deadline_s: float, start: str = "forkserver") -> list:
    """Run ``target(rank, world_size, address, out)`` in ``world_size`` processes started by ``start``
    (``"forkserver"``: torch imported once, in the server, as test_checkpoint.py; ``"spawn"`` where the ranks use
    CUDA); their exit codes. Every rank is joined by the deadline and killed if still alive."""
    ctx = multiprocessing.get_context(start)
    if start == "forkserver":
        ctx.set_forkserver_preload(["torch", "torchssvm", "torchssvm.distributed"])
    address = _free_address()
    procs = [ctx.Process(target=target, args=(r, world_size, address, str(out)), daemon=True)
             for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        end = time.monotonic() + deadline_s
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        assert not alive, f"ranks {alive} still running after {deadline_s} s"
        return [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)


# -- the single-process references --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def references():
    torch.set_num_threads(1)
    data = _data()
    out = {"fw": _trajectory(FrankWolfe(_model(data), data, lam=LAM), FW_STEPS)}
    for name, kw in CASES.items():
        out[name] = _trajectory(_bcfw(lambda **k: BCFW(_model(data), data, lam=LAM, seed=SEED, **k), kw), PASSES)
    for name, kw in TABLES.items():
        out[name] = _trajectory(BCFW(_table(), lam=LAM, seed=SEED, **kw), PASSES)
    out["rescaled"] = _rescaled(BCFW(_model(data), data, lam=LAM, seed=SEED, **RESCALED))
    for name, kw in SPARSE.items():
        sparse, kw = _sparse_case(kw)
        out[name] = _trajectory(BCFW(_sparse_model(sparse), sparse, lam=LAM, seed=SEED, **kw), PASSES)
    return out


def _close(a, b, what: str) -> None:
    """``a`` equals ``b`` (tensors or numbers) to `RTOL` relative to ``max(1, |b|)``."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    scale = max(1.0, float(b.abs().max()))
    err = float((a - b).abs().max()) if a.numel() else 0.0
    assert err <= RTOL * scale, f"{what}: off by {err:.3g} (scale {scale:.3g})"


def _same(a: torch.Tensor, b: torch.Tensor, bitwise: bool, what: str) -> None:
    if bitwise:
        assert torch.equal(a, b), f"{what} differs from the single-process run (by {float((a - b).abs().max()):.3g})"
    else:
        _close(a, b, what)


def _blocks(z_local: torch.Tensor, ell_local: torch.Tensor, lengths: torch.Tensor, K: int, T: int):
    """A shard's blocks ``z (n_r, T_r K + K^2 + 2K)`` in the whole problem's layout ``(n_r, T K + K^2 + 2K)``: its
    unary marginals padded from its own longest sentence ``T_r`` to ``T``."""
    T_r = int(lengths.max())
    n_r = z_local.shape[0]
    unary = torch.zeros(n_r, T, K, dtype=z_local.dtype)
    unary[:, :T_r] = z_local[:, : T_r * K].view(n_r, T_r, K)
    return torch.cat([unary.flatten(1), z_local[:, T_r * K:]], 1), ell_local


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_sharded_solvers_take_the_single_process_iterates(world_size, tmp_path, references):
    """Every rank's ``w`` after each step, the reports, the exact gap pass (``duality_gap``: the certificate and the
    ``(n,)`` block gaps) and the blocks ``z``, ``l`` gathered from the ranks equal the single-process
    `FrankWolfe` and `BCFW` runs (same seed and batch size): BCFW on a dense chain bitwise (uniform and gap
    sampling, FW, pairwise and away steps, B = 1 and B > 1, a cache, a box; the host step and the host-free step;
    `rescale_lambda` between passes), batch Frank-Wolfe and BCFW on
    explicit tables to 1e-12 relative (bitwise on a group of one, which sends nothing); the ranks agree bitwise with
    each other; counters equal."""
    codes = _spawn(_rank_solvers, world_size, tmp_path, deadline_s=300)  # a hang guard: room for a busy machine
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    for r, res in enumerate(ranks):
        assert res["ok"], f"rank {r} failed:\n{res['error']}"
    assert codes == [0] * world_size
    data, sparse = _data(), _sparse_data()
    for res in ranks:  # what the host-free step refuses, on every rank alike
        refused = res["refused"]
        assert "sparse attributes" in refused["sparse"], refused
        assert f"at least batch_size = {N // world_size + 1}" in refused["small shards"], refused
        assert "cuda_graph" in refused["graph"], refused
        assert "SlackRescaledProblem" in refused["slack"] and "block at a time" in refused["slack"], refused
    for name in ["fw", *CASES, *TABLES, *SPARSE, "rescaled"]:
        ref = references[name]
        bitwise = name not in TABLES and name != "fw" or world_size == 1  # a group of one: single-process steps
        chain = sparse if name in SPARSE else data
        lengths, K = chain.lengths, chain.num_labels
        T = int(lengths.max())
        for r, res in enumerate(ranks):
            got = res[name]
            assert torch.equal(got["w"], ranks[0][name]["w"]), f"{name}: rank {r}'s w differs from rank 0's"
            if world_size == 1 and "comm_bytes" in got:
                assert got["comm_bytes"] == 0, f"{name}: a group of one sent {got['comm_bytes']} bytes"
            _same(got["w"], ref["w"], bitwise, f"{name}: w")
            for step, (a, b) in enumerate(zip(got["reports"], ref["reports"])):
                assert a.keys() == b.keys()
                for key in a:
                    if key == "time":
                        continue
                    if isinstance(b[key], int) or bitwise:
                        assert a[key] == b[key], f"{name} step {step}: {key} {a[key]!r} != {b[key]!r}"
                    else:
                        assert a[key] == b[key] or abs(a[key] - b[key]) <= RTOL * max(1.0, abs(b[key])), \
                            f"{name} step {step}: {key} {a[key]!r} != {b[key]!r}"
            # the exact gap pass (`duality_gap`): the certificate and the (n,) block gaps
            for key in ("primal", "dual", "gap"):
                _same(torch.tensor(got["exact"][key]), torch.tensor(ref["exact"][key]), bitwise, f"{name}: {key}")
            _same(got["block_gaps"], ref["block_gaps"], bitwise, f"{name}: block gaps")
            if "moved" in ref:  # `rescale_lambda`: its delta, the block gaps and the global gap it moved
                for key in ("delta", "block_gaps"):
                    _same(got["moved"][key], ref["moved"][key], bitwise, f"{name}: rescale_lambda's {key}")
                assert got["moved"]["global_gap"] == ref["moved"]["global_gap"], name
        # the blocks: rank r holds the examples of shard_range(n, r, W), in its own layout
        z_parts, ell_parts = [], []
        for r, res in enumerate(ranks):
            rows = shard_range(N, r, world_size)
            z, ell = res[name]["z"], res[name]["ell"]
            if name not in TABLES:
                z, ell = _blocks(z, ell, lengths[rows.start: rows.stop], K, T)
            z_parts.append(z)
            ell_parts.append(ell)
        _same(torch.cat(z_parts), ref["z"], bitwise, f"{name}: z")
        _same(torch.cat(ell_parts), ref["ell"], bitwise, f"{name}: ell")


def test_sparse_chain_sends_attributes_and_directions_not_rows(tmp_path):
    """On 2 ranks, a sparse chain with d = 1.2 million parameters: every update sends what determines the batch's
    rows, not the rows. A batch of B = 4 (always exchanged): ``8 (S (2 A + K) + B L + 3 B + 3)`` bytes with ``S``
    the batch's tokens (A = 3 attribute ids and values and K = 3 direction values per token, the L = K^2 + 2 K tail
    per block), a B = 1 step's broadcast ``8 (S (2 A + K) + L + 2 + 4)``; both far below the ``8 B d`` of dense rows
    (under a thousandth here). The iterates stay bitwise those of one process."""
    codes = _spawn(_rank_sparse_bytes, 2, tmp_path, deadline_s=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["ok"], f"rank {r} failed:\n{res['error']}"
    assert codes == [0, 0]
    data = _sparse_data(n=BIG_N, num_features=BIG_D, seed=5)
    A, K = data.x.ids.shape[2], data.num_labels
    L, per_token = K * K + 2 * K, 2 * A + K
    lengths = set(data.lengths.tolist())
    for B in (4, 1):
        d = ranks[0][B]["d"]
        assert d == BIG_D * K + K * K + 3 * K
        solver = BCFW(_sparse_model(data), data, lam=LAM, seed=SEED, batch_size=B, gap_check_every=0)
        ref = torch.stack([solver.step() and solver.w.clone() for _ in range(BIG_PASSES)])
        for r, res in enumerate(ranks):
            assert torch.equal(res[B]["w"], ref), f"B = {B}, rank {r}: w differs from one process's"
            sent = res[B]["bytes"]
            assert len(sent) == BIG_PASSES * BIG_N // B
            for got in sent:
                assert 0 < got < B * d * 8 / 1000, (B, got, B * d * 8)
                floats = got // 8 - (B * L + 3 * B + 3 if B > 1 else L + 6)
                assert got % 8 == 0 and floats % per_token == 0, (B, got)
                tokens = floats // per_token
                assert (2 * B <= tokens <= 7 * B) if B > 1 else tokens in lengths, (B, got, tokens)


def test_state_per_rank_resumes_the_run_a_wrong_one_is_refused_and_budgets_agree(tmp_path):
    """`save_sharded` after two passes, then two more passes; a fresh solver resumed with `load_sharded` takes the
    same two passes bitwise (BCFW with gap sampling, pairwise steps, a cache and B = 4; batch Frank-Wolfe); a fit
    with ``checkpoint=folder`` stopped early and fitted again from a fresh solver ends bitwise where one fit ends. A
    manifest of another world size is refused on every rank, and so is a state that one rank cannot trust (its v
    edited: that rank names v, the other names the rank that refused), and neither changes the solver. `fit` with a
    time budget stops every rank after the same step although their clocks differ (one rank is slower)."""
    codes = _spawn(_rank_state, 2, tmp_path, deadline_s=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["ok"], f"rank {r} failed:\n{res['error']}"
    assert codes == [0, 0]
    manifest = (tmp_path / "state" / "bcfw" / "manifest.json").read_text()
    assert '"world_size": 2' in manifest and '"step2/rank1.ckpt"' in manifest
    for r, res in enumerate(ranks):
        for name in ("bcfw", "bcfw-free", "fw"):
            whole, again = res[name]
            assert whole[:2] == again[:2] and torch.equal(whole[2], again[2]), f"rank {r} {name}: resumed run differs"
        w_whole, w_resumed, steps_whole, steps_resumed, resumed_steps = res["fit"]
        assert torch.equal(w_whole, w_resumed) and steps_whole == steps_resumed, f"rank {r}: fit(checkpoint=)"
        assert 0 < resumed_steps < steps_whole  # the second fit took only the steps after the checkpoint
        refusals = res["refusals"]
        assert "world size 2; this one has 2" not in refusals["world size"]
        assert "world size 4" in refusals["world size"], refusals
    assert ranks[0]["budget"] == ranks[1]["budget"] and 1 <= len(ranks[0]["budget"]) < 1000, ranks[0]["budget"]
    assert "state_dict['v']" in ranks[1]["refusals"]["edited v"], ranks[1]["refusals"]
    assert "rank 1 refused" in ranks[0]["refusals"]["edited v"], ranks[0]["refusals"]


def test_host_free_step_on_shards_never_waits_for_the_device(tmp_path):
    """On 2 ranks of the simulated CUDA device, the host-free step (gap sampling, pairwise steps, a cache, B = 16 of
    n = 64) reads nothing from the device: the host waits only for the reports, as many times per pass as one
    process does (the report's read, the replica check's read, one read per exact gap pass), and the ranks' counters
    agree. With the solver's ``timeout=`` (whose NCCL wait blocks the host) it is refused."""
    codes = _spawn(_rank_host_free_syncs, 2, tmp_path, deadline_s=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["ok"], f"rank {r} failed:\n{res['error']}"
    assert codes == [0, 0]
    for res in ranks:
        assert res["device"] == "cuda:0"
        assert res["per_step"] == [0] * 8, res  # 4 steps a pass, 2 passes
        assert res["syncs"] == 2 * 2 + 1, res["sites"]  # two reads per report, one exact gap pass (pass 2 of 2..3)
        assert "blocks the host" in res["timeout"], res["timeout"]
    assert ranks[0]["oracle_calls"] == ranks[1]["oracle_calls"]


def test_replicas_that_drift_apart_make_every_rank_raise(tmp_path):
    """The replica check of each report (`ShardedProblem.check_replicated`): ``v`` differing in one coordinate by
    1e-9 on one of 2 ranks is a RuntimeError on both, naming ``v`` and the spread."""
    codes = _spawn(_rank_replicas, 2, tmp_path, deadline_s=60)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["ok"], f"rank {r} failed:\n{res['error']}"
        assert res["outcome"].startswith("v differs between the ranks (by up to 1e-09"), res["outcome"]
    assert codes == [0, 0]


@pytest.mark.parametrize("how", ["dies", "stalls"])
def test_a_rank_that_dies_or_stalls_makes_the_others_raise(how, tmp_path):
    """Rank 1 exits, or sleeps 5 s, in the middle of a pass; rank 0, waiting in the step's collective, raises
    instead of hanging: at once when the peer closed the connection (gloo), after the solver's 2 s timeout when it
    stalls."""
    codes = _spawn(_rank_that_dies if how == "dies" else _rank_that_stalls, 2, tmp_path, deadline_s=60)
    if how == "dies":
        assert codes[1] == 3
    seconds, outcome = (tmp_path / "rank0.txt").read_text().split("\n", 1)
    assert outcome.startswith("raised"), outcome
    assert float(seconds) < (2 if how == "dies" else 4.5), (seconds, outcome)
    if how == "stalls":
        assert float(seconds) >= 1.8 and "timed out" in outcome, (seconds, outcome)


def test_shard_range_covers_every_example_once():
    for n in (0, 1, 5, 23):
        for world in (1, 2, 4, 7):
            ranges = [shard_range(n, r, world) for r in range(world)]
            assert [i for rg in ranges for i in rg] == list(range(n))
            assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
    with pytest.raises(ValueError, match="rank"):
        shard_range(5, 2, 2)
    data = _data()
    parts = [shard_dataset(data, r, 4) for r in range(4)]
    assert [len(p) for p in parts] == [6, 6, 6, 5]
    assert torch.equal(torch.cat([p.lengths for p in parts]), data.lengths)


def test_no_process_group_is_a_clear_error():
    import torch.distributed as dist

    from torchssvm.distributed import DistributedBCFW

    assert not dist.is_initialized()
    data = _data()
    with pytest.raises(ValueError, match="not initialized"):
        DistributedBCFW(_model(data), data, lam=LAM)


def test_replica_fingerprints_see_one_entry_changes_and_ulp_drift():
    """`check_replicated`'s fingerprints of the bits of ``v``: flipping any single bit of any entry (the lowest
    mantissa bit, an exponent bit, the sign) changes both; so do patterns that a linear fingerprint (a sum of the
    bits times odd multipliers) misses: two sign flips, +-1-ulp patterns such as (+1, -2, +1) at even positions,
    and 2,000 random +-1-ulp drifts of 2 to 8 entries (a BLAS's drift); the same bits give the same fingerprints."""
    from torchssvm.distributed.problem import _fingerprints

    g = torch.Generator().manual_seed(0)
    v = torch.randn(257, generator=g, dtype=torch.float64)
    base = _fingerprints(v)
    assert torch.equal(_fingerprints(v.clone()), base)

    def changed(delta: dict) -> bool:
        bits = v.clone().view(torch.int64)
        for k, d in delta.items():
            bits[k] = bits[k] ^ d if d == -(2**63) else bits[k] + d
        return bool((_fingerprints(bits.view(torch.float64)) != base).all())

    for k in (0, 100, 256):
        for bit in (0, 31, 52, 62, 63):
            bits = v.clone().view(torch.int64)
            bits[k] ^= 1 << bit if bit < 63 else -(2**63)
            assert bool((_fingerprints(bits.view(torch.float64)) != base).all()), (k, bit)
    assert changed({3: -(2**63), 10: -(2**63)})  # two sign flips
    assert changed({0: 1, 2: -2, 4: 1}) and changed({5: 1, 7: -1, 9: -1, 11: 1})
    for _ in range(2000):
        m = int(torch.randint(2, 9, (1,), generator=g))
        where = torch.randperm(257, generator=g)[:m].tolist()
        signs = (torch.randint(0, 2, (m,), generator=g) * 2 - 1).tolist()
        assert changed(dict(zip(where, signs))), (where, signs)
