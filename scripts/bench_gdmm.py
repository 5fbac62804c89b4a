"""GDMM against BCFW and SSG (Yen et al., 2016): primal objective and test error against solver time.

    TORCHSSVM_DATA=../shared/data python scripts/bench_gdmm.py --data large --K 1000 --budget 120
    TORCHSSVM_DATA=../shared/data python scripts/bench_gdmm.py --data pos --budget 600 --rho 0.1 --batch 64
    TORCHSSVM_DATA=../shared/data python scripts/bench_gdmm.py --data pos --budget 400 --rho 0.1 --methods gdmm-seq

Every solver trains the same SSVM: C = 1 with the per-token Hamming loss (the paper's setting; lam = 1/n
in our convention), on the same machine, one after the other. Solver time excludes evaluation (as the paper
does): after a step that crosses the next checkpoint (checkpoints spaced by a factor ``--spacing`` in solver
time) the exact primal ``P(w)`` (a full Viterbi pass) and the test token error are computed. The report gives,
per solver, the time to reach a primal within 1% (and 0.1%) of the best primal any solver found.
Results merge into ``docs/benchmarks/gdmm.json`` (one entry per data set); ``--report-only`` rewrites
``gdmm.md`` and the plots from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_machine import cpu_description  # noqa: E402
from _sparse_chain_bcfw import SparseChainBCFW  # noqa: E402

import torchssvm as ts  # noqa: E402
from torchssvm.evaluation import evaluate_chain  # noqa: E402
from torchssvm.optim import BCFW, GDMM, SSG  # noqa: E402
from torchssvm.structures import Chain  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
METHODS = ("gdmm", "gdmm-seq", "gdmm-sampled", "soft-bcfw", "bcfw", "bcfw-batched", "bcfw-sparse", "ssg")
GDMMS = ("gdmm", "gdmm-seq", "gdmm-sampled", "soft-bcfw")


def load(args):
    if args.data == "pos":
        train = ts.data.conll2000("train", task="pos")
        test = ts.data.conll2000("test", task="pos")
        if args.n:
            train = train.subset(torch.arange(min(args.n, len(train))))
        return "conll2000-pos", train, test
    kw = {"num_labels": args.K, "num_features": args.D, "seed": args.seed}
    train = ts.data.synthetic_large_chain("train", n=args.n or 1000, **kw)
    test = ts.data.synthetic_large_chain("test", n=args.n_test, **kw)
    return f"large-chain-K{args.K}", train, test


def make(method, args, train):
    model = ts.models.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse,
                                       dtype=torch.float64)
    st = Chain(train.num_labels, normalize=False)
    lam = 1.0 / len(train)
    common = {"structure": st}
    if method in GDMMS:
        # gdmm-seq: the faithful sequential passes (batch_size 1), compiled when numba is installed (K <= 128)
        kw = {"rho": args.rho, "eta": 0.0 if method == "soft-bcfw" else 1.0,
              "batch_size": 1 if method == "gdmm-seq" else args.batch, "primal_every": 0,
              "bigram_update": args.bigram_update}
        if method == "gdmm-sampled":
            kw.update(fmo="sampled", nu=args.nu)
        return model, st, GDMM.from_C(model, train, C=1.0, **kw, **common)
    if method == "bcfw":
        return model, st, BCFW(model, train, lam=lam, gap_check_every=0, **common)
    if method == "bcfw-batched":  # the library's mini-batch BCFW (the exact coordinated step), B = --batch
        return model, st, BCFW(model, train, lam=lam, gap_check_every=0, batch_size=args.batch, **common)
    if method == "bcfw-sparse":  # the same Alg. 4 with sparse transition blocks (K in the thousands)
        return model, st, SparseChainBCFW(model, train, lam, **common)
    return model, st, SSG(model, train, lam=lam, eval_every=0, **common)


@torch.no_grad()
def primal_of(solver, model) -> float:
    if isinstance(solver, GDMM):
        return solver.primal_objective()
    if isinstance(solver, (SSG, SparseChainBCFW)):
        return solver.primal()
    return solver.duality_gap()["primal"]


def checkpointed(solver, args, evaluate, keys, label: str):
    """Step ``solver`` until ``args.budget`` solver seconds. After a step that crosses the next checkpoint
    (``args.first``, then spaced by ``args.spacing``) record ``{"time", **evaluate()}`` (primal, test error: not
    timed) and the step report's ``keys``, and print it. Shared by the GDMM benchmarks. Returns (curve, wall s)."""
    curve, next_t = [], args.first
    wall = time.perf_counter()
    while True:
        r = solver.step()
        t = solver.seconds
        if t >= next_t or t >= args.budget:
            point = {"time": t, **evaluate()}
            if isinstance(r, dict):
                point.update((k, r[k]) for k in keys if r.get(k) is not None)
            curve.append(point)
            print(f"  {label:13s} t={t:8.1f}s  P={point['primal']:.6g}  test err={point['test_error']:.4f}"
                  + (f"  infeas={point['infeasibility']:.2e} |A|={point['active_unigram']:.1f}/"
                     f"{point['active_bigram']:.1f}" if "infeasibility" in point else ""), flush=True)
            next_t = max(next_t * args.spacing, t * args.spacing)
        if t >= args.budget:
            break
    return curve, time.perf_counter() - wall


def run(method, args, train, test):
    model, st, solver = make(method, args, train)

    def evaluate():
        return {"primal": primal_of(solver, model),
                "test_error": evaluate_chain(model, st, test, backend="torch")["token_error"]}

    curve, wall = checkpointed(solver, args, evaluate, ("infeasibility", "active_unigram", "active_bigram",
                                                        "visits_unigram", "visits_bigram", "inner_bigram", "passes"),
                               method)
    out = {"curve": curve, "wall": wall, "budget": args.budget, "threads": args.threads,
           "spacing": args.spacing, "batch": args.batch, "rho": args.rho}
    if isinstance(solver, GDMM):
        out["bigram_update"] = args.bigram_update
    return out


def run_key(method: str, args) -> str:
    """GDMM runs with the exact bigram update are stored as ``<method>/exact`` beside the default (step) ones."""
    return f"{method}/exact" if method in GDMMS and args.bigram_update == "exact" else method


def base_method(key: str) -> str:
    return key.split("/")[0]


def time_to(curve, target):
    return next((p["time"] for p in curve if p["primal"] <= target), None)


def curve_cells(curve, best, at) -> str:
    """The report cells shared by the GDMM benchmarks: time to 1% and 0.1% of ``best``, the best primal by
    each time of ``at``, the final primal, the final test error and the solver seconds."""
    t1, t01 = time_to(curve, best * 1.01), time_to(curve, best * 1.001)
    by = [min((p["primal"] for p in curve if p["time"] <= 1.1 * t), default=None) for t in at]
    by = ["-" if b is None else f"{b:.4g}" for b in by]
    last = curve[-1]
    return (f"{_seconds(t1)} | {_seconds(t01)} | {' | '.join(by)} | {last['primal']:.6g} | "
            f"{last['test_error']:.4f} | {last['time']:.0f}")


def _gdmm_sizes(point) -> str:
    """GDMM's mean active-set sizes and oracle reads (of the last pass before the checkpoint), else "-"."""
    if "active_unigram" not in point:
        return "- | - | -"
    inner = f"{point['inner_bigram']:.2f}" if point.get("inner_bigram") else "-"
    return (f"{point['active_unigram']:.1f} / {point['active_bigram']:.1f} | {point['visits_unigram']:.0f} / "
            f"{point['visits_bigram']:.0f} | {inner}")


def _seconds(t) -> str:
    return "-" if t is None else f"{t:.1f} s"


def report(results: dict) -> None:
    lines = ["# GDMM against BCFW and SSG (issue 9)", "",
             "Generated by `scripts/bench_gdmm.py` (see its docstring for the commands); hand-written findings "
             "are in `gdmm_findings.md`. Primal: the exact SSVM objective `lam/2 ||w||^2 + (1/n) sum_i H_i` "
             "(C = 1, per-token Hamming: lam = 1/n); time: solver seconds, evaluation excluded.", ""]
    for name, entry in results.items():
        runs = entry["runs"]
        best = min(p["primal"] for r in runs.values() for p in r["curve"])
        lines += [f"## {name}", "", f"{entry['machine']}; {entry['setup']}", "",
                  f"Best primal found: {best:.6g}.", "",
                  "| solver | time to 1% | time to 0.1% | primal by 25 s | by 50 s | final primal | final test error "
                  "| solver s | active labels / pairs | entries read per unigram / bigram FMO call "
                  "| face changes per bigram update |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for method, r in runs.items():
            c = r["curve"]
            label = method  # runs made separately may differ from the entry's thread count
            if r.get("threads") and not entry["machine"].endswith(f", {r['threads']} threads"):
                label += f" ({r['threads']} threads)"
            lines.append(f"| {label} | {curve_cells(c, best, (25, 50))} | {_gdmm_sizes(c[-1])} |")
        bcfw = "bcfw" if "bcfw" in runs else "bcfw-sparse"
        base = time_to(runs[bcfw]["curve"], best * 1.01) if bcfw in runs else None
        gdmms = [k for k in runs if base_method(k) in ("gdmm", "gdmm-seq", "gdmm-sampled")]
        g = time_to(runs["gdmm-sampled"]["curve"], best * 1.01) if "gdmm-sampled" in runs else None
        if base and g:
            lines += ["", f"BCFW / GDMM (sampled FMO) time to 1%: {base / g:.1f}x."]
        for fast in gdmms:
            t_fast = time_to(runs[fast]["curve"], best * 1.01) if fast in runs else None
            # only where the fast solver got there before its last checkpoint (the best is not just its last point)
            if bcfw in runs and t_fast and base is None and t_fast < runs[fast]["curve"][-1]["time"]:
                end = runs[bcfw]["curve"][-1]["time"]
                lines += ["", f"{bcfw} never came within 1% of the best in its {end:.0f} solver s; {fast} did by its "
                          f"checkpoint at {t_fast:.1f} s: time to 1% at least {end / t_fast:.1f}x lower (censored)."]
        pairs = [(m, b) for b in (bcfw, "bcfw-batched") for m in gdmms] + [
            (b, m) for b in (bcfw, "bcfw-batched") for m in gdmms if base_method(m) != "gdmm-sampled"]
        for fast, slow in pairs:
            if fast not in runs or slow not in runs:
                continue
            target = runs[slow]["curve"][-1]
            t = time_to(runs[fast]["curve"], target["primal"])
            if t:
                lines += ["", f"{fast} reaches {slow}'s final primal ({target['primal']:.4g} at "
                          f"{target['time']:.0f} s) by its checkpoint at {t:.1f} s: at least "
                          f"{target['time'] / t:.1f}x faster to that objective (checkpoints are coarse, so "
                          "this is a lower bound)."]
        if any(k.endswith("/exact") for k in runs):
            lines += ["", "`/exact`: GDMM with the exact block minimization of every bigram factor on its active set "
                      "(`bigram_update=\"exact\"`); the others use the reference code's update, one projected step "
                      "with an upper bound of the block Hessian (the default for chains)."]
        lines += ["", "A solver reaches \"1% of the best\" only if the best is near convergence: when every curve "
                  "still falls at the end of the budget, read the equal-time columns instead."]
        lines += ["", f"![{name}](gdmm_{name}.png)", ""]
        plot(name, runs, best)
    (OUT / "gdmm.md").write_text("\n".join(lines) + "\n")


def plot(name, runs, best):
    plot_curves(OUT / f"gdmm_{name}.png", runs, name)


def plot_curves(path, runs, title, *, offset=0.0, primal_label="primal objective", error_label="test token error"):
    """Primal objective (minus ``offset``, log-log) and test error against solver time, one line per run;
    shared by the GDMM benchmarks. Skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for method, r in runs.items():
        c = r["curve"]
        t = [p["time"] for p in c]
        ax[0].loglog(t, [p["primal"] - offset for p in c], marker=".", label=method)
        ax[1].semilogx(t, [p["test_error"] for p in c], marker=".", label=method)
    ax[0].set_xlabel("solver seconds")
    ax[0].set_ylabel(primal_label)
    ax[1].set_xlabel("solver seconds")
    ax[1].set_ylabel(error_label)
    ax[0].legend()
    ax[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", choices=("large", "pos"), default="large")
    ap.add_argument("--K", type=int, default=1000)
    ap.add_argument("--D", type=int, default=32)
    ap.add_argument("--n", type=int, default=0, help="training sequences (large: default 1000; pos: all)")
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--budget", type=float, default=120.0, help="solver seconds per method")
    ap.add_argument("--first", type=float, default=2.0, help="first evaluation checkpoint (solver seconds)")
    ap.add_argument("--spacing", type=float, default=1.5)
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--nu", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256, help="GDMM factors per block-Jacobi update")
    ap.add_argument("--bigram-update", choices=("exact", "step"), default="step",
                    help="GDMM's bigram update (exact: the block minimizer on the active set; stored as "
                         "<method>/exact)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="", help="entry name in gdmm.json (default: from the data set)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--json", type=Path, default=OUT / "gdmm.json",
                    help="results file (another one to run methods side by side; merge with --merge)")
    ap.add_argument("--merge", type=Path, nargs="*", default=[],
                    help="merge the runs of these results files into --json, then report")
    args = ap.parse_args()
    path = args.json
    if args.merge:
        results = json.loads(path.read_text()) if path.exists() else {}
        for other in args.merge:
            for name, entry in json.loads(other.read_text()).items():
                merged = results.setdefault(name, {**entry, "runs": {}})
                merged["runs"].update(entry["runs"])
        path.write_text(json.dumps(results, indent=1))
        report(results)
        return
    if args.report_only and path != OUT / "gdmm.json":
        raise SystemExit("--report-only reads docs/benchmarks/gdmm.json")
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.report_only:
        torch.set_num_threads(args.threads)
        name, train, test = load(args)
        name = args.name or name
        print(f"{name}: {len(train)} train / {len(test)} test sequences, {train.num_tokens} tokens, "
              f"K = {train.num_labels}", flush=True)
        entry = results.get(name, {"runs": {}})
        entry["machine"] = f"{cpu_description()}, torch {torch.__version__}, {args.threads} threads"
        entry["setup"] = (f"{len(train)} train / {len(test)} test sequences ({train.num_tokens} train tokens), "
                          f"K = {train.num_labels}; GDMM rho = {args.rho}, eta = 1, block-Jacobi batches of "
                          f"{args.batch}, sampled FMO nu = {args.nu}; BCFW B = 1 (the paper's; bcfw-sparse: the same "
                          "algorithm with sparse transition blocks, scripts/_sparse_chain_bcfw.py); budget: "
                          "the solver seconds of each run (methods may be run separately, with different budgets)")
        for method in args.methods.split(","):
            if method not in METHODS:
                raise SystemExit(f"unknown method {method!r}; choose from {METHODS}")
            entry["runs"][run_key(method, args)] = run(method, args, train, test)
            results[name] = entry
            path.write_text(json.dumps(results, indent=1))
    if path != OUT / "gdmm.json":
        print(f"wrote {path}; merge it with --merge {path} to report it", flush=True)
        return
    report(results)


if __name__ == "__main__":
    main()
