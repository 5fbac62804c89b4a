"""Start-up of a BCFW run: cold (empty Triton and numba caches) against warm (the caches of the cold run).

Triton keeps compiled kernels in ``TRITON_CACHE_DIR`` (default ``~/.triton/cache``) and numba, for the functions
compiled with ``cache=True`` (all of torchssvm's), in ``NUMBA_CACHE_DIR`` (default: ``__pycache__`` beside the
source). Each run here is a fresh Python process with both pointed at one temporary folder: the first run
compiles into it, the second finds everything there. Reported per run, in wall seconds: the import, loading the
data, building the solver, and from the call of ``fit()`` to the first exact gap (``gap_check_every=1``: the first
pass ends with one) -- the time a user waits for a first certificate.

A third run, ``warm, libraries loaded``, first calls the vendor libraries the step reaches through torch on the
device (a 2 x 2 Cholesky factorization and solve: cuSOLVER, which CUDA loads lazily at its first call; a matrix
product: cuBLAS) before ``fit()``; its ``libraries`` column is those calls' seconds. Warm minus that run's
``fit()`` is what the libraries' first calls cost inside ``fit()``: the device QP (on CUDA since B = 256 went to the
device) is the step's first cuSOLVER user.

    python scripts/bench_startup.py --device cuda --out DIR [--batch-size 256]

Writes ``startup_{device}.{json,md}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
import torchssvm as ts
t_import = time.perf_counter() - t0
device = torch.device(sys.argv[1]); B = int(sys.argv[2]); preload = sys.argv[3] == "1"
t0 = time.perf_counter()
train = ts.data.ocr("train", "large").to(device)
t_data = time.perf_counter() - t0
t0 = time.perf_counter()
model = ts.LinearChainModel(train.num_features, train.num_labels, dtype=torch.float64, device=device)
solver = ts.optim.BCFW(model, train, lam=1e-3, batch_size=B, seed=0, sampling="gap", step="pairwise", cache_size=10,
                       gap_check_every=1)
if device.type == "cuda":
    torch.cuda.synchronize()
t_build = time.perf_counter() - t0
t0 = time.perf_counter()
if preload:  # the device QP's own Newton solve, then a product
    from torchssvm.kernels.step.box_qp_torch import cholesky_solve_ex
    m = torch.eye(2, dtype=torch.float64, device=device) * 2
    cholesky_solve_ex(m, torch.ones(2, dtype=torch.float64, device=device))
    m @ m
    if device.type == "cuda":
        torch.cuda.synchronize()
t_libraries = time.perf_counter() - t0
t0 = time.perf_counter()
first = []
solver.fit(max_passes=1, callback=lambda r: first.append((time.perf_counter() - t0, r["gap"], r["gap_exact"])))
print(json.dumps({"import": t_import, "data": t_data, "build": t_build, "libraries": t_libraries,
                  "first_exact_gap": first[0][0], "gap": first[0][1], "exact": first[0][2]}))
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
               "NUMBA_CACHE_DIR": os.path.join(cache, "numba")}
        for name, preload in (("cold", "0"), ("warm", "0"), ("warm, libraries loaded", "1")):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", CHILD, args.device, str(args.batch_size), preload], env=env,
                               capture_output=True, text=True, timeout=300)
            if p.returncode:
                sys.exit(f"{name} run failed:\n{p.stderr[-3000:]}")
            runs[name] = {**json.loads(p.stdout.strip().splitlines()[-1]), "process": time.perf_counter() - t0}
            print(name, runs[name], flush=True)
    import torch
    from _bench_machine import code_version
    from bench_bcfw_speed import machine

    where = machine(torch.device(args.device))
    (args.out / f"startup_{args.device}.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "machine": where, "code": code_version(),
         "batch_size": args.batch_size, "runs": runs}, indent=1))
    lines = [f"# Start-up of BCFW on {args.device} (OCR-large, B = {args.batch_size}), {time.strftime('%Y-%m-%d')}",
             "", f"Machine: {where}. Code: {code_version()}. Command: `python scripts/bench_startup.py --device "
             f"{args.device} --batch-size {args.batch_size} --out DIR`. Wall seconds in a fresh process each; the "
             "pairwise / gap-sampling / cache-10 configuration with an exact gap after the first pass.", "",
             "| run | import | data | build | libraries | fit() to first exact gap | whole process |",
             "|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['import']:.2f} | {r['data']:.2f} | {r['build']:.2f} | {r['libraries']:.2f} "
                     f"| {r['first_exact_gap']:.2f} | {r['process']:.2f} |")
    lines += ["", "libraries: the seconds of a first Cholesky factorization and solve and a first matrix product on "
              "the device before `fit()` (the third run only); warm minus the third run's `fit()` is their first "
              "calls' cost inside `fit()`."]
    (args.out / f"startup_{args.device}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
