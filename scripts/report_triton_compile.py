"""Report: every Triton kernel compiled for sm_80 and sm_90 on this CPU-only machine, per Triton version.

Runs `torchssvm.kernels.compile_check` (record each kernel wrapper's launches, compile them with Triton's own
pipeline and ``ptxas``, read the resource use with ``cuobjdump``) once with the installed Triton and once per
``--with-triton DIR``, a directory that holds another Triton (``pip install --no-deps --target DIR
triton==3.6.0``: the version of the lent GPU machines). No timings: registers, stack frame (spilled
registers) and shared memory per thread block, and whether the launch fits the limits of the architecture.

    python scripts/report_triton_compile.py --with-triton /tmp/t36
    python scripts/report_triton_compile.py --report-only

Writes ``docs/benchmarks/triton_compile.{json,md}``; ``triton_compile_findings.md`` (hand-written) is
appended to the report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _bench_machine import write_report as write_markdown

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"


def run_check(triton_dir: str | None, archs) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if triton_dir:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (triton_dir, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as d:
        env["TRITON_CACHE_DIR"] = d
        path = Path(d) / "check.json"
        proc = subprocess.run([sys.executable, "-m", "torchssvm.kernels.compile_check", "--arch",
                               *map(str, archs), "--json", str(path)], env=env, capture_output=True, text=True)
        print(proc.stdout, end="")
        if not path.exists():
            raise SystemExit(f"compile_check wrote no report:\n{proc.stderr[-4000:]}")
        report = json.loads(path.read_text())
    report["returncode"] = proc.returncode
    return report


def write_report(runs: list, out: Path) -> None:
    lines = ["# Triton kernels compiled for NVIDIA GPUs, without a GPU", "",
             "Command: `python scripts/report_triton_compile.py --with-triton DIR` (`torchssvm.kernels.compile_check`"
             " once per Triton version, `DIR` holding Triton 3.6, the version on the lent GPU machines). "
             "Each launch of every kernel wrapper, at the shapes of the tests and benchmarks, is recorded on the "
             "CPU, compiled to a cubin for sm_80 (A100) and sm_90 (H100, H200) and checked against the launch "
             "limits (255 registers per thread, 65,536 per block, shared memory per block, grid extents). "
             "Per cell: registers per thread / stack frame per thread in bytes (registers spilled to local "
             "memory) / shared memory per block in bytes. No timings: nothing here ran on a GPU.", ""]
    for run in runs:
        results = run["results"]
        failed = [r for r in results if not r["ok"]]
        archs = run["archs"]
        lines += [f"## Triton {run['triton']} (torch {run['torch']})", "",
                  f"{len(results)} compilations, {len(failed)} failing"
                  + (f"; gaps in the check: {'; '.join(run['gaps'])}" if run["gaps"] else "") + ".", "",
                  "| kernel | launch | workloads | " + " | ".join(f"sm_{a}" for a in archs) + " |",
                  "|---|---|---|" + "---|" * len(archs)]
        rows = {}
        for r in results:
            key = (r["launch"]["kernel"], r["launch"]["describe"])
            rows.setdefault(key, {"workloads": r["workloads"], "cells": {}})["cells"][r["arch"]] = r
        for (kernel, describe), row in rows.items():
            cells = []
            for a in archs:
                r = row["cells"].get(a)
                if r is None:
                    cells.append("-")
                elif r["error"]:
                    cells.append("**fails to compile**")
                else:
                    cell = f"{r['registers']} / {r['stack_bytes']} / {r['shared_bytes']}"
                    cells.append(cell if r["ok"] else f"**{cell}: {'; '.join(r['problems'])}**")
            lines.append(f"| `{kernel}` | {describe} | {'; '.join(row['workloads'])} | " + " | ".join(cells) + " |")
        for r in failed:
            if r["error"]:
                lines += ["", f"`{r['launch']['kernel']}` on sm_{r['arch']}:", "", "```",
                          r["error"].strip()[-1500:], "```"]
        lines.append("")
    write_markdown(out, "triton_compile", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--with-triton", nargs="*", default=[], metavar="DIR",
                        help="directories holding other Triton versions to compile with as well")
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true", help="rewrite the markdown from the json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "triton_compile.json"
    if args.report_only:
        runs = json.loads(path.read_text())
    else:
        runs = [run_check(None, args.arch)] + [run_check(d, args.arch) for d in args.with_triton]
        path.write_text(json.dumps(runs, indent=1))
    write_report(runs, args.out)
    if any(r["returncode"] for r in runs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
