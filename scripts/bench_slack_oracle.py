"""Cost of the exact slack-rescaled chain oracle against plain loss-augmented Viterbi (same machine, one run).

The error-count DP (`torchssvm.kernels.chain.slack_chain_torch`) runs Viterbi over (label, errors so far),
``T + 1`` times the states; this measures what that costs at the shapes of the papers' chain data:
OCR words (T = 14, K = 26) and CoNLL-2000 sentences (T = 40 and 78, K = 22), batches of 64 and 512,
random float64 potentials (float32 on CUDA), median of ``--repeats`` timed calls after one warm-up. Writes
``docs/benchmarks/slack_oracle.{md,json}``; with ``--device cuda`` the Triton kernels (backend "auto")
against the torch twins on the GPU, to ``slack_oracle_cuda.{md,json}``.

    python scripts/bench_slack_oracle.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _bench_machine import device_description, median_seconds, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
SHAPES = [("OCR", 64, 14, 26), ("OCR", 512, 14, 26), ("CoNLL", 64, 40, 22), ("CoNLL", 512, 40, 22),
          ("CoNLL longest", 64, 78, 22)]


def main() -> None:
    import torchssvm as ts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dt = torch.float32 if cuda else torch.float64
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, B, T, K in SHAPES:
        chain = ts.Chain(K)
        pot = ts.ChainPotentials(*(torch.randn(*s, generator=g, dtype=dt).to(args.device)
                                   for s in ((B, T, K), (K, K), (K,), (K,))))
        y = torch.randint(0, K, (B, T), generator=g).to(args.device)
        row = {"data": name, "B": B, "T": T, "K": K}
        backends = ("torch", "triton") if cuda else ("torch",)
        for be in backends:
            row[f"viterbi_{be}_ms"] = 1e3 * median_seconds(
                lambda be=be: chain.max_oracle(pot, y, backend=be), args.repeats, cuda)  # noqa: B023
            row[f"slack_{be}_ms"] = 1e3 * median_seconds(
                lambda be=be: chain.slack_max_oracle(pot, y, backend=be), args.repeats, cuda)  # noqa: B023
            row[f"ratio_{be}"] = row[f"slack_{be}_ms"] / row[f"viterbi_{be}_ms"]
        rows.append(row)
        print(row, flush=True)
    device = device_description(torch.device("cuda" if cuda else "cpu"))
    meta = {"machine": f"{device}, {torch.get_num_threads()} torch threads; torch {torch.__version__}"}
    name = "slack_oracle_cuda" if cuda else "slack_oracle"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# Exact slack-rescaled chain oracle against loss-augmented Viterbi", "",
             f"Median milliseconds per batched call ({'float32' if cuda else 'float64'}, full-length sequences). "
             "The slack oracle is the error-count DP: Viterbi over (label, errors so far), T + 1 times the "
             f"states of Viterbi. Produced by `python scripts/bench_slack_oracle.py --device {args.device}`. "
             f"Machine: {meta['machine']}.", ""]
    head = "| data shape | B | T | K |"
    for be in backends:
        head += f" Viterbi {be} (ms) | slack DP {be} (ms) | ratio {be} |"
    lines += [head, "|" + "---|" * (4 + 3 * len(backends))]
    for r in rows:
        line = f"| {r['data']} | {r['B']} | {r['T']} | {r['K']} |"
        for be in backends:
            line += f" {r[f'viterbi_{be}_ms']:.2f} | {r[f'slack_{be}_ms']:.2f} | {r[f'ratio_{be}']:.1f}x |"
        lines.append(line)
    write_report(args.out, name, lines)


if __name__ == "__main__":
    main()
