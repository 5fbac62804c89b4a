"""The machine line the benchmark reports print: CPU model (from /proc/cpuinfo where there is one) and cores."""

from __future__ import annotations

import os
import platform
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
