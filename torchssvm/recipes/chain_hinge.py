"""A linear chain SSVM trained on its primal: the structured hinge loss plus ``lam/2 ||w||^2`` minimized by a
torch optimizer (Adam or SGD with momentum) over mini-batches."""

from __future__ import annotations

import time
from typing import Optional

import torch

from ..evaluation import evaluate_chain
from ..logging import add_certificate_layout, log_scalars, make_writer
from ..logging import progress as progress_bar
from ..losses import StructuredHingeLoss
from ..models import LinearChainModel
from ..structures.chain import Chain
from .run import Callback, Progress, TrainingRun, check_device, check_diverged, close_writer, make_optimizer


def train_chain_hinge(train, test, *, epochs: int, batch_size: int, lr: float, lam: float, optimizer: str = "adam",
                      device: str = "cpu", backend: str = "auto", logdir: Optional[str] = "runs",
                      run_name: str = "train", seed: int = 0, callback: Callback = None,
                      progress: Progress = None) -> TrainingRun:
    """Minimize ``lam/2 ||w||^2 + mean_i hinge_i(w)`` of a `LinearChainModel` (Hamming loss, `Chain`) with a
    torch optimizer.

    Args:
        train, test: `SequenceDataset`s (dense features or `TokenFeatures`).
        epochs: passes over ``train``, in shuffled mini-batches of ``batch_size`` sequences.
        lr: the optimizer's learning rate; ``optimizer``: ``"adam"`` or ``"sgd"`` (momentum 0.9).
        lam: the L2 regularization.
        device: ``"cpu"`` or a CUDA device; ``backend``: the kernels' backend (``"auto"``, ``"torch"``, ``"triton"``).
        logdir: TensorBoard folder (a run folder ``<run_name>-<time>`` is made in it); None: no logging.
        seed: seeds torch and the batch order.
        callback: called with each epoch's metrics.
        progress: ``progress("epoch", done, total)`` after each mini-batch (``done`` of ``total`` batches), or None.

    Returns a `TrainingRun` (``model``: the `LinearChainModel`, ``solver``: the optimizer). Its history holds,
    per epoch: ``epoch``, ``objective`` (the mean training objective over the epoch's batches), ``seconds``
    (since the start, evaluation included), ``train_error``, ``test_error`` (token error rates),
    ``test_sequence_error`` and, on chunk tags, ``test_chunk_f1`` (%). TensorBoard gets ``train/batch_loss`` per
    step and ``train/{loss,error}``, ``test/{error,sequence_error,chunk_f1}``, ``time/seconds`` per epoch; a
    progress bar runs on stderr when it is a terminal.
    """
    torch.manual_seed(seed)
    dev = check_device(device)
    model = LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, device=dev)
    structure = Chain(train.num_labels)
    criterion = StructuredHingeLoss(structure, backend=backend)
    opt = make_optimizer(optimizer, model.parameters(), lr)
    writer = make_writer(logdir, run_name) if logdir else None
    if writer is not None:
        add_certificate_layout(writer, (), ("error",))
    gen = torch.Generator().manual_seed(seed)
    train_dev = train.to(dev)
    step, t0, history = 0, time.perf_counter(), []
    n_batches = (len(train) + batch_size - 1) // batch_size
    for epoch in range(1, epochs + 1):
        total_loss = 0.0
        bar = progress_bar(train_dev.batches(batch_size, shuffle=True, generator=gen), total=n_batches,
                       desc=f"epoch {epoch}/{epochs}")
        for batch in bar:
            try:
                hinge = criterion(model(batch.x), batch.y, batch.lengths)
            except ValueError as e:  # NaN potentials: of data (checked up front) or of diverged weights
                check_diverged(model.parameters(), epoch, lr, err=e)
                raise
            reg = 0.5 * lam * sum((p * p).sum() for p in model.parameters())
            loss = hinge + reg
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_value = float(loss.detach())
            check_diverged(model.parameters(), epoch, lr, loss=loss_value)
            total_loss += loss_value * batch.lengths.shape[0]
            step += 1
            if writer is not None:
                writer.add_scalar("train/batch_loss", loss_value, step)
            if progress is not None:
                progress("epoch", step - (epoch - 1) * n_batches, n_batches)
            bar.set_postfix(loss=f"{loss_value:.4f}")
        tr = evaluate_chain(model, structure, train, device=dev, backend=backend)
        te = evaluate_chain(model, structure, test, device=dev, backend=backend)
        metrics = {"epoch": epoch, "objective": total_loss / len(train), "seconds": time.perf_counter() - t0,
                   "train_error": tr["token_error"], "test_error": te["token_error"],
                   "test_sequence_error": te["sequence_error"]}
        if "chunk_f1" in te:
            metrics["test_chunk_f1"] = te["chunk_f1"]
        log_scalars(writer, {"loss": metrics["objective"], "error": tr["token_error"]}, epoch, "train")
        log_scalars(writer, {"error": te["token_error"], "sequence_error": te["sequence_error"],
                             **({"chunk_f1": te["chunk_f1"]} if "chunk_f1" in te else {})}, epoch, "test")
        log_scalars(writer, {"seconds": metrics["seconds"]}, epoch, "time")
        history.append(metrics)
        if callback is not None:
            callback(metrics)
    hparams = {"solver": "torch", "optimizer": optimizer, "lam": lam, "epochs": epochs, "batch_size": batch_size,
               "lr": lr, "backend": backend, "device": device, "seed": seed}
    return TrainingRun(model, opt, history, close_writer(writer, hparams, history[-1] if history else {}))
