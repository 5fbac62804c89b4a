"""TensorBoard writers and progress bars used by the command line and the examples."""

from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Optional


def make_writer(logdir: str = "runs", name: str = "run"):
    """A `torch.utils.tensorboard.SummaryWriter` writing to ``<logdir>/<name>-<YYYYmmdd-HHMMSS>``."""
    from torch.utils.tensorboard import SummaryWriter

    path = os.path.join(logdir, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    suffix, unique = 1, path
    while os.path.exists(unique):
        suffix += 1
        unique = f"{path}-{suffix}"
    return SummaryWriter(log_dir=unique)


def log_scalars(writer, scalars: dict, step: int, prefix: str = "") -> None:
    """Write every numeric entry of ``scalars`` as ``prefix/key`` (no-op without a writer)."""
    if writer is None:
        return
    for key, value in scalars.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.add_scalar(f"{prefix}/{key}" if prefix else key, value, step)


def progress(iterable: Iterable, *, total: Optional[int] = None, desc: str = "", disable: Optional[bool] = None):
    """A tqdm bar on stderr; hidden when stderr is not a terminal unless ``disable=False``."""
    from tqdm.auto import tqdm

    if disable is None:
        disable = not sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, disable=disable, leave=False, dynamic_ncols=True)
