"""Benchmark: the loss-augmented pictorial-structure oracle (26-part pose tree) by distance transforms
against brute-force max-sum with explicit (HW) x (HW) tables.

Per grid (32x32, 64x64, 128x128 positions) and batch size (1, 16, 64; 256 up to 64x64), on seeded `synthetic_pose` data
(float32 detector maps as unaries, shared deformation weights, the LSP truncated loss), median of
``--repeats`` timed calls after one warm-up, one run on one machine:

- distance transform: ``SpatialTree.max_oracle(pot, target, scale)``, the BCFW oracle (unary + loss, then
  `kernels.spatial_tree_max_sum`), per backend ("torch", the vectorized twin; on CPU also "numba", the
  compiled twin that ``backend="auto"`` picks there; on CUDA "triton");
- brute force: `kernels.tree_max_sum` (torch, and triton on CUDA) on the same loss-augmented unaries with
  explicit shared tables ``(E, HW, HW)`` built from the same quadratic costs, where they fit
  (``--brute-max-bytes``, and batch 1 only from 64x64 up); elsewhere the O((HW)^2) extrapolation from the
  largest measured grid, marked as such.
  Building the tables (once per weight vector, shared by the batch) is timed separately.

Before timing, the script asserts that both give the same labels and values (``torch.equal``) on the
same problem made exact (unaries rounded to multiples of 1/64, rest offsets to half-integers, dyadic
weights) at every grid where brute force runs.

Mixture types per edge (`MixtureSpatialTree`, ``--types``, default 3 and 13; 13 is the paper's LSP count):
the same oracle with T deformation types per edge on articulated `synthetic_pose` (3 limb modes), rest
offsets from `data.edge_types` (K-means) and a type bias, without and with type co-occurrence scores, at
``--mixture-grids`` (32, 64) and batch 16, per backend. Each backend is checked first against brute force
with explicit tables ``max_t (bias + table_t)`` at 32x32, batch 1, T = 3 (equal values, and the returned
positions and types attain them). ``--pair-types t`` adds T = t^2 types without co-occurrence, one per pair of
t K-means types: the paper's exact two-orientation model (t = 13: 169 types per edge).

Writes ``docs/benchmarks/tree.{json,md}`` (``tree_cuda.*`` with ``--device cuda``); ``tree_findings.md``
(hand-written) is appended to the .md. Usage:

    python scripts/bench_tree.py [--device cuda] [--quick] [--report-only] [--pair-types 13]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from _bench_machine import cpu_description, median_seconds, write_report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
GRIDS = (32, 64, 128)
BATCHES = (1, 16, 64, 256)
MAX_BATCH_LABELS = 256 * 64 * 64  # batch x positions above this (256 at 128x128) is not run
BRUTE_MAX_BATCH = 64  # brute force batches at 32x32 and below (batch 1 above)
TARGET_CPU_MS = 5.0  # per image at 64x64, batched, 2-core CPU
TARGET_GPU_MS = 0.1  # per image at 64x64, batched, GPU
PAPER_S = 2.0  # the paper's MATLAB/C oracle, about 2 s per image
MIXTURE_TYPES = (3, 13)
MIXTURE_BATCH = 16


def make_problem(side: int, n: int, device, seed: int = 0):
    """A `SpatialTree` on ``side x side`` and a function ``batch(B)`` giving the first B of n seeded
    `synthetic_pose` examples: potentials (float32 sharp-detector maps as unaries, shared dyadic weights
    ``w_xx = w_yy = 1/16`` and zero linear terms, the split's rest offsets rounded to half-integers so that the
    exact variant is exact; the same weights and rest for every B), targets and loss scales."""
    from torchssvm.data.pose import POSE_PARENTS, synthetic_pose
    from torchssvm.structures.tree import SpatialTree, SpatialTreePotentials

    d = synthetic_pose("train", n, height=side, width=side, num_features=1, seed=seed)
    E = len(POSE_PARENTS) - 1
    weights = torch.tensor([0.0, 1 / 16, 0.0, 1 / 16]).repeat(E, 1).to(device)
    rest = ((d.rest * 2).round() / 2).float().to(device)
    unary = d.features[:, :, 0].float().to(device)
    target, scale = d.positions.to(device), d.scale.float().to(device)

    def batch(B):
        return SpatialTreePotentials(unary[:B].contiguous(), weights, rest), target[:B], scale[:B]

    return SpatialTree(POSE_PARENTS, side, side), batch


def build_tables(tree, weights, rest, dtype=torch.float32):
    """Shared ``(E, HW, HW)`` tables ``[l_p, l_c] = -w . Delta(l_c - l_p - r)``, the brute-force form of the
    spatial potentials."""
    H, W = tree.height, tree.width
    dev = weights.device
    pos = torch.arange(H * W, device=dev)
    x, y = (pos % W).to(dtype), (pos // W).to(dtype)
    tabs = torch.empty(tree.num_edges, H * W, H * W, dtype=dtype, device=dev)
    for e in range(tree.num_edges):
        w = weights[e].to(dtype)
        dx = x.view(1, -1) - x.view(-1, 1) - rest[e, 0].to(dtype)
        dy = y.view(1, -1) - y.view(-1, 1) - rest[e, 1].to(dtype)
        torch.mul(dx, w[0], out=tabs[e])
        tabs[e].add_(w[1] * dx * dx).add_(w[2] * dy).add_(w[3] * dy * dy).neg_()
        del dx, dy
    return tabs


def augmented_unary(tree, pot, target, scale):
    """The loss-augmented unary that ``SpatialTree.max_oracle`` decodes (unary + truncated LSP loss)."""
    lw = torch.ones(target.shape[0], dtype=torch.float64, device=target.device)
    return tree._augmented_unary(pot.unary, scale, target, lw)


def check_exact(tree, pot, target, scale, tables, backend) -> bool:
    """Distance transforms and brute force agree exactly on the problem rounded to dyadic values (brute force
    by the torch twin for the numba backend, which has no explicit-table oracle)."""
    from torchssvm.kernels import spatial_tree_max_sum, tree_max_sum

    unary = (augmented_unary(tree, pot, target, scale) * 64).round() / 64
    lab, val = spatial_tree_max_sum(unary, pot.weights, pot.rest, tree.parents, tree.height, tree.width,
                                    backend=backend)
    ref_lab, ref_val = tree_max_sum(unary, tables, tree.parents, backend="torch" if backend == "numba" else backend)
    assert torch.equal(lab, ref_lab), f"labels differ at {tree.height}x{tree.width} ({backend})"
    assert torch.equal(val, ref_val), f"values differ at {tree.height}x{tree.width} ({backend})"
    return True


def main(argv=None) -> None:
    from torchssvm.kernels import numba_available, tree_max_sum, triton_available

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--grids", type=int, nargs="+", default=list(GRIDS))
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--brute-max-bytes", type=float, default=2e9,
                    help="largest brute-force table set to build (bytes, float32)")
    ap.add_argument("--quick", action="store_true", help="small grids and batches, one repeat (smoke test)")
    ap.add_argument("--types", type=int, nargs="*", default=list(MIXTURE_TYPES),
                    help="mixture types per edge to time (none: skip the mixture section)")
    ap.add_argument("--mixture-grids", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--no-cooccurrence", action="store_true", help="time the mixtures without co-occurrence only")
    ap.add_argument("--pair-types", type=int, nargs="*", default=[],
                    help="also time t^2 types, the pairs of t types of an arc's two orientations (the paper: 13)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the saved .json")
    args = ap.parse_args(argv)
    if args.report_only:
        name = "tree_cuda" if args.device == "cuda" else "tree"
        saved = json.loads((args.out / f"{name}.json").read_text())
        write_report(args.out, name, report_lines(saved["rows"], saved["exact_checks"], saved["meta"],
                                                  args.device == "cuda", saved["meta"]["backends"],
                                                  saved["meta"].get("brute_backends", saved["meta"]["backends"]))
                     + mixture_lines(saved.get("mixture_rows", []), saved.get("mixture_checks", []), saved["rows"]))
        return
    if args.quick:
        args.grids, args.batches, args.repeats = [16, 32], [1, 4], 1
        args.types, args.mixture_grids = [3], [16]
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device available")
    device = torch.device(args.device)
    backends = ["torch"] + (["triton"] if cuda and triton_available() else [])
    brute_backends = list(backends)  # explicit tables: torch and triton
    if not cuda and numba_available():
        backends.append("numba")

    rows, checks, brute = [], [], {}
    for side in args.grids:
        K = side * side
        table_bytes = 25 * K * K * 4
        tree, batch = make_problem(side, max(b for b in args.batches if b * K <= MAX_BATCH_LABELS or b == 1), device)
        tables = None
        if table_bytes <= args.brute_max_bytes:
            pot, _, _ = batch(1)
            t0 = time.perf_counter()
            tables = build_tables(tree, pot.weights, pot.rest)
            if cuda:
                torch.cuda.synchronize()
            build_s = time.perf_counter() - t0
            print(f"{side}x{side}: tables {table_bytes / 1e9:.2f} GB built in {build_s:.2f} s", flush=True)
        for B in args.batches:
            if B * K > MAX_BATCH_LABELS:
                continue
            pot, target, scale = batch(B)
            for be in backends:
                s = median_seconds(lambda: tree.max_oracle(pot, target, scale, backend=be),  # noqa: B023
                                   args.repeats, cuda)
                row = {"grid": side, "B": B, "method": "distance transform", "backend": be,
                       "batch_ms": 1e3 * s, "ms_per_image": 1e3 * s / B, "measured": True}
                rows.append(row)
                print(row, flush=True)
            # brute force: batches up to BRUTE_MAX_BATCH at grids up to 32x32, batch 1 only above
            if tables is None or not (B == 1 or (side <= 32 and B <= BRUTE_MAX_BATCH)):
                continue
            for be in backends:
                checks.append({"grid": side, "backend": be, "B": B,
                               "exact_match": check_exact(tree, pot, target, scale, tables, be)})
            unary = augmented_unary(tree, pot, target, scale)
            for be in brute_backends:
                s = median_seconds(lambda: tree_max_sum(unary, tables, tree.parents, backend=be),  # noqa: B023
                                   args.repeats if side <= 32 else 1, cuda)
                row = {"grid": side, "B": B, "method": "brute force", "backend": be,
                       "batch_ms": 1e3 * s, "ms_per_image": 1e3 * s / B, "measured": True,
                       "table_build_s": build_s}
                brute[(side, B, be)] = row["ms_per_image"]
                rows.append(row)
                print(row, flush=True)
        tables = None
    # extrapolate brute force where it was not run: O((HW)^2) from the largest grid measured at batch 1
    for be in brute_backends:
        measured = sorted(side for (side, b, bk) in brute if b == 1 and bk == be)
        if not measured:
            continue
        base = measured[-1]
        for side in args.grids:
            if (side, 1, be) not in brute:
                est = brute[(base, 1, be)] * (side * side / (base * base)) ** 2
                rows.append({"grid": side, "B": 1, "method": "brute force", "backend": be, "batch_ms": est,
                             "ms_per_image": est, "measured": False, "extrapolated_from": base})

    mixture_rows, mixture_checks = [], []
    if args.types:
        mixture_rows, mixture_checks = run_mixtures(args, device, backends, cuda)

    device_name = torch.cuda.get_device_name() if cuda else "CPU"
    meta = {"machine": cpu_description(), "device": device_name, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "repeats": args.repeats,
            "backends": backends, "brute_backends": brute_backends,
            "command": " ".join(["python scripts/bench_tree.py", *(argv if argv is not None else sys.argv[1:])])}
    name = "tree_cuda" if cuda else "tree"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "exact_checks": checks,
                                                       "mixture_rows": mixture_rows,
                                                       "mixture_checks": mixture_checks}, indent=1))
    write_report(args.out, name, report_lines(rows, checks, meta, cuda, backends, brute_backends)
                 + mixture_lines(mixture_rows, mixture_checks, rows))


def make_mixture_problem(side: int, T: int, n: int, device, seed: int = 0, cooccurrence: bool = False,
                         pairs: bool = False):
    """A `MixtureSpatialTree` with T types per edge on ``side x side`` and the first n articulated
    `synthetic_pose` examples (3 limb modes): potentials (float32 sharp-detector unaries, the shared weights of
    `make_problem` for every type, K-means rest offsets rounded to half-integers, a dyadic type bias in
    [-1/2, 1/2], and with ``cooccurrence`` shared dyadic co-occurrence scores in [-1/2, 1/2]), targets
    (positions and K-means types) and loss scales. ``pairs``: T = t^2 types, one per pair of t K-means types
    (the paper's types of the two orientations of an arc: two equal quadratics in the same displacement are
    one, centred at the mean of the two rest offsets)."""
    from torchssvm.data.pose import POSE_PARENTS, edge_types, synthetic_pose
    from torchssvm.structures.mixture_tree import MixtureSpatialTree, MixtureTreePotentials

    d = synthetic_pose("train", max(n, 64), height=side, width=side, num_features=1, limb_modes=3, seed=seed)
    E = len(POSE_PARENTS) - 1
    if pairs:
        t = math.isqrt(T)
        if t * t != T:
            raise ValueError(f"pairs needs a square number of types, got T = {T}")
        base = edge_types(d, t, seed=seed)
        rest = ((base.rest[:, :, None] + base.rest[:, None, :]) / 2).reshape(E, T, 2)
        et = base._replace(rest=rest, types=base.types * t + base.types)
    else:
        et = edge_types(d, T, seed=seed)
    g = torch.Generator().manual_seed(seed)
    weights = torch.tensor([0.0, 1 / 16, 0.0, 1 / 16]).repeat(E, T, 1).to(device)
    rest = ((et.rest * 2).round() / 2).float().to(device)
    bias = (torch.randint(-8, 9, (1, E, T, 1), generator=g) / 16).float().expand(n, E, T, 1).to(device)
    cooc = (torch.randint(-8, 9, (E, T, T), generator=g) / 16).float().to(device) if cooccurrence else None
    pot = MixtureTreePotentials(d.features[:n, :, 0].float().contiguous().to(device), weights, rest, bias, None,
                                cooc)
    target = torch.cat([d.positions[:n], et.types[:n]], 1).to(device)
    return MixtureSpatialTree(POSE_PARENTS, side, side, T), pot, target, d.scale[:n].float().to(device)


def check_mixture(side, T, device, backend) -> bool:
    """The mixture oracle against brute force with explicit tables ``max_t (bias_t + table_t)`` on one
    example made exact (dyadic unaries): equal values, and the returned positions and types attain them."""
    from torchssvm.kernels import tree_max_sum

    from torchssvm.structures.mixture_tree import MixtureTreePotentials

    tree, pot, target, scale = make_mixture_problem(side, T, 1, device)
    lw = torch.ones(1, dtype=torch.float64, device=device)
    unary = (tree._augmented_unary(pot.unary, scale, target[:, :tree.num_nodes], lw) * 64).round() / 64
    exact = MixtureTreePotentials(unary, pot.weights, pot.rest, pot.child_scores)
    labels, value = tree._max_oracle(exact, None, None, None, backend)
    tables = torch.stack([build_tables(tree, pot.weights[:, t], pot.rest[:, t]) + pot.child_scores[0, :, t]
                          .view(-1, 1, 1) for t in range(T)]).amax(0)
    _, ref = tree_max_sum(unary, tables, tree.parents, backend="torch")
    assert torch.equal(value, ref), f"mixture values differ at {side}x{side}, T = {T} ({backend})"
    attained = tree._score(exact, labels, None)
    assert torch.equal(attained, value), f"the mixture labelling does not attain its value ({backend})"
    return True


def run_mixtures(args, device, backends, cuda):
    rows, checks = [], []
    for be in backends:
        checks.append({"grid": 32, "T": 3, "backend": be, "exact_match": check_mixture(32, 3, device, be)})
    cases = [(T, cooc, False) for T in args.types for cooc in ((False,) if args.no_cooccurrence else (False, True))]
    cases += [(t * t, False, True) for t in args.pair_types]
    for side in args.mixture_grids:
        for T, cooc, pairs in cases:
            tree, pot, target, scale = make_mixture_problem(side, T, MIXTURE_BATCH, device, cooccurrence=cooc,
                                                            pairs=pairs)
            for be in backends:
                s = median_seconds(lambda: tree.max_oracle(pot, target, scale, backend=be),  # noqa: B023
                                   args.repeats, cuda)
                row = {"grid": side, "B": MIXTURE_BATCH, "T": T, "cooccurrence": cooc, "pairs": pairs,
                       "backend": be, "batch_ms": 1e3 * s, "ms_per_image": 1e3 * s / MIXTURE_BATCH}
                rows.append(row)
                print(row, flush=True)
    return rows, checks


def mixture_lines(mixture_rows, mixture_checks, rows):
    if not mixture_rows:
        return []
    backends = list(dict.fromkeys(r["backend"] for r in mixture_rows))
    lines = ["", "## Mixture types per edge", "",
             f"`MixtureSpatialTree.max_oracle` with T types per edge (batch {mixture_rows[0]['B']}, articulated "
             "`synthetic_pose` with 3 limb modes, K-means rest offsets, a type bias; same run). The one-type "
             "figure is the main table's `SpatialTree` row at the same grid and batch; the ratio is the "
             "mixture's time over it (T transforms per edge, so about T is the expectation). Co-occurrence: "
             "type co-occurrence scores of consecutive edges, messages per type of the parent's edge "
             "(T^2 extra work per position and edge).", "",
             "| grid | T | co-occurrence | " + " | ".join(f"{be} (ms/image) | {be} / one type" for be in backends)
             + " |", "|---|---|---|" + "---|---|" * len(backends)]

    def one_type(side, B, be):
        for r in rows:
            if (r["grid"], r["B"], r["method"], r["backend"]) == (side, B, "distance transform", be):
                return r["ms_per_image"]
        return None

    for side in sorted({r["grid"] for r in mixture_rows}):
        for T in sorted({r["T"] for r in mixture_rows}):
            for cooc in sorted({r.get("cooccurrence", False) for r in mixture_rows}):
                cells = []
                for be in backends:
                    r = next((r for r in mixture_rows if (r["grid"], r["T"], r.get("cooccurrence", False),
                                                          r["backend"]) == (side, T, cooc, be)), None)
                    base = one_type(side, r["B"], be) if r else None
                    cells += [f"{r['ms_per_image']:.2f}" if r else "-",
                              f"{r['ms_per_image'] / base:.1f}x" if r and base else "-"]
                if all(c == "-" for c in cells):
                    continue
                pairs = any(r.get("pairs") for r in mixture_rows if r["T"] == T)
                label = f"{T} ({math.isqrt(T)} x {math.isqrt(T)} pairs)" if pairs else str(T)
                lines.append(f"| {side}x{side} | {label} | {'yes' if cooc else 'no'} | " + " | ".join(cells) + " |")
    lines += ["", "Exactness: values equal to brute force with explicit tables `max_t (bias_t + table_t)`, and the "
              "returned positions and types attain them, at: "
              + ", ".join(f"{c['grid']}x{c['grid']} T = {c['T']} ({c['backend']})" for c in mixture_checks)
              + ". Co-occurrence has no explicit-table form over positions alone; `tests/test_mixture_tree.py` "
              "checks it against enumeration over positions and types."]
    return lines


def report_lines(rows, checks, meta, cuda, backends, brute_backends):
    lines = ["# Pictorial-structure oracle: distance transforms against brute force (26-part pose tree)", "",
             f"Machine: {meta['machine']}; device {meta['device']}; torch {meta['torch']}; {meta['threads']} "
             f"threads. Command: `{meta['command']}`. Median of {meta['repeats']} timed calls after one warm-up "
             "(brute force beyond 32x32: one timed call); every figure from the same run. Milliseconds per "
             "image = batch time / batch size. The oracle is loss-augmented decoding (unary + LSP truncated "
             "loss), what BCFW calls once per example.", "",
             "| grid | batch | " + " | ".join(f"DT {be} (ms/image)" for be in backends)
             + " | " + " | ".join(f"brute force {be} (ms/image)" for be in brute_backends)
             + f" | speed-up (DT {backends[-1]} vs brute torch) |",
             "|---|---|" + "---|" * (len(backends) + len(brute_backends) + 1)]

    def get(side, B, method, be):
        for r in rows:
            if (r["grid"], r["B"], r["method"], r["backend"]) == (side, B, method, be):
                return r
        return None

    grids = sorted({r["grid"] for r in rows})
    batches = sorted({r["B"] for r in rows if r["method"] == "distance transform"})
    for side in grids:
        for B in batches:
            dts = [get(side, B, "distance transform", be) for be in backends]
            bfs = [get(side, B, "brute force", be) for be in brute_backends]
            if not any(dts):
                continue
            cells = [f"{r['ms_per_image']:.2f}" if r else "-" for r in dts]
            for r in bfs:
                cells.append("-" if r is None else f"{r['ms_per_image']:.1f}"
                             + ("" if r["measured"] else f" (extrapolated from {r['extrapolated_from']}x"
                                f"{r['extrapolated_from']}, x (HW)^2)"))
            dt0, bf0 = dts[-1], bfs[0]
            cells.append(f"{bf0['ms_per_image'] / dt0['ms_per_image']:.1f}x"
                         + ("" if bf0["measured"] else " (est.)") if dt0 and bf0 else "-")
            lines.append(f"| {side}x{side} | {B} | " + " | ".join(cells) + " |")
    builds = sorted({(r["grid"], r["table_build_s"]) for r in rows if "table_build_s" in r})
    lines += ["", "Brute force uses shared float32 tables (E = 25, (HW)^2 entries each: "
              + ", ".join(f"{s}x{s}: {25 * (s * s) ** 2 * 4 / 1e9:.2f} GB built in {t:.2f} s" for s, t in builds)
              + "), built once per weight vector and not counted in the per-image time. Where it was not run the "
              "figure is the batch-1 time of the largest grid measured times the ratio of (HW)^2, marked "
              "extrapolated.", "",
              "Exactness: on each problem rounded to dyadic values (unaries to 1/64, rest offsets to "
              "half-integers), distance transforms and brute force return identical labels and values "
              "(`torch.equal`) at: " + (", ".join(f"{c['grid']}x{c['grid']} batch {c['B']} ({c['backend']})"
                                                   for c in checks) or "none (brute force not run)") + ".", "",
              "## Targets", ""]
    best64 = [r for r in rows if r["grid"] == 64 and r["method"] == "distance transform" and r["B"] > 1]
    if best64:
        for be in backends:
            rs = [r for r in best64 if r["backend"] == be]
            if not rs:
                continue
            r = min(rs, key=lambda r: r["ms_per_image"])
            target = TARGET_GPU_MS if cuda else TARGET_CPU_MS
            where = "GPU" if cuda else "CPU"
            ok = "met" if r["ms_per_image"] <= target else "NOT met"
            lines.append(f"- 64x64, batched, {where}, {be}: best {r['ms_per_image']:.2f} ms per image (batch {r['B']}) "
                         f"against at most {target} ms: {ok}. The paper's MATLAB/C oracle: about "
                         f"{PAPER_S * 1e3:.0f} ms per image ({PAPER_S * 1e3 / r['ms_per_image']:.0f}x slower).")
    else:
        lines.append("- 64x64 batched not measured in this run.")
    if not cuda:
        lines.append("- GPU (at most 0.1 ms per image at 64x64): not measured in this run (no CUDA device); "
                     "run `python scripts/bench_tree.py --device cuda` on a GPU machine (torch and Triton backends).")
    return lines


if __name__ == "__main__":
    main()
