"""The toy example of "Minding the gaps" App. C (Osokin et al., 2016): oracle calls to reach a duality gap
epsilon with uniform vs gap sampling; the predicted speed-up is about min(n, K, 1/(n eps)).

    python scripts/bench_bcfw_toy.py      # writes docs/benchmarks/bcfw_toy.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_optim_bcfw import _oracle_calls_to  # noqa: E402  (the same construction the tests use)

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "bcfw_toy.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="the report (markdown)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = ["| n | K | eps | min(n, K, 1/(n eps)) | uniform calls | gap-sampling calls | speed-up |",
            "|---|---|---|---|---|---|---|"]
    for n, K, eps in [(10, 200, 1e-4), (20, 200, 1e-4), (40, 200, 1e-4), (80, 200, 1e-4), (40, 10, 1e-4),
                      (40, 20, 1e-4), (40, 200, 1e-3)]:
        u = _oracle_calls_to(n, K, eps, "uniform")
        g = _oracle_calls_to(n, K, eps, "gap")
        pred = min(n, K, 1 / (n * eps))
        rows.append(f"| {n} | {K} | {eps:g} | {pred:g} | {u} | {g} | {u / g:.1f} |")
        print(rows[-1], flush=True)
    text = ["# Gap sampling on the toy example of App. C", "",
            "One hard block (K labels, features -e_k / sqrt 2) and n - 1 easy blocks, 0-1 loss, lam = 1/n. "
            "Oracle calls (exact-gap passes every 10 passes included) until the exact duality gap, checked after "
            "every pass, is <= eps; one seed. The paper predicts a speed-up of about min(n, K, 1/(n eps)); the "
            "pass granularity of the check rounds small counts up. Produced by `python scripts/bench_bcfw_toy.py` "
            "(2-core CPU, seconds).", "", *rows, ""]
    args.out.write_text("\n".join(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
