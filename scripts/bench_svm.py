"""Issue 8's experiments on a9a (and Checkers): linear SVM solvers against liblinear, kernel SVM by sampled
cuts against libsvm. Everything runs on this machine in one process; ratios are what to read.

Linear (``--part linear``): the binary hinge SVM without bias, ``J(w) = lam/2 ||w||^2 + (1/n) sum hinge``, on
the a9a training split (22,793 examples, 123 features; `torchssvm.data.a9a`, seed 0). Solvers, each with
``--budget`` seconds: Pragam (Zhang et al., 2010; its exact gap certifies every iterate), ls-bmrm and qp-bmrm and the
1-slack cutting plane over `HingeRisk`, BCFW (the SVM as a 2-output feature table, mini-batches of
``--bcfw-batch``), and scikit-learn's LinearSVC (liblinear's dual coordinate descent, ``C = 1 / (lam n)``,
``loss="hinge"``, no intercept) at a ladder of tolerances. ``J*`` is the best primal any solver reached;
the largest certified dual value brackets it. Pragam-b (with bias) solves a different problem: only its test
accuracy and time are compared, as in the paper.

Kernel (``--part kernel``): the RBF SVM without bias (``C_svm = C / N``, gamma as given) by
`KernelCuttingPlane` with exact cuts, linear-time / constant-time sampled cuts for each ``--rs`` and hybrid cuts
for each ``--hybrid-rs`` (each sampled configuration once per ``--seeds`` seed; the report adds their means), against
scikit-learn's SVC (libsvm, same kernel and C, with its bias) on the a9a training split (``--kernel-n``
examples) and on the seeded Checkers board at ``--checkers-sizes``: training seconds and test error.

Writes ``docs/benchmarks/svm.{md,json}`` and ``svm_linear.png``.

    TORCHSSVM_DATA=../shared/data python scripts/bench_svm.py --part linear
    TORCHSSVM_DATA=../shared/data python scripts/bench_svm.py --part kernel
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from pathlib import Path

import torch
from _bench_machine import code_version, cpu_description, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"


def hinge_objective(x, y, w, lam, b=0.0):
    margin = y * (x @ w + b)
    return 0.5 * lam * float(w @ w) + float((1 - margin).clamp_min(0).mean())


def accuracy(x, y, w, b=0.0):
    return float(((x @ w + b >= 0).double() * 2 - 1 == y).double().mean())


def run_linear(args):
    from sklearn.svm import LinearSVC

    import torchssvm as ts
    from torchssvm.optim import BCFW, BMRM, FeatureTableProblem, HingeRisk, OneSlackCuttingPlane
    from torchssvm.optim.primal.pragam import Pragam

    torch.set_num_threads(args.threads)
    x, y = ts.data.a9a("train", dtype=torch.float64)
    xt, yt = ts.data.a9a("test", dtype=torch.float64)
    y, yt = y.double(), yt.double()
    n, lam = x.shape[0], args.lam
    runs = {}

    def record(name, times, primals, w, b=0.0, duals=None, extra=None):
        runs[name] = {"time": times, "primal": primals, "dual": duals or [], "test_accuracy": accuracy(xt, yt, w, b),
                      "train_objective_final": primals[-1] if primals else None, **(extra or {})}
        print(f"{name:>10}: {len(times)} points, {times[-1]:.2f} s, J = {primals[-1]:.8f}, "
              f"test acc {runs[name]['test_accuracy']:.4f}", flush=True)

    # liblinear at a ladder of tolerances (each a separate fit, timed end to end)
    times, primals = [], []
    w = None
    for tol in (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6):
        m = LinearSVC(C=1.0 / (lam * n), loss="hinge", dual=True, fit_intercept=False, tol=tol, max_iter=1_000_000)
        t0 = time.perf_counter()
        m.fit(x.numpy(), y.numpy())
        times.append(time.perf_counter() - t0)
        w = torch.from_numpy(m.coef_[0].copy())
        primals.append(hinge_objective(x, y, w, lam))
    record("liblinear", times, primals, w, extra={"tolerances": [1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6]})

    # Pragam and Pragam-b
    for name, bias in (("pragam", False), ("pragam_b", True)):
        solver = Pragam(x, y, lam, bias=bias)
        times, primals, duals = [], [], []

        def keep(r, times=times, primals=primals, duals=duals):
            if r["iteration"] % 10 == 0 or r["iteration"] < 10:
                times.append(r["time"])
                primals.append(r["primal"])
                duals.append(r["dual"])

        solver.fit(time_budget=args.budget, callback=keep)
        record(name, times, primals, solver.w, float(getattr(solver, "b", 0.0)), duals,
               extra={"iterations": solver_iterations(solver), "L": float(solver.L)})

    # bundle methods and 1-slack over the hinge risk
    for name, make in (("ls_bmrm", lambda: BMRM(HingeRisk(x, y), lam=lam, variant="ls", eps=1e-9)),
                       ("qp_bmrm", lambda: BMRM(HingeRisk(x, y), lam=lam, variant="qp", eps=1e-9)),
                       ("one_slack", lambda: OneSlackCuttingPlane(HingeRisk(x, y), lam=lam, eps=1e-9))):
        solver = make()
        times, primals, duals = [], [], []
        best = float("inf")
        while solver.seconds < args.budget:
            r = solver.step()
            best = min(best, r["primal"])
            times.append(r["time"])
            primals.append(best)
            duals.append(r["dual"])
            if r["converged"]:
                break
        record(name, times, primals, solver.w_best, duals=duals, extra={"iterations": solver.steps_done})

    # BCFW on the 2-output feature table (phi(x, +-1) = +-x / 2, 0/1 loss)
    truth = (y > 0).long()
    F = torch.stack([-x / 2, x / 2], 1)
    Lt = torch.ones(n, 2, dtype=torch.float64)
    Lt[torch.arange(n), truth] = 0
    solver = BCFW(FeatureTableProblem(F, Lt, truth), lam=lam, batch_size=args.bcfw_batch, step="pairwise", seed=0)
    times, primals = [], []
    while solver.seconds < args.budget:
        solver.step()
        times.append(solver.seconds)
        primals.append(hinge_objective(x, y, solver.w, lam))
    record("bcfw", times, primals, solver.w, extra={"batch_size": args.bcfw_batch, "passes": len(times)})

    # the optimum: best primal reached, bracketed by the best certified dual
    j_star = min(min(r["primal"]) for k, r in runs.items() if k != "pragam_b")
    d_star = max(max([d for d in r["dual"] if d == d and d != float("-inf")] or [float("-inf")])
                 for k, r in runs.items() if k != "pragam_b")
    for k, r in runs.items():
        if k == "pragam_b":
            continue
        sub = [p - j_star for p in r["primal"]]
        r["time_to"] = {str(t): next((tt for tt, s in zip(r["time"], sub) if s <= t), None)
                        for t in (1e-2, 1e-3, 1e-4, 1e-5)}
    for r in runs.values():  # the curves are kept at a few hundred points (the table used every point)
        thin_run(r)
    return {"lam": lam, "n_train": n, "n_test": xt.shape[0], "J_star": j_star, "best_dual": d_star,
            "budget": args.budget, "runs": runs}


def thin_run(run, keep=300):
    """Keep at most ``keep`` points of a run's ``time`` / ``primal`` / ``dual`` curves, spaced evenly in
    log(iteration), always with the first and the last point (so the JSON stays small)."""
    m = len(run["time"])
    if m <= keep:
        return
    idx = sorted({min(m - 1, int(round(math.expm1(k * math.log(m) / (keep - 1))))) for k in range(keep)} | {m - 1})
    for key in ("time", "primal", "dual"):
        if len(run.get(key, [])) == m:
            run[key] = [run[key][i] for i in idx]


def solver_iterations(solver):
    return int(getattr(solver, "iteration", getattr(solver, "k", 0)) or 0)


def run_kernel(args):
    from sklearn.svm import SVC

    import torchssvm as ts
    from torchssvm.optim import KernelCuttingPlane

    torch.set_num_threads(args.threads)
    results = []

    old_rows = {}
    if args.reuse_svc and (args.out / "svm.json").exists():
        old_rows = {(r["dataset"], r["n_train"]): r for r in
                    json.loads((args.out / "svm.json").read_text()).get("kernel", {}).get("rows", [])}

    def compare(dataset, x, y, xt, yt, C_svm, gamma, configs):
        N = x.shape[0]
        old = old_rows.get((dataset, N))
        if old is not None:  # --reuse-svc: keep the row's SVC run and its other cuts, add / replace these
            row = json.loads(json.dumps(old))
            fresh = {(sampling, r, seed) for sampling, r in configs for seed in args.seeds}
            row["cuts"] = [c for c in row["cuts"] if (c["sampling"], c["r"], c.get("seed", 0)) not in fresh]
            print(f"{dataset} N={N}: SVC reused ({row['svc']['seconds']:.1f} s, test error "
                  f"{row['svc']['test_error']:.4f})", flush=True)
            return _run_cuts(row, x, y, xt, yt, configs)
        t0 = time.perf_counter()
        svc = SVC(C=C_svm, kernel="rbf", gamma=gamma, tol=1e-3, cache_size=2000).fit(x.numpy(), y.numpy())
        t_svc = time.perf_counter() - t0
        err_svc = float((torch.from_numpy(svc.predict(xt.numpy())) != yt).double().mean())
        row = {"dataset": dataset, "n_train": N, "n_test": xt.shape[0], "C_svm": C_svm, "gamma": gamma,
               "budget": args.kernel_budget, "code": code_version(),
               "svc": {"seconds": t_svc, "test_error": err_svc, "support_vectors": int(svc.n_support_.sum())},
               "cuts": []}
        print(f"{dataset} N={N}: SVC {t_svc:.1f} s, test error {err_svc:.4f}", flush=True)
        return _run_cuts(row, x, y, xt, yt, configs)

    def _run_cuts(row, x, y, xt, yt, configs):
        N, C_svm, gamma = x.shape[0], row["C_svm"], row["gamma"]
        t_svc, err_svc = row["svc"]["seconds"], row["svc"]["test_error"]
        for (sampling, r), seed in itertools.product(configs, args.seeds):
            if sampling == "exact" and seed != args.seeds[0]:
                continue  # exact cuts draw nothing: one run
            r_linear = args.hybrid_r_linear if sampling == "hybrid" else None
            solver = KernelCuttingPlane.from_C(x, y, C_svm * N, kernel="rbf", gamma=gamma, sampling=sampling,
                                               r=max(r, 1), r_linear=r_linear, eps=args.eps, seed=seed)
            hist = solver.fit(time_budget=args.kernel_budget)
            err = float((solver.predict(xt) != yt).double().mean())
            entry = {"sampling": sampling, "r": r, "r_linear": r_linear, "seed": seed, "code": code_version(),
                     "seconds": solver.seconds, "test_error": err,
                     "iterations": solver.steps_done, "converged": hist[-1]["converged"],
                     "cuts": hist[-1]["cuts"], "kernel_evaluations": hist[-1]["kernel_evaluations"],
                     "speedup_vs_svc": t_svc / solver.seconds, "error_minus_svc": err - err_svc}
            row["cuts"].append(entry)
            print(f"   {sampling:>8} r={r} seed {seed}: {solver.seconds:.1f} s, test error {err:.4f} "
                  f"({'converged' if entry['converged'] else 'budget'}, {entry['iterations']} it)", flush=True)
        results.append(row)

    x, y = ts.data.a9a("train")
    xt, yt = ts.data.a9a("test")
    for n in args.a9a_sizes:
        configs = ([("exact", 0)] * args.with_exact + [(s, r) for r in args.rs for s in ("linear", "constant")]
                   + [("hybrid", r) for r in args.hybrid_rs])
        compare("a9a", x[:n], y[:n], xt, yt, args.C_svm, args.gamma, configs)
    tx, ty = ts.data.checkers(args.checkers_test, seed=2)
    for N in args.checkers_sizes:
        cx, cy = ts.data.checkers(N, seed=1)
        configs = ([("exact", 0)] * (N <= args.checkers_exact_max)
                   + [("linear", r) for r in args.checkers_rs if N <= args.checkers_linear_max]
                   + [("constant", r) for r in args.checkers_rs] + [("hybrid", r) for r in args.hybrid_rs])
        compare("checkers", cx, cy, tx, ty, 1.0, 20.0, configs)
    return results


def run_name(sampling, r, r_linear=None):
    """``"exact"``, ``"constant r=400"``, ``"hybrid r=1000 then 400"``."""
    if sampling == "exact":
        return "exact"
    return f"{sampling} r={r}" + (f" then {r_linear}" if sampling == "hybrid" and r_linear is not None else "")


def cut_groups(row):
    """The row's cut runs grouped by ``(sampling, r)`` in order of first appearance, each group a list of runs
    (one per seed)."""
    groups = {}
    for c in row["cuts"]:
        groups.setdefault((c["sampling"], c["r"]), []).append(c)
    return groups


def mean_run(runs, row):
    """Seed 004's protocol (3 seeds, means): the mean seconds and test error of ``runs``, with the speed-up of the
    mean time and the standard deviations."""
    k = len(runs)
    secs, errs = [c["seconds"] for c in runs], [c["test_error"] for c in runs]
    sec, err = sum(secs) / k, sum(errs) / k
    sd = (lambda v: statistics.stdev(v) if k > 1 else 0.0)  # noqa: E731
    return {"seconds": sec, "test_error": err, "seconds_std": sd(secs), "test_error_std": sd(errs),
            "speedup_vs_svc": row["svc"]["seconds"] / sec, "error_minus_svc": err - row["svc"]["test_error"],
            "iterations": sum(c["iterations"] for c in runs) / k, "converged": all(c["converged"] for c in runs),
            "seeds": k}


def merge_kernel_rows(old_rows, new_rows):
    """Rows of ``old_rows`` not re-measured (same dataset and N) are kept; ``new_rows`` replace the others."""
    fresh = {(r["dataset"], r["n_train"]) for r in new_rows}
    rows = [r for r in old_rows if (r["dataset"], r["n_train"]) not in fresh] + list(new_rows)
    return sorted(rows, key=lambda r: (r["dataset"] != "a9a", r["dataset"], r["n_train"]))


def svc_growth(rows):
    """SVC's growth on Checkers: the least-squares exponent of seconds vs N over the sizes >= 30,000, and the
    size at which it would reach 30 minutes."""
    pts = [(row["n_train"], row["svc"]["seconds"]) for row in rows
           if row["dataset"] == "checkers" and row["n_train"] >= 30000]
    fit = None
    if len(pts) >= 2:
        lx = [math.log(n) for n, _ in pts]
        ly = [math.log(t) for _, t in pts]
        mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
        slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
        n30 = math.exp(mx + (math.log(1800.0) - my) / slope)
        fit = {"exponent": slope, "n_at_30_minutes": n30}
    return fit


def plot_kernel(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r["dataset"] == "checkers"]
    if not rows:
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    ns = [r["n_train"] for r in rows]
    ax.loglog(ns, [r["svc"]["seconds"] for r in rows], "ko-", label="SVC (libsvm)")
    bx.semilogx(ns, [100 * r["svc"]["test_error"] for r in rows], "ko-", label="SVC (libsvm)")
    names = sorted({(c["sampling"], c["r"]) for r in rows for c in r["cuts"]})
    styles = {"constant": "-", "linear": "--", "hybrid": "-.", "exact": ":"}
    colors = plt.get_cmap("tab20").colors
    for k, (sampling, r) in enumerate(names):
        pts = [(row["n_train"], mean_run(runs, row)) for row in rows for key, runs in cut_groups(row).items()
               if key == (sampling, r)]
        label = {"hybrid": f"hybrid r={r}", "exact": "exact cuts"}.get(sampling, f"{sampling}-time r={r}")
        style = {"marker": "o", "linestyle": styles[sampling], "color": colors[k % len(colors)], "label": label}
        ax.loglog([n for n, _ in pts], [c["seconds"] for _, c in pts], **style)
        bx.semilogx([n for n, _ in pts], [100 * c["test_error"] for _, c in pts], **style)
    ax.set_xlabel("training examples N")
    ax.set_ylabel("training seconds (this machine)")
    ax.set_title("Checkers: training time")
    bx.set_xlabel("training examples N")
    bx.set_ylabel("test error (%)")
    bx.set_title("Checkers: test error")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_linear(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 1, figsize=(6.5, 4.2))
    for name, r in data["runs"].items():
        if name == "pragam_b":
            continue
        sub = [max(p - data["J_star"], 1e-9) for p in r["primal"]]
        label = "liblinear (one fit per tolerance)" if name == "liblinear" else name
        ax.loglog([max(t, 1e-3) for t in r["time"]], sub, marker="o" if name == "liblinear" else None, ms=3,
                  label=label)
    ax.set_xlabel("seconds (this machine)")
    ax.set_ylabel("J(w) - J*  (bundle methods: best so far)")
    ax.set_title(f"a9a, linear SVM, lam = {data['lam']:.3g}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _machine() -> str:
    return f"{cpu_description()}, torch {torch.__version__}"


def _machines(all_data) -> str:
    """The machine each part was measured on (a part measured before the parts kept their own: the file's)."""
    seen = []
    for part in ("linear", "kernel"):
        if part in all_data:
            m = all_data[part].get("machine") or all_data.get("machine", "unknown")
            seen.append((part, m))
    if len({m for _, m in seen}) <= 1:
        return seen[0][1] if seen else "unknown"
    return "; ".join(f"{part} part: {m}" for part, m in seen)


def report(all_data):
    lines = ["# Linear and kernel SVM solvers on a9a and Checkers (issue 8)", "",
             f"Machine: {_machines(all_data)}; everything below ran in one process per part.",
             "Command: `TORCHSSVM_DATA=../shared/data python scripts/bench_svm.py --part linear` "
             "(and `--part kernel`).",
             ""]
    lin = all_data.get("linear")
    if lin:
        lines += [f"## Linear SVM, lam = {lin['lam']:.4g} (no bias), a9a train {lin['n_train']} / test {lin['n_test']}",
                  "", f"J* = {lin['J_star']:.10f} (best primal reached); best certified dual {lin['best_dual']:.10f}.",
                  f"Budget {lin['budget']} s per solver. Time (s) to reach J(w) - J* below each level; '-' = not "
                  "within the budget.", "",
                  "| solver | 1e-2 | 1e-3 | 1e-4 | 1e-5 | final J - J* | test accuracy |",
                  "|---|---|---|---|---|---|---|"]
        for name, r in lin["runs"].items():
            if name == "pragam_b":
                continue
            cells = [("-" if r["time_to"][k] is None else f"{r['time_to'][k]:.2f}") for k in ("0.01", "0.001",
                                                                                         "0.0001", "1e-05")]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['primal'][-1] - lin['J_star']:.2e} | "
                         f"{r['test_accuracy']:.4f} |")
        pb = lin["runs"]["pragam_b"]
        lines += ["", f"Pragam-b (with bias, its own objective): test accuracy {pb['test_accuracy']:.4f} after "
                  f"{pb['time'][-1]:.1f} s.", "", "![linear](svm_linear.png)", ""]
    ker = all_data.get("kernel")
    if ker:
        lines += [f"## Kernel SVM (RBF), eps = {ker['eps']}, budget {ker['budget']} s per run", "",
                  "| data | N | solver | seconds | test error (%) | minus SVC's (points) | speed-up vs SVC "
                  "| iterations | converged |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in ker["rows"]:
            s = row["svc"]
            if row.get("budget", ker["budget"]) != ker["budget"]:
                lines.append(f"| {row['dataset']} | {row['n_train']} | (budget {row['budget']:.0f} s per run) "
                             "| | | | | | |")
            if "code" in row:
                later = {}
                for (sampling, r), runs in cut_groups(row).items():
                    for code in dict.fromkeys(c.get("code", row["code"]) for c in runs):
                        if code != row["code"]:
                            later.setdefault(code, []).append(run_name(sampling, r))
                note = "".join(f"; {', '.join(names)} at {code}" for code, names in later.items())
                lines.append(f"| {row['dataset']} | {row['n_train']} | (code at {row['code']}{note}) | | | | | | |")
            lines.append(f"| {row['dataset']} | {row['n_train']} | SVC (libsvm) | {s['seconds']:.1f} | "
                         f"{100 * s['test_error']:.2f} | 0 | 1 | - | - |")
            for (sampling, r), runs in cut_groups(row).items():
                name = run_name(sampling, r, runs[0].get("r_linear"))
                for c in runs:
                    seed = f", seed {c['seed']}" if len(runs) > 1 else ""
                    lines.append(f"| {row['dataset']} | {row['n_train']} | {name}{seed} | {c['seconds']:.1f} | "
                                 f"{100 * c['test_error']:.2f} | {100 * c['error_minus_svc']:+.2f} | "
                                 f"{c['speedup_vs_svc']:.2f} | "
                                 f"{c['iterations']} | {c['converged']} |")
                if len(runs) > 1:
                    m = mean_run(runs, row)
                    lines.append(f"| {row['dataset']} | {row['n_train']} | **{name}, mean of {m['seeds']} seeds** | "
                                 f"**{m['seconds']:.1f}** (sd {m['seconds_std']:.1f}) | "
                                 f"**{100 * m['test_error']:.2f}** (sd {100 * m['test_error_std']:.2f}) | "
                                 f"**{100 * m['error_minus_svc']:+.2f}** | **{m['speedup_vs_svc']:.2f}** | "
                                 f"{m['iterations']:.0f} | {m['converged']} |")
        fit = ker.get("svc_checkers_fit")
        if fit:
            lines += ["", f"SVC's training time on Checkers grows as N^{fit['exponent']:.2f} (least squares over the "
                      f"sizes >= 30,000); at that rate it reaches 30 minutes at N ~ {fit['n_at_30_minutes']:,.0f}.",
                      "", "![kernel](svm_kernel.png)"]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("linear", "kernel"))
    ap.add_argument("--report-only", action="store_true", help="rewrite svm.md and the plots from svm.json")
    ap.add_argument("--lam", type=float, default=2.0 ** -18)
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--bcfw-batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--a9a-sizes", type=int, nargs="*", default=[5000, 22793])
    ap.add_argument("--C-svm", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=0.05)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--rs", type=int, nargs="+", default=[100, 400, 1000, 4000])
    ap.add_argument("--with-exact", type=int, default=1)
    ap.add_argument("--kernel-budget", type=float, default=300.0)
    ap.add_argument("--checkers-sizes", type=int, nargs="*", default=[10000, 30000, 100000, 300000])
    ap.add_argument("--checkers-test", type=int, default=100000)
    ap.add_argument("--checkers-linear-max", type=int, default=100000,
                    help="linear-time sampled cuts only up to this N (each cut costs N r kernel evaluations)")
    ap.add_argument("--checkers-exact-max", type=int, default=0, help="exact cuts only up to this N")
    ap.add_argument("--checkers-rs", type=int, nargs="*", default=[400, 1000])
    ap.add_argument("--hybrid-rs", type=int, nargs="*", default=[],
                    help="kernel part: constant-time draws of sampling='hybrid' runs (both data sets)")
    ap.add_argument("--hybrid-r-linear", type=int, default=400, help="the hybrid runs' linear-time draws")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="kernel part: sampling seeds per sampled-cut configuration (Yu & Joachims, 2008: means of 3)")
    ap.add_argument("--reuse-svc", action="store_true",
                    help="for sizes already in svm.json, keep their SVC run and other solvers; run only the new ones")
    ap.add_argument("--merge", action="store_true",
                    help="kernel part: keep the stored rows of sizes not re-measured in this run")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.part is None and not args.report_only:
        ap.error("--part is required (or --report-only)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "svm.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    if args.report_only:
        if "linear" in data:
            plot_linear(data["linear"], args.out / "svm_linear.png")
        if "kernel" in data:
            plot_kernel(data["kernel"], args.out / "svm_kernel.png")
        write_report(args.out, "svm", report(data))
        return
    if args.part == "linear":
        data["linear"] = {**run_linear(args), "machine": _machine()}
        plot_linear(data["linear"], args.out / "svm_linear.png")
    else:
        rows = run_kernel(args)
        budget = args.kernel_budget
        if args.merge and "kernel" in data:
            rows = merge_kernel_rows(data["kernel"]["rows"], rows)
            budget = data["kernel"]["budget"]  # the header's; rows run with another budget say so
        data["kernel"] = {"eps": args.eps, "budget": budget, "rows": rows, "svc_checkers_fit": svc_growth(rows),
                          "machine": _machine()}
        plot_kernel(data["kernel"], args.out / "svm_kernel.png")
    path.write_text(json.dumps(data, indent=1))
    write_report(args.out, "svm", report(data))


if __name__ == "__main__":
    main()
