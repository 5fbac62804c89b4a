"""Shared by the benchmark scripts: the machine line their reports print (CPU model from /proc/cpuinfo where
there is one, and cores) and a median timer."""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path


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


def median_seconds(fn, repeats: int = 5) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn`` after one warm-up call (CPU timings)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
