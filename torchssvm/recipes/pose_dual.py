"""Pictorial structures trained on the dual by a solver of `torchssvm.optim`, with the positivity box on the
quadratic deformation weights that the distance-transform oracle needs."""

from __future__ import annotations

import dataclasses
from typing import Optional

from .. import optim
from ..logging import add_certificate_layout, log_scalars, make_writer
from .run import DUAL_SOLVERS, Callback, Progress, TrainingRun, check_device, close_writer, end_of_pass, resume, save


def train_pose_dual(train, test, *, solver: str = "bcfw", lam: float = 1e-2, passes: int = 10,
                    gap_tol: Optional[float] = None, time_budget: Optional[float] = None, sampling: str = "gap",
                    step: str = "fw", cache_size: int = 0, batch_size: int = 1, gap_check_every: int = 10,
                    positivity: bool = True, types: int = 1, backend: str = "auto", device: str = "cpu",
                    logdir: Optional[str] = "runs", run_name: str = "train-pose", seed: int = 0,
                    callback: Callback = None, checkpoint=None, checkpoint_every: int = 1,
                    progress: Progress = None) -> TrainingRun:
    """Train `optim.SpatialTreeProblem` on `PoseDataset`s (with ``types`` T > 1 `optim.MixtureSpatialTreeProblem`,
    T K-means deformation types per edge) with a dual solver and the positivity box on the quadratic deformation
    weights (Osokin et al., 2016, App. H; ``positivity=False`` drops it, and the oracle then raises as soon as a
    quadratic weight turns negative).

    Args:
        train, test: `PoseDataset`s (``train`` is moved to ``device``).
        solver, lam, passes, gap_tol, time_budget, sampling, step, cache_size, batch_size, gap_check_every,
            backend, device, logdir, run_name, seed: as in `train_chain_dual` (``seed`` also seeds the K-means).
        positivity: constrain ``w_xx, w_yy >= 0`` by the box.
        types: deformation types per edge.
        callback: called with each pass's metrics.
        progress: ``progress(phase, done, total)`` called inside each pass (`optim.Solver.progress`: blocks
            visited, ``phase`` ``"pass"`` or ``"gap"``), or None.
        checkpoint, checkpoint_every: a file to resume from when it exists (passes count from the start of
            training: the run ends at ``passes`` in all) and to write, atomically, every ``checkpoint_every`` passes
            and at the end (`optim.save_checkpoint`).

    Returns a `TrainingRun` (``model``: the problem, whose ``weight`` is ``w``, the solver's output (SSG: its
    average); ``solver``: the dual solver). Its history holds, per pass: ``pass``, ``passes``, ``seconds``,
    ``train_lsp_loss``, ``test_lsp_loss``, ``train_pck``, ``test_pck`` (nodes within s/2 of the truth),
    ``min_quadratic_weight``, ``primal`` and, except for SSG, ``dual`` and ``gap`` (a monitoring pass, not
    counted). TensorBoard gets the same and the solver's scalars.
    """
    dev = check_device(device)
    train = dataclasses.replace(train, features=train.features.to(dev), positions=train.positions.to(dev),
                                scale=train.scale.to(dev), rest=train.rest.to(dev))
    if types > 1:
        problem = optim.MixtureSpatialTreeProblem(train, types, backend=backend, seed=seed)
    else:
        problem = optim.SpatialTreeProblem(train, backend=backend)
    writer = make_writer(logdir, run_name) if logdir else None
    box = problem.positivity_box() if positivity else None
    common = {"box": box, "writer": writer}
    if solver == "bcfw":
        s = optim.BCFW(problem, lam=lam, sampling=sampling, step=step, cache_size=cache_size, batch_size=batch_size,
                       gap_check_every=gap_check_every, seed=seed, **common)
    elif solver == "fw":
        s = optim.FrankWolfe(problem, lam=lam, **common)
    elif solver == "ssg":
        s = optim.SSG(problem, lam=lam, seed=seed, **common)
    else:
        raise ValueError(f"solver must be one of {DUAL_SOLVERS} here (train_pose_hinge: 'torch'), got {solver!r}")
    s.progress = progress
    if writer is not None:
        add_certificate_layout(writer, (s.tag,), ("lsp_loss", "pck"))
    history = []
    done = resume(s, checkpoint)  # passes count from the start of training: a resumed run ends where it would have
    for k in range(done + 1, passes + 1):
        r = s.step()
        w = problem.weight.clone()  # the solver's output (SSG: its average)
        cert = {"primal": r["primal"]} if solver == "ssg" else s.duality_gap()
        tr, te = problem.evaluate(w), problem.evaluate(w, test)
        min_quad = float(problem.weights(w)[-1][..., 1::2].min())  # w_P: (E, 4), or (E, T, 4) with types
        metrics = {"pass": k, "passes": r["passes"], "seconds": r["time"], "train_lsp_loss": tr["lsp_loss"],
                   "test_lsp_loss": te["lsp_loss"], "train_pck": tr["pck"], "test_pck": te["pck"],
                   "min_quadratic_weight": min_quad,
                   **{key: cert[key] for key in ("primal", "dual", "gap") if key in cert}}
        log_scalars(writer, {"lsp_loss": tr["lsp_loss"], "pck": tr["pck"]}, k, "train")
        log_scalars(writer, {"lsp_loss": te["lsp_loss"], "pck": te["pck"]}, k, "test")
        log_scalars(writer, {"min_quadratic_weight": min_quad}, k, "box")
        last = end_of_pass(writer, k, cert, r, metrics, history, callback, gap_tol, time_budget) or k == passes
        save(s, checkpoint, k, checkpoint_every, last)
        if last:
            break
    hparams = {"solver": solver, "lam": lam, "passes": passes, "gap_tol": gap_tol, "time_budget": time_budget,
               "sampling": sampling, "step": step, "cache_size": cache_size, "batch_size": batch_size,
               "gap_check_every": gap_check_every, "positivity": positivity, "types": types, "backend": backend,
               "device": device, "seed": seed}
    return TrainingRun(problem, s, history, close_writer(writer, hparams, history[-1] if history else {}))
