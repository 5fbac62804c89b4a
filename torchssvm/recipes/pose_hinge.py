"""Pictorial structures trained on the primal: the structured hinge loss plus ``lam/2 ||w||^2`` by a torch
optimizer, projected onto the positivity box after every step (projected (sub)gradient)."""

from __future__ import annotations

import time
from typing import Optional

import torch

from .. import optim
from ..logging import add_certificate_layout, log_scalars, make_writer
from ..losses import StructuredHingeLoss
from ..structures.tree import SpatialTreePotentials
from .run import Callback, Progress, TrainingRun, check_diverged, close_writer, make_optimizer


def train_pose_hinge(train, test, *, epochs: int, batch_size: int, lr: float, lam: float, optimizer: str = "adam",
                     backend: str = "auto", logdir: Optional[str] = "runs", run_name: str = "train-pose-torch",
                     seed: int = 0, callback: Callback = None, progress: Progress = None) -> TrainingRun:
    """Minimize ``lam/2 ||w||^2 + mean_i hinge_i(w)`` of the pictorial-structure model of
    `optim.SpatialTreeProblem` (same parameters ``w = [w_U | w_P]``, LSP loss) with a torch optimizer and the
    structured hinge loss, projecting ``w_xx, w_yy`` onto ``>= 0`` after every step (the distance-transform
    oracle needs them). On the CPU.

    Args:
        train, test: `PoseDataset`s.
        epochs, batch_size, lr, lam, optimizer, backend, logdir, run_name, seed: as in `train_chain_hinge`.
        callback: called with each epoch's metrics.
        progress: ``progress("epoch", done, total)`` after each mini-batch (``done`` of ``total`` batches), or None.

    Returns a `TrainingRun` (``model``: the `SpatialTreeProblem`, whose ``weight`` is the trained ``w``;
    ``solver``: the optimizer). Its history holds, per epoch: ``epoch``, ``objective``, ``seconds``,
    ``train_lsp_loss``, ``test_lsp_loss``, ``test_pck``, ``min_quadratic_weight``. TensorBoard gets
    ``train/batch_loss`` per step and ``train/{loss,lsp_loss,pck}``, ``test/{lsp_loss,pck}``,
    ``box/min_quadratic_weight``, ``time/seconds`` per epoch.
    """
    torch.manual_seed(seed)
    problem = optim.SpatialTreeProblem(train, backend=backend)
    w = torch.zeros(problem.d, dtype=torch.float64, requires_grad=True)
    opt = make_optimizer(optimizer, [w], lr)
    criterion = StructuredHingeLoss(problem.structure, backend=backend)
    writer = make_writer(logdir, run_name) if logdir else None
    if writer is not None:
        add_certificate_layout(writer, (), ("lsp_loss", "pck"))
    gen = torch.Generator().manual_seed(seed)
    t0, history, step = time.perf_counter(), [], 0
    for epoch in range(1, epochs + 1):
        total = 0.0
        batches = torch.randperm(problem.n, generator=gen).split(batch_size)
        for k, idx in enumerate(batches, 1):
            wu, wp = problem.weights(w)
            pot = SpatialTreePotentials(torch.einsum("bvfl,vf->bvl", problem.features[idx], wu),
                                        wp * problem.per_pixel, problem.rest)
            try:
                loss = criterion(pot, problem.truth[idx], problem.scale[idx]) + 0.5 * lam * (w * w).sum()
            except ValueError as e:  # NaN potentials: of diverged weights (the data are checked up front)
                check_diverged([w], epoch, lr, err=e)
                raise
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():  # projection onto the box: the quadratic deformation weights stay >= 0
                problem.weights(w)[1][:, 1::2].clamp_(min=0.0)
            loss_value = float(loss.detach())
            check_diverged([w], epoch, lr, loss=loss_value)
            total += loss_value * idx.shape[0]
            step += 1
            if writer is not None:
                writer.add_scalar("train/batch_loss", loss_value, step)
            if progress is not None:
                progress("epoch", k, len(batches))
        wd = w.detach()
        tr, te = problem.evaluate(wd), problem.evaluate(wd, test)
        metrics = {"epoch": epoch, "objective": total / problem.n, "seconds": time.perf_counter() - t0,
                   "train_lsp_loss": tr["lsp_loss"], "test_lsp_loss": te["lsp_loss"], "test_pck": te["pck"],
                   "min_quadratic_weight": float(problem.weights(wd)[1][:, 1::2].min())}
        log_scalars(writer, {"loss": metrics["objective"], "lsp_loss": tr["lsp_loss"], "pck": tr["pck"]}, epoch,
                    "train")
        log_scalars(writer, {"lsp_loss": te["lsp_loss"], "pck": te["pck"]}, epoch, "test")
        log_scalars(writer, {"min_quadratic_weight": metrics["min_quadratic_weight"]}, epoch, "box")
        log_scalars(writer, {"seconds": metrics["seconds"]}, epoch, "time")
        history.append(metrics)
        if callback is not None:
            callback(metrics)
    problem.write_model(w.detach())
    hparams = {"solver": "torch", "optimizer": optimizer, "lam": lam, "epochs": epochs, "batch_size": batch_size,
               "lr": lr, "backend": backend, "seed": seed}
    return TrainingRun(problem, opt, history, close_writer(writer, hparams, history[-1] if history else {}))
