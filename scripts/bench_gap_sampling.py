"""Gap per pass of the host-free step (device sampling: Gumbel-top-k, the device QP) against the host step.

Both steps draw the blocks from the same law (draws without replacement proportional to the gap estimates,
unseen blocks first), from different random numbers; the host-free step also pads every batch to the longest
sequence and runs BCFW's host-free number of QP iterations. This runs both on the CPU for a few seeds and reports
the exact gap after each exact pass, averaged over the seeds, and the ratio (goal: within 1.1x).

    python scripts/bench_gap_sampling.py --out DIR [--setting ocr-large --batch-size 64 --passes 10 --seeds 3]

Writes ``gap_sampling.{json,md}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _bench_machine import code_version
from bench_bcfw_speed import SETTINGS, load, machine

CONFIG = {"sampling": "gap", "step": "pairwise", "cache_size": 10, "gap_check_every": 2}


def run(train, lam, B, passes, seed, host_free) -> dict:
    import torchssvm as ts

    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, dtype=torch.float64)
    solver = ts.optim.BCFW(model, train, lam=lam, batch_size=B, seed=seed, host_free=host_free, **CONFIG)
    t0 = time.perf_counter()
    curve = [(r["passes"], r["gap"]) for r in solver.fit(max_passes=passes) if r["gap_exact"]]
    return {"curve": curve, "seconds": time.perf_counter() - t0, "qp_unconverged": solver.qp_unconverged}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default="ocr-large", choices=list(SETTINGS))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--passes", type=float, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    train, lam = load(args.setting), SETTINGS[args.setting]
    runs = {"host": [], "host_free": []}
    for seed in range(args.seeds):  # interleaved: the machine's load falls on both alike
        for name in runs:
            r = run(train, lam, args.batch_size, args.passes, seed, name == "host_free")
            runs[name].append(r)
            print(name, seed, r["curve"][-1], f"{r['seconds']:.1f} s", flush=True)
    mean = {name: [sum(r["curve"][k][1] for r in rs) / len(rs) for k in range(min(len(r["curve"]) for r in rs))]
            for name, rs in runs.items()}
    passes = [p for p, _ in runs["host"][0]["curve"]]
    results = {"meta": {"machine": machine(torch.device("cpu")), "code": code_version(),
                        "date": time.strftime("%Y-%m-%d"), "setting": args.setting, "lam": lam,
                        "batch_size": args.batch_size, "seeds": args.seeds, "config": CONFIG}, "runs": runs,
               "mean_gap": mean}
    (args.out / "gap_sampling.json").write_text(json.dumps(results, indent=1))
    lines = [f"# Gap per pass: host-free step against the host step ({args.setting}, lambda {lam:g}, "
             f"B = {args.batch_size}, {args.seeds} seeds)", "",
             f"Machine: {results['meta']['machine']}. Code: {results['meta']['code']}. Date: "
             f"{results['meta']['date']}. {CONFIG}.", "",
             "| effective passes | exact gap, host step | exact gap, host-free step | ratio |", "|---|---|---|---|"]
    for k in range(min(len(mean["host"]), len(mean["host_free"]))):
        a, b = mean["host"][k], mean["host_free"][k]
        lines.append(f"| {passes[k]:.1f} | {a:.4e} | {b:.4e} | {b / a:.3f} |")
    (args.out / "gap_sampling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
