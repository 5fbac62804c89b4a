"""The fixed cost of one `StructuredHingeLoss` call on a `Chain` (issue 40, deliverable 3): milliseconds per forward +
backward, per MAP decode and per copy of the unary (the memory floor), and the host waits and kernel launches per
forward + backward.

The target is 0.25 ms per forward + backward at (B, T, K) = (32, 50, 45), float32, ``backend="auto"`` (Triton on
CUDA), with no host wait; before issue 40 an H100 took 2.27 ms and waited 3 times per call.

- ``--device cuda``: times on the GPU; the host waits are the CUDA runtime's blocking calls in a profile
  (`torchssvm.testing.count_cuda_waits`), the launches the device activities (kernels, fills, copies) in the same
  profile.
- ``--device cpu``: times on the CPU (``"auto"``: the numba / torch twins), and counts the waits and launches of the
  CUDA code path on a simulated device (`torchssvm.testing.simulated_cuda`, Triton interpreted) at the first shape.
- ``--device simulated``: the counts alone.

On the CPU and on a GPU (not the simulated device) each shape also gets a host profile (`host_profile`): the Python
functions and host-side operator events with the most time per call, which says where a call's fixed cost goes.

    python scripts/bench_loss_cost.py --device cuda --out DIR     # DIR/loss_cost_cuda.{json,md}
    python scripts/bench_loss_cost.py --device cpu --quick --out /tmp/x
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] in (["cpu"], ["simulated"]):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the simulated device runs the Triton kernels interpreted

import torch  # noqa: E402

SHAPES = ((32, 50, 45), (512, 100, 45), (8, 50, 1024))
TARGET_MS = 0.25


def _inputs(B, T, K, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    unary = torch.randn(B, T, K, generator=g).to(device).requires_grad_()
    trans = torch.randn(K, K, generator=g).to(device).requires_grad_()
    lengths = torch.full((B,), T, device=device)
    y = torch.randint(0, K, (B, T), generator=g).to(device)
    return unary, trans, lengths, y


def _calls(B, T, K, device, backend):
    import torchssvm as ts

    unary, trans, lengths, y = _inputs(B, T, K, device)
    chain = ts.Chain(K)
    crit = ts.StructuredHingeLoss(chain, backend=backend)

    def fb():
        loss = crit(ts.ChainPotentials(unary, trans), y, lengths)
        loss.backward()

    def decode():
        with torch.no_grad():
            chain.decode(ts.ChainPotentials(unary.detach(), trans.detach()), lengths, backend=backend)

    def copy():
        unary.detach().clone()

    def floor():  # the host's floor for any loss: one op, a sum, autograd's backward (3 launches and the seed)
        (unary * 2).sum().backward()

    return fb, decode, copy, floor


def _timeit(fn, device, n):
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n * 1e3


def count_simulated(B, T, K, backend, calls=1) -> dict:
    """Host syncs and launches per forward + backward on the simulated device (after one warm-up call)."""
    from torchssvm.testing import simulated_cuda

    with simulated_cuda() as mode:
        fb = _calls(B, T, K, torch.device("cuda"), backend)[0]
        fb()
        syncs, launches = mode.syncs, mode.launches
        mode.sync_sites, mode.launch_sites = collections.Counter(), collections.Counter()
        for _ in range(calls):
            fb()
    return {"shape": [B, T, K], "syncs": (mode.syncs - syncs) / calls, "launches": (mode.launches - launches) / calls,
            "sync_sites": {k: v / calls for k, v in mode.sync_sites.most_common()},
            "launch_sites": {k: v / calls for k, v in mode.launch_sites.most_common()}}


def count_cuda(fn, calls=10) -> dict:
    """Host waits (blocking runtime calls) and device activities per call of ``fn`` on a GPU, from one profile."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    from torchssvm.testing.cuda_waits import count_cuda_waits

    fn()
    torch.cuda.synchronize()
    with count_cuda_waits() as waits:
        for _ in range(calls):
            fn()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    launch_calls = collections.Counter(e.name for e in prof.events() if e.device_type == DeviceType.CPU
                                       and e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                      "cudaLaunchKernelExC", "cudaMemsetAsync", "cudaMemcpyAsync"))
    return {"waits": sum(waits.values()) / calls, "wait_calls": {k: v / calls for k, v in waits.items()},
            "device_activities": len(device_events) / calls,
            "launch_calls": {k: v / calls for k, v in launch_calls.items()},
            "kernels": dict(collections.Counter(e.name[:80] for e in device_events).most_common())}


def host_profile(fn, device, calls=50, top=15) -> dict:
    """Where the host's time per call of ``fn`` goes: the Python functions with the most own time (cProfile; the
    library's and torch's Python, Triton's launcher), and the host-side operator events with the most self time
    (torch.profiler: aten ops, runtime calls), in microseconds per call. On a GPU these are what stands between
    the kernels' few microseconds and the call's milliseconds."""
    import cProfile
    import pstats

    from torch.profiler import DeviceType, ProfilerActivity, profile

    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (primitive calls, calls, own s, cumulative s, callers)}
    own = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    python = [{"function": f"{Path(f).name}:{line}({name})", "calls": n / calls, "us_own": t * 1e6 / calls,
               "us_cumulative": ct * 1e6 / calls} for (f, line, name), (_, n, t, ct, _) in own]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as tp:
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    host = [e for e in tp.key_averages() if e.device_type == DeviceType.CPU]
    host.sort(key=lambda e: -e.self_cpu_time_total)
    ops = [{"op": e.key[:80], "calls": e.count / calls, "us_self": e.self_cpu_time_total / calls}
           for e in host[:top]]
    return {"python": python, "ops": ops}


def _describe(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bench_machine import cpu_description

    return cpu_description()


def _version() -> str:
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _bench_machine import code_version

        return code_version()
    except Exception:  # noqa: BLE001 - a copy outside the checkout
        return "unknown"


def run(device_name: str, shapes, iters: int, backend: str, count_calls: int) -> dict:
    import triton

    import torchssvm as ts

    results = {"device": device_name, "backend": backend, "torch": torch.__version__, "triton": triton.__version__,
               "torchssvm": str(Path(ts.__file__).resolve().parent), "code": _version(), "rows": []}
    if device_name == "simulated":
        results["machine"] = "simulated CUDA device"
    else:
        device = torch.device(device_name)
        results["machine"] = _describe(device)
        for B, T, K in shapes:
            fb, decode, copy, floor = _calls(B, T, K, device, backend)
            row = {"shape": [B, T, K], "ms_forward_backward": _timeit(fb, device, iters),
                   "ms_decode": _timeit(decode, device, iters), "ms_unary_copy": _timeit(copy, device, iters),
                   "ms_autograd_floor": _timeit(floor, device, iters)}
            if device.type == "cuda":
                row["cuda"] = count_cuda(fb, count_calls)
            row["host_profile"] = host_profile(fb, device)
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    if device_name in ("cpu", "simulated"):
        B, T, K = shapes[0]
        results["simulated"] = count_simulated(B, T, K, backend, count_calls if device_name == "simulated" else 1)
        print(json.dumps(results["simulated"]), flush=True)
    return results


def markdown(results: dict) -> str:
    dev = results["device"]
    lines = [f"# Cost of a StructuredHingeLoss forward + backward ({dev})", "",
             f"Command: `python scripts/bench_loss_cost.py --device {dev}`; {results['machine']}; torch "
             f"{results['torch']}, Triton {results['triton']}; code {results['code']}; backend "
             f"`{results['backend']}`, float32, Chain(K), shared transitions, every length T. Target (issue 40): "
             f"<= {TARGET_MS} ms per forward + backward at (32, 50, 45) with no host wait.", ""]
    if results["rows"]:
        cuda = dev.startswith("cuda")
        head = "| (B, T, K) | forward + backward (ms) | decode (ms) | unary copy (ms) | autograd floor (ms) |"
        rule = "|---|---|---|---|---|"
        if cuda:
            head += " host waits per call | device activities per call |"
            rule += "---|---|"
        lines += [head, rule]
        for r in results["rows"]:
            line = (f"| {tuple(r['shape'])} | {r['ms_forward_backward']:.3f} | {r['ms_decode']:.3f} | "
                    f"{r['ms_unary_copy']:.3f} | {r['ms_autograd_floor']:.3f} |")
            if cuda:
                line += f" {r['cuda']['waits']:g} | {r['cuda']['device_activities']:g} |"
            lines.append(line)
        lines += ["", "Decode: `Chain.decode` (MAP Viterbi) under `no_grad`; unary copy: `unary.clone()`, the memory "
                  "floor; autograd floor: `(unary * 2).sum().backward()`, what any loss's forward + backward costs "
                  "this host.", ""]
        if cuda:
            for r in results["rows"]:
                lines.append(f"- {tuple(r['shape'])}: runtime launch calls per call {r['cuda']['launch_calls']}; "
                             f"waits {r['cuda']['wait_calls'] or 'none'}")
            lines.append("")
        first = results["rows"][0]
        if "host_profile" in first:
            hp = first["host_profile"]
            lines += [f"Host time per forward + backward at {tuple(first['shape'])} (`host_profile`): Python functions "
                      "by own time (cProfile), then host-side operator events by self time (torch.profiler); "
                      "microseconds per call.", "", "| Python function | calls | own (us) | cumulative (us) |",
                      "|---|---|---|---|"]
            lines += [f"| `{r['function']}` | {r['calls']:g} | {r['us_own']:.1f} | {r['us_cumulative']:.1f} |"
                      for r in hp["python"]]
            lines += ["", "| host-side event | calls | self (us) |", "|---|---|---|"]
            lines += [f"| `{r['op']}` | {r['calls']:g} | {r['us_self']:.1f} |" for r in hp["ops"]]
            lines.append("")
    sim = results.get("simulated")
    if sim:
        lines += [f"On the simulated CUDA device (`torchssvm.testing.simulated_cuda`, Triton interpreted) at "
                  f"{tuple(sim['shape'])}: **{sim['syncs']:g} host syncs** and **{sim['launches']:g} launches** per "
                  "forward + backward.", "", "| launches | where |", "|---|---|"]
        lines += [f"| {v:g} | `{k}` |" for k, v in sim["launch_sites"].items()]
        if sim["sync_sites"]:
            lines += ["", "| syncs | where |", "|---|---|"]
            lines += [f"| {v:g} | `{k}` |" for k, v in sim["sync_sites"].items()]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cpu or simulated")
    p.add_argument("--out", type=Path, default=None, help="folder for loss_cost_<device>.{json,md}")
    p.add_argument("--backend", default="auto")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--count-calls", type=int, default=10, help="calls per count (waits, launches)")
    p.add_argument("--quick", action="store_true", help="the first shape only, 10 iterations")
    p.add_argument("--shapes", default=None, help="e.g. 32x50x45,8x50x1024")
    args = p.parse_args(argv)
    shapes = SHAPES if args.shapes is None else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.quick:
        shapes, args.iters = shapes[:1], 10
    results = run(args.device, shapes, args.iters, args.backend, args.count_calls)
    report = markdown(results)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"loss_cost_{args.device.split(':')[0]}"
        (args.out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / f"{name}.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
