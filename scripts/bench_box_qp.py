"""Benchmark: the mini-batch step's B x B box QP solved on the host (numba's compiled loop, numpy) or on the
inputs' device (torch).

`torchssvm.optim.frank_wolfe.box_qp` picks the solver by size and device (`_host_solver`): with numba, the
compiled host loop for CPU inputs of any size and for device inputs up to ``_NUMBA_DEVICE_MAX_B`` = 256
blocks; without it, numpy on the host up to ``_NUMPY_MAX_B`` = 64 blocks; the torch iteration on the device
above. On a GPU the host paths cost a copy of the inputs and a wait, the device path a few dozen kernel launches
per Newton iteration; where they cross there is not measured yet. This script times the three on the same problems.

The problems are the QPs of real steps: BCFW (pairwise steps, gap sampling, a cache of 10, lambda 1e-3) on a
seeded synthetic chain with OCR's shapes (26 labels, 128 features, 2,048 sequences), captured on the CPU over
passes 3 to 5 at each B. Each path solves each one from ``--device``'s tensors; the table gives milliseconds per
QP (copies and waits included) and checks that all reach the same objective.

    python scripts/bench_box_qp.py                 # docs/benchmarks/box_qp.{json,md}
    python scripts/bench_box_qp.py --device cuda   # docs/benchmarks/box_qp_cuda.{json,md}
    python scripts/bench_box_qp.py --device cuda --batch-sizes 256 1024 4096 --count 8   # the host-free sizes
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from _bench_machine import code_version, device_description, measured_or_saved, write_report

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def capture(B: int, count: int, seed: int = 0, device: str = "cpu") -> list:
    """Up to ``count`` box QPs ``(c, H, upper)`` (CPU, float64) of BCFW steps at batch size ``B``, on a chain of
    ``max(2048, 2 B)`` sequences (two steps per pass at least); on a GPU the run takes the host-free step (its QPs
    solved on the device: the host's loop is slow at thousands of blocks)."""
    import torchssvm as ts
    from torchssvm.optim.frank_wolfe import bcfw

    ds = ts.data.synthetic_chain("train", max(2048, 2 * B), num_labels=26, num_features=128, seed=seed)
    model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device=device)
    solver = ts.optim.BCFW(model, ds.to(device), lam=1e-3, batch_size=B, sampling="gap", step="pairwise",
                           cache_size=10, gap_check_every=0, seed=seed, host_free=torch.device(device).type != "cpu",
                           cuda_graph=False)  # eager: a replayed step would not call the recording QP
    qps, solve = [], bcfw.box_qp

    def record(c, H, upper, **kw):
        if solver.steps_done >= 2 and c.shape[0] == B and len(qps) < count:
            qps.append(tuple(t.detach().to("cpu", torch.float64, copy=True) for t in (c, H, upper)))
        return solve(c, H, upper, **kw)

    bcfw.box_qp = record
    try:
        while len(qps) < count and solver.steps_done < 5:
            solver.step()
    finally:
        bcfw.box_qp = solve
    return qps


def time_paths(qps: list, device: torch.device, repeats: int) -> dict:
    """Milliseconds per QP on each path (the minimum over ``repeats`` rounds; None for numba's where it is not
    installed) and the largest relative difference between the objectives the paths reach."""
    from torchssvm.optim.frank_wolfe import box_qp as bq
    from torchssvm.optim.frank_wolfe import box_qp_numba

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    on = [tuple(t.to(device) for t in qp) for qp in qps]
    paths = {"numba": box_qp_numba.projected_newton, "numpy": bq._projected_newton_numpy, "device": None}
    if not box_qp_numba.available():
        del paths["numba"]
    saved, out, answers = bq._host_solver, {"numba": None}, {}
    try:
        for name, solve in paths.items():
            bq._host_solver = lambda B, dev, solve=solve: solve
            bq.box_qp(*on[0])  # numba compiles (or loads its cache) on the first call
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
        bq._host_solver = saved
    diff = 0.0
    for i, (c, H, _) in enumerate(qps):
        values = [float(bq.qp_objective(c, H, a[i])) for a in answers.values()]
        diff = max(diff, (max(values) - min(values)) / max(max(map(abs, values)), 1e-300))
    out["objective_rel_diff"] = diff
    return out


def time_sync_free(qps: list, device: torch.device, repeats: int, max_iter: int) -> dict:
    """The host-free step's QP, ``max_iter`` iterations of each form on ``device``: milliseconds per QP (the minimum
    over ``repeats`` rounds, one wait per round), the QPs short of the tolerance, and the largest relative excess of
    its objective over the host's compiled loop (or numpy's) at 50 iterations."""
    from torchssvm.kernels.backends import triton_available

    from torchssvm.optim.frank_wolfe import box_qp as bq
    from torchssvm.optim.frank_wolfe import box_qp_numba

    host = box_qp_numba.projected_newton if box_qp_numba.available() else bq._projected_newton_numpy
    best = [float(bq.qp_objective(c, H, torch.from_numpy(host(c.numpy(), H.numpy(), u.numpy(), 50, 1e-12))))
            for c, H, u in qps]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    on = [tuple(t.to(device) for t in qp) for qp in qps]
    out = {"max_iter": max_iter}
    forms = ("torch", "triton") if triton_available() and (device.type == "cuda" or _interpreted()) else ("torch",)
    for form in forms:
        flag = torch.zeros((), dtype=torch.long, device=device)
        def solve(c, H, u, flag=flag, form=form):
            return bq.box_qp(c, H, u, sync_free=True, max_iter=max_iter, unconverged=flag, backend=form)

        solve(*on[0])  # compiles the kernels
        ms = float("inf")
        for _ in range(repeats):
            flag.zero_()
            sync()
            t0 = time.perf_counter()
            got = [solve(*qp) for qp in on]
            sync()
            ms = min(ms, 1e3 * (time.perf_counter() - t0) / len(on))
        excess = max((float(bq.qp_objective(c, H, g.cpu())) - f) / max(abs(f), 1e-300)
                     for (c, H, _), g, f in zip(qps, got, best))
        out[form] = {"ms": ms, "unconverged": int(flag), "objective_excess": excess}
    return out


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _picked(B: int, results: dict) -> str:
    numba, cuda = results.get("numba_installed", True), results.get("cuda", False)
    if numba and (not cuda or B <= results["numba_device_max_b"]):
        return "numba"
    return "numpy" if B <= results["numpy_max_b"] else "device"


def write(results: dict, out: Path, cuda: bool) -> None:
    results["cuda"] = cuda
    lines = ["# The mini-batch step's box QP: host (numba, numpy) against device (torch)", "",
             f"Command: `python scripts/bench_box_qp.py{' --device cuda' if cuda else ''}`; {results['device']}; "
             f"torch {results['torch']}, code {results['code']}. QPs of BCFW steps (pairwise, gap sampling, cache "
             f"10) on a synthetic chain with OCR's shapes, {results['count']} per B; milliseconds per QP from "
             f"{'device' if cuda else 'CPU'} tensors (copies and waits included), the minimum over "
             f"{results['repeats']} rounds. The last column but one is the path `box_qp` takes (with numba: the "
             f"compiled loop{' up to B = ' + str(results['numba_device_max_b']) if cuda else ' at every B'}).", "",
             "| B | host, numba (ms) | host, numpy (ms) | device, torch (ms) | numpy / numba | torch / numba | "
             "`box_qp` takes | objectives' largest relative difference |",
             "|---|---|---|---|---|---|---|---|"]
    for B, r in results["sizes"].items():
        if "numpy" not in r:  # --skip-host
            continue
        nb = r.get("numba")
        cells = [f"{nb:.3f}" if nb else "-", f"{r['numpy']:.3f}", f"{r['device']:.3f}",
                 f"{r['numpy'] / nb:.1f}" if nb else "-", f"{r['device'] / nb:.1f}" if nb else "-"]
        lines.append(f"| {B} | {' | '.join(cells)} | {_picked(int(B), results)} | {r['objective_rel_diff']:.1e} |")
    lines.append("")
    sync_free = {B: r["sync_free"] for B, r in results["sizes"].items() if "sync_free" in r}
    if sync_free:
        lines += ["The host-free step's QP (`box_qp(..., sync_free=True)`, a fixed number of iterations, no host read; "
                  "the time of the whole list of QPs over their count, one wait at the end): the torch iteration "
                  "against the Triton kernels (`kernels/step/box_qp_triton.py`); short: the QPs left above the "
                  "tolerance; excess: the largest relative excess of an objective over the host loop's at 50 "
                  "iterations.", "",
                  "| B | iterations | torch (ms) | Triton (ms) | torch / Triton | short (torch, Triton) | "
                  "excess (torch, Triton) |", "|---|---|---|---|---|---|---|"]
        for B, r in sync_free.items():
            t, tr = r["torch"], r.get("triton")
            cells = [f"{t['ms']:.3f}", f"{tr['ms']:.3f}" if tr else "-", f"{t['ms'] / tr['ms']:.1f}" if tr else "-",
                     f"{t['unconverged']}, {tr['unconverged'] if tr else '-'}",
                     f"{t['objective_excess']:.1e}, " + (f"{tr['objective_excess']:.1e}" if tr else "-")]
            lines.append(f"| {B} | {r['max_iter']} | {' | '.join(cells)} |")
        lines.append("")
    write_report(out, "box_qp_cuda" if cuda else "box_qp", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[32, 64, 128, 256, 512])
    parser.add_argument("--count", type=int, default=24, help="QPs per batch size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--sync-free", action=argparse.BooleanOptionalAction, default=None,
                        help="also time the host-free step's QP (default: with --device cuda)")
    parser.add_argument("--max-iter", type=int, default=10, help="the host-free QP's iterations (BCFW's default)")
    parser.add_argument("--skip-host", action="store_true", help="only the host-free QP (large B)")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def measure() -> dict:
        from torchssvm.optim.frank_wolfe import box_qp_numba
        from torchssvm.optim.frank_wolfe.box_qp import _NUMBA_DEVICE_MAX_B, _NUMPY_MAX_B

        results = {"device": device_description(device), "torch": torch.__version__, "code": code_version(),
                   "count": args.count, "repeats": args.repeats, "numpy_max_b": _NUMPY_MAX_B,
                   "numba_device_max_b": _NUMBA_DEVICE_MAX_B, "numba_installed": box_qp_numba.available(),
                   "sizes": {}}
        sync_free = cuda if args.sync_free is None else args.sync_free
        for B in args.batch_sizes:
            qps = capture(B, args.count, device=str(device))
            results["sizes"][str(B)] = {} if args.skip_host else time_paths(qps, device, args.repeats)
            if sync_free:
                results["sizes"][str(B)]["sync_free"] = time_sync_free(qps, device, args.repeats, args.max_iter)
            print(B, json.dumps(results["sizes"][str(B)]), flush=True)
        return results

    results = measured_or_saved(args.out / ("box_qp_cuda.json" if cuda else "box_qp.json"), args.report_only,
                                measure)
    write(results, args.out, cuda)


if __name__ == "__main__":
    main()
