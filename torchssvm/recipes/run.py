"""What every recipe returns (`TrainingRun`) and the pieces their loops share: the device check, the torch
optimizer by name, the dual solvers' stopping rule and checkpoints, and the TensorBoard writer's close."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, List, Optional

import torch

from .. import optim
from ..kernels import resolve
from ..logging import final_metrics, log_hparams, log_scalars
from ..optim.checkpoint import resume_from

# called with each epoch's (torch optimizers) or pass's (dual solvers) metrics, as soon as they are computed
Callback = Optional[Callable[[dict], None]]
# progress(phase, done, total) inside a pass or an epoch (`optim.Solver.progress`)
Progress = Optional[Callable[[str, int, int], None]]

OPTIMIZERS = ("adam", "sgd")
DUAL_SOLVERS = ("bcfw", "fw", "ssg")


@dataclasses.dataclass
class TrainingRun:
    """A finished training run.

    Attributes:
        model: what holds the trained parameters: the `LinearChainModel` (chain recipes), or the
            `SpatialTreeProblem` / `MixtureSpatialTreeProblem` whose ``weight`` is ``w`` (pose recipes).
        solver: what trained it: the dual solver (`BCFW`, `FrankWolfe`, `SSG`; its ``state_dict`` resumes it) or
            the torch optimizer.
        history: one metrics dict per epoch or pass, in order (the keys are listed by each recipe).
        logdir: the TensorBoard folder written, or None without a ``logdir``.
    """

    model: Any
    solver: Any
    history: List[dict] = dataclasses.field(default_factory=list)
    logdir: Optional[str] = None

    @property
    def metrics(self) -> dict:
        """The last epoch's or pass's metrics ({} when none ran)."""
        return self.history[-1] if self.history else {}


def check_device(device) -> torch.device:
    """``device`` as a `torch.device`: the CPU or an available CUDA device, else a ValueError saying why."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or a CUDA device ('cuda', 'cuda:1'), got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available on this machine")
    return dev


def check_backend(backend: str, device, data: str) -> None:
    """That ``backend`` can run the oracle of ``data`` (``"pose"``: the spatial tree's, else the chain's) on
    ``device``: its package is installed, and Triton has a GPU or its interpreter; a ValueError or RuntimeError
    saying which (`torchssvm.kernels.resolve`), before any data are loaded."""
    resolve("spatial_tree_max_sum" if data == "pose" else "viterbi", backend, device)


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """``"adam"``: `torch.optim.Adam`; ``"sgd"``: `torch.optim.SGD` with momentum 0.9."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise ValueError(f"optimizer must be 'adam' or 'sgd', got {name!r}")


def check_diverged(params, epoch: int, lr: float, loss: Optional[float] = None, err: Optional[Exception] = None):
    """Raise a FloatingPointError saying the run diverged when a parameter, or the batch's ``loss`` (already read),
    is not finite: after a step with too large a learning rate, the next batch's potentials hold NaN or inf and the
    loss refuses them (``err``, chained) with no word on why. Called on that error and on each loss value: no read of
    its own on the way of a healthy run."""
    bad = loss is not None and not math.isfinite(loss)
    if not bad and err is not None:
        bad = not all(bool(torch.isfinite(p).all()) for p in params)
    if bad:
        what = f"the batch loss became {loss}" if loss is not None else "the weights became non-finite"
        raise FloatingPointError(f"training diverged in epoch {epoch}: {what} (learning rate {lr})") from err


def end_of_pass(writer, k: int, cert: dict, report: dict, metrics: dict, history: list, callback: Callback,
                gap_tol: Optional[float], time_budget: Optional[float]) -> bool:
    """The end of pass ``k`` of a dual solver's recipe: log the certified gap (when ``cert`` has one), keep
    ``metrics`` in ``history``, call ``callback(metrics)``. Returns whether the loop ends here: the certified gap
    reached ``gap_tol`` or the solver time ``time_budget`` (None: no such limit)."""
    if "gap" in cert:
        log_scalars(writer, {"duality_gap": cert["gap"]}, k, "certificate")
    history.append(metrics)
    if callback is not None:
        callback(metrics)
    return ((gap_tol is not None and cert.get("gap", float("inf")) <= gap_tol)
            or (time_budget is not None and report["time"] >= time_budget))


def resume(solver, checkpoint) -> int:
    """The passes already done by ``solver``: 0, or, when the file ``checkpoint`` exists, those of the state it
    holds, which ``solver`` then takes (`optim.load_checkpoint`, then ``load_state_dict``: a checkpoint of other
    data or settings is refused, naming why)."""
    if checkpoint is not None:
        resume_from(solver, checkpoint)
    return solver.steps_done


def save(solver, checkpoint, k: int, every: int, last: bool) -> None:
    """Write ``solver``'s state to ``checkpoint`` (atomically) after pass ``k`` when ``every`` divides ``k`` or the
    run ends here (``last``); nothing without a ``checkpoint``."""
    if checkpoint is not None and (last or k % every == 0):
        optim.save_checkpoint(solver.state_dict(), checkpoint)


def close_writer(writer, hparams: Optional[dict] = None, metrics: Optional[dict] = None) -> Optional[str]:
    """Close the TensorBoard writer (if any); its folder, or None. With ``hparams`` (the recipe's arguments; None
    values left out) it first writes them and the finite numbers of ``metrics`` (the last pass's or epoch's) for
    the HParams tab, in the run's own folder (`log_hparams`: ``final/{name}`` scalars at the last pass or epoch)."""
    if writer is None:
        return None
    if hparams is not None:
        metrics = metrics or {}
        log_hparams(writer, {k: v for k, v in hparams.items() if v is not None}, final_metrics(metrics),
                    step=int(metrics.get("pass", metrics.get("epoch", 0))))
    logdir = writer.log_dir
    writer.close()
    return logdir
