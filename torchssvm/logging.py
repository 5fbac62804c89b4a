"""TensorBoard writers and progress bars used by the command line and the examples.

Besides the writer (`make_writer`) and scalars (`log_scalars`), two functions make a run readable in TensorBoard
without knowing the tag names: `add_certificate_layout` (a Custom Scalars layout with a solver's primal, dual and
gap, exact and estimated, on one chart) and `log_hparams` (the run's settings and final metrics for the HParams
tab, written into the writer's own run folder). ``docs/tensorboard.md`` lists every tag the library writes.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
import time
from typing import Iterable, Optional, Sequence

__all__ = ["make_writer", "log_scalars", "add_certificate_layout", "certificate_layout", "log_hparams",
           "final_metrics", "progress", "CERTIFICATE_TAG"]


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


def _check_writer(writer, name: str = "writer") -> None:
    """A TypeError naming ``name`` unless ``writer`` is a `SummaryWriter` (it needs ``file_writer`` for the
    summaries of the plugins, which ``add_scalar`` alone does not give)."""
    if not callable(getattr(writer, "add_scalar", None)) or not callable(getattr(writer, "_get_file_writer", None)):
        raise TypeError(f"{name} must be a torch.utils.tensorboard.SummaryWriter, got {type(writer).__name__} "
                        f"{writer!r}")


def log_hparams(writer, hparams: dict, metrics: dict, *, prefix: str = "final", step: Optional[int] = None) -> None:
    """Write the run's hyperparameters and final metrics for TensorBoard's HParams tab into ``writer``'s own run
    folder.

    `SummaryWriter.add_hparams` writes them into a new sub-folder named by the time, which TensorBoard shows as a
    second run, apart from the curves of the run it describes; this writes the same three summaries (experiment,
    session start with the values, session end) with ``writer``'s own file writer, so the run's curves and its
    HParams row are one run. Each metric is also written as the scalar ``{prefix}/{name}`` (``name`` itself with
    ``prefix=""``) at ``step``: the HParams table reads a metric's value from that scalar. Call it once per
    writer, at the end of the run (a later call replaces the values the HParams tab shows).

    Args:
        writer: a `torch.utils.tensorboard.SummaryWriter`.
        hparams: name -> int, float, str or bool (torch's helper records a bool as the number 1 or 0).
        metrics: name -> int or float, e.g. ``{"gap": 1e-3, "test_error": 0.12}``.
        prefix: the folder of the metric scalars (``final/gap``), kept apart from the per-step curves.
        step: the step of the metric scalars (None: 0).

    Raises TypeError naming the argument (and key) that is not of these types.
    """
    _check_writer(writer)
    if not isinstance(hparams, dict):
        raise TypeError(f"hparams must be a dict of name -> int, float, str or bool, got {type(hparams).__name__}")
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict of name -> int or float, got {type(metrics).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__} {prefix!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
        raise TypeError(f"step must be an int or None, got {type(step).__name__} {step!r}")
    for key, value in hparams.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"hparams keys must be non-empty str, got {key!r}")
        if isinstance(value, bool) or isinstance(value, str):
            continue
        if not isinstance(value, numbers.Real):
            raise TypeError(f"hparams[{key!r}] must be an int, float, str or bool, got {type(value).__name__} "
                            f"{value!r}")
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"metrics keys must be non-empty str, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"metrics[{key!r}] must be an int or float, got {type(value).__name__} {value!r}")
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    tags = {key: f"{prefix}/{key}" if prefix else key for key in metrics}
    values = {key: value if isinstance(value, (bool, str)) else float(value) for key, value in hparams.items()}
    experiment, start, end = hparams_summaries(values, {tags[key]: float(v) for key, v in metrics.items()})
    file_writer = writer._get_file_writer()
    for summary in (experiment, start, end):
        file_writer.add_summary(summary, step)
    for key, value in metrics.items():
        writer.add_scalar(tags[key], float(value), 0 if step is None else step)
    writer.flush()


# the scalars of a solver's report that are values of the objective: ``{tag}/{name}`` exact, ``{tag}/{name}_estimate``
# between exact passes (`Solver._log`); ``exact_gap`` is the certified gap repeated at the passes that computed it
_OBJECTIVE = "(primal|dual|gap|exact_gap)(_estimate)?"
_GAP = "(gap|exact_gap)(_estimate)?"
CERTIFICATE_TAG = "certificate/duality_gap"


def certificate_layout(tags: Sequence[str] = ("bcfw",), metrics: Sequence[str] = ()) -> dict:
    """The Custom Scalars layout of `add_certificate_layout`, as the dict `SummaryWriter.add_custom_scalars`
    takes: ``{category: {chart title: ["Multiline", [tag regexes]]}}``."""
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise TypeError(f"tags must be a sequence of solver tags such as ('bcfw',), got {tags!r}")
    if isinstance(metrics, str) or not isinstance(metrics, Sequence):
        raise TypeError(f"metrics must be a sequence of metric names such as ('error',), got {metrics!r}")
    for name, values in (("tags", tags), ("metrics", metrics)):
        for value in values:
            if not isinstance(value, str) or not value or "/" in value:
                raise TypeError(f"{name} must hold non-empty str without '/', got {value!r}")
    layout = {}
    for tag in tags:
        t = re.escape(tag)
        layout[f"certificate: {tag}"] = {
            f"{tag}: primal, dual and gap (exact and estimate)": [
                "Multiline", [f"^{t}/{_OBJECTIVE}$", f"^{re.escape(CERTIFICATE_TAG)}$"]],
            f"{tag}: duality gap, certified and estimated": [
                "Multiline", [f"^{t}/{_GAP}$", f"^{re.escape(CERTIFICATE_TAG)}$"]],
        }
    if metrics:
        layout["train vs test"] = {f"{name}: train and test": ["Multiline", [f"^(train|test)/{re.escape(name)}$"]]
                                   for name in metrics}
    return layout


def add_certificate_layout(writer, tags: Sequence[str] = ("bcfw",), metrics: Sequence[str] = ()) -> dict:
    """Give ``writer``'s run a Custom Scalars layout where each solver ``tag``'s primal, dual and gap, exact and
    estimated (``{tag}/primal``, ``{tag}/primal_estimate``, ``{tag}/gap``, ``{tag}/gap_estimate``,
    ``{tag}/exact_gap``), and the recipes' ``certificate/duality_gap`` are on ONE chart, with a second chart of the
    gaps alone (their scale is far below the objective's), and one chart per name in ``metrics`` with
    ``train/{name}`` and ``test/{name}``.

    The Scalars tab draws each tag on its own card, so an estimate and the certificate it stands for are never
    seen together; this layout puts them side by side, so that a gap estimate far from the certified gap shows.
    The layout holds regular expressions, so it can be written when the writer is made, before any scalar.
    A run has one layout: call it once per writer (`SummaryWriter.add_custom_scalars`).

    Args:
        writer: a `torch.utils.tensorboard.SummaryWriter`.
        tags: the solvers' ``tag`` (``"bcfw"``, ``"fw"``, ``"ssg"``, ``"nslack"``, ...); () for none.
        metrics: names logged as both ``train/{name}`` and ``test/{name}`` (``"error"``, ``"pck"``).

    Returns the layout written (`certificate_layout`). Raises TypeError naming the argument that is wrong.
    """
    _check_writer(writer)
    layout = certificate_layout(tags, metrics)
    writer.add_custom_scalars(layout)
    return layout


def final_metrics(metrics: dict) -> dict:
    """The finite numbers of a recipe's last metrics dict (bools and anything else left out), for `log_hparams`."""
    return {k: float(v) for k, v in metrics.items() if isinstance(k, str) and isinstance(v, numbers.Real)
            and not isinstance(v, bool) and math.isfinite(v)}


def progress(iterable: Iterable, *, total: Optional[int] = None, desc: str = "", disable: Optional[bool] = None):
    """A tqdm bar on stderr; hidden when stderr is not a terminal unless ``disable=False``."""
    from tqdm.auto import tqdm

    if disable is None:
        disable = not sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, disable=disable, leave=False, dynamic_ncols=True)
