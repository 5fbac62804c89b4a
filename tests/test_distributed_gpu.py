"""The sharded dual solvers with NCCL on CUDA (`torchssvm.distributed`, docs/distributed.md): on 1 GPU (a group of
one, which sends nothing, takes the single-process steps bitwise) and, where the machine has them, on 2 GPUs (one
rank per GPU, the same test code; to 1e-12 where the reduction order differs). Each rank runs `DistributedBCFW`
with the host step and with the host-free step (mini-batch B = 4, gap sampling, pairwise steps, a cache) and
`DistributedFrankWolfe` on its shard on its GPU, and its iterates, certificate and counters are compared with the
single-process solvers on the whole data set on GPU 0.

Skipped without CUDA or NCCL: CI has neither; `scripts/gpu_session.sh distributed` runs it on a lent GPU.
``TORCHSSVM_GPU_TESTS_DEVICE=cpu`` dry-runs the same code with gloo on the CPU (one "device" per rank), so that no
GPU time goes on a broken test."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
from test_distributed import _close, _data, _spawn, rank_result  # the ranks' shared parts

import torchssvm as ts

LAM, SEED, PASSES = 0.1, 7, 3
BCFW_KW = dict(sampling="gap", step="pairwise", batch_size=4, cache_size=4, gap_check_every=1, host_free=False)
FREE_KW = dict(BCFW_KW, host_free=True)  # the host-free step: a fixed-size batch per rank, no host read


DRY_RUN = os.environ.get("TORCHSSVM_GPU_TESTS_DEVICE") == "cpu"  # gloo on the CPU: the same code, no GPU


def _nccl() -> bool:
    import torch.distributed as dist

    return torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()


pytestmark = pytest.mark.skipif(not (_nccl() or DRY_RUN), reason="needs CUDA and NCCL")


def _device(rank: int) -> str:
    return "cpu" if DRY_RUN else f"cuda:{rank}"


def _gpus() -> int:
    return 2 if DRY_RUN else torch.cuda.device_count()


def _run(solver, steps: int) -> dict:
    ws = []
    for _ in range(steps):
        report = solver.step()
        ws.append(solver.w.detach().cpu().clone())
    cert = solver.duality_gap()
    # the counters: on CUDA the cache's misses are counted on each rank's device and summed with the report
    return {"w": torch.stack(ws), "gap": float(cert["gap"]), "primal": float(cert["primal"]),
            "counters": (report.get("oracle_calls"), report.get("cache_hits"))}


def _rank_nccl(rank: int, world_size: int, address: str, out: str) -> None:
    import torch.distributed as dist

    from torchssvm.distributed import DistributedBCFW, DistributedFrankWolfe, shard_dataset

    with rank_result(rank, out) as result:
        if not DRY_RUN:
            torch.cuda.set_device(rank)
        dist.init_process_group("gloo" if DRY_RUN else "nccl", init_method=address, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120))
        data = _data()
        shard = shard_dataset(data)
        device = _device(rank)
        model = ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64, device=device)
        result["bcfw"] = _run(DistributedBCFW(model, shard, lam=LAM, seed=SEED, **BCFW_KW), PASSES)
        model = ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64, device=device)
        result["bcfw-free"] = _run(DistributedBCFW(model, shard, lam=LAM, seed=SEED, **FREE_KW), PASSES)
        model = ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64, device=device)
        result["fw"] = _run(DistributedFrankWolfe(model, shard, lam=LAM), PASSES)


@pytest.mark.parametrize("world_size", [1, 2])
def test_sharded_solvers_on_nccl_take_the_single_process_iterates(world_size, tmp_path):
    if world_size > _gpus():
        pytest.skip(f"needs {world_size} GPUs, this machine has {_gpus()}")
    data = _data()
    ref = {}
    model = ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64, device=_device(0))
    ref["bcfw"] = _run(ts.optim.BCFW(model, data, lam=LAM, seed=SEED, **BCFW_KW), PASSES)
    model = ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64, device=_device(0))
    ref["bcfw-free"] = _run(ts.optim.BCFW(model, data, lam=LAM, seed=SEED, **FREE_KW), PASSES)
    model = ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64, device=_device(0))
    ref["fw"] = _run(ts.optim.FrankWolfe(model, data, lam=LAM), PASSES)
    codes = _spawn(_rank_nccl, world_size, tmp_path, 300, start="spawn")  # CUDA: no fork
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    for r, res in enumerate(ranks):
        assert res["ok"], f"rank {r} failed:\n{res['error']}"
    assert codes == [0] * world_size
    for name in ("bcfw", "bcfw-free", "fw"):
        for r, res in enumerate(ranks):
            assert torch.equal(res[name]["w"], ranks[0][name]["w"]), f"{name}: rank {r}'s w differs from rank 0's"
            assert res[name]["counters"] == ref[name]["counters"], f"{name}: rank {r}'s counters"
            if world_size == 1:  # a group of one takes every single-process step
                assert torch.equal(res[name]["w"], ref[name]["w"]), f"{name}: w differs from one process"
                assert res[name]["gap"] == ref[name]["gap"]
            else:
                _close(res[name]["w"], ref[name]["w"], f"{name}: w")
                _close(torch.tensor(res[name]["gap"]), torch.tensor(ref[name]["gap"]), f"{name}: gap")
