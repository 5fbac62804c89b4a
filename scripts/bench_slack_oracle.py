"""Cost of the exact slack-rescaled chain oracle against plain loss-augmented Viterbi (same machine, one run).

The error-count DP (`torchssvm.kernels.slack_chain_torch`) runs Viterbi over (label, errors so far),
``T + 1`` times the states; this measures what that costs at the shapes of the papers' chain data:
OCR words (T = 14, K = 26) and CoNLL-2000 sentences (T = 40 and 78, K = 22), batches of 64 and 512,
random float64 potentials, median of ``--repeats`` timed calls after one warm-up. Writes
``docs/benchmarks/slack_oracle.{md,json}``.

    python scripts/bench_slack_oracle.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _bench_machine import cpu_description, median_seconds, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
SHAPES = [("OCR", 64, 14, 26), ("OCR", 512, 14, 26), ("CoNLL", 64, 40, 22), ("CoNLL", 512, 40, 22),
          ("CoNLL longest", 64, 78, 22)]


def main() -> None:
    import torchssvm as ts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, B, T, K in SHAPES:
        chain = ts.Chain(K)
        pot = ts.ChainPotentials(torch.randn(B, T, K, generator=g, dtype=torch.float64),
                                 torch.randn(K, K, generator=g, dtype=torch.float64),
                                 torch.randn(K, generator=g, dtype=torch.float64),
                                 torch.randn(K, generator=g, dtype=torch.float64))
        y = torch.randint(0, K, (B, T), generator=g)
        viterbi = median_seconds(lambda: chain.max_oracle(pot, y), args.repeats)  # noqa: B023
        slack = median_seconds(lambda: chain.slack_max_oracle(pot, y), args.repeats)  # noqa: B023
        rows.append({"data": name, "B": B, "T": T, "K": K, "viterbi_ms": 1e3 * viterbi, "slack_ms": 1e3 * slack,
                     "ratio": slack / viterbi})
        print(rows[-1], flush=True)
    meta = {"machine": f"{cpu_description()}, {torch.get_num_threads()} torch threads; torch {torch.__version__}"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slack_oracle.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# Exact slack-rescaled chain oracle against loss-augmented Viterbi", "",
             "Median milliseconds per batched call (float64, full-length sequences, torch twins on CPU). "
             "The slack oracle is the error-count DP: Viterbi over (label, errors so far), T + 1 times the "
             f"states of Viterbi. Produced by `python scripts/bench_slack_oracle.py`. Machine: {meta['machine']}.", "",
             "| data shape | B | T | K | loss-augmented Viterbi (ms) | slack DP (ms) | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['data']} | {r['B']} | {r['T']} | {r['K']} | {r['viterbi_ms']:.2f} | {r['slack_ms']:.2f} | "
                     f"{r['ratio']:.1f}x |")
    write_report(args.out, "slack_oracle", lines)


if __name__ == "__main__":
    main()
