"""Shared by the benchmark scripts: the machine line their reports print (CPU model from /proc/cpuinfo where
there is one, and cores), a median timer, the measure-or-reload step of ``--report-only``, and the report writer
that keeps the hand-written findings."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import List


def cpu_description() -> str:
    """``"<CPU model>, <n> cores"``."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def code_version() -> str:
    """The short commit hash of the checkout the benchmark runs from (``"+dirty"`` with uncommitted changes under
    ``torchssvm/``), or ``"unknown"`` outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "torchssvm"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def device_description(device) -> str:
    """The GPU's name for a CUDA ``device``, else `cpu_description`."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_description()


def measured_or_saved(path: Path, report_only: bool, measure) -> dict:
    """The results saved at ``path`` (``--report-only``), or ``measure()``'s, saved there first."""
    if report_only:
        return json.loads(path.read_text())
    results = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    return results


def median_seconds(fn, repeats: int = 5, cuda: bool = False) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn`` after one warm-up call; ``cuda=True``
    synchronizes the device before each clock read."""
    if cuda:
        import torch

        sync = torch.cuda.synchronize
    else:
        def sync():
            return None
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_report(out: Path, name: str, lines: List[str]) -> Path:
    """Write ``out / name.md`` from ``lines``, followed by ``out / name_findings.md`` when it exists (the
    reading of the figures, written by hand, survives a re-run)."""
    findings = out / f"{name}_findings.md"
    if findings.exists():
        lines = lines + ["", findings.read_text()]
    path = out / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return path


def style_gap_axes(axes, ylabel: str = "duality gap", legend_size=None) -> None:
    """Log-scale duality gap against effective passes (first axis) and solver seconds (second), with a
    grid and the legend on the first: the two panels of every convergence plot."""
    for ax, key in zip(axes, ("effective passes", "solver seconds")):
        ax.set_yscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=legend_size)
