"""The mini-batch BCFW step on a GPU: the host step against the host-free step, eager and replayed as a CUDA graph.

For each mode and batch size B on OCR-large (lambda 1e-3; the time-to-gap configuration: gap sampling, pairwise
steps, a cache of 10 labellings, an exact gap every 5 passes):

- ``host``: ``host_free=False`` (the host draws the blocks and solves the box QP: 1 to 3 waits per step);
- ``eager``: ``host_free=True, cuda_graph=False`` (no wait per step; every kernel launched from Python);
- ``graph``: ``host_free=True, cuda_graph=True`` (each step replayed as one CUDA graph).

It reports seconds per pass in steady state (after two warm-up passes), milliseconds per step, the GPU's busy
fraction over one pass (kernel time in a ``torch.profiler`` trace over wall time), the host waits and launches
in that pass, and, with ``--time-to-gap``, the wall time from the solver's construction to the first exact gap
(start-up) and to a certified ``--tol``.

    python scripts/bench_bcfw_gpu_step.py --device cuda --out DIR [--time-to-gap --budget 60]
    python scripts/bench_bcfw_gpu_step.py --device cpu --batch-sizes 64 --modes host eager --passes 2   # smoke

Writes ``bcfw_gpu_step_{device}.{json,md}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from _bench_machine import code_version
from bench_bcfw_speed import SETTINGS, load, machine

CONFIG = {"sampling": "gap", "step": "pairwise", "cache_size": 10, "gap_check_every": 5}
MODES = {"host": {"host_free": False}, "eager": {"host_free": True, "cuda_graph": False},
         "graph": {"host_free": True, "cuda_graph": True}}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _solver(train, lam, B, mode, device, qp_max_iter):
    import torchssvm as ts

    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, dtype=torch.float64,
                                device=device)
    kw = dict(MODES[mode])
    if mode == "graph" and device.type != "cuda":
        kw.pop("cuda_graph")
    if qp_max_iter is not None and kw.get("host_free"):
        kw["qp_max_iter"] = qp_max_iter
    return ts.optim.BCFW(model, train.to(device), lam=lam, batch_size=B, seed=0, **{**CONFIG, **kw})


def _profile_pass(solver, device) -> dict:
    """GPU kernel time, waits and launches over one pass (the report read included)."""
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        solver.step()
        _sync(device)
        wall = time.perf_counter() - t0
    kernel_us, waits, launches = 0.0, 0, 0
    for e in prof.events():
        name = e.name
        if name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
            waits += 1
        elif name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                      "cudaLaunchKernelExC"):
            launches += 1
        elif name.startswith("cudaMemcpy") and "Async" not in name:
            waits += 1
        device_type = getattr(e, "device_type", None)
        if device_type is not None and device_type.name == "CUDA":
            kernel_us += e.self_device_time_total if hasattr(e, "self_device_time_total") else e.self_cuda_time_total
    return {"wall": wall, "kernel_seconds": kernel_us * 1e-6, "busy": kernel_us * 1e-6 / wall, "waits": waits,
            "host_launch_calls": launches}


def measure(train, lam, B, mode, device, passes, qp_max_iter) -> dict:
    solver = _solver(train, lam, B, mode, device, qp_max_iter)
    for _ in range(2):  # warm-up: compiles, the first visits, the captures
        solver.step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(passes):
        r = solver.step()
    _sync(device)
    per_pass = (time.perf_counter() - t0) / passes
    steps = -(-solver.n // B)
    out = {"mode": mode, "batch_size": B, "seconds_per_pass": per_pass, "ms_per_step": 1e3 * per_pass / steps,
           "steps_per_pass": steps, "gap": r["gap"], "qp_unconverged": r.get("qp_unconverged"),
           "graph_captures": getattr(solver, "graph_captures", 0), "cuda_graph": getattr(solver, "cuda_graph", False)}
    if device.type == "cuda":
        try:
            out["profile"] = _profile_pass(solver, device)
        except Exception as e:  # noqa: BLE001 - a profiler failure must not lose the timings
            out["profile"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def time_to_gap(train, lam, B, mode, device, tol, budget, qp_max_iter) -> dict:
    """Wall seconds from before the solver is built to each exact gap, and to a certified ``tol``."""
    _sync(device)
    t0 = time.perf_counter()
    solver = _solver(train, lam, B, mode, device, qp_max_iter)
    built = time.perf_counter() - t0
    curve = []

    def record(r):
        if r["gap_exact"]:
            curve.append((time.perf_counter() - t0, r["passes"], r["gap"]))
            print(f"    {mode} B={B}: gap {r['gap']:.3e} at {curve[-1][0]:.2f} s wall, {r['passes']:.1f} passes",
                  flush=True)

    last = solver.fit(gap_tol=tol, time_budget=budget, callback=record)[-1]
    wall = time.perf_counter() - t0
    reached = last["gap_exact"] and last["gap"] <= tol
    return {"mode": mode, "batch_size": B, "built": built, "first_exact": curve[0][0] if curve else None,
            "time_to_tol": wall if reached else None, "wall": wall, "passes": last["passes"], "gap": last["gap"],
            "curve": curve, "qp_unconverged": last.get("qp_unconverged")}


def report(results: dict, out: Path) -> None:
    m = results["meta"]
    lines = [f"# The mini-batch BCFW step on {m['device']}: host, host-free eager, host-free CUDA graph", "",
             f"Machine: {m['machine']}. Code: {m['code']}. Date: {m['date']}. Command: "
             f"`python scripts/bench_bcfw_gpu_step.py {m['args']}`. OCR-large, lambda {m['lam']:g}, {m['config']}.",
             "",
             "| mode | B | s / pass | ms / step | GPU busy | waits / pass | launch calls / pass | QPs short of tol |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results["steady"]:
        p = r.get("profile") or {}
        busy = f"{100 * p['busy']:.0f}%" if "busy" in p else "-"
        lines.append(f"| {r['mode']} | {r['batch_size']} | {r['seconds_per_pass']:.4f} | {r['ms_per_step']:.3f} | "
                     f"{busy} | {p.get('waits', '-')} | {p.get('host_launch_calls', '-')} | "
                     f"{r['qp_unconverged']} |")
    if results.get("time_to_gap"):
        lines += ["", f"Time to a certified gap of {m['tol']:g} (wall seconds from before the solver is built; "
                  "start-up included):", "", "| mode | B | built | first exact gap | to tol | passes | final gap |",
                  "|---|---|---|---|---|---|---|"]
        for r in results["time_to_gap"]:
            first = "-" if r["first_exact"] is None else f"{r['first_exact']:.2f}"
            tt = "not reached" if r["time_to_tol"] is None else f"{r['time_to_tol']:.2f}"
            lines.append(f"| {r['mode']} | {r['batch_size']} | {r['built']:.2f} | {first} | {tt} | "
                         f"{r['passes']:.1f} | {r['gap']:.2e} |")
    (out / f"bcfw_gpu_step_{m['device']}.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--setting", default="ocr-large", choices=list(SETTINGS))
    ap.add_argument("--batch-sizes", nargs="*", type=int, default=[256, 1024, 4096])
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    ap.add_argument("--passes", type=int, default=3, help="steady-state passes timed per run")
    ap.add_argument("--qp-max-iter", type=int, default=None, help="host-free QP iterations (default: BCFW's)")
    ap.add_argument("--time-to-gap", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--budget", type=float, default=60.0, help="solver seconds per time-to-gap run")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device available")
    args.out.mkdir(parents=True, exist_ok=True)
    train = load(args.setting)
    lam = SETTINGS[args.setting]
    results = {"meta": {"machine": machine(device), "device": device.type, "code": code_version(),
                        "date": time.strftime("%Y-%m-%d"), "args": " ".join(sys.argv[1:] if argv is None else argv),
                        "lam": lam, "config": CONFIG, "tol": args.tol}, "steady": [], "time_to_gap": []}
    path = args.out / f"bcfw_gpu_step_{device.type}.json"
    for B in args.batch_sizes:
        for mode in args.modes:
            r = measure(train, lam, B, mode, device, args.passes, args.qp_max_iter)
            print(f"{mode} B={B}: {r['seconds_per_pass']:.4f} s/pass, {r['ms_per_step']:.3f} ms/step, "
                  f"profile {r.get('profile')}", flush=True)
            results["steady"].append(r)
            path.write_text(json.dumps(results, indent=1))
    if args.time_to_gap:
        for B in args.batch_sizes:
            for mode in args.modes:
                if mode == "host" and B > 256:
                    continue  # above 256 the host step's QP is the device loop with its reads: slow, known
                results["time_to_gap"].append(time_to_gap(train, lam, B, mode, device, args.tol, args.budget,
                                                          args.qp_max_iter))
                path.write_text(json.dumps(results, indent=1))
    report(results, args.out)
    print((args.out / f"bcfw_gpu_step_{device.type}.md").read_text())


if __name__ == "__main__":
    main()
