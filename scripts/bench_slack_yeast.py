"""Slack against margin rescaling on Yeast, and the slack-rescaling searches on the trained models.

Model: the pairwise multi-label MRF of Choi et al. (2016), section 5 (`MultiLabel(14, edges="full")`, unary
``x W + b``, one shared interaction per label pair), normalized Hamming loss. Training: Pegasos
(`torchssvm.optim.Pegasos`, mini-batches of 32, averaged iterates) on ``lam/2 ||w||^2 + mean hinge``,
the slack-rescaled hinge (exact oracle: enumeration of the 2^14 labellings) or the margin-rescaled one;
``lam`` tuned on the last 300 training genes, then retrained on all 1,500 and scored on the 917 test
genes (the Table 2 analogue).

Searches (the Table 1 analogue, with a difference stated in the report: the paper calls them inside
n-slack cutting-plane training, here they run on the slack model's training examples at the weights of
several epochs): bisecting, binary (F-bar), angular (FIFO and priority queue, the 0.999 stop) and the
Sarawagi-Gupta golden search (with ``xi = 0``, its value at a fresh working set), each against the exact
oracle: oracle calls per search, how often it reaches 0.999 of the exact ``max Phi`` (among examples
with ``max Phi > 0``), and milliseconds per search (batched over the examples, so per-search time is
the batch time over the count). Writes ``docs/benchmarks/slack.{md,json}``.

    python scripts/bench_slack_yeast.py
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _bench_machine import cpu_description, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"


def potentials(params, x):
    import torchssvm as ts

    W, b, pair = params
    return ts.MultiLabelPotentials(x @ W + b, pair)


def train(kind, data, lam, epochs, seed, snapshots=()):
    import torchssvm as ts

    K, D = data.num_labels, data.num_features
    ml = ts.MultiLabel(K)
    params = [torch.zeros(D, K, dtype=torch.float64, requires_grad=True),
              torch.zeros(K, dtype=torch.float64, requires_grad=True),
              torch.zeros(ml.num_edges, dtype=torch.float64, requires_grad=True)]
    opt = ts.optim.Pegasos(params, lam=lam, average=True)
    loss_fn = ts.SlackRescaledHingeLoss(ml) if kind == "slack" else ts.StructuredHingeLoss(ml)
    g = torch.Generator().manual_seed(seed)
    saved = {}
    t0 = time.perf_counter()
    for epoch in range(1, epochs + 1):
        for batch in data.batches(32, shuffle=True, generator=g):
            loss = loss_fn(potentials(params, batch.x.double()), batch.y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch in snapshots:
            opt.averaged()
            saved[epoch] = [p.detach().clone() for p in params]
            opt.averaged()
    seconds = time.perf_counter() - t0
    opt.averaged()
    return ml, [p.detach() for p in params], saved, seconds


def scores(ml, params, data):
    y_hat = ml.decode(potentials(params, data.x.double()))
    y = data.y
    tp = ((y_hat == 1) & (y == 1)).sum(0).double()
    fp = ((y_hat == 1) & (y == 0)).sum(0).double()
    fn = ((y_hat == 0) & (y == 1)).sum(0).double()
    micro = float(2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()))
    per_label = torch.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn).clamp_min(1), torch.ones_like(tp))
    macro = float(per_label.mean())
    inter, union = ((y_hat == 1) & (y == 1)).sum(1).double(), ((y_hat == 1) | (y == 1)).sum(1).double()
    jaccard = float(torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union)).mean())
    return {"exact_match": float((y_hat == y).all(1).double().mean()), "jaccard": jaccard,
            "hamming": float((y_hat != y).double().mean()), "micro_f1": micro, "macro_f1": macro}


def search_stats(ml, params, data):
    from torchssvm.search import TableOracle, angular_search, binary_search, bisecting_search, golden_search

    pot = potentials(params, data.x.double())
    _, exact = ml.slack_max_oracle(pot, data.y)
    positive = exact > 0
    runs = {
        "angular (FIFO)": lambda o: angular_search(o, queue="fifo"),
        "angular (priority)": lambda o: angular_search(o, queue="priority"),
        "bisecting": lambda o: bisecting_search(o),
        "binary (F-bar)": lambda o: binary_search(o),
        "Sarawagi-Gupta (golden)": lambda o: golden_search(o, torch.zeros(len(data), dtype=torch.float64)),
    }
    out = {}
    for name, run in runs.items():
        oracle = TableOracle.from_structure(ml, pot, data.y)
        t0 = time.perf_counter()
        r = run(oracle)
        seconds = time.perf_counter() - t0
        reached = (r.phi >= 0.999 * exact - 1e-12) & positive
        out[name] = {"calls": float(r.calls.double().mean()),
                     "reached": float(reached.sum() / positive.sum().clamp_min(1)),
                     "ms_per_search": 1e3 * seconds / len(data),
                     "mean_shortfall": float(((exact - r.phi) / exact.clamp_min(1e-300))[positive].mean())
                     if bool(positive.any()) else 0.0,
                     "bound_ok": bool((r.bound >= exact - 1e-9).all())}
    return out, int(positive.sum())


def main() -> None:
    import torchssvm as ts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lams", nargs="*", type=float, default=[1e-4, 1e-3, 1e-2])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    train_all, test = ts.data.yeast("train"), ts.data.yeast("test")
    fit, dev = train_all.subset(range(1200)), train_all.subset(range(1200, 1500))
    tuning, final = {}, {}
    for kind in ("slack", "margin"):
        for lam in args.lams:
            ml, params, _, sec = train(kind, fit, lam, args.epochs, args.seed)
            tuning[f"{kind} {lam:g}"] = {**scores(ml, params, dev), "seconds": sec}
            print(kind, lam, tuning[f"{kind} {lam:g}"], flush=True)
        best = max(args.lams, key=lambda lam: -tuning[f"{kind} {lam:g}"]["hamming"])
        snaps = (1, 5, args.epochs) if kind == "slack" else ()
        ml, params, saved, sec = train(kind, train_all, best, args.epochs, args.seed, snapshots=snaps)
        final[kind] = {"lam": best, "seconds": sec, **scores(ml, params, test)}
        print(kind, final[kind], flush=True)
        if kind == "slack":
            searches = {}
            for epoch, p in saved.items():
                stats, npos = search_stats(ml, p, train_all)
                searches[epoch] = {"violating_examples": npos, "stats": stats}
                print(epoch, npos, stats, flush=True)
    meta = {"machine": f"{cpu_description()}, {torch.get_num_threads()} torch threads; torch {torch.__version__}",
            "epochs": args.epochs, "lams": args.lams}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slack.json").write_text(json.dumps({"meta": meta, "tuning": tuning, "final": final,
                                                     "searches": searches}, indent=1))
    lines = ["# Slack rescaling on Yeast: searches and slack against margin", "",
             f"Produced by `python scripts/bench_slack_yeast.py`. Machine: {meta['machine']}. Pegasos, "
             f"{args.epochs} epochs, mini-batches of 32, averaged iterates; lam from {args.lams} by dev Hamming "
             "loss (last 300 training genes), then retrained on all 1,500; test on 917.", "",
             "## Slack against margin rescaling (Table 2 analogue)", "",
             "| loss | lam | exact match | Jaccard acc. | Hamming loss | micro F1 | macro F1 | train s |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, r in final.items():
        lines.append(f"| {kind} | {r['lam']:g} | {r['exact_match']:.3f} | {r['jaccard']:.3f} | {r['hamming']:.3f} | "
                     f"{r['micro_f1']:.3f} | {r['macro_f1']:.3f} | {r['seconds']:.0f} |")
    lines += ["", "Paper (Table 2, Yeast, LP oracle, cutting plane): slack Acc .54, label loss .205, MiF1 .661, "
              "MaF1 .651; margin .545, .204, .666, .654.", "",
              "## Searches on the slack model's 1,500 training genes (Table 1 analogue)", ""]
    for epoch, s in searches.items():
        lines += [f"After epoch {epoch}: {s['violating_examples']} genes with max Phi > 0.", "",
                  "| search | oracle calls per search | reaches 0.999 of exact | mean shortfall | ms per search | "
                  "bound holds |", "|---|---|---|---|---|---|"]
        for name, r in s["stats"].items():
            lines.append(f"| {name} | {r['calls']:.1f} | {100 * r['reached']:.1f}% | {r['mean_shortfall']:.2e} | "
                         f"{r['ms_per_search']:.3f} | {r['bound_ok']} |")
        lines.append("")
    lines += ["Paper (Table 1, Yeast, inside cutting plane): queries per search angular 3.8, bisecting 10.3, "
              "Sarawagi 43.2; 4.7 / 3.6 / 18.5 ms per search."]
    write_report(args.out, "slack", lines)


if __name__ == "__main__":
    main()
