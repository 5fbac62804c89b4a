"""The BCFW comparison of "Minding the gaps" (Osokin et al., 2016, Figs. 3, 5-6) on our CPU: 8 methods x 5 seeds.

Settings: OCR-large and CoNLL-2000 chunking (linear chains, cheap oracles), and ``pose:1e-2``, pictorial
structures on 300 articulated `synthetic_pose` examples at 32x32 (`SpatialTreeProblem` with the positivity
box; the data of `bench_pose_mixture.py`), whose distance-transform oracle is the expensive kind of the
paper's LSP experiment.

Methods: {uniform, gap sampling} x {BCFW, BCPFW (pairwise)} x {no cache, cache of 50}. For every run
the exact duality gap is computed after each pass (outside the timed solver time, not counted as oracle
calls), against effective passes (oracle calls / n) and solver seconds. Each run is written to
``docs/benchmarks/bcfw_runs/<setting>_<method>_<seed>.json`` (existing files are skipped, so the script
resumes), then ``--report-only`` (or the end of a run) writes ``docs/benchmarks/bcfw.md`` and PNG plots.

Each run stops at ``--max-passes`` effective passes or at its solver-time budget (``--time-budget``,
default per setting in ``BUDGET``), and every run also stops at the wall-clock ``--deadline`` (seconds
from the script's start) so that a batch of runs fits a fixed slot; a run cut there is kept with the
passes it made (``"cut": true``).

    python scripts/bench_bcfw.py --jobs 16 --settings ocr-large:1e-3 --runs-dir /tmp/runs --deadline 560
    python scripts/bench_bcfw.py --report-only
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from _bench_machine import cpu_description, style_gap_axes

# One thread per run, numba's too (the pose oracle): two runs' thread pools on the same cores made each
# 7x slower in a trial with --jobs 2.
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
RUNS = OUT / "bcfw_runs"
SETTINGS = ("ocr-large:1e-4", "ocr-large:1e-3", "ocr-large:1e-1", "conll:1e-2", "pose:1e-2")
BUDGET = {"ocr-large:1e-4": 65.0, "ocr-large:1e-3": 65.0, "ocr-large:1e-1": 30.0, "conll:1e-2": 150.0,
          "pose:1e-2": 40.0}
POSE = {"height": 32, "width": 32, "limb_modes": 2, "limb_angle": 1.5, "miss_rate": 0.5, "seed": 0}
TEST = {"conll": ("test_chunk_f1", "test chunk F1"), "pose": ("test_lsp_loss", "test LSP loss")}
METHODS = [f"{s}-{st}{'-cache' if c else ''}" for s, st, c in
           itertools.product(("uniform", "gap"), ("fw", "pairwise"), (False, True))]
LABEL = {"uniform": "uniform", "gap": "gap", "fw": "BCFW", "pairwise": "BCPFW"}
_DATA = {}


def method_kwargs(method: str) -> dict:
    parts = method.split("-")
    return {"sampling": parts[0], "step": parts[1], "cache_size": 50 if "cache" in parts else 0}


def load(setting: str):
    name = setting.split(":")[0]
    if name not in _DATA:
        import torchssvm as ts

        if name == "ocr-large":
            _DATA[name] = (ts.data.ocr("train", "large"), ts.data.ocr("test", "large"))
        elif name == "conll":
            _DATA[name] = (ts.data.conll2000("train", "chunk", min_count=3),
                           ts.data.conll2000("test", "chunk", min_count=3))
        elif name == "pose":
            _DATA[name] = (ts.data.synthetic_pose("train", 300, **POSE), ts.data.synthetic_pose("test", 300, **POSE))
        else:
            raise ValueError(setting)
    return _DATA[name]


def machine() -> str:
    return f"{cpu_description()}, torch {torch.__version__}, 1 thread per run"


def run_one(job) -> str:
    setting, method, seed, max_passes, budget, runs_dir, deadline = job
    path = runs_dir / f"{setting.replace(':', '_')}_{method}_{seed}.json"
    if path.exists():
        return f"skip {path.name}"
    torch.set_num_threads(1)
    import torchssvm as ts
    from torchssvm.evaluation import evaluate_chain

    train, test = load(setting)
    lam = float(setting.split(":")[1])
    if setting.startswith("pose"):
        problem = ts.optim.SpatialTreeProblem(train)
        solver = ts.optim.BCFW(problem, lam=lam, box=problem.positivity_box(), seed=seed, **method_kwargs(method))
    else:
        model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse)
        solver = ts.optim.BCFW(model, train, lam=lam, seed=seed, **method_kwargs(method))
    g0 = solver.duality_gap()
    trace = [{"passes": 0.0, "time": 0.0, "gap": g0["gap"], "primal": g0["primal"], "estimate": math.inf,
              "cache_hit_rate": 0.0}]
    cut = False
    while True:
        r = solver.step()
        g = solver.duality_gap()
        trace.append({"passes": r["passes"], "time": r["time"], "gap": g["gap"], "primal": g["primal"],
                      "estimate": r["gap"], "cache_hit_rate": r["cache_hit_rate"]})
        if r["passes"] >= max_passes or r["time"] >= budget:
            break
        if time.time() >= deadline:
            cut = True
            break
    if setting.startswith("pose"):
        ev = solver.problem.evaluate(solver.w, test)
        tests = {"test_lsp_loss": ev["lsp_loss"], "test_pck": ev["pck"]}
    else:
        ev = evaluate_chain(model, solver.problem.structure, test)
        tests = {"test_token_error": ev["token_error"], "test_chunk_f1": ev.get("chunk_f1")}
    result = {"setting": setting, "method": method, "seed": seed, "lam": lam, "n": train.__len__(),
              "d": solver.problem.d, "trace": trace, **tests, "machine": machine(), "budget": budget, "cut": cut}
    runs_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return f"done {path.name}: gap {trace[-1]['gap']:.3e} after {trace[-1]['passes']:.1f} passes, {r['time']:.0f}s"


# -- report --------------------------------------------------------------------------------------
def _grid_median(runs, key, grid):
    """Median, min and max over runs of log-interpolated gaps on ``grid`` (points past a run's end: nan)."""
    import numpy as np

    rows = []
    for run in runs:
        xs = np.array([t[key] for t in run["trace"]])
        ys = np.log10(np.maximum([t["gap"] for t in run["trace"]], 1e-16))
        row = np.interp(grid, xs, ys, right=np.nan)
        rows.append(row)
    a = np.array(rows)
    with np.errstate(all="ignore"):
        return 10 ** np.nanmedian(a, 0), 10 ** np.nanmin(a, 0), 10 ** np.nanmax(a, 0)


def report() -> None:
    runs = [json.loads(p.read_text()) for p in sorted(RUNS.glob("*.json"))]
    if not runs:
        sys.exit("no runs in docs/benchmarks/bcfw_runs")
    lines = ["# BCFW variants on OCR-large, CoNLL-2000 and pictorial structures (CPU)", "",
             "The comparison of \"Minding the gaps\" (Osokin et al., 2016, Fig. 3): {uniform, gap} sampling x "
             "{BCFW, BCPFW} x {no cache, cache of 50}, 5 seeds each (pose: 3). Exact duality gap after every pass "
             "(computed outside the timed solver time), against effective passes (oracle calls / n; cache hits are "
             "free, the exact-gap passes of gap sampling count) and solver seconds. Curves: median (line) and min-max "
             "(band) over seeds. Produced by `python scripts/bench_bcfw.py`; raw traces in `bcfw_runs/`.", "",
             f"Machine: {runs[0]['machine']}. Solver-time budget per run (seconds): "
             + ", ".join(f"{k} {v:g}" for k, v in BUDGET.items()) + "; these are short horizons (2 to 8 "
             "effective passes, against the paper's hundreds): see the findings at the end.", ""]
    summary = {}
    lines += _sections(runs, "", summary)
    long_runs = [json.loads(p.read_text()) for p in sorted((OUT / "bcfw_runs_long").glob("*.json"))]
    if long_runs:
        lines += ["# Longer runs (one seed)", "",
                  "The same eight methods with a longer budget, one seed (raw traces in `bcfw_runs_long/`). "
                  f"Machine: {long_runs[0]['machine']}; budget {long_runs[0]['budget']:g} solver seconds per run.",
                  ""]
        lines += _sections(long_runs, "_long", summary)
    extra = OUT / "bcfw_findings.md"
    if extra.exists():
        lines += [extra.read_text()]
    (OUT / "bcfw.md").write_text("\n".join(lines) + "\n")
    (OUT / "bcfw.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {OUT / 'bcfw.md'}")


def _sections(runs, suffix: str, summary: dict) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lines = []
    for setting in SETTINGS:
        sr = [r for r in runs if r["setting"] == setting]
        if not sr:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        rows = []
        for mi, method in enumerate(METHODS):
            mr = [r for r in sr if r["method"] == method]
            if not mr:
                continue
            parts = method.split("-")
            label = f"{LABEL[parts[0]]} {LABEL[parts[1]]}{' + cache' if 'cache' in parts else ''}"
            style = {"color": f"C{mi}", "linestyle": "-" if parts[0] == "gap" else "--"}
            for ax, key in zip(axes, ("passes", "time")):
                end = min(r["trace"][-1][key] for r in mr)
                grid = np.linspace(0, end, 60)
                med, lo, hi = _grid_median(mr, key, grid)
                ax.plot(grid, med, label=label, **style)
                ax.fill_between(grid, lo, hi, color=style["color"], alpha=0.15)
            common = min(r["trace"][-1]["passes"] for r in mr)
            at = [_grid_median([r], "passes", np.array([common]))[0][0] for r in mr]
            per_pass = [r["trace"][-1]["time"] / max(r["trace"][-1]["passes"], 1e-9) for r in mr]
            err_key, test_name = TEST.get(setting.split(":")[0], ("test_token_error", "test letter error"))
            errs = [r[err_key] for r in mr]
            rows.append((label, common, float(np.median(at)), float(np.min(at)), float(np.max(at)),
                         float(np.median(per_pass)), float(np.median([r["trace"][-1]["cache_hit_rate"] for r in mr])),
                         float(np.median(errs)), len(mr)))
            summary.setdefault(setting + suffix, {})[method] = {"passes": common, "gap_median": float(np.median(at)),
                                                       "seconds_per_pass": float(np.median(per_pass)),
                                                       "test": float(np.median(errs))}
        style_gap_axes(axes, legend_size=8)
        name, lam = setting.split(":")
        fig.suptitle(f"{name}, lambda = {lam} (n = {sr[0]['n']}, d = {sr[0]['d']})")
        fig.tight_layout()
        png = f"bcfw_{name}_{lam}{suffix}.png"
        fig.savefig(OUT / png, dpi=110)
        plt.close(fig)
        lines += [f"## {name}, lambda = {lam}{' (longer run)' if suffix else ''}", ""]
        if sr[0]["machine"] != runs[0]["machine"]:
            lines += [f"Machine: {sr[0]['machine']}; budget {sr[0]['budget']:g} solver seconds per run.", ""]
        lines += [f"![{setting}]({png})", "",
                  f"| method | passes | gap (median) | gap (min..max) | s / pass | cache hit rate | {test_name} | "
                  "seeds |", "|---|---|---|---|---|---|---|---|"]
        for label, common, med, lo, hi, spp, hit, err, k in rows:
            errs = {"conll": f"{err:.2f}", "pose": f"{err:.4f}"}.get(setting.split(":")[0], f"{100 * err:.2f}%")
            lines.append(f"| {label} | {common:.1f} | {med:.3e} | {lo:.2e}..{hi:.2e} | {spp:.1f} | {hit:.2f} | {errs} "
                         f"| {k} |")
        lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS))
    ap.add_argument("--methods", nargs="*", default=METHODS)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-passes", type=float, default=200.0)
    ap.add_argument("--time-budget", type=float, default=None,
                    help="solver seconds per run (default: BUDGET of the setting)")
    ap.add_argument("--deadline", type=float, default=math.inf,
                    help="wall-clock seconds from the start after which every run stops at its next pass")
    ap.add_argument("--runs-dir", type=Path, default=None, help="where run JSONs go (default: docs/benchmarks/...)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--long", action="store_true", help="write to bcfw_runs_long/ (the one-seed longer runs)")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    runs_dir = args.runs_dir or (OUT / "bcfw_runs_long" if args.long else RUNS)
    if not args.report_only:
        deadline = time.time() + args.deadline
        # longest runs first, so that the pool's tail is short
        jobs = [(s, m, seed, args.max_passes, args.time_budget or BUDGET[s], runs_dir, deadline)
                for s in sorted(args.settings, key=lambda s: -BUDGET[s])
                for seed in range(args.seeds) for m in args.methods]
        torch.set_num_threads(1)  # before any parallel region: OpenMP does not survive a fork
        for s in args.settings:
            load(s)  # before the fork: workers share the data
        t0 = time.perf_counter()
        if args.jobs > 1:
            import multiprocessing as mp

            with mp.get_context("fork").Pool(args.jobs, maxtasksperchild=None) as pool:
                for msg in pool.imap(run_one, jobs):
                    print(f"[{time.perf_counter() - t0:7.0f}s] {msg}", flush=True)
        else:
            for job in jobs:
                print(f"[{time.perf_counter() - t0:7.0f}s] {run_one(job)}", flush=True)
    if runs_dir in (RUNS, OUT / "bcfw_runs_long"):
        report()


if __name__ == "__main__":
    main()
