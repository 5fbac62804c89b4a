"""Mini-batch BCFW against the faithful sequential solver (B = 1) on the same machine.

For each data set and each ``batch_size`` B in ``--batch-sizes`` one uniform-sampling BCFW run (FW
steps, no cache) of ``--passes`` effective passes; the exact duality gap after every pass (a full
oracle pass, outside the timed solver seconds). Writes ``docs/benchmarks/bcfw_speed.{md,json}`` and one
PNG per data set (gap against effective passes and against solver seconds) and states the issue's
targets: at B = 64 the gap after 20 passes within 1.5x of B = 1's, and seconds per pass at least 10x
lower than B = 1's.

    python scripts/bench_bcfw_speed.py                        # CPU, OCR-large and CoNLL-2000
    python scripts/bench_bcfw_speed.py --device cuda --out /tmp/speed_cuda
    python scripts/bench_bcfw_speed.py --report-only          # rewrite md / png from the json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from _bench_machine import cpu_description, style_gap_axes

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
SETTINGS = {"ocr-large": 1e-3, "conll": 1e-2}


def load(name: str):
    import torchssvm as ts

    if name == "ocr-large":
        return ts.data.ocr("train", "large")
    if name == "conll":
        return ts.data.conll2000("train", "chunk", min_count=3)
    raise ValueError(f"unknown data set {name!r}")


def machine(device: torch.device) -> str:
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    threads = torch.get_num_threads()
    return f"{cpu_description()}, {threads} torch threads; device {dev}; torch {torch.__version__}"


def run(train, lam: float, B: int, passes: int, device: torch.device, seed: int) -> dict:
    import torchssvm as ts

    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, dtype=torch.float64,
                                device=device)
    solver = ts.optim.BCFW(model, train, lam=lam, batch_size=B, seed=seed)
    g0 = solver.duality_gap()
    trace = [{"passes": 0.0, "time": 0.0, "gap": g0["gap"], "primal": g0["primal"], "dual": g0["dual"]}]
    while trace[-1]["passes"] < passes:
        r = solver.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        g = solver.duality_gap()
        trace.append({"passes": r["passes"], "time": solver.seconds, "gap": g["gap"], "primal": g["primal"],
                      "dual": g["dual"]})
    return {"batch_size": B, "trace": trace}


def report(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = results["meta"]
    script = "python scripts/bench_bcfw_speed.py "
    commands = ", then ".join(f"`{(script + a).strip()}`" for a in meta["args"].split("; "))
    lines = ["# Mini-batch BCFW: speed against the sequential solver", "",
             "Uniform sampling, FW steps, no cache; one run per batch size (seed 0). Exact duality gap after "
             "every effective pass (computed outside the solver seconds). B = 1 is the paper's algorithm step "
             "for step; B > 1 is the exact coordinated step of docs/design.md (one batched oracle call, the B x B "
             "box QP solved by projected Newton). Produced by "
             f"{commands}.", "", f"Machine: {meta['machine']}.", ""]
    targets = []
    for name, runs in results["settings"].items():
        lam = SETTINGS[name]
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        base = next((r for r in runs if r["batch_size"] == 1), None)
        lines += [f"## {name}, lambda = {lam:g}", "", f"![{name}](bcfw_speed_{name}{meta['suffix']}.png)", "",
                  "| B | s / pass | speed-up vs B=1 | gap after 10 passes | gap after 20 passes | ratio to B=1 at 20 |",
                  "|---|---|---|---|---|---|"]
        for i, r in enumerate(runs):
            tr = r["trace"]
            for ax, key in zip(axes, ("passes", "time")):
                ax.plot([t[key] for t in tr], [t["gap"] for t in tr], color=f"C{i}", label=f"B = {r['batch_size']}")
            spp = tr[-1]["time"] / tr[-1]["passes"]
            gap_at = {p: next((t["gap"] for t in tr if t["passes"] >= p - 1e-9), None) for p in (10, 20)}
            r["seconds_per_pass"], r["gap_at"] = spp, gap_at
            speed = base["trace"][-1]["time"] / base["trace"][-1]["passes"] / spp if base else None
            base_20 = base.get("gap_at", {}).get(20) if base else None
            ratio = gap_at[20] / base_20 if gap_at[20] and base_20 else None
            fmt = lambda v: "-" if v is None else f"{v:.3e}"  # noqa: E731
            lines.append(f"| {r['batch_size']} | {spp:.3f} | {'-' if speed is None else f'{speed:.1f}x'} | "
                         f"{fmt(gap_at[10])} | {fmt(gap_at[20])} | {'-' if ratio is None else f'{ratio:.2f}'} |")
            if r["batch_size"] == 64 and base:
                targets.append(f"- {name}: B = 64 gap after 20 passes / B = 1's = "
                               f"{'-' if ratio is None else f'{ratio:.2f}'} (target <= 1.5: "
                               f"{'met' if ratio is not None and ratio <= 1.5 else 'not met'}); seconds per pass "
                               f"{speed:.2f}x lower (target >= 10x: {'met' if speed >= 10 else 'not met'}).")
        style_gap_axes(axes)
        fig.suptitle(f"{name}, lambda = {lam:g}: BCFW by batch size ({meta['device']})")
        fig.tight_layout()
        fig.savefig(out / f"bcfw_speed_{name}{meta['suffix']}.png", dpi=110)
        plt.close(fig)
        lines.append("")
    lines += ["## Targets", ""] + targets + [""]
    findings = out / f"bcfw_speed{meta['suffix']}_findings.md"  # hand-written per device
    if findings.exists():
        lines.append(findings.read_text())
    (out / f"bcfw_speed{meta['suffix']}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / ('bcfw_speed' + meta['suffix'] + '.md')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--batch-sizes", nargs="*", type=int, default=[1, 16, 64, 256, 1024])
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    suffix = "_cuda" if device.type == "cuda" else ""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bcfw_speed{suffix}.json"
    if args.report_only:
        report(json.loads(path.read_text()), args.out)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {"meta": {"machine": machine(device), "device": device.type, "suffix": suffix,
                        "args": " ".join(sys.argv[1:])}, "settings": {}}
    if path.exists():  # keep the other data sets' runs (measured on the same machine: checked here)
        old = json.loads(path.read_text())
        if old["meta"]["machine"] != results["meta"]["machine"]:
            sys.exit(f"{path} was measured on {old['meta']['machine']!r}; pass another --out")
        results["settings"] = {k: v for k, v in old["settings"].items() if k not in args.settings}
        results["meta"]["args"] = "; ".join(dict.fromkeys([old["meta"]["args"], results["meta"]["args"]]))
    for name in args.settings:
        train = load(name)
        results["settings"][name] = []
        results["settings"] = {k: results["settings"][k] for k in SETTINGS if k in results["settings"]}
        for B in args.batch_sizes:
            t0 = time.perf_counter()
            r = run(train, SETTINGS[name], B, args.passes, device, args.seed)
            results["settings"][name].append(r)
            last = r["trace"][-1]
            print(f"{name} B={B}: gap {last['gap']:.3e} after {last['passes']:.0f} passes, "
                  f"{last['time'] / last['passes']:.3f} s/pass ({time.perf_counter() - t0:.0f} s wall)", flush=True)
            path.write_text(json.dumps(results))
    report(results, args.out)


if __name__ == "__main__":
    main()
