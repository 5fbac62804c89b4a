"""Seconds per pass of the n-slack cutting plane (`NSlackCuttingPlane`, pairwise working-set QP moves) on
OCR-small, and the certificates it reports, in this checkout against a git revision of it.

Each run is one process: ``--passes`` passes after a first one (the working sets start empty), at one torch
thread count. The runs alternate between the two code trees and the thread counts, ``--rounds`` times, so both
trees see the same machine load. The table gives each tree's seconds for the timed passes (median over the
rounds) and their ratio, the passes at which the two trees' primal, dual and gap agree to 1e-12, and the largest
relative difference of those. A change that only rounds differently keeps the certificates equal for some passes,
then may part from them a little: a pairwise move's exact line search leaves cuts with equal violations, whose
order the last bit decides, and the trees take other, equally valid, moves. Without ``--against`` only this
checkout is timed.

The other tree is a ``git worktree`` of ``--against``, made and removed by the script; its ``torchssvm.kernels``
is its own ``kernels/`` (a link inside the worktree), not the editable install's. Writes
``docs/benchmarks/nslack_pass.{md,json}``.

    TORCHSSVM_DATA=../shared/data python scripts/bench_nslack_pass.py --against HEAD~1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench_machine import code_version, cpu_description, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"

_WORKER = """
import json, sys, time
import torch
import torchssvm as ts
threads, passes, lam = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(threads)
train = ts.data.ocr("train", "small")
model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse)
solver = ts.optim.NSlackCuttingPlane(model, train, lam=lam, seed=0)
solver.step()
out = []
for _ in range(passes):
    t = time.perf_counter()
    report = solver.step()
    out.append({"seconds": time.perf_counter() - t,
                **{k: float(report[k]) for k in ("primal", "dual", "gap")}})
print(json.dumps({"module": ts.__file__, "kernels": ts.kernels.__file__, "passes": out}))
"""


def run_tree(tree: Path, threads: int, passes: int, lam: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", _WORKER, str(threads), str(passes), str(lam)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the run in {tree} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not result["module"].startswith(str(tree)) or not result["kernels"].startswith(str(tree)):
        raise SystemExit(f"the run in {tree} imported {result['module']} and {result['kernels']}")
    return result


def worktree(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` at ``where``, with ``torchssvm/kernels`` linked to its ``kernels/``."""
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(where), rev], cwd=ROOT, check=True)
    (where / "torchssvm" / "kernels").symlink_to(where / "kernels", target_is_directory=True)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="a git revision to time beside this checkout")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this checkout": ROOT}
        if args.against:
            rev = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout.strip()
            trees[rev] = worktree(rev, Path(tmp) / "against")
        runs = {(name, t): [] for name in trees for t in threads}
        loads = []
        start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        try:
            for r in range(args.rounds):
                for t in threads:
                    for name, tree in (trees.items() if r % 2 == 0 else reversed(trees.items())):
                        loads.append(os.getloadavg()[0])
                        runs[name, t].append(run_tree(tree, t, args.passes, args.lam)["passes"])
                        print(f"round {r + 1} threads {t} {name}: "
                              f"{sum(p['seconds'] for p in runs[name, t][-1]):.2f} s", flush=True)
        finally:
            if args.against:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees[rev])], cwd=ROOT)

    names = list(trees)
    rows = []
    for t in threads:
        seconds = {name: statistics.median(sum(p["seconds"] for p in run) for run in runs[name, t]) for name in names}
        equal = diff = None
        if len(names) == 2:
            rel = [max(abs(x[k] - y[k]) / max(abs(y[k]), 1e-300) for k in ("primal", "dual", "gap"))
                   for x, y in zip(runs[names[0], t][0], runs[names[1], t][0])]
            equal = next((i for i, r in enumerate(rel) if r > 1e-12), len(rel))
            diff = max(rel)
        rows.append({"threads": t, "seconds": seconds, "passes_equal_to_1e-12": equal,
                     "max_relative_certificate_difference": diff})
    results = {"machine": cpu_description(), "code": code_version(), "against": names[1:] or None,
               "start": start, "passes": args.passes, "rounds": args.rounds, "lam": args.lam,
               "load_average": [min(loads), max(loads)], "rows": rows,
               "runs": {f"{name} / {t} threads": v for (name, t), v in runs.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nslack_pass.json").write_text(json.dumps(results, indent=1))

    lines = ["# n-slack cutting plane: seconds per pass on OCR-small", "",
             f"Command: `python scripts/bench_nslack_pass.py{' --against ' + args.against if args.against else ''}"
             f" --passes {args.passes} --rounds {args.rounds}`; {results['machine']}; code {results['code']}; "
             f"{start}; load average {min(loads):.1f}-{max(loads):.1f}. `NSlackCuttingPlane(lam={args.lam:g}, "
             f"seed=0)` (pairwise QP moves), one process per run, the trees alternating. Seconds: passes 2 to "
             f"{args.passes + 1} together, the median over the rounds.", ""]
    head = "| threads | " + " | ".join(f"{n} (s)" for n in names)
    if len(names) == 2:
        head += (f" | {names[1]} / this checkout | timed passes whose primal, dual and gap agree to 1e-12 | "
                 "largest relative difference")
    lines += [head + " |", "|---" * (len(names) + 1 + 3 * (len(names) == 2)) + "|"]
    for row in rows:
        sp = row["seconds"]
        line = f"| {row['threads']} | " + " | ".join(f"{sp[n]:.2f}" for n in names)
        if len(names) == 2:
            line += (f" | {sp[names[1]] / sp[names[0]]:.2f}x | the first {row['passes_equal_to_1e-12']} of "
                     f"{args.passes} | {row['max_relative_certificate_difference']:.1e}")
        lines.append(line + " |")
    write_report(args.out, "nslack_pass", lines)


if __name__ == "__main__":
    main()
