"""Profile: where the host-free step's B x B box QP spends its device time, and what its Newton solve costs.

The host-free mini-batch BCFW step solves a box QP of size B on the device in a fixed number of projected Newton
iterations (`torchssvm.optim.frank_wolfe.box_qp.box_qp(..., sync_free=True)`, on CUDA the Triton kernels of
`kernels/step/box_qp_triton.py` and one Newton system per iteration). For each B this script

1. times the QP (``--max-iter`` iterations, the median milliseconds per QP, the device synchronized around each) and
   lists the device kernels with the most time in a `torch.profiler` trace of three QPs;
2. times the Newton system alone on a ridged PSD matrix of that size: the LU solve (``torch.linalg.solve_ex``)
   against the Cholesky factorization and its triangular solves (``cholesky_ex`` + ``cholesky_solve``), in float64
   and float32, and a ``B x B`` by ``B x 126`` product (the size of the trial points' product) for scale.

The QPs are random (``H = A^T A / d`` with ``d = 2,000``, ``c >= 0``, ``upper = 1 / B``), which costs the same
kernels as BCFW's own: the iteration's work does not depend on the values.

    python scripts/profile_box_qp.py --device cuda --out DIR      # DIR/profile_box_qp_cuda.{json,md}
    python scripts/profile_box_qp.py --device cpu --batch-sizes 64 --out DIR   # a dry run of the script
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _bench_machine import code_version, device_description, median_seconds


def _qp(B: int, device: torch.device):
    g = torch.Generator().manual_seed(B)
    A = torch.randn(2000, B, generator=g, dtype=torch.float64) / 2000 ** 0.5
    c = torch.randn(B, generator=g, dtype=torch.float64).abs() * 0.1
    return c.to(device), (A.T @ A).to(device), torch.full((B,), 1.0 / B, dtype=torch.float64, device=device)


def profile(B: int, device: torch.device, max_iter: int, repeats: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as trace
    from torchssvm.kernels.step.box_qp_torch import cholesky_solve_ex

    from torchssvm.optim.frank_wolfe.box_qp import box_qp

    c, H, u = _qp(B, device)
    flag = torch.zeros((), dtype=torch.int64, device=device)
    backend = "triton" if device.type == "cuda" else "torch"

    def qp():
        return box_qp(c, H, u, sync_free=True, max_iter=max_iter, unconverged=flag, backend=backend)

    cuda = device.type == "cuda"
    out = {"B": B, "backend": backend, "qp_ms": 1e3 * median_seconds(qp, repeats, cuda)}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with trace(activities=activities) as p:
        for _ in range(3):
            qp()
        if cuda:
            torch.cuda.synchronize()
    attr = "device_time_total" if cuda else "cpu_time_total"
    events = [e for e in p.key_averages() if getattr(e, attr, 0) > 0]
    total = sum(getattr(e, "self_" + attr, 0) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, "self_" + attr, 0), reverse=True)
    out["kernels"] = [{"name": e.key[:90], "calls_per_qp": e.count / 3, "us_per_qp": getattr(e, "self_" + attr) / 3,
                       "share": getattr(e, "self_" + attr) / total} for e in events[:10]]
    M = H + 1e-13 * H.diagonal().max() * torch.eye(B, dtype=torch.float64, device=device)
    r = c.clone()
    solves = {
        "lu_f64": lambda: torch.linalg.solve_ex(M, r),
        "cholesky_f64": lambda: cholesky_solve_ex(M, r),  # the QP's own solve
        "lu_f32": lambda: torch.linalg.solve_ex(M.float(), r.float()),
        "cholesky_f32": lambda: cholesky_solve_ex(M.float(), r.float()),
        "product_f64": lambda: M @ M[:, :126],
    }
    out["solve_ms"] = {name: 1e3 * median_seconds(fn, 10, cuda) for name, fn in solves.items()}
    # a failed factorization stops early: its time is no solve's (float32 loses the ridge of a rank-deficient H)
    out["cholesky_failed"] = {"float64": bool(solves["cholesky_f64"]()[1] != 0),
                              "float32": bool(solves["cholesky_f32"]()[1] != 0)}
    return out


def write(results: dict, out: Path, device: str) -> None:
    lines = [f"# The host-free box QP's device time ({device})", "",
             f"Device: {results['device']}; torch {results['torch']}. Code: {results['code']}. "
             f"Date: {results['date']}. "
             f"Command: `python scripts/profile_box_qp.py --device {device} --out DIR`; {results['max_iter']} "
             "projected Newton iterations per QP, random QPs of BCFW's shape.", "",
             "| B | ms per QP | LU solve f64 (ms) | Cholesky f64 (ms) | LU f32 | Cholesky f32 "
             "| H @ (B x 126) f64 (ms) |",
             "|---|---|---|---|---|---|---|"]
    for r in results["sizes"]:
        s = r["solve_ms"]
        failed = r["cholesky_failed"]
        chol = {k: "failed" if failed[d] else f"{s[k]:.3f}" for k, d in (("cholesky_f64", "float64"),
                                                                        ("cholesky_f32", "float32"))}
        lines.append(f"| {r['B']} | {r['qp_ms']:.3f} | {s['lu_f64']:.3f} | {chol['cholesky_f64']} | {s['lu_f32']:.3f} "
                     f"| {chol['cholesky_f32']} | {s['product_f64']:.3f} |")
    for r in results["sizes"]:
        lines += ["", f"Kernels by device time, B = {r['B']} ({r['backend']} form):", "",
                  "| kernel | calls per QP | us per QP | share |", "|---|---|---|---|"]
        lines += [f"| `{k['name']}` | {k['calls_per_qp']:.0f} | {k['us_per_qp']:.1f} | {100 * k['share']:.0f}% |"
                  for k in r["kernels"]]
    path = out / f"profile_box_qp_{device}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--max-iter", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    for name, value in (("--batch-sizes", min(args.batch_sizes)), ("--max-iter", args.max_iter),
                        ("--repeats", args.repeats)):
        if value < 1:
            ap.error(f"{name} must be at least 1, got {value}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%d"), "device": device_description(device), "torch": torch.__version__,
               "code": code_version(), "max_iter": args.max_iter, "sizes": []}
    for B in args.batch_sizes:
        results["sizes"].append(profile(B, device, args.max_iter, args.repeats))
        print(json.dumps({k: v for k, v in results["sizes"][-1].items() if k != "kernels"}), flush=True)
    (args.out / f"profile_box_qp_{device.type}.json").write_text(json.dumps(results, indent=1))
    write(results, args.out, device.type)


if __name__ == "__main__":
    main()
