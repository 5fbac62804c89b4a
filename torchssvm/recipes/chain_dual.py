"""A linear chain SSVM trained on its dual by a solver of `torchssvm.optim` (BCFW, batch Frank-Wolfe or the
stochastic subgradient method), with the exact duality gap of every pass as its certificate."""

from __future__ import annotations

from typing import Optional

import torch

from .. import optim
from ..evaluation import evaluate_chain
from ..logging import add_certificate_layout, log_scalars, make_writer
from ..models import LinearChainModel
from ..structures.chain import Chain
from .run import DUAL_SOLVERS, Callback, Progress, TrainingRun, check_device, close_writer, end_of_pass, resume, save


def train_chain_dual(train, test, *, solver: str = "bcfw", lam: float = 1e-2, passes: int = 10,
                     gap_tol: Optional[float] = None, time_budget: Optional[float] = None, sampling: str = "gap",
                     step: str = "fw", cache_size: int = 0, batch_size: int = 1, gap_check_every: int = 10,
                     box=None, backend: str = "auto", device: str = "cpu", logdir: Optional[str] = "runs",
                     run_name: str = "train", seed: int = 0, rescaling: str = "margin",
                     callback: Callback = None, checkpoint=None, checkpoint_every: int = 1,
                     progress: Progress = None) -> TrainingRun:
    """Train a float64 `LinearChainModel` (Hamming loss, `Chain`) on fixed features with a dual solver.

    Args:
        train, test: `SequenceDataset`s (dense features or `TokenFeatures`).
        solver: ``"bcfw"`` (`optim.BCFW`, Lacoste-Julien et al. 2013), ``"fw"`` (`optim.FrankWolfe`, batch) or
            ``"ssg"`` (`optim.SSG`, stochastic subgradient).
        lam: the SSVM's regularization ``lam/2 ||w||^2 + mean_i H_i(w)``.
        passes: solver steps (a step is one pass over the blocks); the run also stops on a certified gap
            ``<= gap_tol`` or after ``time_budget`` solver seconds.
        sampling, step, cache_size, batch_size, gap_check_every: BCFW's block sampling (``"gap"`` or
            ``"uniform"``), step (``"fw"``, ``"pairwise"``, ``"away"``), cache of corners per block, blocks per
            coordinated step and passes between exact gap refreshes.
        box: box constraints on named parameter groups, e.g. ``{"transition": (0.0, None)}``.
        backend: the oracles' kernels backend; ``device``: ``"cpu"`` or a CUDA device (the blocks, caches, ``w``
            and oracle calls live there).
        logdir, run_name: TensorBoard folder and run name (None: no logging).
        seed: the solver's sampling seed.
        rescaling: ``"margin"`` or ``"slack"`` (the slack-rescaled SSVM: exact error-count DP oracle).
        callback: called with each pass's metrics.
        progress: ``progress(phase, done, total)`` called inside each pass (`optim.Solver.progress`: blocks
            visited, ``phase`` ``"pass"`` or ``"gap"``), or None.
        checkpoint, checkpoint_every: a file to resume from when it exists (passes count from the start of
            training: the run ends at ``passes`` in all) and to write, atomically, every ``checkpoint_every`` passes
            and at the end (`optim.save_checkpoint`).

    Returns a `TrainingRun` (``model``: the `LinearChainModel`, holding ``w``; ``solver``: the dual solver).
    Its history holds, per pass: ``pass``, ``passes`` (effective passes), ``seconds`` (solver time),
    ``train_error``, ``test_error``, ``primal`` and, except for SSG, ``dual`` and ``gap`` (the exact duality gap of
    the iterate: a full oracle pass for monitoring, not counted in the solver's oracle calls), and on chunk tags
    ``test_chunk_f1`` (%). TensorBoard gets the solver's scalars and ``train/error``, ``test/{error,chunk_f1}``,
    ``certificate/duality_gap``.
    """
    dev = check_device(device)
    model = LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, dtype=torch.float64,
                             device=dev)
    structure = Chain(train.num_labels)
    writer = make_writer(logdir, run_name) if logdir else None
    common = {"structure": structure, "backend": backend, "writer": writer, "rescaling": rescaling}
    if solver == "bcfw":
        s = optim.BCFW(model, train, lam=lam, sampling=sampling, step=step, cache_size=cache_size,
                       batch_size=batch_size, gap_check_every=gap_check_every, box=box, seed=seed, **common)
    elif solver == "fw":
        s = optim.FrankWolfe(model, train, lam=lam, box=box, **common)
    elif solver == "ssg":
        s = optim.SSG(model, train, lam=lam, box=box, seed=seed, **common)
    else:
        raise ValueError(f"solver must be one of {DUAL_SOLVERS} here, got {solver!r}")
    s.progress = progress
    if writer is not None:
        add_certificate_layout(writer, (s.tag,), ("error",))
    history = []
    done = resume(s, checkpoint)  # passes count from the start of training: a resumed run ends where it would have
    for k in range(done + 1, passes + 1):
        r = s.step()
        cert = {"primal": r["primal"]} if solver == "ssg" else s.duality_gap()
        tr = evaluate_chain(model, structure, train, device=dev, backend=backend)
        te = evaluate_chain(model, structure, test, device=dev, backend=backend)
        metrics = {"pass": k, "passes": r["passes"], "seconds": r["time"], "train_error": tr["token_error"],
                   "test_error": te["token_error"], **{key: cert[key] for key in ("primal", "dual", "gap")
                                                       if key in cert}}
        if "chunk_f1" in te:
            metrics["test_chunk_f1"] = te["chunk_f1"]
        log_scalars(writer, {"error": tr["token_error"]}, k, "train")
        log_scalars(writer, {"error": te["token_error"], **({"chunk_f1": te["chunk_f1"]} if "chunk_f1" in te
                                                            else {})}, k, "test")
        last = end_of_pass(writer, k, cert, r, metrics, history, callback, gap_tol, time_budget) or k == passes
        save(s, checkpoint, k, checkpoint_every, last)
        if last:
            break
    hparams = {"solver": solver, "lam": lam, "passes": passes, "gap_tol": gap_tol, "time_budget": time_budget,
               "sampling": sampling, "step": step, "cache_size": cache_size, "batch_size": batch_size,
               "gap_check_every": gap_check_every, "backend": backend, "device": device, "seed": seed,
               "rescaling": rescaling, "box": None if box is None else str(box)}
    return TrainingRun(model, s, history, close_writer(writer, hparams, history[-1] if history else {}))
