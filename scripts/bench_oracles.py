"""Benchmark: loss-augmented Viterbi and hinge forward+backward against pytorch-crf and torch-struct.

Measures, at (B, T, K) in {(32,14,26), (32,50,45), (8,50,300), (512,100,45)}, all in one run on one
machine, median of repeats after warm-up (CUDA synchronized before reading clocks):

- decode throughput (tokens/s): our loss-augmented Viterbi (``Chain.max_oracle``, torch backend, on CPU
  the compiled numba twin when numba imports, on CUDA the Triton kernel) against pytorch-crf's
  ``CRF.decode`` and torch-struct's max semiring
  (``LinearChainCRF(...).argmax``) when it imports;
- training step time: our ``StructuredHingeLoss`` forward+backward against pytorch-crf's NLL
  forward+backward, both with respect to the same unary and transition tensors.

On CUDA it also measures the physical limit of the Triton Viterbi decode (the roofline section, alone with
``--roofline``, about a minute; written to ``oracles_cuda_roofline.{md,json}``, and into the full report):

- K <= 64: the decode's time against a device copy of its unary tensor ``(B, T, K)`` (``unary.clone()``), at
  (32, 50, 45), (512, 100, 45) and (32, 14, 26): the copy reads and writes what the decode must at least read;
- K = 1,024 (and 300): ``B * T * K * K`` max-plus operations per decode, in G max-plus/s and in percent of the
  device's fp32 FMA rate (`FP32_PEAK`: the non-tensor fp32 peak in FLOP/s halved; one max-plus, an add and a max,
  counted like one FMA, two floating-point operations; since the add and the max are two instructions where an FMA
  is one, the instruction-issue ceiling is half of that rate).

Each figure is given two ways: per call as the rest of the benchmark times it (host clock, device synchronized
around each call, so the host's launch overhead counts), and the device's time per call from a replayed CUDA
graph of back-to-back calls (CUDA events; falls back to events around uncaptured calls).

Writes ``docs/benchmarks/oracles.{md,json,png}`` (``--out`` to change). Usage:

    python scripts/bench_oracles.py [--device cuda] [--quick] [--roofline]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

import torchssvm as ts

SIZES = [(32, 14, 26), (32, 50, 45), (8, 50, 300), (512, 100, 45)]
ROOFLINE_COPY_SIZES = [(32, 50, 45), (512, 100, 45), (32, 14, 26)]
ROOFLINE_MAXPLUS_SIZES = [(8, 50, 1024), (8, 50, 300)]
# Non-tensor fp32 peak (FLOP/s, boost clock, dense) by device name (first match wins); an FMA is 2 FLOP.
FP32_PEAK = [
    ("H100 PCIe", 51.2e12),
    ("H100 NVL", 60.0e12),
    ("H100", 67.0e12),  # SXM5 (the "H100 80GB HBM3")
    ("H200", 67.0e12),
    ("GH200", 67.0e12),
    ("A100", 19.5e12),
    ("L40S", 91.6e12),
    ("L4", 30.3e12),
]


def timeit(fn, device, *, min_repeats=5, min_seconds=1.0, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_repeats or time.perf_counter() - start < min_seconds:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if len(times) >= 200:
            break
    return statistics.median(times)


def device_time(fn, device, reps=20, replays=5):
    """Device seconds per call of ``fn``: ``reps`` back-to-back calls captured in a CUDA graph and replayed
    (median over ``replays``, CUDA events), else events around ``reps`` uncaptured calls. Returns
    ``(seconds, "graph" | "events")``."""
    fn()
    torch.cuda.synchronize(device)
    how = "graph"
    try:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()  # warm-up on the side stream, as capture requires
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(reps):
                    fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        run = graph.replay
        graph.replay()
    except Exception:  # noqa: BLE001 - a launch that cannot be captured: time it uncaptured
        torch.cuda.synchronize(device)
        how = "events"

        def run():
            for _ in range(reps):
                fn()
    times = []
    for _ in range(replays):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        run()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) / 1e3 / reps)
    return statistics.median(times), how


def fp32_peak(name):
    """``(name pattern, FLOP/s)`` of `FP32_PEAK` matching the device name, or None."""
    for pattern, flops in FP32_PEAK:
        if pattern.lower() in name.lower():
            return pattern, flops
    return None


def bench_roofline(device, quick=False):
    """The Triton Viterbi decode against its physical limits (see the module docstring): rows per size and
    kernel, with host-timed and device-timed seconds."""
    from torchssvm.kernels import viterbi_torch
    from torchssvm.kernels.chain.viterbi_triton import choose_kernel, viterbi_triton

    kw = {"min_repeats": 3, "min_seconds": 0.1} if quick else {"min_repeats": 5, "min_seconds": 0.3}
    name = torch.cuda.get_device_name(device)
    peak = fp32_peak(name)
    out = {"device": name, "fp32_peak_flops": peak[1] if peak else None, "peak_source": peak[0] if peak else None,
           "copy": [], "maxplus": []}
    for section, sizes in (("copy", ROOFLINE_COPY_SIZES), ("maxplus", ROOFLINE_MAXPLUS_SIZES)):
        for B, T, K in sizes:
            unary, trans, _, lengths = make_problem(B, T, K, device)
            auto = choose_kernel(B, T, K, device)
            row = {"B": B, "T": T, "K": K, "auto": auto, "maxplus_ops": B * T * K * K}
            if section == "copy":
                row["copy_call_s"] = timeit(unary.clone, device, **kw)
                row["copy_device_s"], _ = device_time(unary.clone, device)
            ref = viterbi_torch(unary, trans, None, None, lengths)  # exact: equal to the torch twin
            for kernel in dict.fromkeys([auto, "legacy"]):
                def decode(kernel=kernel, unary=unary, trans=trans, lengths=lengths):
                    return viterbi_triton(unary, trans, None, None, lengths, kernel=kernel)

                got = decode()
                row[f"{kernel}_exact"] = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]))
                row[f"{kernel}_call_s"] = timeit(decode, device, **kw)
                row[f"{kernel}_device_s"], row[f"{kernel}_timing"] = device_time(decode, device)
            out[section].append(row)
            print(json.dumps(row), flush=True)
    return out


def roofline_lines(roof):
    """The roofline section of the report (markdown lines)."""
    peak = roof.get("fp32_peak_flops")
    fma = peak / 2 if peak else None
    lines = [
        "## The physical limit of the Triton Viterbi decode (roofline)",
        "",
        f"Device {roof['device']}. Kernels: `auto` is what `viterbi_triton` runs for the shape (`sequence`: one "
        "program per sequence, K <= 64; `grid`: the persistent GPU-wide max-plus product), `legacy` the earlier "
        "kernel. *call*: host clock per call, device synchronized around it (launch overhead included); "
        "*device*: device time per call from a replayed CUDA graph of 20 back-to-back calls.",
        "",
        "### K <= 64: decode time against a device copy of the unary tensor (B, T, K) (goal: at most 3x)",
        "",
        "| B, T, K | copy call / device (us) | kernel | decode call / device (us) | decode / copy, call | "
        "decode / copy, device | equal to the torch twin |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in roof["copy"]:
        for kernel in dict.fromkeys([r["auto"], "legacy"]):
            c, d = r[f"{kernel}_call_s"], r[f"{kernel}_device_s"]
            lines.append(
                f"| {r['B']}, {r['T']}, {r['K']} | {1e6 * r['copy_call_s']:.1f} / {1e6 * r['copy_device_s']:.1f} | "
                f"{kernel}{' (auto)' if kernel == r['auto'] else ''} | {1e6 * c:.1f} / {1e6 * d:.1f} | "
                f"{c / r['copy_call_s']:.1f}x | {d / r['copy_device_s']:.1f}x | {r[f'{kernel}_exact']} |")
    lines += [
        "",
        "### Large K: max-plus throughput (goal at K = 1,024: at least 30% of the fp32 peak)",
        "",
        "One max-plus (an add and a max) is counted like one FMA: "
        + (f"the peak is the fp32 FMA rate, {fma / 1e12:.2f} T/s ({peak / 1e12:.1f} TFLOP/s non-tensor fp32 for "
           f"'{roof['peak_source']}', halved). " if peak else "no fp32 peak is known for this device. ")
        + "The add and the max are two instructions where an FMA is one, so issue alone caps a max-plus kernel at "
        "50% of that rate. Operations per decode: B * T * K * K.",
        "",
        "| B, T, K | kernel | call (ms) | device (ms) | G max-plus/s (device) | % of fp32 FMA rate | "
        "equal to the torch twin |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in roof["maxplus"]:
        for kernel in dict.fromkeys([r["auto"], "legacy"]):
            d = r[f"{kernel}_device_s"]
            rate = r["maxplus_ops"] / d
            lines.append(
                f"| {r['B']}, {r['T']}, {r['K']} | {kernel}{' (auto)' if kernel == r['auto'] else ''} | "
                f"{1e3 * r[f'{kernel}_call_s']:.3f} | {1e3 * d:.3f} | {rate / 1e9:.0f} | "
                f"{f'{100 * rate / fma:.1f}%' if fma else '-'} | {r[f'{kernel}_exact']} |")
    small = [r[f"{r['auto']}_device_s"] / r["copy_device_s"] for r in roof["copy"] if r["K"] == 45]
    big = [r for r in roof["maxplus"] if r["K"] == 1024]
    lines += ["", "Targets:", ""]
    if small:
        lines.append(f"- decode / copy (device) at K = 45, B = 32 / 512, T = 50 / 100, at most 3x: "
                     f"{', '.join(f'{x:.1f}x' for x in small)} ({'met' if max(small) <= 3 else 'NOT met'}).")
    if big and fma:
        pct = 100 * big[0]["maxplus_ops"] / big[0][f"{big[0]['auto']}_device_s"] / fma
        lines.append(f"- max-plus at K = 1,024 (B = 8, T = 50), at least 30% of the fp32 FMA rate: {pct:.1f}% "
                     f"({'met' if pct >= 30 else 'NOT met'}).")
    lines.append("")
    if roof.get("notes"):  # findings written into the saved .json by hand, kept by --report-only
        lines += ["### Findings", ""] + [f"- {note}" for note in roof["notes"]] + [""]
    return lines


def write_roofline(roof, meta, out, stem):
    """``{stem}_roofline.{json,md}``: the roofline section alone."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}_roofline.json"), "w") as f:
        json.dump({"meta": meta, "roofline": roof}, f, indent=2)
    head = ["# Triton Viterbi decode against its physical limit", "",
            f"Machine: {meta['machine']}; device {meta['device']}; torch {meta['torch']}; peers {meta['peers']}. "
            f"Command: `{meta['command']}`.", ""]
    with open(os.path.join(out, f"{stem}_roofline.md"), "w") as f:
        f.write("\n".join(head + roofline_lines(roof)[2:]))


def make_problem(B, T, K, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    unary = torch.randn(B, T, K, generator=g).to(device)
    trans = torch.randn(K, K, generator=g).to(device)
    y = torch.randint(0, K, (B, T), generator=g).to(device)
    lengths = torch.full((B,), T, dtype=torch.long, device=device)
    return unary, trans, y, lengths


def bench_size(B, T, K, device, quick):
    kw = {"min_repeats": 3, "min_seconds": 0.2} if quick else {}
    unary, trans, y, lengths = make_problem(B, T, K, device)
    chain = ts.Chain(K)
    pot = ts.ChainPotentials(unary, trans)
    row = {"B": B, "T": T, "K": K, "tokens": B * T}

    def ours_decode(backend):
        return lambda: chain.max_oracle(pot, y, lengths, backend=backend)

    row["ours_torch_decode_s"] = timeit(ours_decode("torch"), device, **kw)
    numba = device.type == "cpu" and ts.kernels.numba_available()
    if numba:
        row["ours_numba_decode_s"] = timeit(ours_decode("numba"), device, **kw)
    if device.type == "cuda" and ts.kernels.triton_available():
        row["ours_triton_decode_s"] = timeit(ours_decode("triton"), device, **kw)

    u_req = unary.clone().requires_grad_()
    t_req = trans.clone().requires_grad_()
    hinge = ts.StructuredHingeLoss(chain, backend="torch")

    def ours_train():
        u_req.grad = t_req.grad = None
        hinge(ts.ChainPotentials(u_req, t_req), y, lengths).backward()

    row["ours_torch_hinge_fb_s"] = timeit(ours_train, device, **kw)
    if numba:
        hinge_nb = ts.StructuredHingeLoss(chain, backend="numba")

        def ours_train_numba():
            u_req.grad = t_req.grad = None
            hinge_nb(ts.ChainPotentials(u_req, t_req), y, lengths).backward()

        row["ours_numba_hinge_fb_s"] = timeit(ours_train_numba, device, **kw)
    if device.type == "cuda" and ts.kernels.triton_available():
        hinge_tr = ts.StructuredHingeLoss(chain, backend="triton")

        def ours_train_triton():
            u_req.grad = t_req.grad = None
            hinge_tr(ts.ChainPotentials(u_req, t_req), y, lengths).backward()

        row["ours_triton_hinge_fb_s"] = timeit(ours_train_triton, device, **kw)

    try:
        from torchcrf import CRF
    except ImportError:
        CRF = None
    if CRF is not None:
        crf = CRF(K, batch_first=True).to(device)
        with torch.no_grad():
            crf.transitions.copy_(trans)
            crf.start_transitions.zero_()
            crf.end_transitions.zero_()
        mask = torch.ones(B, T, dtype=torch.bool, device=device)
        with torch.no_grad():
            row["pytorchcrf_decode_s"] = timeit(lambda: crf.decode(unary, mask), device, **kw)
        ref = torch.tensor(crf.decode(unary, mask), device=device)
        plain = chain.decode(pot, lengths, backend="torch")
        row["decode_agrees_with_pytorchcrf"] = bool(torch.equal(ref, plain))

        def crf_train():
            u_req.grad = None
            crf.zero_grad(set_to_none=True)
            (-crf(u_req, y, mask, reduction="mean")).backward()

        row["pytorchcrf_nll_fb_s"] = timeit(crf_train, device, **kw)

    try:
        import torch_struct
    except Exception:
        torch_struct = None
    # torch-struct's parallel scan materializes (B, T, K, K, K) products: skip sizes that cannot fit.
    if torch_struct is not None and B * T * K ** 3 * 4 > 8e9:
        row["torchstruct_decode_s"] = None
        row["torchstruct_note"] = f"needs about {B * T * K ** 3 * 4 / 1e9:.0f} GB (K^3 scan); not run"
    elif torch_struct is not None:
        def ts_decode():
            # torch-struct's edge potentials: log_potentials[b, n, z_{n+1}, z_n]
            edge = unary[:, 1:, :, None] + trans.t()[None, None]
            edge = edge.clone()
            edge[:, 0] += unary[:, 0, None, :]
            return torch_struct.LinearChainCRF(edge, lengths=lengths).argmax

        row["torchstruct_decode_s"] = timeit(ts_decode, device, **kw)
    return row


def fmt_rate(tokens, seconds):
    return f"{tokens / seconds / 1e6:.2f}M" if seconds else "-"


def write_report(rows, meta, out, stem="oracles", roofline=None):
    """``stem.{json,md,png}`` in ``out``: ``oracles`` for the CPU, ``oracles_cuda`` for a GPU (`_stem`); with
    ``roofline`` (`bench_roofline`), its section too."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, **({"roofline": roofline} if roofline else {})}, f, indent=2)
    has_numba = any("ours_numba_decode_s" in r for r in rows)  # a column only where it was measured (CPU)
    lines = [
        "# Oracle benchmark: loss-augmented Viterbi and hinge forward+backward",
        "",
        f"Machine: {meta['machine']}; device {meta['device']}; torch {meta['torch']}; "
        f"{meta['threads']} threads; peers {meta['peers']}. Command: `{meta['command']}`. "
        "Median of repeats after warm-up; each size's figures come from the same run.",
        "",
        "## Decode throughput (tokens/s) and our speed-up",
        "",
        f"| B, T, K | ours (torch) | {'ours (numba) | ' if has_numba else ''}ours (Triton) | pytorch-crf decode | "
        "torch-struct max | ours / pytorch-crf | ours / torch-struct |",
        "|---|---|---|---|---|---|---|" + ("---|" if has_numba else ""),
    ]
    notes = []
    for r in rows:
        best = min(v for k, v in r.items() if k.startswith("ours_") and k.endswith("decode_s"))
        crf = r.get("pytorchcrf_decode_s")
        tsd = r.get("torchstruct_decode_s")
        if "torchstruct_note" in r:
            notes.append(f"torch-struct at {r['B']}, {r['T']}, {r['K']}: {r['torchstruct_note']}.")
        lines.append(
            f"| {r['B']}, {r['T']}, {r['K']} | {fmt_rate(r['tokens'], r['ours_torch_decode_s'])} | "
            + (f"{fmt_rate(r['tokens'], r['ours_numba_decode_s']) if 'ours_numba_decode_s' in r else '-'} | "
               if has_numba else "") +
            f"{fmt_rate(r['tokens'], r['ours_triton_decode_s']) if 'ours_triton_decode_s' in r else '-'} | "
            f"{fmt_rate(r['tokens'], crf) if crf else '-'} | {fmt_rate(r['tokens'], tsd) if tsd else '-'} | "
            f"{crf / best:.1f}x | {f'{tsd / best:.1f}x' if tsd else '-'} |"
        )
    lines += [""] + notes + [
        "",
        "## Training step: hinge forward+backward vs CRF NLL forward+backward (ms)",
        "",
        f"| B, T, K | ours hinge (torch) | {'ours hinge (numba) | ' if has_numba else ''}ours hinge (Triton) | "
        "pytorch-crf NLL | NLL / hinge |",
        "|---|---|---|---|---|" + ("---|" if has_numba else ""),
    ]
    for r in rows:
        best = min(v for k, v in r.items() if k.startswith("ours_") and k.endswith("hinge_fb_s"))
        crf = r.get("pytorchcrf_nll_fb_s")
        tri, nb = r.get("ours_triton_hinge_fb_s"), r.get("ours_numba_hinge_fb_s")
        lines.append(
            f"| {r['B']}, {r['T']}, {r['K']} | {1e3 * r['ours_torch_hinge_fb_s']:.2f} | "
            + (f"{f'{1e3 * nb:.2f}' if nb else '-'} | " if has_numba else "")
            + f"{f'{1e3 * tri:.2f}' if tri else '-'} | "
            f"{f'{1e3 * crf:.2f}' if crf else '-'} | "
            f"{f'{crf / best:.1f}x' if crf else '-'} |"
        )
    lines += ["", "Decodes agree with pytorch-crf's (same potentials, no loss augmentation): "
              + ", ".join(str(r.get("decode_agrees_with_pytorchcrf", "-")) for r in rows) + ".", ""]
    dec = [r["pytorchcrf_decode_s"] / r["ours_torch_decode_s"] for r in rows if r.get("pytorchcrf_decode_s")]
    fb = [r["pytorchcrf_nll_fb_s"] / r["ours_torch_hinge_fb_s"] for r in rows if r.get("pytorchcrf_nll_fb_s")]
    if dec and fb:
        lines += [
            "## Targets",
            "",
            f"- Viterbi (torch backend) at least 2x pytorch-crf's decode: smallest ratio {min(dec):.1f}x "
            f"({'met' if min(dec) >= 2 else 'NOT met'}).",
            f"- Hinge forward+backward no slower than pytorch-crf's NLL forward+backward: smallest ratio "
            f"{min(fb):.1f}x ({'met' if min(fb) >= 1 else 'NOT met'}).",
        ]
        nb = [r["ours_torch_decode_s"] / r["ours_numba_decode_s"] for r in rows if r.get("ours_numba_decode_s")]
        if nb:
            lines.append(f"- The numba twin (what `backend=\"auto\"` runs on CPU) against the torch twin, decode: "
                         f"{min(nb):.1f}x to {max(nb):.1f}x faster.")
        big = [r for r in rows if (r["B"], r["T"], r["K"]) == (512, 100, 45) and "ours_triton_decode_s" in r]
        if big:
            ratio = big[0]["pytorchcrf_decode_s"] / big[0]["ours_triton_decode_s"]
            lines.append(f"- Triton on GPU at least 20x pytorch-crf's decode at (512,100,45) on the same GPU: "
                         f"{ratio:.1f}x ({'met' if ratio >= 20 else 'NOT met'}).")
        else:
            lines.append("- Triton on GPU: not measured in this run (no CUDA device); "
                         "run `python scripts/bench_oracles.py --device cuda` on a GPU machine.")
        lines.append("")
    if roofline:
        lines += roofline_lines(roofline)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['B']},{r['T']},{r['K']}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = range(len(rows))
    for key, name in [("ours_torch_decode_s", "ours (torch)"), ("ours_numba_decode_s", "ours (numba)"),
                      ("ours_triton_decode_s", "ours (Triton)"),
                      ("pytorchcrf_decode_s", "pytorch-crf"), ("torchstruct_decode_s", "torch-struct")]:
        if any(r.get(key) for r in rows):
            vals = [r["tokens"] / r[key] if r.get(key) else float("nan") for r in rows]
            axes[0].plot(x, vals, marker="o", label=name)
    axes[0].set_yscale("log")
    axes[0].set_title("decode throughput (tokens/s)")
    for key, name in [("ours_torch_hinge_fb_s", "ours hinge (torch)"), ("ours_numba_hinge_fb_s", "ours hinge (numba)"),
                      ("ours_triton_hinge_fb_s", "ours hinge (Triton)"),
                      ("pytorchcrf_nll_fb_s", "pytorch-crf NLL")]:
        if any(r.get(key) for r in rows):
            vals = [1e3 * r[key] if r.get(key) else float("nan") for r in rows]
            axes[1].plot(x, vals, marker="o", label=name)
    axes[1].set_yscale("log")
    axes[1].set_title("forward+backward (ms)")
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels)
        ax.set_xlabel("B, T, K")
        ax.legend(fontsize=8)
    fig.suptitle(f"{meta['device']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{stem}.png"), dpi=110)


def _peer_versions():
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("pytorch-crf", "torch-struct", "triton"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks"))
    p.add_argument("--report-only", action="store_true", help="rewrite the .md and .png from the saved .json")
    p.add_argument("--roofline", action="store_true",
                   help="only the Triton decode against its physical limit (CUDA; about a minute): "
                        "oracles_cuda_roofline.{md,json}")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    stem = "oracles_cuda" if device.type == "cuda" else "oracles"  # a GPU run never overwrites the CPU figures
    if args.report_only:
        if args.roofline:
            with open(os.path.join(args.out, f"{stem}_roofline.json")) as f:
                saved = json.load(f)
            write_roofline(saved["roofline"], saved["meta"], args.out, stem)
            return
        with open(os.path.join(args.out, f"{stem}.json")) as f:
            saved = json.load(f)
        write_report(saved["rows"], saved["meta"], args.out, stem, saved.get("roofline"))
        return
    if args.roofline and device.type != "cuda":
        p.error("--roofline measures the Triton kernels: it needs --device cuda")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "CPU"
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "device": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "peers": _peer_versions(),
        "command": "python scripts/bench_oracles.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    roofline = None
    if device.type == "cuda" and ts.kernels.triton_available():
        roofline = bench_roofline(device, args.quick)
        write_roofline(roofline, meta, args.out, stem)
        if args.roofline:
            print(open(os.path.join(args.out, f"{stem}_roofline.md")).read())
            return
    rows = []
    for B, T, K in SIZES:
        row = bench_size(B, T, K, device, args.quick)
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_report(rows, meta, args.out, stem, roofline)
    print(open(os.path.join(args.out, f"{stem}.md")).read())


if __name__ == "__main__":
    main()
