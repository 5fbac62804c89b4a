"""Time to a certified duality gap: mini-batch BCFW (on CPU or a GPU) against the sequential solver on CPU.

Issue 4's GPU target is the time to a duality gap of 1e-3 on OCR-large (lambda 1e-3), at least 50x lower
on a GPU than with the sequential solver (B = 1) on the CPU. Each run here is one BCFW configuration, the
one that converges fastest at this gap on the 2-core CPU (gap sampling, pairwise steps, a cache of 10
labellings per block, an exact gap every 5 passes; seed 0), with ``batch_size`` B in ``--batch-sizes``,
stopped by ``fit(gap_tol=...)`` on the first exact gap <= ``--tol`` or after ``--budget`` solver seconds.
The time to the gap is the solver's own seconds, the exact gap passes that certify it included: it is the
time a user waits for the certificate.

The sequential reference is B = 1 of that same configuration, not the paper's uniform FW steps without a
cache: that one is two orders of magnitude slower here (``docs/benchmarks/bcfw_time_to_gap.md``), so a
ratio against it would say nothing about the mini-batch path.

    python scripts/bench_bcfw_time_to_gap.py                          # CPU: B = 1, 16, 64, 256
    python scripts/bench_bcfw_time_to_gap.py --device cuda --out DIR   # GPU: B = 64, 128, 256, ratio to
                                                                       # the CPU's B = 1 in docs/benchmarks
    python scripts/bench_bcfw_time_to_gap.py --report-only [--device cuda --out DIR]

Writes ``bcfw_time_to_gap{,_cuda}.{json,md,png}``; ``bcfw_time_to_gap_findings.md`` (hand-written) is
appended to the CPU report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from _bench_machine import code_version, style_gap_axes
from bench_bcfw_speed import SETTINGS, load, machine  # the same data sets, lambdas and machine line

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
CONFIG = {"sampling": "gap", "step": "pairwise", "cache_size": 10, "gap_check_every": 5}


def run(train, lam: float, B: int, tol: float, budget: float, device: torch.device, seed: int) -> dict:
    """One run to the first exact gap <= ``tol`` (or ``budget`` solver seconds): the exact gaps as
    ``(effective passes, solver seconds, gap)``, the time to ``tol`` (None if not reached) and the wall time."""
    import torchssvm as ts

    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, dtype=torch.float64,
                                device=device)
    solver = ts.optim.BCFW(model, train.to(device), lam=lam, batch_size=B, seed=seed, **CONFIG)
    curve = []

    def record(r):
        if r["gap_exact"]:
            curve.append((r["passes"], r["time"], r["gap"]))
            print(f"  B={B}: gap {r['gap']:.3e} after {r['passes']:.1f} effective passes, {r['time']:.1f} s",
                  flush=True)

    t0 = time.perf_counter()
    last = solver.fit(gap_tol=tol, time_budget=budget, callback=record)[-1]
    wall = time.perf_counter() - t0
    reached = last["gap_exact"] and last["gap"] <= tol
    return {"batch_size": B, "curve": curve, "time_to_tol": last["time"] if reached else None,
            "passes": last["passes"], "visit_passes": solver.steps_done, "gap": last["gap"],
            "primal": last["primal"], "cache_hit_rate": last["cache_hit_rate"], "wall": wall, "budget": budget}


def _reference(results: dict, name: str, reference: dict | None):
    """The sequential CPU run (B = 1) of ``name`` at the same tolerance: from this run's results on CPU, else
    from ``reference``."""
    for source in (results, reference):
        if source and source["meta"]["device"] == "cpu" and source["meta"]["tol"] == results["meta"]["tol"]:
            base = next((r for r in source["settings"].get(name, []) if r["batch_size"] == 1), None)
            if base is not None:
                return base, source["meta"]["machine"]
    return None, None


def _speedup(r: dict, base: dict | None):
    """How many times less time than the sequential reference ``base`` run ``r`` took to the gap (None if
    either did not reach it)."""
    if base is None or not base["time_to_tol"] or not r["time_to_tol"]:
        return None
    return base["time_to_tol"] / r["time_to_tol"]


def report(results: dict, out: Path, reference: dict | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = results["meta"]
    tol = meta["tol"]
    cfg = ", ".join(f"{k} {v}" for k, v in meta["config"].items())
    lines = [f"# Mini-batch BCFW: time to a certified duality gap of {tol:g}", "",
             f"BCFW with {cfg}, float64, seed 0, stopped on the first exact gap <= {tol:g} (or the budget). "
             "Time is the solver's own seconds, the exact gap passes that certify the gap included. "
             f"Produced by `{('python scripts/bench_bcfw_time_to_gap.py ' + meta['args']).strip()}`.", "",
             f"Machine: {meta['machine']}; code {meta['code']}.", ""]
    targets = []
    for name, runs in results["settings"].items():
        lam = SETTINGS[name]
        base, base_machine = _reference(results, name, reference)
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        lines += [f"## {name}, lambda = {lam:g}", "", f"![{name}](bcfw_time_to_gap_{name}{meta['suffix']}.png)", ""]
        if base is not None and meta["device"] != "cpu":
            lines += [f"Sequential reference (B = 1, CPU): {base_machine}.", ""]
        lines += ["| device | B | time to gap (s) | effective passes | passes over the blocks | cache hit rate | "
                  "final gap | speed-up vs CPU B = 1 |", "|---|---|---|---|---|---|---|---|"]
        shown = ([("CPU", base)] if base is not None and meta["device"] != "cpu" else []) + \
                [(meta["device"].upper(), r) for r in runs]
        for i, (dev, r) in enumerate(shown):
            label = f"{dev} B = {r['batch_size']}" + ("" if r["curve"] else " (no exact gap)")
            for j, ax in enumerate(axes):
                ax.plot([c[j] for c in r["curve"]], [c[2] for c in r["curve"]], marker=".", color=f"C{i}",
                        label=label)
            t, speed = r["time_to_tol"], _speedup(r, base)
            when = f"{t:.1f}" if t else f"not reached in {r['budget']:g}"
            lines.append(f"| {dev} | {r['batch_size']} | {when} | {r['passes']:.1f} | {r['visit_passes']} | "
                         f"{r['cache_hit_rate']:.2f} | {r['gap']:.2e} | "
                         f"{'-' if speed is None else f'{speed:.1f}x'} |")
        for ax in axes:
            ax.axhline(tol, color="grey", lw=0.8, ls=":")
        style_gap_axes(axes)
        if any(r["curve"] for _, r in shown):  # a log axis without a point fails to draw
            axes[1].set_xscale("log")
        fig.suptitle(f"{name}, lambda = {lam:g}: BCFW to a gap of {tol:g} ({meta['machine'].split(';')[1].strip()})")
        fig.tight_layout()
        fig.savefig(out / f"bcfw_time_to_gap_{name}{meta['suffix']}.png", dpi=110)
        plt.close(fig)
        lines.append("")
        best = max(((r["batch_size"], _speedup(r, base)) for r in runs if r["batch_size"] != 1 and _speedup(r, base)),
                   key=lambda b: b[1], default=None)
        if best is not None:
            goal = " (issue 4's GPU target: >= 50x)" if meta["device"] == "cuda" and name == "ocr-large" else ""
            met = "" if not goal else (": met" if best[1] >= 50 else ": not met")
            targets.append(f"- {name}: fastest B = {best[0]} on {meta['device'].upper()}, {best[1]:.1f}x less "
                           f"time to a gap of {tol:g} than B = 1 on the CPU{goal}{met}.")
    if targets:
        lines += ["## Summary", ""] + targets + [""]
    findings = out / f"bcfw_time_to_gap{meta['suffix']}_findings.md"
    if findings.exists():
        lines.append(findings.read_text())
    path = out / f"bcfw_time_to_gap{meta['suffix']}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", nargs="*", default=["ocr-large"], choices=list(SETTINGS))
    ap.add_argument("--batch-sizes", nargs="*", type=int, default=None,
                    help="default: 1 16 64 256 on CPU, 64 128 256 on CUDA (B = 1024's gap after 20 passes is "
                    "2.3x B = 1's on OCR-large: bcfw_speed.md)")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--budget", type=float, default=3600.0, help="solver seconds per run")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--reference", type=Path, default=OUT / "bcfw_time_to_gap.json",
                    help="the CPU results whose B = 1 runs a GPU run is compared with")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    suffix = "" if device.type == "cpu" else f"_{device.type}"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bcfw_time_to_gap{suffix}.json"
    reference = json.loads(args.reference.read_text()) if args.reference.exists() else None
    if args.report_only:
        report(json.loads(path.read_text()), args.out, reference)
        return
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device available")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = args.batch_sizes or ([1, 16, 64, 256] if device.type == "cpu" else [64, 128, 256])
    results = {"meta": {"machine": machine(device), "device": device.type, "suffix": suffix, "tol": args.tol,
                        "config": CONFIG, "code": code_version(), "args": " ".join(sys.argv[1:])}, "settings": {}}
    if path.exists():  # keep the runs not redone now, when measured on the same machine at the same tolerance
        old = json.loads(path.read_text())
        if old["meta"]["machine"] != results["meta"]["machine"] or old["meta"]["tol"] != args.tol:
            sys.exit(f"{path} holds runs from {old['meta']['machine']!r} at tol {old['meta']['tol']}; "
                     "pass another --out")
        results["settings"] = old["settings"]
        results["meta"]["args"] = "; ".join(dict.fromkeys([old["meta"]["args"], results["meta"]["args"]]))
    for name in args.settings:
        train = load(name)
        kept = [r for r in results["settings"].get(name, []) if r["batch_size"] not in sizes]
        results["settings"][name] = kept
        for B in sizes:
            r = run(train, SETTINGS[name], B, args.tol, args.budget, device, args.seed)
            results["settings"][name] = sorted(results["settings"][name] + [r], key=lambda r: r["batch_size"])
            t = r["time_to_tol"]
            print(f"{name} B={B}: " + (f"gap {args.tol:g} certified in {t:.1f} s" if t else
                                       f"gap {r['gap']:.2e} after the budget") +
                  f", {r['passes']:.1f} effective passes ({r['wall']:.0f} s wall)", flush=True)
            path.write_text(json.dumps(results))
    report(results, args.out, reference)


if __name__ == "__main__":
    main()
