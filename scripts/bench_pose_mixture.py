"""Benchmark: pictorial structures with T mixture types per edge against one type, trained by BCFW.

On articulated `synthetic_pose` (limbs bent in ``--modes`` modes, so each limb edge's displacements form
clusters), per variant: `SpatialTreeProblem` (T = 1) or `MixtureSpatialTreeProblem` (K-means types on the
training set), BCFW with the positivity box at ``--lam`` for ``--passes`` passes (seed 0), then the exact
duality gap and primal, the test set's LSP loss and PCK (positions decoded with the training set's types),
and seconds per pass. One run on one machine.

Variants: ``T`` for each of ``--types`` (detector maps only), then with type evidence
(`data.synthetic_type_maps`, T = ``--evidence-types``; the paper's pairwise CNN scores): ``1+evidence``
(one type, the evidence maps summed over types as an extra unary channel of each edge's child: the same
position evidence without the type), ``T+maps`` (the type maps as type scores, one weight per edge) and
``T+evidence+maps`` (both). ``--evidence-types 0`` skips them. With co-occurrence of consecutive edges'
types (`MixtureSpatialTreeProblem(cooccurrence=True)`): ``T+cooccurrence`` (detector maps only) and
``T+evidence+maps+cooccurrence``; ``--no-cooccurrence`` skips them.

Writes ``docs/benchmarks/pose_mixture.{json,md}`` (``--name``: another name); ``pose_mixture_findings.md``
(hand-written) is appended. ``--seeds`` runs every variant per seed (data and solver) and adds means and
paired differences against the one-type model with the same position evidence; ``--only`` picks variants.
Usage:

    python scripts/bench_pose_mixture.py [--types 1 2 3] [--n 300] [--passes 40]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from _bench_machine import code_version, cpu_description, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--evidence-types", type=int, default=3)
    ap.add_argument("--no-cooccurrence", action="store_true")
    ap.add_argument("--n", type=int, default=300, help="training poses")
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--side", type=int, default=32, help="grid side")
    ap.add_argument("--modes", type=int, default=2, help="limb modes of the generator")
    ap.add_argument("--angle", type=float, default=1.5, help="limb_angle (radians)")
    ap.add_argument("--miss-rate", type=float, default=0.5)
    ap.add_argument("--lam", type=float, default=0.01)
    ap.add_argument("--passes", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="data and solver seeds; with several, the report adds means and paired differences")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--only", nargs="+", default=None, help="run only these variants (names as in the report)")
    ap.add_argument("--name", default="pose_mixture", help="report name: writes NAME.json and NAME.md")
    args = ap.parse_args(argv)
    if args.report_only:
        saved = json.loads((args.out / f"{args.name}.json").read_text())
        write_report(args.out, args.name, report_lines(saved["meta"], saved["rows"]))
        return
    kw = {"height": args.side, "width": args.side, "limb_modes": args.modes, "limb_angle": args.angle,
          "miss_rate": args.miss_rate}
    rows = []
    for seed in args.seeds:
        rows += run_seed(args, kw, seed)
    meta = {"machine": cpu_description(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "code": code_version(), "data": kw, "n": args.n, "n_test": args.n_test, "lam": args.lam,
            "passes": args.passes, "seeds": args.seeds,
            "command": " ".join(["python scripts/bench_pose_mixture.py",
                                 *(argv if argv is not None else sys.argv[1:])])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    write_report(args.out, args.name, report_lines(meta, rows))


def run_seed(args, kw, seed: int):
    """Every variant on the data of ``seed`` (training and test sets), BCFW seeded with ``seed``."""
    import torchssvm as ts
    from torchssvm.optim import BCFW, MixtureSpatialTreeProblem, SpatialTreeProblem

    train = ts.data.synthetic_pose("train", args.n, seed=seed, **kw)
    test = ts.data.synthetic_pose("test", args.n_test, seed=seed, **kw)
    variants = [(str(T), T, False, train, test) for T in args.types]
    if args.evidence_types:
        T = args.evidence_types
        types = ts.data.edge_types(train, T)
        trm = ts.data.synthetic_type_maps(train, types)
        tem = ts.data.synthetic_type_maps(test, ts.data.edge_types(test, T, rest=types.rest))
        variants += [("1+evidence", 1, False, summed(trm, False), summed(tem, False)),
                     (f"{T}+maps", T, False, trm, tem),
                     (f"{T}+evidence+maps", T, False, summed(trm, True), summed(tem, True))]
        if not args.no_cooccurrence:
            variants += [(f"{T}+cooccurrence", T, True, train, test),
                         (f"{T}+evidence+maps+cooccurrence", T, True, summed(trm, True), summed(tem, True))]
    rows = []
    for name, T, cooc, tr, te in variants:
        if args.only is not None and name not in args.only:
            continue
        t0 = time.perf_counter()
        problem = SpatialTreeProblem(tr) if T == 1 else MixtureSpatialTreeProblem(tr, T, cooccurrence=cooc)
        solver = BCFW(problem, lam=args.lam, box=problem.positivity_box(), seed=seed, gap_check_every=10)
        for _ in range(args.passes):
            solver.step()
        train_s = time.perf_counter() - t0
        gap = solver.duality_gap()
        ev = problem.evaluate(solver.w, te)
        row = {"variant": name, "seed": seed, "T": T, "d": problem.d, "gap": gap["gap"], "primal": gap["primal"],
               "test_lsp_loss": ev["lsp_loss"], "test_pck": ev["pck"], "train_s": train_s,
               "s_per_pass": train_s / args.passes}
        rows.append(row)
        print(row, flush=True)
    return rows


def summed(dataset, keep_maps: bool):
    """``dataset`` with its type maps summed over types as one more unary channel of each edge's child (the
    root gets zeros): the maps' position evidence without the type. ``keep_maps``: keep the type maps too."""
    import dataclasses

    n, V, _, K = dataset.features.shape
    extra = torch.zeros(n, V, 1, K, dtype=dataset.features.dtype)
    extra[:, 1:, 0] = dataset.type_maps.sum(2).to(extra.dtype)  # edge e's child is node e + 1
    return dataclasses.replace(dataset, features=torch.cat([dataset.features, extra], 2),
                               type_maps=dataset.type_maps if keep_maps else None)


def report_lines(meta, rows):
    d = meta["data"]
    seeds = ", ".join(str(s) for s in meta.get("seeds", [0]))
    lines = ["# Mixture types per edge against one type (BCFW on articulated synthetic poses)", "",
             f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['threads']} threads; code {meta['code']}. "
             f"Command: `{meta['command']}`.", "",
             f"Data: `synthetic_pose` {d['height']}x{d['width']}, limb_modes = {d['limb_modes']}, limb_angle = "
             f"{d['limb_angle']}, miss_rate = {d['miss_rate']}, {meta['n']} training and {meta['n_test']} test poses. "
             f"BCFW with the positivity box, lam = {meta['lam']}, {meta['passes']} passes; seeds {seeds} (data and "
             "solver); T = 1 is "
             "`SpatialTreeProblem`, T > 1 `MixtureSpatialTreeProblem` (K-means types of the training set, type "
             "bias, per-type deformation). Variants named `T` use the detector maps only; `+evidence` adds the type "
             "evidence maps of `synthetic_type_maps` summed over types as a unary channel (position evidence "
             "without the type), `+maps` gives the type maps to the mixture as type scores (one weight per "
             "edge), `+cooccurrence` learns a co-occurrence score of consecutive edges' types. Test figures "
             "decode positions only (lower LSP loss and higher PCK are better).", "",
             "| variant | seed | d | duality gap | primal | test LSP loss | test PCK | s per pass |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('variant', r['T'])} | {r.get('seed', 0)} | {r['d']} | {r['gap']:.4f} | "
                     f"{r['primal']:.4f} | {r['test_lsp_loss']:.4f} | {r['test_pck']:.4f} | {r['s_per_pass']:.2f} |")
    if len(meta.get("seeds", [0])) > 1:
        lines += [""] + summary_lines(rows)
    return lines


def reference_variant(name: str) -> str:
    """The one-type model a variant is compared with: the same position evidence, no type."""
    return "1+evidence" if ("evidence" in name or "maps" in name) else "1"


def summary_lines(rows):
    """Per variant over seeds: mean and standard deviation of the test LSP loss, and the paired relative
    change against its one-type reference (`reference_variant`) on the same seed's data."""
    import statistics

    by = {}
    for r in rows:
        by.setdefault(r["variant"], {})[r["seed"]] = r
    lines = ["## Over seeds", "",
             "Paired change: the variant's test LSP loss relative to its reference's on the same seed (negative: "
             "the variant is better); 'better on' counts the seeds where it is lower.", "",
             "| variant | reference | test LSP loss, mean +- sd | test PCK, mean | duality gap, mean | "
             "paired change, mean (min, max) | better on |",
             "|---|---|---|---|---|---|---|"]
    for name, per_seed in by.items():
        ref = reference_variant(name)
        losses = [r["test_lsp_loss"] for r in per_seed.values()]
        sd = statistics.stdev(losses) if len(losses) > 1 else 0.0
        pck = statistics.fmean(r["test_pck"] for r in per_seed.values())
        gap = statistics.fmean(r["gap"] for r in per_seed.values())
        common = [s for s in per_seed if s in by.get(ref, {})]
        if name == ref or not common:
            change, better = "-", "-"
        else:
            rel = [per_seed[s]["test_lsp_loss"] / by[ref][s]["test_lsp_loss"] - 1 for s in common]
            change = f"{100 * statistics.fmean(rel):+.1f}% ({100 * min(rel):+.1f}%, {100 * max(rel):+.1f}%)"
            better = f"{sum(x < 0 for x in rel)} of {len(rel)}"
        lines.append(f"| {name} | {ref if name != ref else '-'} | {statistics.fmean(losses):.4f} +- {sd:.4f} | "
                     f"{pck:.4f} | {gap:.4f} | {change} | {better} |")
    return lines


if __name__ == "__main__":
    main()
