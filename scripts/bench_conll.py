"""CoNLL-2000 chunking: our linear SSVM (BCFW) against a CRF trained by CRFsuite (L-BFGS), same attributes.

Both models see the same token attributes (`torchssvm.data.conll2000`, ``min_count``: attributes seen
that often in training) and the same 22 IOB2 tags; CRFsuite adds its own state features for the
(attribute, tag) pairs seen in training and the tag transitions, our model has every (attribute, tag)
weight, transitions and the OCR-style biases. Regularization is tuned on a held-out split (the last
``--dev`` training sentences): ``lam`` for the SSVM, ``c2`` for the CRF; then both train on the full
training split and are scored on the test split by the conlleval chunk F1.

Training to convergence: CRFsuite's L-BFGS stops by its default test (relative objective change below
1e-5 over 10 iterations); BCFW (mini-batch ``--block-batch``, gap sampling, ``--step`` pairwise steps and a
cache of ``--cache-size`` labellings per block: the papers' fastest variant, BCPFW with caching) stops at a
certified duality gap below ``--gap-tol`` (absolute; the primal is about 0.06 at the tuned lam). Writes
``docs/benchmarks/conll2000.{md,json}``.

    python scripts/bench_conll.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from _bench_machine import style_gap_axes
from _bench_machine import write_report as write_markdown

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"


def crfsuite_items(ds, idx):
    """Attribute lists (strings ``a<id>``) and tag lists of the sentences ``idx`` of a dataset."""
    ids, lengths = ds.x.ids, ds.lengths
    xs, ys = [], []
    for i in idx:
        L = int(lengths[i])
        rows = ids[i, :L].tolist()
        xs.append([[f"a{a}" for a in row if a >= 0] for row in rows])
        ys.append([ds.label_names[int(t)] for t in ds.y[i, :L]])
    return xs, ys


def train_crf(ds, idx, c2: float, max_iterations: int):
    import pycrfsuite

    xs, ys = crfsuite_items(ds, idx)
    trainer = pycrfsuite.Trainer(verbose=False)
    for x, y in zip(xs, ys):
        trainer.append(x, y)
    trainer.select("lbfgs")
    trainer.set_params({"c1": 0.0, "c2": c2, "max_iterations": max_iterations})
    path = os.path.join(tempfile.mkdtemp(), "crf.model")
    t0 = time.perf_counter()
    trainer.train(path)
    seconds = time.perf_counter() - t0
    info = trainer.logparser.last_iteration
    return path, seconds, {"iterations": len(trainer.logparser.iterations), "loss": info.get("loss")}


def crf_f1(path, ds, idx) -> float:
    import pycrfsuite

    from torchssvm.metrics import chunk_f1

    tagger = pycrfsuite.Tagger()
    tagger.open(path)
    xs, _ = crfsuite_items(ds, idx)
    pred = [tagger.tag(x) for x in xs]
    return chunk_f1(pred, [ds.tags[i] for i in idx])["f1"]


def ssvm_solver(train, lam: float, block_batch: int, step: str, cache_size: int, seed: int = 0):
    """A sparse float64 chain model and its BCFW solver (gap sampling, exact gap every 5 passes)."""
    import torchssvm as ts

    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=True, dtype=torch.float64)
    return model, ts.optim.BCFW(model, train, lam=lam, sampling="gap", step=step, cache_size=cache_size,
                                batch_size=block_batch, seed=seed, gap_check_every=5)


def train_ssvm(train, lam: float, block_batch: int, gap_tol, max_passes: int, step: str = "pairwise",
               cache_size: int = 10, seed: int = 0):
    model, solver = ssvm_solver(train, lam, block_batch, step, cache_size, seed)
    t0 = time.perf_counter()
    r = solver.fit(max_passes=max_passes, gap_tol=gap_tol)[-1]  # stops on a certified (exact) gap only
    seconds = time.perf_counter() - t0
    return model, seconds, {"step": step, "cache_size": cache_size, "passes": r["passes"], "gap": r["gap"],
                            "primal": r["primal"], "gap_exact": r["gap_exact"],
                            "solver_seconds": r["time"]}


def compare_variants(train, lam: float, args) -> list:
    """BCFW's step and cache variants (``args.variants``, ``step:cache_size``) on the full training set at
    ``lam``: the exact gap against solver seconds and effective passes (exact-gap passes included) for
    ``args.variant_passes`` passes, mini-batch ``args.block_batch``, gap sampling, seed 0."""
    runs = []
    for spec in args.variants:
        step, cache = spec.split(":")
        _, solver = ssvm_solver(train, lam, args.block_batch, step, int(cache))
        hist = solver.fit(max_passes=args.variant_passes)
        curve = [(r["passes"], r["time"], r["gap"]) for r in hist if r["gap_exact"]]
        runs.append({"step": step, "cache_size": int(cache), "curve": curve})
        print(f"variant {spec}: gap {curve[-1][2]:.2e} after {curve[-1][0]:.1f} passes, {curve[-1][1]:.0f} s",
              flush=True)
    return runs


def time_to(curve, tol):
    """Solver seconds of the first exact gap <= ``tol`` in a ``(passes, seconds, gap)`` curve (None: never)."""
    return next((t for _, t, g in curve if g <= tol), None)


def variant_lines(runs, out: Path, tols=(1e-2, 3e-3, 1e-3, 3e-4)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["## BCFW variants at the tuned lam", "",
             "Full training set, gap sampling, mini-batch as above, seed 0; the exact gap every 5 passes (its "
             "passes counted). Solver seconds to reach each gap ('-': not within the run); the gap at the end.",
             "", "| steps | cache | " + " | ".join(f"s to gap {t:g}" for t in tols) + " | passes | final gap |",
             "|---|---|" + "---|" * len(tols) + "---|---|"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for r in runs:
        c = r["curve"]
        times = [time_to(c, t) for t in tols]
        lines.append(f"| {r['step']} | {r['cache_size']} | " + " | ".join("-" if x is None else f"{x:.0f}"
                                                                          for x in times)
                     + f" | {c[-1][0]:.1f} | {c[-1][2]:.2e} |")
        label = f"{r['step']}, cache {r['cache_size']}"
        axes[0].plot([p for p, _, _ in c], [g for _, _, g in c], marker=".", label=label)
        axes[1].plot([t for _, t, _ in c], [g for _, _, g in c], marker=".", label=label)
    style_gap_axes(axes)
    fig.tight_layout()
    fig.savefig(out / "conll2000_variants.png", dpi=110)
    plt.close(fig)
    return lines + ["", "![variants](conll2000_variants.png)", ""]


def ssvm_f1(model, ds) -> float:
    import torchssvm as ts
    from torchssvm.evaluation import evaluate_chain

    return evaluate_chain(model, ts.Chain(ds.num_labels), ds)["chunk_f1"]


def main() -> None:
    import torchssvm as ts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-count", type=int, default=3)
    ap.add_argument("--dev", type=int, default=1000, help="held-out training sentences for tuning")
    ap.add_argument("--lams", nargs="*", type=float, default=[1e-3, 1e-2])
    ap.add_argument("--c2s", nargs="*", type=float, default=[0.1, 1.0])
    ap.add_argument("--block-batch", type=int, default=64)
    ap.add_argument("--gap-tol", type=float, default=1e-3)
    ap.add_argument("--step", default="pairwise", choices=["fw", "pairwise", "away"])
    ap.add_argument("--cache-size", type=int, default=10, help="labellings cached per block (0: none)")
    ap.add_argument("--variants", nargs="*", default=["fw:0", "fw:10", "pairwise:0", "pairwise:10"],
                    help="step:cache_size pairs compared at the tuned lam (gap against time; none: skip)")
    ap.add_argument("--variant-passes", type=float, default=40)
    ap.add_argument("--variants-only", action="store_true",
                    help="run only the variant comparison, at the lam of the saved conll2000.json")
    ap.add_argument("--tune-passes", type=int, default=10, help="BCFW passes per tuning run")
    ap.add_argument("--max-passes", type=int, default=100)
    ap.add_argument("--max-iterations", type=int, default=1000, help="CRFsuite L-BFGS iterations at most")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    train = ts.data.conll2000("train", "chunk", min_count=args.min_count)
    test = ts.data.conll2000("test", "chunk", min_count=args.min_count)
    if args.variants_only:
        log = json.loads((args.out / "conll2000.json").read_text())
        log["variants"] = compare_variants(train, log["ssvm"]["lam"], args)
        (args.out / "conll2000.json").write_text(json.dumps(log, indent=1, default=str))
        write_report(log, args.out)
        return
    n = len(train)
    fit_idx, dev_idx = list(range(n - args.dev)), list(range(n - args.dev, n))
    fit, dev = train.subset(fit_idx), train.subset(dev_idx)
    log = {"tuning": {"ssvm": {}, "crf": {}}}
    for c2 in args.c2s:
        path, sec, info = train_crf(train, fit_idx, c2, args.max_iterations)
        log["tuning"]["crf"][c2] = {"dev_f1": crf_f1(path, train, dev_idx), "seconds": sec, **info}
        print(f"crf c2={c2}: dev F1 {log['tuning']['crf'][c2]['dev_f1']:.2f} ({sec:.0f} s)", flush=True)
    for lam in args.lams:
        model, sec, info = train_ssvm(fit, lam, args.block_batch, None, args.tune_passes, args.step,
                                       args.cache_size)
        log["tuning"]["ssvm"][lam] = {"dev_f1": ssvm_f1(model, dev), "seconds": sec, **info}
        print(f"ssvm lam={lam}: dev F1 {log['tuning']['ssvm'][lam]['dev_f1']:.2f} ({sec:.0f} s)", flush=True)
    c2 = max(args.c2s, key=lambda c: log["tuning"]["crf"][c]["dev_f1"])
    lam = max(args.lams, key=lambda v: log["tuning"]["ssvm"][v]["dev_f1"])

    path, crf_sec, crf_info = train_crf(train, list(range(n)), c2, args.max_iterations)
    crf = {"c2": c2, "seconds": crf_sec, "test_f1": crf_f1(path, test, list(range(len(test)))), **crf_info}
    print(f"crf final: {crf}", flush=True)
    model, ssvm_sec, ssvm_info = train_ssvm(train, lam, args.block_batch, args.gap_tol, args.max_passes,
                                            args.step, args.cache_size)
    ssvm = {"lam": lam, "seconds": ssvm_sec, "test_f1": ssvm_f1(model, test), **ssvm_info}
    print(f"ssvm final: {ssvm}", flush=True)
    log["variants"] = compare_variants(train, lam, args)
    command = " ".join(["python scripts/bench_conll.py", *sys.argv[1:]])
    log.update({"command": command, "crf": crf, "ssvm": ssvm, "args": vars(args) | {"out": str(args.out)},
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
                           f"{torch.get_num_threads()} threads"})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conll2000.json").write_text(json.dumps(log, indent=1, default=str))
    write_report(log, args.out)


def write_report(log: dict, out: Path) -> None:
    crf, ssvm, a = log["crf"], log["ssvm"], log["args"]
    df1 = ssvm["test_f1"] - crf["test_f1"]
    ratio = ssvm["seconds"] / crf["seconds"]
    step, cache = ssvm.get("step", "fw"), ssvm.get("cache_size", 0)
    variant = {"fw": "Frank-Wolfe", "pairwise": "pairwise", "away": "away"}[step] + " steps" + (
        f", cache of {cache}" if cache else ", no cache")
    lines = ["# CoNLL-2000 chunking: linear SSVM (BCFW) against a CRF (CRFsuite)", "",
             f"Same token attributes (min_count={a['min_count']}), 8,936 training / 2,012 test sentences, conlleval "
             f"chunk F1. Regularization tuned on the last {a['dev']} training sentences; then trained on all of "
             f"them. Machine: {log['machine']}. Command: `{log.get('command', 'python scripts/bench_conll.py')}`. "
             f"The SSVM stops at a certified gap <= {a['gap_tol']:g} or after {a['max_passes']} passes.", "",
             "| model | regularization | training | seconds | test chunk F1 |", "|---|---|---|---|---|",
             f"| CRF, CRFsuite L-BFGS | c2 = {crf['c2']:g} | {crf['iterations']} iterations (its convergence test) | "
             f"{crf['seconds']:.0f} | {crf['test_f1']:.2f} |",
             f"| SSVM, BCFW (gap sampling, B = {a['block_batch']}, {variant}) | lam = {ssvm['lam']:g} | "
             f"{ssvm['passes']:.0f} "
             f"effective passes, certified gap {ssvm['gap']:.2e} ({'exact' if ssvm['gap_exact'] else 'estimate'}), "
             f"primal {ssvm['primal']:.4f} | {ssvm['seconds']:.0f} | {ssvm['test_f1']:.2f} |", "",
             "Tuning (dev chunk F1):", ""]
    lines += [f"- CRF c2 = {k}: {v['dev_f1']:.2f} ({v['seconds']:.0f} s)" for k, v in log["tuning"]["crf"].items()]
    lines += [f"- SSVM lam = {k}: {v['dev_f1']:.2f} ({v['seconds']:.0f} s, {a['tune_passes']} passes)"
              for k, v in log["tuning"]["ssvm"].items()]
    lines += ["", "## Targets", "",
              f"- F1 within 0.3 points of CRFsuite's: {df1:+.2f} ({'met' if df1 >= -0.3 else 'not met'}).",
              f"- Training time no worse than CRFsuite's: {ratio:.2f}x CRFsuite's "
              f"({'met' if ratio <= 1.0 else 'not met'}).", ""]
    if log.get("variants"):
        lines += variant_lines(log["variants"], out)
    write_markdown(out, "conll2000", lines)


if __name__ == "__main__":
    main()
