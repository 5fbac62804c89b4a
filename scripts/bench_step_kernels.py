"""Benchmark: the mini-batch BCFW step's bookkeeping as Triton kernels against the torch ops they replace.

Six operations of a pairwise + cache step on the chain SSVM, at OCR-large's shapes (26 labels, width 14,
B = 64 blocks of 6,251, 10 cached labellings each), each timed per call with both backends on one device:

- ``chain_labels_score``: the scores of the B x 10 cached labellings (`chain_score_triton`);
- ``chain_inner``: ``<theta_b, z_b>`` of the B blocks (`chain_score_triton`);
- ``chain_marginals``: a pairwise direction, the difference of two corners (`chain_marginals_triton`);
- ``insert_batch``: the FW atoms' insertion into the cache (`atoms_insert_triton`), with its one read of the
  appended counts, which both backends make;
- ``select_atoms``: the cache test, the FW atoms and the away atoms from the oracle's answer
  (`atoms_select_triton`);
- ``apply_block_step``: the end of the step, z, l and the atoms' weights of the B blocks (`block_step_triton`).

On a GPU the torch ops are launch-bound: the time per call is the number of kernels times the launch cost, which
is what the fused kernels remove (launch counts: docs/benchmarks/host_syncs.md). The CPU has no Triton (the
interpreter is not a speed), so there only the torch side runs.

    python scripts/bench_step_kernels.py --device cuda   # writes docs/benchmarks/step_kernels_cuda.{json,md}
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _bench_machine import code_version, device_description, measured_or_saved, write_report

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
N, B, C, T, K = 6251, 64, 10, 14, 26


def _per_call(fn, device: torch.device, calls: int) -> float:
    """Seconds per call over ``calls`` back-to-back calls after a warm-up (the device drained before and after)."""
    fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls


def _operations(device: torch.device, backend: str) -> dict:
    from torchssvm.kernels import apply_block_step, chain_inner, chain_labels_score, chain_marginals, select_atoms

    from torchssvm.optim.frank_wolfe.atoms import AtomStore

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, T + 1, (N,), generator=g)
    pad = torch.arange(T) >= lengths.unsqueeze(1)
    truth = torch.randint(0, K, (N, T), generator=g).masked_fill(pad, -1)
    idx = torch.randperm(N, generator=g)[:B]
    lab = torch.randint(0, K, (B, C, T), generator=g).masked_fill(pad[idx].unsqueeze(1), -1)
    unary = torch.randn(B, T, K, generator=g, dtype=torch.float64)
    trans, start, end = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((K, K), (K,), (K,)))
    d = {name: t.to(device) for name, t in (("lengths", lengths[idx]), ("lab", lab), ("unary", unary),
                                             ("trans", trans), ("start", start), ("end", end), ("idx", idx))}
    store = AtomStore(truth.to(device), C, backend=backend)
    for _ in range(C - 1):  # fill every block's cache, so that insertions replace inactive atoms
        store.insert_batch(torch.arange(N, device=device), torch.randint(0, K, (N, T), generator=g).to(device),
                           torch.rand(N, dtype=torch.float64).to(device), torch.zeros(N, C, dtype=torch.float64,
                                                                                       device=device),
                           cap=C, keep_active=True)
    scores = torch.randn(B, C, dtype=torch.float64, device=device)
    new = torch.randint(0, K, (B, T), generator=g).to(device)
    loss = torch.rand(B, dtype=torch.float64, device=device)
    a_H = torch.randn(B, C, dtype=torch.float64, device=device)
    a_alpha = torch.rand(B, C, dtype=torch.float64, device=device)
    a_labels, a_loss, _ = store.slots(d["idx"], idx)
    base, ell = torch.randn(B, dtype=torch.float64, device=device), torch.randn(B, dtype=torch.float64, device=device)
    gaps = torch.rand(N, dtype=torch.float64, device=device)
    misses = torch.zeros((), dtype=torch.long, device=device)
    m = T * K + K * K + 2 * K  # the chain problem's block vectors
    z, z_ell = torch.zeros(N, m, dtype=torch.float64, device=device), torch.zeros(N, dtype=torch.float64, device=device)
    direction = torch.randn(B, m, generator=g, dtype=torch.float64).to(device)
    gamma = torch.rand(B, generator=g, dtype=torch.float64).to(device) / 100
    slot_s, slot_a = (torch.randint(0, C, (B,), generator=g).to(device) for _ in range(2))
    return {
        "select_atoms": lambda: select_atoms(a_H, store.count, a_labels, a_loss, a_alpha, d["idx"], base, ell,
                                             gaps, new, loss, base, N, 0.25, 1e-4, misses, True, backend=backend),
        "chain_labels_score": lambda: chain_labels_score(d["unary"], d["trans"], d["start"], d["end"], d["lab"],
                                                         d["lengths"], backend=backend),
        "chain_inner": lambda: chain_inner(d["unary"], d["trans"], d["start"], d["end"], direction, backend=backend),
        "chain_marginals": lambda: chain_marginals(d["lab"][:, 0], d["lengths"], K, d["lab"][:, 1],
                                                   backend=backend),
        "insert_batch": lambda: store.insert_batch(d["idx"], new, loss, scores, cap=C, keep_active=True,
                                                   host_idx=idx),
        "apply_block_step": lambda: apply_block_step(z, z_ell, d["idx"], z[d["idx"]], z_ell[d["idx"]], gamma,
                                                     direction, loss, store.alpha, store.alpha_valid, "pairwise",
                                                     slot_s, slot_a, a_alpha[:, 0], backend=backend),
    }


def measure(device: torch.device, calls: int) -> dict:
    backends = ["torch", "triton"] if device.type == "cuda" else ["torch"]
    results = {}
    for backend in backends:
        for name, fn in _operations(device, backend).items():
            results.setdefault(name, {})[backend] = _per_call(fn, device, calls)
    return results


def write(results: dict, out: Path, cuda: bool) -> None:
    lines = ["# The BCFW step's bookkeeping: Triton kernels against torch ops", "",
             f"Command: `python scripts/bench_step_kernels.py{' --device cuda' if cuda else ''}`; "
             f"{results['device']}; torch {results['torch']}, code {results['code']}. OCR-large's shapes: B = {B} "
             f"blocks of {N}, {C} cached labellings, width {T}, {K} labels, float64; microseconds per call over "
             f"{results['calls']} back-to-back calls.", "",
             "| operation | torch ops (us) | Triton kernel (us) | torch / Triton |", "|---|---|---|---|"]
    for name, r in results["ops"].items():
        tri = r.get("triton")
        kernel, ratio = ("-", "-") if tri is None else (f"{1e6 * tri:.1f}", f"{r['torch'] / tri:.1f}x")
        lines.append(f"| `{name}` | {1e6 * r['torch']:.1f} | {kernel} | {ratio} |")
    lines.append("")
    write_report(out, "step_kernels_cuda" if cuda else "step_kernels", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def run() -> dict:
        results = {"device": device_description(device), "torch": torch.__version__, "code": code_version(),
                   "calls": args.calls, "ops": measure(device, args.calls)}
        print(json.dumps(results["ops"], indent=1))
        return results

    results = measured_or_saved(args.out / ("step_kernels_cuda.json" if cuda else "step_kernels.json"),
                                args.report_only, run)
    write(results, args.out, cuda)


if __name__ == "__main__":
    main()
