"""The dual solvers on 1, 2, 4 CPU processes (`torchssvm.distributed`, gloo): seconds per BCFW pass and per exact
gap pass, bytes passed to collectives per step, memory per rank, on a seeded synthetic chain problem; and a
projection to N GPUs from the measured bytes. Writes docs/benchmarks/distributed.md (followed by the hand-written
distributed_findings.md) and distributed.json.

Every world size runs in its own processes (multiprocessing's forkserver, one process per rank, gloo over TCP on
127.0.0.1, one thread each). Each rank generates the whole data set from its seed (so every world size solves the
same problem), keeps its shard (`shard_dataset`) and runs `DistributedBCFW` (uniform sampling, FW steps, mini-batch
``--batch-sizes``, no exact pass inside the timed passes), then one exact gap pass (`duality_gap`). The one-process
row also times `BCFW` without a process group on the whole data set: the single-process user's cost.

    python scripts/bench_distributed.py                         # 200k tokens, 1, 2, 4 ranks: a few minutes
    python scripts/bench_distributed.py --tokens 2000000        # the issue's 2M tokens (needs ~8 GB, 4 ranks)
    python scripts/bench_distributed.py --report-only           # rewrite the page from the saved JSON
    python scripts/bench_distributed.py --sparse                # bytes per step of a CoNLL-like sparse chain

``--sparse`` measures what a step sends on a chain of sparse token attributes at CoNLL-2000's size (D = 75,455
binary attributes, 20 per token, K = 22 labels: d = 1.66 million parameters), where a dense row per block would be
13 MB: the bytes each update passes to collectives (the batch's attributes and directions, docs/distributed.md),
against the ``8 (B d + 3 B + 3)`` of dense rows. Writes docs/benchmarks/distributed_sparse.md and .json.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import multiprocessing
import os
import resource
import socket
import time
from pathlib import Path

import torch
from _bench_machine import code_version, cpu_description, measured_or_saved, write_report

ROOT = Path(__file__).resolve().parent.parent
OUT_MD = ROOT / "docs" / "benchmarks" / "distributed.md"
OUT_JSON = ROOT / "docs" / "benchmarks" / "distributed.json"
MEAN_LENGTH = 12  # synthetic_chain's lengths are uniform in [4, 20]


def _data(cfg: dict):
    import torchssvm as ts

    return ts.data.synthetic_chain("train", n=cfg["n"], num_labels=cfg["K"], num_features=cfg["D"], seed=0,
                                   dtype=torch.float32)


def _tensor_bytes(obj) -> int:
    """Bytes of the distinct tensor storages among ``obj``'s attributes (one level down into tuples, lists,
    TokenFeatures)."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if isinstance(t, torch.Tensor):
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()

    for value in vars(obj).values():
        add(value)
        if isinstance(value, (tuple, list)):
            for v in value:
                add(v)
        elif hasattr(value, "ids") and hasattr(value, "values"):
            add(value.ids)
            add(value.values)
    return total


def _init_rank(rank: int, world_size: int, address: str) -> None:
    """One thread, and this rank's place in the gloo group."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=600))


def _rank(rank: int, world_size: int, address: str, cfg: dict, out: str) -> None:
    import torch.distributed as dist

    import torchssvm as ts
    from torchssvm.distributed import DistributedBCFW, shard_dataset
    from torchssvm.optim import BCFW

    _init_rank(rank, world_size, address)
    data = _data(cfg)
    shard = shard_dataset(data)
    result = {"rank": rank, "n_local": len(shard), "tokens_local": int(shard.lengths.sum()), "by_B": {}}
    lam, B0 = cfg["lam"], cfg["Bs"][0]

    def model():
        return ts.LinearChainModel(shard.num_features, shard.num_labels, dtype=torch.float64)

    # warm-up (compiled kernels loaded, allocator), untimed: a pass of each solver on the first examples
    small = shard.subset(range(min(len(shard), 2 * B0)))
    DistributedBCFW(model(), small, lam=lam, batch_size=min(B0, len(small)), gap_check_every=0).step()
    if world_size == 1:  # the single-process solver, no process group involved: the reference times
        BCFW(model(), small, lam=lam, batch_size=min(B0, len(small)), gap_check_every=0).step()
        for B in cfg["Bs"]:
            solver = BCFW(model(), data, lam=lam, batch_size=B, gap_check_every=0, seed=0)
            times = []
            for _ in range(cfg["passes"]):
                t0 = time.perf_counter()
                solver.step()
                times.append(time.perf_counter() - t0)
            result["by_B"][str(B)] = {"plain_pass_s": min(times)}
            del solver
    del data
    gc.collect()
    for B in cfg["Bs"]:
        t0 = time.perf_counter()
        solver = DistributedBCFW(model(), shard, lam=lam, batch_size=B, gap_check_every=0, seed=0)
        r = result["by_B"].setdefault(str(B), {})
        r["build_s"] = time.perf_counter() - t0
        comm = solver.shard.comm
        passes = []
        for _ in range(cfg["passes"]):
            b0, c0, s0, t0 = comm.bytes, comm.calls, comm.seconds, time.perf_counter()
            report = solver.step()
            passes.append({"s": time.perf_counter() - t0, "bytes": comm.bytes - b0, "calls": comm.calls - c0,
                           "comm_s": comm.seconds - s0, "gap": report["gap"]})
        r["passes"] = passes
        b0, t0 = comm.bytes, time.perf_counter()
        exact = solver.duality_gap()
        r["gap_pass_s"] = time.perf_counter() - t0
        r["gap_pass_bytes"] = comm.bytes - b0
        r["gap"] = exact["gap"]
        state = _tensor_bytes(solver.problem) + sum(t.untyped_storage().nbytes() for t in (solver.z, solver.ell))
        result["data_and_blocks_bytes"] = state
        result["replicated_bytes"] = sum(t.untyped_storage().nbytes() for t in (solver.v, solver.block_gaps,
                                                                                solver.first_visit))
        del solver
        gc.collect()
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    results = [None] * world_size
    dist.all_gather_object(results, result)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def _address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def run_world(world_size: int, cfg: dict, tmp: Path) -> list:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchssvm", "torchssvm.distributed"])
    out = tmp / f"world{world_size}.json"
    address = _address()
    procs = [ctx.Process(target=_rank, args=(r, world_size, address, cfg, str(out))) for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        codes = [p.exitcode for p in procs]
        if codes != [0] * world_size:
            raise RuntimeError(f"world size {world_size}: ranks exited with {codes}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return json.loads(out.read_text())


def measure(cfg: dict) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        worlds = {}
        for w in cfg["worlds"]:
            worlds[str(w)] = run_world(w, cfg, Path(tmp))
            print(f"world size {w}: done", flush=True)
    tokens = int(_data(cfg).lengths.sum())
    return {"config": cfg, "machine": cpu_description(), "commit": code_version(), "date": cfg["date"],
            "load": list(os.getloadavg()), "tokens": tokens, "worlds": worlds}


def _mb(x: float) -> str:
    return f"{x / 2**20:,.1f}"


def _formula(n: int, B: int, d: int, ranks: list) -> float:
    """Bytes per step from docs/distributed.md: a batch on one rank broadcasts ``v``, its gaps and the counters, a
    spread one all-reduces its rows (the pass's last batch is smaller), weighted by the chance that a uniform draw
    of that size lies on one rank; plus the pass's report (the all-gathered ``l``; the replica check: two
    fingerprints of ``v`` and the clock)."""
    if len(ranks) == 1:
        return 0.0  # every collective of a group of one is the identity (`Collectives`)
    sizes = [B] * (n // B) + ([n % B] if n % B else [])
    total = 0.0
    for b in sizes:
        p_one = sum(math.comb(r["n_local"], b) for r in ranks) / math.comb(n, b)
        total += p_one * 8 * (d + b + 3) + (1 - p_one) * 8 * (b * d + 3 * b + 3)
    return (total + 8 * max(r["n_local"] for r in ranks) + 8 * 3) / len(sizes)


def report(res: dict) -> list:
    cfg = res["config"]
    n, K, D = cfg["n"], cfg["K"], cfg["D"]
    d = D * K + K * K + 3 * K
    worlds = res["worlds"]
    lines = [
        "# The dual solvers on several CPU processes",
        "",
        f"`scripts/bench_distributed.py` on {res['machine']} (load average {res['load'][0]:.1f} when it ended: the "
        f"cores are shared with other users), {res['date']}, commit `{res['commit']}`. Problem: `synthetic_chain` "
        f"seed 0, n = {n:,} sentences ({res.get('tokens', n * MEAN_LENGTH):,} tokens), K = {K} labels, D = {D} "
        f"dense features (d = {d}), float64; `DistributedBCFW` with uniform sampling, FW steps, lam = {cfg['lam']}, "
        f"one thread per rank, gloo on 127.0.0.1. Seconds per pass: the fastest of {cfg['passes']}; every rank "
        "finishes a pass at the same step, the slowest rank's time is given. Design and what each step sends: "
        "[docs/distributed.md](../distributed.md).",
        "",
        "Memory per rank (the same for every batch size):",
        "",
        "| ranks | examples / rank | data + blocks / rank (MiB) | replicated / rank (MiB) | peak RSS / rank (MiB) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for w, ranks in worlds.items():
        lines.append(f"| {w} | {max(r['n_local'] for r in ranks):,} | "
                     f"{_mb(max(r['data_and_blocks_bytes'] for r in ranks))} | "
                     f"{_mb(max(r['replicated_bytes'] for r in ranks))} | "
                     f"{_mb(max(r['peak_rss_bytes'] for r in ranks))} |")
    lines += [
        "",
        "\"Data + blocks\" is what a rank holds while it trains (its problem's tensors, `z`, `l`); \"replicated\" is "
        "`v`, the `(n,)` block gaps and the sampler's order. Peak RSS includes the whole data set, which every rank "
        "here generates before it keeps its shard (and, on one rank, the single-process solver's run).",
    ]
    for B in cfg["Bs"]:
        steps = math.ceil(n / B)
        one = worlds["1"][0]["by_B"][str(B)]
        base = min(p["s"] for p in one["passes"])
        lines += [
            "",
            f"## B = {B} ({steps:,} steps per pass)",
            "",
            f"`BCFW` without a process group: {one['plain_pass_s']:.2f} s per pass.",
            "",
            "| ranks | s / pass | vs 1 rank | in collectives | exact gap pass (s) | bytes / step (measured) | "
            "bytes / step (formula) |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for w, ranks in worlds.items():
            best = [min(r["by_B"][str(B)]["passes"], key=lambda p: p["s"]) for r in ranks]
            sec = max(p["s"] for p in best)
            comm = max(p["comm_s"] for p in best)
            lines.append(f"| {w} | {sec:.2f} | {base / sec:.2f}x | {100 * comm / sec:.0f}% | "
                         f"{max(r['by_B'][str(B)]['gap_pass_s'] for r in ranks):.2f} | "
                         f"{best[0]['bytes'] / steps:,.0f} | {_formula(n, B, d, ranks):,.0f} |")
    lines += [
        "",
        "\"In collectives\": the share of the pass the slowest rank spent inside collectives, waiting for the other "
        "ranks included. Bytes per step: those of the pass divided by its steps; the formula is docs/distributed.md's "
        "(a batch on one rank: a broadcast of `8 (d + B + 3)` bytes; a batch spread over ranks: an all-reduce of "
        "`8 (B d + 3 B + 3)`; the per-pass report: `8 n_max + 24`; a group of one sends nothing).",
        "",
        "## Projection to N GPUs",
        "",
        "A model, not a measurement: a pass costs `t_1 / N` of compute plus `steps x (alpha + 2 bytes / beta)` of "
        "communication (a ring all-reduce sends about twice its buffer), with `t_1` the one-rank pass above (the CPU's "
        "compute; a GPU's is smaller), the bytes of a spread batch's step, and an NCCL all-reduce on one node of "
        "`alpha` = 30 us and `beta` = 100 GB/s (assumed, NVLink class; not measured here).",
        "",
        "| B | N | compute (s) | communication (s) | pass (s) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for B in cfg["Bs"]:
        steps = math.ceil(n / B)
        base = min(p["s"] for p in worlds["1"][0]["by_B"][str(B)]["passes"])
        spread = 8 * (B * d + 3 * B + 3)
        for N in (1, 2, 4, 8):
            comm = 0.0 if N == 1 else steps * (30e-6 + 2 * spread / 100e9)
            lines.append(f"| {B} | {N} | {base / N:.3f} | {comm:.3f} | {base / N + comm:.3f} |")
    lines += [
        "",
        "Communication per step does not shrink with N, compute does: the step's latency bounds the speed-up once "
        "`t_1 / N` nears `steps x alpha`; larger batches amortize it (the rows grow with B, the steps fall as 1 / B).",
        "",
    ]
    return lines


# -- --sparse: the bytes per step of a sparse chain at CoNLL-2000's size ------------------------------------------
SPARSE_MD = ROOT / "docs" / "benchmarks" / "distributed_sparse.md"
SPARSE_JSON = ROOT / "docs" / "benchmarks" / "distributed_sparse.json"


def _sparse_data(cfg: dict):
    """Seeded sentences of lengths uniform in [4, 20] (12 on average), ``A`` binary attributes per token drawn from
    ``D`` (a Zipf-like law: the first attributes are frequent, as words' and tags' are), ``K`` labels."""
    import torchssvm as ts

    g = torch.Generator().manual_seed(0)
    n, T, A, D, K = cfg["n"], 20, cfg["A"], cfg["D"], cfg["K"]
    lengths = torch.randint(4, T + 1, (n,), generator=g)
    ids = (torch.rand(n, T, A, generator=g, dtype=torch.float64) ** 3 * D).long().clamp_max(D - 1)
    y = torch.randint(0, K, (n, T), generator=g)
    pad = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)
    y[pad], ids[pad] = -1, -1
    return ts.data.SequenceDataset(ts.TokenFeatures(ids), y, lengths, num_labels=K, num_features=D)


def _rank_sparse(rank: int, world_size: int, address: str, cfg: dict, out: str) -> None:
    import torch.distributed as dist

    import torchssvm as ts
    from torchssvm.distributed import DistributedBCFW, shard_dataset

    _init_rank(rank, world_size, address)
    data = _sparse_data(cfg)
    shard = shard_dataset(data)
    result = {"rank": rank, "n_local": len(shard), "by_B": {}}
    for B in cfg["Bs"]:
        model = ts.LinearChainModel(data.num_features, data.num_labels, sparse=True, dtype=torch.float64)
        solver = DistributedBCFW(model, shard, lam=cfg["lam"], batch_size=B, gap_check_every=0, seed=0)
        comm, marks = solver.shard.comm, [solver.shard.comm.bytes]
        solver.progress = lambda phase, done, total, comm=comm, marks=marks: (
            marks.append(comm.bytes) if phase == "pass" else None)
        t0 = time.perf_counter()
        solver.step()
        seconds = time.perf_counter() - t0
        per_update = [b - a for a, b in zip(marks, marks[1:])]
        result["by_B"][str(B)] = {"d": solver.problem.d, "updates": per_update, "pass_s": seconds,
                                  "pass_bytes": comm.bytes - marks[0]}
    results = [None] * world_size
    dist.all_gather_object(results, result)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def measure_sparse(cfg: dict) -> dict:
    import tempfile

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchssvm", "torchssvm.distributed"])
    worlds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in cfg["worlds"]:
            out = Path(tmp) / f"world{w}.json"
            address = _address()
            procs = [ctx.Process(target=_rank_sparse, args=(r, w, address, cfg, str(out))) for r in range(w)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            if [p.exitcode for p in procs] != [0] * w:
                raise RuntimeError(f"world size {w}: ranks exited with {[p.exitcode for p in procs]}")
            worlds[str(w)] = json.loads(out.read_text())
            print(f"world size {w}: done", flush=True)
    tokens = int(_sparse_data(cfg).lengths.sum())
    return {"config": cfg, "machine": cpu_description(), "commit": code_version(), "date": cfg["date"],
            "load": list(os.getloadavg()), "tokens": tokens, "worlds": worlds}


def report_sparse(res: dict) -> list:
    cfg, worlds = res["config"], res["worlds"]
    n, K, D, A = cfg["n"], cfg["K"], cfg["D"], cfg["A"]
    d = D * K + K * K + 3 * K
    L = K * K + 2 * K
    lines = [
        "# What a step sends on a sparse chain (`torchssvm.distributed`)",
        "",
        f"`scripts/bench_distributed.py --sparse` on {res['machine']} (load average {res['load'][0]:.1f} when it "
        f"ended: the cores are shared with other users), {res['date']}, commit `{res['commit']}`. Problem: seeded "
        f"sparse chain (CoNLL-2000's size): n = {n:,} sentences ({res['tokens']:,} tokens, lengths 4 to 20), K = {K} "
        f"labels, D = {D:,} binary attributes, A = {A} per token (d = {d:,}), float64; `DistributedBCFW` with uniform "
        f"sampling, FW steps, lam = {cfg['lam']:.3g}, one pass, gloo on 127.0.0.1. Bytes: those this rank passed to "
        "collectives in each update (`ShardedProblem.comm_bytes`, read after each), rank 0's; the per-pass report "
        "(the all-gathered `l`; the replica check: two fingerprints of `v` and the clock, 24 bytes) is not an "
        "update's. Design: "
        "[docs/distributed.md](../distributed.md).",
        "",
        "| B | ranks | updates / pass | bytes / update (mean) | min | max | dense rows `8 (B d + 3 B + 3)` | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for B in cfg["Bs"]:
        for w, ranks in worlds.items():
            ups = ranks[0]["by_B"][str(B)]["updates"]
            dense = 8 * (B * d + 3 * B + 3) if B > 1 else 8 * (d + B + 3)
            mean = sum(ups) / len(ups)
            ratio = f"1 / {dense / mean:,.0f}" if mean else "-"
            lines.append(f"| {B} | {w} | {len(ups):,} | {mean:,.0f} | {min(ups):,} | {max(ups):,} | {dense:,} | "
                         f"{ratio} |")
    lines += [
        "",
        f"A sparse chain's update sends, per token of the batch, its {A} attribute ids and its {K} unary direction "
        f"values, and per block the tail of its direction ({L} floats: transition, start and end) and 3 numbers: "
        f"`8 (S ({A} + {K}) + B {L} + 3 B + 3)` bytes for B > 1 (`S`: the batch's tokens), `8 (S ({A} + {K}) + {L} "
        "+ 6)` for B = 1 (the owner's broadcast; the dense column is then its broadcast of `v`, `8 (d + 4)`). A group "
        "of one sends nothing.",
        "",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200_000, help="about this many tokens (n = tokens / 12)")
    ap.add_argument("--worlds", default="1,2,4", help="world sizes")
    ap.add_argument("--batch-sizes", default="64,512", help="mini-batch sizes B")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--labels", type=int, default=5)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--lam", type=float, default=1e-3)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--sparse", action="store_true", help="bytes per step of a CoNLL-sized sparse chain instead")
    args = ap.parse_args()
    if args.sparse:
        cfg = {"n": 256, "worlds": [int(w) for w in args.worlds.split(",")], "Bs": [1, 64], "K": 22, "D": 75_455,
               "A": 20, "lam": 1.0 / 8936, "date": datetime.date.today().isoformat()}
        res = measured_or_saved(SPARSE_JSON, args.report_only, lambda: measure_sparse(cfg))
        write_report(SPARSE_MD.parent, "distributed_sparse", report_sparse(res))
        return
    cfg = {"n": max(1, args.tokens // MEAN_LENGTH), "worlds": [int(w) for w in args.worlds.split(",")],
           "Bs": [int(b) for b in args.batch_sizes.split(",")],
           "passes": args.passes, "K": args.labels, "D": args.features, "lam": args.lam,
           "date": datetime.date.today().isoformat()}
    res = measured_or_saved(OUT_JSON, args.report_only, lambda: measure(cfg))
    write_report(OUT_MD.parent, "distributed", report(res))


if __name__ == "__main__":
    main()
