"""Report: how often the mini-batch BCFW step makes the host wait for the device, and where, without a GPU.

On a GPU each host synchronisation (a value read with ``.item()``/``bool()``, a boolean-mask read or write, a
copy to the host, a blocking copy from it) drains the launch queue, so a step's count of them is a fixed cost
per mini-batch that no kernel speed-up removes. This runs BCFW on a simulated CUDA device
(`torchssvm.testing.simulated_cuda`: the CUDA code paths on the CPU) on OCR-large's shapes (a ``synthetic_chain``
with OCR's 26 labels and 128 features, n = 512) for batch sizes B and two configurations, and counts the
synchronisations per mini-batch by library line. With ``--device cuda`` it runs on a real GPU and counts the CUDA
runtime's waiting calls in a profile (`torchssvm.testing.count_cuda_waits`) instead, by call.

    python scripts/report_host_syncs.py                 # writes docs/benchmarks/host_syncs.{json,md}
    python scripts/report_host_syncs.py --device cuda   # writes host_syncs_cuda.{json,md}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _bench_machine import write_report as write_markdown

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
_TIME_TO_GAP = {"sampling": "gap", "step": "pairwise", "cache_size": 10, "gap_check_every": 5}
CONFIGS = {"FW steps, uniform sampling (the paper's); the host step": {"host_free": False},
           "pairwise steps, gap sampling, cache 10 (the time-to-gap runs); the host step":
               {**_TIME_TO_GAP, "host_free": False},
           # eager: every kernel launched from Python (on CUDA the default replays the step as one graph)
           "FW steps, uniform sampling; the host-free step, eager": {"host_free": True, "cuda_graph": False},
           "pairwise steps, gap sampling, cache 10; the host-free step, eager":
               {**_TIME_TO_GAP, "host_free": True, "cuda_graph": False}}


def _warm_solver(B: int, config: dict, n: int):
    """BCFW on ``cuda`` after its first pass (which visits every block once): the passes after it are counted.
    The Triton oracle, which ``backend="auto"`` picks on CUDA (interpreted on the simulated device): one launch,
    not its torch twin's 180."""
    import torchssvm as ts

    ds = ts.data.synthetic_chain("train", n, num_labels=26, num_features=128, seed=0)
    model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device="cuda")
    solver = ts.optim.BCFW(model, ds.to("cuda"), lam=1e-3, batch_size=B, seed=0, backend="triton", **config)
    solver.step()
    return solver


def _per_minibatch(counter, batches: int) -> dict:
    return {k: v / batches for k, v in counter.most_common()}


def measure(B: int, config: dict, n: int, passes: int) -> dict:
    from torchssvm.testing import simulated_cuda

    with simulated_cuda() as mode:
        solver = _warm_solver(B, config, n)
        before, mode.sync_sites = mode.syncs, type(mode.sync_sites)()
        launches, mode.launch_sites = mode.launches, type(mode.launch_sites)()
        for _ in range(passes):
            solver.step()
    batches = passes * -(-n // B)
    return {"B": B, "per_minibatch": (mode.syncs - before) / batches, "sites": _per_minibatch(mode.sync_sites, batches),
            "launches_per_minibatch": (mode.launches - launches) / batches,
            "launch_sites": _per_minibatch(mode.launch_sites, batches)}


def measure_cuda(B: int, config: dict, n: int, passes: int) -> dict:
    """`measure` on a real GPU: the waiting runtime calls, by call."""
    from torchssvm.testing import count_cuda_waits

    solver = _warm_solver(B, config, n)
    with count_cuda_waits() as waits:
        for _ in range(passes):
            solver.step()
    batches = passes * -(-n // B)
    return {"B": B, "per_minibatch": sum(waits.values()) / batches, "sites": _per_minibatch(waits, batches)}


def write_report(results: dict, out: Path, cuda: bool = False) -> None:
    if cuda:
        head = ["# Host waits per mini-batch BCFW step on a GPU", "",
                f"Command: `python scripts/report_host_syncs.py --device cuda`, on {results.get('device', 'a GPU')}: "
                "the CUDA runtime calls that block the host (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, "
                "`cudaEventSynchronize`, `cudaMemcpy`) in a `torch.profiler` trace. Data: `synthetic_chain`, n = "
                "512, 26 labels, 128 features (OCR's shapes), lambda 1e-3, float64, the Triton oracle; counts "
                "averaged over the passes after the first. The simulated device's count of the same runs: "
                "[host_syncs.md](host_syncs.md).", ""]
    else:
        head = ["# Host synchronisations per mini-batch BCFW step", "",
                "Command: `python scripts/report_host_syncs.py`, on the CPU with a simulated CUDA device "
                "(`torchssvm.testing.simulated_cuda`: the CUDA code paths run, every value the host reads from "
                "the device is counted: value reads, boolean-mask reads and writes, copies to the host and "
                "blocking copies from it). Data: `synthetic_chain`, n = 512, 26 labels, 128 features (OCR's "
                "shapes), lambda 1e-3, float64, the Triton oracle (interpreted; what `backend=\"auto\"` runs on CUDA); "
                "counts averaged over the passes after the first. Kernel launches: the aten ops on device tensors "
                "that are not views or bare allocations, and the Triton kernels' launches.", ""]
    lines, where = head, "runtime call" if cuda else "library line"
    for name, runs in results.items():
        if name == "device":
            continue
        launches = not cuda and "launches_per_minibatch" in runs[0]
        lines += [f"## {name}", ""]
        if launches:
            lines += ["| B | syncs per mini-batch | per block | kernel launches per mini-batch |", "|---|---|---|---|"]
            lines += [f"| {r['B']} | {r['per_minibatch']:.1f} | {r['per_minibatch'] / r['B']:.2f} | "
                      f"{r['launches_per_minibatch']:.0f} |" for r in runs]
        else:
            lines += ["| B | syncs per mini-batch | per block |", "|---|---|---|"]
            lines += [f"| {r['B']} | {r['per_minibatch']:.1f} | {r['per_minibatch'] / r['B']:.2f} |" for r in runs]
        top = next((r for r in runs if r["B"] == 64), runs[-1])  # issue 4's batch size
        lines += ["", f"Where, at B = {top['B']} (syncs per mini-batch, by {where}):", "",
                  f"| {where} | syncs |", "|---|---|"]
        lines += [f"| `{k}` | {v:.2f} |" for k, v in top["sites"].items() if v >= 0.05]
        if launches:
            lines += ["", f"Kernel launches per mini-batch at B = {top['B']}, by library function (the ten largest):",
                      "", "| function | launches |", "|---|---|"]
            lines += [f"| `{k}` | {v:.1f} |" for k, v in list(top["launch_sites"].items())[:10]]
        lines.append("")
    write_markdown(out, "host_syncs_cuda" if cuda else "host_syncs", lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["simulated", "cuda"], default="simulated")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    path = args.out / ("host_syncs_cuda.json" if cuda else "host_syncs.json")
    if args.report_only:
        results = json.loads(path.read_text())
    else:
        run = measure_cuda if cuda else measure
        results = {name: [run(B, cfg, args.n, args.passes) for B in args.batch_sizes]
                   for name, cfg in CONFIGS.items()}
        for name, runs in results.items():
            print(name, [(r["B"], round(r["per_minibatch"], 1)) for r in runs])
        if cuda:
            results["device"] = torch.cuda.get_device_name()
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
    write_report(results, args.out, cuda)


if __name__ == "__main__":
    main()
