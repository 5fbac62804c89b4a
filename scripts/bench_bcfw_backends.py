"""What the compiled kernels buy a BCFW pass: seconds per pass with ``backend="torch"`` against ``"auto"``.

``"auto"`` runs, on the CPU, the numba twins of the chain kernels (Viterbi, the scores of labellings and of
marginals, the one-hot marginals), of the sparse attributes' potentials, Gram rows and update of ``w``, and of the
block step; the rest of the step (cache tests, the dense products, the small vector sums) stays torch. On CUDA it
runs the Triton kernels (the chain kernels and the step's bookkeeping). Everything else is the same: data, seed,
batch size, configuration. Two configurations on OCR-large (lambda 1e-3) and CoNLL-2000 chunking (1e-2): the paper's
(uniform sampling, FW steps, no cache: every block visit decodes) and the time-to-gap one (gap sampling, pairwise
steps, a cache of 10, an exact gap pass every 5 passes: most visits hit the cache). Each cell runs one warm-up pass,
then ``--passes`` passes timed by the solver's own clock; torch and auto alternate twice and each keeps its faster
run, so that a drift of the machine hits both. A second table times an exact duality gap pass (``duality_gap()``: n
oracle calls, what certifies a gap) after one pass at B = 64.

The duals reached are compared, not asserted: the compiled score sums run in a fixed order and torch's reductions
in their own, so scores differ at rounding level, and the sampling and cache decisions, which compare scores, can
make two runs part after a few passes (the Triton kernels' runs likewise).

    python scripts/bench_bcfw_backends.py                          # CPU -> docs/benchmarks/bcfw_backends.md
    python scripts/bench_bcfw_backends.py --device cuda --out DIR  # GPU -> bcfw_backends_cuda.md
    python scripts/bench_bcfw_backends.py --report-only [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _bench_machine import code_version, device_description, measured_or_saved, write_report
from bench_bcfw_speed import SETTINGS, load

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
CONFIGS = {
    "paper": {"sampling": "uniform", "step": "fw", "cache_size": 0, "gap_check_every": 0},
    "time-to-gap": {"sampling": "gap", "step": "pairwise", "cache_size": 10, "gap_check_every": 5},
}


def seconds_per_pass(train, lam: float, B: int, config: dict, backend: str, passes: int, device) -> tuple:
    """Solver seconds per pass after one warm-up pass, and the dual value reached."""
    import torchssvm as ts

    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, dtype=torch.float64,
                                device=device)
    solver = ts.optim.BCFW(model, train, lam=lam, batch_size=B, seed=0, backend=backend, **config)
    solver.step()
    start = solver.seconds
    for _ in range(passes):
        r = solver.step()
    return (solver.seconds - start) / passes, r["dual"]


def exact_pass_seconds(train, lam: float, backend: str, device, repeats: int = 3) -> tuple:
    """Seconds of one exact gap pass (the fastest of ``repeats``) after one pass of the time-to-gap configuration
    at B = 64, and the gap."""
    import torchssvm as ts

    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, dtype=torch.float64,
                                device=device)
    solver = ts.optim.BCFW(model, train, lam=lam, batch_size=64, seed=0, backend=backend,
                           **{**CONFIGS["time-to-gap"], "gap_check_every": 0})
    solver.step()
    best, gap = float("inf"), None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        gap = solver.duality_gap()["gap"]  # reads the gap: the device has finished
        best = min(best, time.perf_counter() - t0)
    return best, gap


def measure(args, device) -> dict:
    import torchssvm as ts

    auto = ts.kernels.resolve("viterbi", "auto", device)
    results = {"device": device_description(device), "torch": torch.__version__, "code": code_version(),
               "threads": torch.get_num_threads(), "auto": auto, "passes": args.passes, "rows": [], "exact": []}
    for name in args.settings:
        train = load(name).to(device)
        times, gaps = {"torch": [], "auto": []}, {}
        for backend in ("torch", "auto", "torch", "auto"):
            seconds, gaps[backend] = exact_pass_seconds(train, SETTINGS[name], backend, device)
            times[backend].append(seconds)
        results["exact"].append({"data": name, "lam": SETTINGS[name], "n": len(train), "torch": min(times["torch"]),
                                 "auto": min(times["auto"]), "gap_torch": gaps["torch"], "gap_auto": gaps["auto"]})
        print(f"{name} exact pass: {json.dumps(results['exact'][-1])}", flush=True)
        for config_name, config in CONFIGS.items():
            for B in args.batch_sizes:
                runs = {"torch": [], "auto": []}
                duals = {}
                for backend in ("torch", "auto", "torch", "auto"):
                    t0 = time.perf_counter()
                    spp, dual = seconds_per_pass(train, SETTINGS[name], B, config, backend, args.passes, device)
                    runs[backend].append(spp)
                    duals[backend] = dual
                    print(f"{name} {config_name} B={B} {backend}: {spp:.3f} s/pass "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)
                results["rows"].append({
                    "data": name, "lam": SETTINGS[name], "config": config_name, "batch_size": B,
                    "torch": min(runs["torch"]), "auto": min(runs["auto"]), "runs": runs,
                    "dual_torch": duals["torch"], "dual_auto": duals["auto"]})
    return results


def _relative_difference(a: float, b: float) -> str:
    return "0 (bitwise)" if a == b else f"{abs(a - b) / max(abs(a), abs(b)):.0e}"


def write(results: dict, out: Path, cuda: bool) -> None:
    names = {"numba": "numba twins of the chain kernels", "triton": "Triton kernels"}
    auto = names.get(results["auto"], results["auto"])
    lines = ["# BCFW passes: torch kernels against what `backend=\"auto\"` runs", "",
             f"Command: `python scripts/bench_bcfw_backends.py{' --device cuda' if cuda else ''}`; "
             f"{results['device']}, {results['threads']} torch threads; torch {results['torch']}; code "
             f"{results['code']}. `auto` runs the {auto} here. Seconds per pass: solver seconds over "
             f"{results['passes']} passes after a warm-up pass, the faster of two runs per backend (alternated); "
             "float64, seed 0. *paper*: uniform sampling, FW steps, no cache. *time-to-gap*: gap sampling, pairwise "
             "steps, cache of 10, an exact gap pass every 5 passes.", "",
             "| data | configuration | B | torch (s / pass) | auto (s / pass) | torch / auto | "
             "duals' relative difference |",
             "|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        same = _relative_difference(r["dual_torch"], r["dual_auto"])
        lines.append(f"| {r['data']} (lambda {r['lam']:g}) | {r['config']} | {r['batch_size']} | {r['torch']:.3f} | "
                     f"{r['auto']:.3f} | {r['torch'] / r['auto']:.2f}x | {same} |")
    ratios = [r["torch"] / r["auto"] for r in results["rows"]]
    lines += ["", f"Across the table, `auto` takes {min(ratios):.2f}x to {max(ratios):.2f}x less time per pass than "
              "torch's kernels.", "",
              "## An exact duality gap pass (n oracle calls)", "",
              "`duality_gap()` after one pass of the time-to-gap configuration at B = 64: the fastest of 3 calls, "
              "the faster of two solvers per backend (alternated).", "",
              "| data | n | torch (s) | auto (s) | torch / auto | gaps' relative difference |",
              "|---|---|---|---|---|---|"]
    for r in results["exact"]:
        same = _relative_difference(r["gap_torch"], r["gap_auto"])
        lines.append(f"| {r['data']} (lambda {r['lam']:g}) | {r['n']} | {r['torch']:.3f} | {r['auto']:.3f} | "
                     f"{r['torch'] / r['auto']:.2f}x | {same} |")
    write_report(out, "bcfw_backends_cuda" if cuda else "bcfw_backends", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    results = measured_or_saved(args.out / f"bcfw_backends{'_cuda' if cuda else ''}.json", args.report_only,
                                lambda: measure(args, device))
    write(results, args.out, cuda)


if __name__ == "__main__":
    main()
