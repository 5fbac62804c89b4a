"""Benchmark: the mini-batch step's B x B box QP solved on the host (numpy) or on the inputs' device (torch).

`torchssvm.optim.box_qp` solves problems of up to ``_NUMPY_MAX_B`` = 64 blocks with the numpy iteration on the
host, from one copy of the inputs, and larger ones with the torch iteration on the device. On the 2-core CPU that
crossover was measured (CoNLL passes); on a GPU it is not: there the host path costs a copy and numpy's time, the
device path a few dozen kernel launches per Newton iteration. This script times both on the same problems.

The problems are the QPs of real steps: BCFW (pairwise steps, gap sampling, a cache of 10, lambda 1e-3) on a
seeded synthetic chain with OCR's shapes (26 labels, 128 features, 2,048 sequences), captured on the CPU over
passes 3 to 5 at each B. Both paths solve each one on ``--device``; the table gives milliseconds per QP (copies
and waits included) and checks that the two reach the same objective.

    python scripts/bench_box_qp.py                 # docs/benchmarks/box_qp.{json,md}
    python scripts/bench_box_qp.py --device cuda   # docs/benchmarks/box_qp_cuda.{json,md}
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _bench_machine import code_version, device_description, measured_or_saved, write_report

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def capture(B: int, count: int, seed: int = 0) -> list:
    """Up to ``count`` box QPs ``(c, H, upper)`` (CPU, float64) of BCFW steps at batch size ``B``."""
    import torchssvm as ts
    from torchssvm.optim import bcfw

    ds = ts.data.synthetic_chain("train", 2048, num_labels=26, num_features=128, seed=seed)
    model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
    solver = ts.optim.BCFW(model, ds, lam=1e-3, batch_size=B, sampling="gap", step="pairwise", cache_size=10,
                           gap_check_every=0, seed=seed)
    qps, solve = [], bcfw.box_qp

    def record(c, H, upper, **kw):
        if solver.steps_done >= 2 and c.shape[0] == B and len(qps) < count:
            qps.append((c.clone(), H.clone(), upper.clone()))
        return solve(c, H, upper, **kw)

    bcfw.box_qp = record
    try:
        while len(qps) < count and solver.steps_done < 5:
            solver.step()
    finally:
        bcfw.box_qp = solve
    return qps


def time_paths(qps: list, device: torch.device, repeats: int) -> dict:
    """Milliseconds per QP on each path (the minimum over ``repeats`` rounds) and the largest relative difference
    of the objectives the two reach."""
    from torchssvm.optim import box_qp as bq

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    on = [tuple(t.to(device) for t in qp) for qp in qps]
    paths = {"host": 10 ** 9, "device": 0}  # the numpy iteration for every B, or the torch one for every B
    saved, out, answers = bq._NUMPY_MAX_B, {}, {}
    try:
        for name, limit in paths.items():
            bq._NUMPY_MAX_B = limit
            best = float("inf")
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                got = [bq.box_qp(c, H, u) for c, H, u in on]
                sync()
                best = min(best, (time.perf_counter() - t0) / len(on))
            out[name] = 1e3 * best
            answers[name] = [g.cpu() for g in got]
    finally:
        bq._NUMPY_MAX_B = saved
    diff = 0.0
    for (c, H, _), a, b in zip(qps, answers["host"], answers["device"]):
        fa, fb = float(bq.qp_objective(c, H, a)), float(bq.qp_objective(c, H, b))
        diff = max(diff, abs(fa - fb) / max(abs(fa), abs(fb), 1e-300))
    out["objective_rel_diff"] = diff
    return out


def write(results: dict, out: Path, cuda: bool) -> None:
    lines = ["# The mini-batch step's box QP: host (numpy) against device (torch)", "",
             f"Command: `python scripts/bench_box_qp.py{' --device cuda' if cuda else ''}`; {results['device']}; "
             f"torch {results['torch']}, code {results['code']}. QPs of BCFW steps (pairwise, gap sampling, cache "
             f"10) on a synthetic chain with OCR's shapes, {results['count']} per B; milliseconds per QP, the "
             f"minimum over {results['repeats']} rounds. `box_qp` takes the host path up to B = "
             f"{results['numpy_max_b']}.", "",
             "| B | host, numpy (ms) | device, torch (ms) | device / host | objectives' largest relative difference |",
             "|---|---|---|---|---|"]
    for B, r in results["sizes"].items():
        lines.append(f"| {B} | {r['host']:.3f} | {r['device']:.3f} | {r['device'] / r['host']:.2f} | "
                     f"{r['objective_rel_diff']:.1e} |")
    lines.append("")
    write_report(out, "box_qp_cuda" if cuda else "box_qp", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[32, 64, 128, 256])
    parser.add_argument("--count", type=int, default=24, help="QPs per batch size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def measure() -> dict:
        from torchssvm.optim.box_qp import _NUMPY_MAX_B

        results = {"device": device_description(device), "torch": torch.__version__, "code": code_version(),
                   "count": args.count, "repeats": args.repeats, "numpy_max_b": _NUMPY_MAX_B, "sizes": {}}
        for B in args.batch_sizes:
            results["sizes"][str(B)] = time_paths(capture(B, args.count), device, args.repeats)
            print(B, json.dumps(results["sizes"][str(B)]), flush=True)
        return results

    results = measured_or_saved(args.out / ("box_qp_cuda.json" if cuda else "box_qp.json"), args.report_only,
                                measure)
    write(results, args.out, cuda)


if __name__ == "__main__":
    main()
