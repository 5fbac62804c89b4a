"""The ``torchssvm`` command: ``demo`` (synthetic data, under a minute on 2 CPU cores) and ``train``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

import torch

from .evaluation import evaluate_chain
from .logging import log_scalars, make_writer, progress
from .losses import StructuredHingeLoss
from .models import LinearChainModel
from .structures.chain import Chain

DATASETS = ("synthetic", "ocr-large", "ocr-small", "conll2000-chunk")


def load_datasets(name: str, root: Optional[str] = None, seed: int = 0, min_count: int = 1):
    """(train, test) `SequenceDataset`s for a ``--data`` name."""
    from . import data

    if name == "synthetic":
        kw = {"num_labels": 6, "num_features": 20, "noise": 1.0, "seed": seed}
        return data.synthetic_chain("train", 1000, **kw), data.synthetic_chain("test", 300, **kw)
    if name.startswith("ocr-"):
        variant = name.split("-", 1)[1]
        return data.ocr("train", variant, root=root), data.ocr("test", variant, root=root)
    if name == "conll2000-chunk":
        return (data.conll2000("train", "chunk", root=root, min_count=min_count),
                data.conll2000("test", "chunk", root=root, min_count=min_count))
    raise ValueError(f"--data must be one of {DATASETS}, got {name!r}")


def train_chain(train, test, *, epochs: int, batch_size: int, lr: float, lam: float, optimizer: str = "adam",
                device: str = "cpu", backend: str = "auto", logdir: Optional[str] = "runs", run_name: str = "train",
                seed: int = 0, out=None) -> dict:
    """Minimize ``lam/2 ||w||^2 + mean_i hinge_i(w)`` of a linear chain SSVM with a torch optimizer.

    Prints one line per epoch (objective, train/test token error) and logs the same to TensorBoard.
    Returns the last epoch's metrics and the log directory.
    """
    torch.manual_seed(seed)
    dev = torch.device(device)
    model = LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse, device=dev)
    structure = Chain(train.num_labels)
    criterion = StructuredHingeLoss(structure, backend=backend)
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    writer = make_writer(logdir, run_name) if logdir else None
    gen = torch.Generator().manual_seed(seed)
    train_dev = train.to(dev)
    step, t0, metrics = 0, time.perf_counter(), {}
    n_batches = (len(train) + batch_size - 1) // batch_size
    for epoch in range(1, epochs + 1):
        total_loss = 0.0
        bar = progress(train_dev.batches(batch_size, shuffle=True, generator=gen), total=n_batches,
                       desc=f"epoch {epoch}/{epochs}")
        for batch in bar:
            hinge = criterion(model(batch.x), batch.y, batch.lengths)
            reg = 0.5 * lam * sum((p * p).sum() for p in model.parameters())
            loss = hinge + reg
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_value = float(loss.detach())
            total_loss += loss_value * batch.lengths.shape[0]
            step += 1
            if writer is not None:
                writer.add_scalar("train/batch_loss", loss_value, step)
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
        f1 = f"  test chunk F1 {te['chunk_f1']:.2f}" if "chunk_f1" in te else ""
        print(f"epoch {epoch:3d}  objective {metrics['objective']:.4f}  train error {tr['token_error']:.4f}  "
              f"test error {te['token_error']:.4f}{f1}  ({metrics['seconds']:.1f}s)", file=out or sys.stdout,
              flush=True)
    if writer is not None:
        metrics["logdir"] = writer.log_dir
        writer.close()
    return metrics


def _add_train_args(p: argparse.ArgumentParser, *, epochs: int, lr: float, lam: float, batch_size: int):
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--lam", type=float, default=lam, help="L2 regularization: lam/2 ||w||^2")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=("auto", "torch", "triton"), default="auto")
    p.add_argument("--logdir", default="runs", help="TensorBoard log folder ('' to disable)")
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchssvm", description="Structured SVMs in PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a chain SSVM on synthetic data (under a minute on CPU)")
    _add_train_args(demo, epochs=8, lr=0.005, lam=1e-4, batch_size=32)
    train = sub.add_parser("train", help="train a linear chain SSVM")
    train.add_argument("--data", choices=DATASETS, default="synthetic")
    train.add_argument("--root", default=None, help="data folder (default: $TORCHSSVM_DATA or the cache)")
    train.add_argument("--min-count", type=int, default=1, help="CoNLL: keep attributes seen this often")
    _add_train_args(train, epochs=10, lr=0.01, lam=1e-4, batch_size=32)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        name, root, min_count = "synthetic", None, 1
    else:
        name, root, min_count = args.data, args.root, args.min_count
    train, test = load_datasets(name, root, seed=args.seed, min_count=min_count)
    print(f"{args.command}: {train!r}\n{' ' * len(args.command)}  {test!r}")
    metrics = train_chain(train, test, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, lam=args.lam,
                          optimizer=args.optimizer, device=args.device, backend=args.backend,
                          logdir=args.logdir or None, run_name=f"{args.command}-{name}", seed=args.seed)
    if "logdir" in metrics:
        print(f"TensorBoard logs: {metrics['logdir']}  (tensorboard --logdir {args.logdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
