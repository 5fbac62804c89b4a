"""Ragged segment sums of the mini-batch BCFW path: native torch against torch_scatter.

The sparse-attribute chain problem (`torchssvm.optim.problems.sparse_gram`) reduces, per mini-batch,
the token-attribute contributions ``x_{r,t,a} u_{r,t}`` (``K`` floats each) to one row per distinct
(block, attribute) pair, and `ChainProblem.accumulate` adds those rows into the emission weights. Both
are segment sums over a ragged index. The design makes torch_scatter an optional backend for such
reductions "where it helps"; this script measures whether it does, on the real reductions: CoNLL-2000
chunking (min_count=3), mini-batches of ``B`` sentences, the unary part of a FW direction
``m(y) - m(y')`` with ``y'`` drawn at random (dense, as in the first passes).

Per mini-batch, the median over ``--repeats`` batches of

- rows: ``(P, K)`` contributions into ``(S, K)`` rows, index from ``torch.unique`` (unsorted in
  contribution order): ``index_add_``, ``torch_scatter.scatter(reduce="sum")``, and, on contributions
  sorted by segment (the sort not timed), ``index_add_`` and ``torch_scatter.segment_coo``;
- accumulate: the ``(S, K)`` rows into the ``(D, K)`` emission matrix by attribute id: ``index_add_``
  against ``torch_scatter.scatter(..., out=E)``.

Every variant is checked against ``index_add_`` (float64, 1e-12). Writes
``docs/benchmarks/segment_sum.{md,json}``.

    pip install torchssvm[scatter]   # torch-scatter builds from source (about 5-7 minutes on 2 cores)
    python scripts/bench_segment_sum.py
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from _bench_machine import cpu_description, median_seconds, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"


def batch_reductions(train, idx, K, g):
    """The contributions, their segment index and the segment count of one mini-batch (as `attribute_rows`)."""
    L = train.lengths[idx]
    T = int(L.max())
    ids = train.x.ids[idx, :T]
    R, _, A = ids.shape
    mask = torch.arange(T).unsqueeze(0) < L.unsqueeze(1)
    y = train.y[idx, :T].clamp_min(0)
    y2 = torch.randint(0, K, y.shape, generator=g)
    u = (torch.nn.functional.one_hot(y, K) - torch.nn.functional.one_hot(y2, K)).double() * mask.unsqueeze(2)
    present = (ids >= 0) & (u != 0).any(2).unsqueeze(2)
    flat = present.reshape(-1).nonzero().squeeze(1)
    attr = ids.reshape(-1)[flat]
    row = flat // (T * A)
    keys, inverse = torch.unique(attr * R + row, return_inverse=True)
    contrib = u.reshape(R * T, K).index_select(0, flat // A)
    return contrib, inverse, keys.shape[0], keys // R


def measure(contrib, inverse, S, attr, E, torch_scatter) -> dict:
    """Seconds of every variant on one mini-batch's reductions, each checked against ``index_add_``."""
    K = contrib.shape[1]
    ref = torch.zeros(S, K, dtype=torch.float64).index_add_(0, inverse, contrib)
    order = torch.argsort(inverse, stable=True)
    s_inv, s_con = inverse[order], contrib[order]
    variants = {
        "rows_index_add": lambda: torch.zeros(S, K, dtype=torch.float64).index_add_(0, inverse, contrib),
        "rows_scatter": lambda: torch_scatter.scatter(contrib, inverse, dim=0, dim_size=S, reduce="sum"),
        "rows_sorted_index_add": lambda: torch.zeros(S, K, dtype=torch.float64).index_add_(0, s_inv, s_con),
        "rows_segment_coo": lambda: torch_scatter.segment_coo(s_con, s_inv, dim_size=S, reduce="sum"),
    }
    out = {}
    for name, fn in variants.items():
        torch.testing.assert_close(fn(), ref, rtol=1e-12, atol=1e-12)
        out[name] = median_seconds(fn)
    E_ref = E.clone().index_add_(0, attr, ref)
    torch.testing.assert_close(torch_scatter.scatter(ref, attr, dim=0, out=E.clone(), reduce="sum"), E_ref,
                               rtol=1e-12, atol=1e-12)
    out["acc_index_add"] = median_seconds(lambda: E.index_add_(0, attr, ref))
    out["acc_scatter"] = median_seconds(lambda: torch_scatter.scatter(ref, attr, dim=0, out=E, reduce="sum"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", nargs="*", type=int, default=[16, 64, 256, 1024])
    ap.add_argument("--repeats", type=int, default=20, help="mini-batches per batch size")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    import torch_scatter  # the optional extra: after the arguments, so that --help works without it

    import torchssvm as ts
    train = ts.data.conll2000("train", "chunk", min_count=3)
    K, D = train.num_labels, train.num_features
    g = torch.Generator().manual_seed(0)
    E = torch.zeros(D, K, dtype=torch.float64)
    results = []
    for B in args.batch_sizes:
        acc = {k: [] for k in ("rows_index_add", "rows_scatter", "rows_sorted_index_add", "rows_segment_coo",
                               "acc_index_add", "acc_scatter")}
        sizes = []
        for _ in range(args.repeats):
            idx = torch.randperm(len(train), generator=g)[:B]
            contrib, inverse, S, attr = batch_reductions(train, idx, K, g)
            sizes.append((contrib.shape[0], S))
            for name, seconds in measure(contrib, inverse, S, attr, E, torch_scatter).items():
                acc[name].append(seconds)
        med = {k: 1e6 * statistics.median(v) for k, v in acc.items()}
        P = statistics.median(s[0] for s in sizes)
        S = statistics.median(s[1] for s in sizes)
        results.append({"batch_size": B, "contributions": P, "segments": S, "microseconds": med})
        print(f"B={B}: P={P:.0f} S={S:.0f} " + " ".join(f"{k}={v:.0f}us" for k, v in med.items()), flush=True)
    meta = {"machine": f"{cpu_description()}, {torch.get_num_threads()} torch threads; torch {torch.__version__}; "
                       f"torch_scatter {torch_scatter.__version__}", "K": K, "D": D, "repeats": args.repeats}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "segment_sum.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = ["# Segment sums of the mini-batch BCFW path: native torch against torch_scatter", "",
             "CoNLL-2000 chunking (min_count=3, K = 22), real mini-batches of B sentences, the unary part of a FW "
             "direction with a random labelling (dense). Median microseconds per mini-batch over "
             f"{args.repeats} batches. Produced by `python scripts/bench_segment_sum.py`.", "",
             f"Machine: {meta['machine']}.", "",
             "| B | contributions P | rows S | index_add_ | scatter | sorted: index_add_ | sorted: segment_coo | "
             "accumulate: index_add_ | accumulate: scatter |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["microseconds"]
        lines.append(f"| {r['batch_size']} | {r['contributions']:.0f} | {r['segments']:.0f} | "
                     f"{m['rows_index_add']:.0f} | {m['rows_scatter']:.0f} | {m['rows_sorted_index_add']:.0f} | "
                     f"{m['rows_segment_coo']:.0f} | "
                     f"{m['acc_index_add']:.0f} | {m['acc_scatter']:.0f} |")
    write_report(args.out, "segment_sum", lines)


if __name__ == "__main__":
    main()
