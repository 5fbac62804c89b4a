"""The ``torchssvm`` command: ``demo`` (BCFW on synthetic data, under a minute on 2 CPU cores) and ``train``
(``--solver bcfw|fw|ssg`` on fixed features, or ``--solver torch``: the hinge loss with a torch optimizer;
``--data pose``: pictorial structures on `data.synthetic_pose`, w_xx, w_yy >= 0 by the box or a projection)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Optional, Sequence

import torch

from .evaluation import evaluate_chain
from .logging import log_scalars, make_writer, progress
from .losses import StructuredHingeLoss
from .models import LinearChainModel
from .structures.chain import Chain

DATASETS = ("synthetic", "ocr-large", "ocr-small", "conll2000-chunk", "pose")


def load_datasets(name: str, root: Optional[str] = None, seed: int = 0, min_count: int = 1, *,
                  num_train: Optional[int] = None, num_test: Optional[int] = None, grid: int = 12,
                  limb_modes: int = 1):
    """(train, test) `SequenceDataset`s for a ``--data`` name (`PoseDataset`s for ``"pose"``: ``num_train``,
    ``num_test`` examples on a ``grid x grid`` board, limbs bent in ``limb_modes`` modes)."""
    from . import data

    if name == "synthetic":
        kw = {"num_labels": 6, "num_features": 20, "noise": 1.0, "seed": seed}
        return data.synthetic_chain("train", 1000, **kw), data.synthetic_chain("test", 300, **kw)
    if name.startswith("ocr-"):
        variant = name.split("-", 1)[1]
        return data.ocr("train", variant, root=root), data.ocr("test", variant, root=root)
    if name == "pose":
        kw = {"height": grid, "width": grid, "limb_modes": limb_modes, "seed": seed}
        return (data.synthetic_pose("train", 16 if num_train is None else num_train, **kw),
                data.synthetic_pose("test", 16 if num_test is None else num_test, **kw))
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
    dev = _check_device(device)
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


SOLVERS = ("bcfw", "fw", "ssg", "torch")


def _check_device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or a CUDA device ('cuda', 'cuda:1'), got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available on this machine")
    return dev


def _stop(cert: dict, report: dict, gap_tol: Optional[float], time_budget: Optional[float]) -> bool:
    """A pass loop's exit: the certified gap reached ``gap_tol`` or the solver time ``time_budget``."""
    return ((gap_tol is not None and cert.get("gap", float("inf")) <= gap_tol)
            or (time_budget is not None and report["time"] >= time_budget))


def _close(writer, metrics: dict) -> dict:
    """Close the TensorBoard writer (if any) and record its folder in ``metrics``."""
    if writer is not None:
        metrics["logdir"] = writer.log_dir
        writer.close()
    return metrics


def train_dual(train, test, *, solver: str = "bcfw", lam: float = 1e-2, passes: int = 10,
               gap_tol: Optional[float] = None, time_budget: Optional[float] = None, sampling: str = "gap",
               step: str = "fw", cache_size: int = 0, batch_size: int = 1, gap_check_every: int = 10, box=None,
               backend: str = "auto", device: str = "cpu", logdir: Optional[str] = "runs", run_name: str = "train",
               seed: int = 0, rescaling: str = "margin", out=None) -> dict:
    """Train a linear chain SSVM on fixed features with a dual solver (`torchssvm.optim`); ``rescaling``
    ``"margin"`` or ``"slack"`` (seed 000: exact error-count DP oracle, slack-rescaled corners).

    Prints one line per pass: effective passes, the exact duality gap of the current iterate (a full
    oracle pass for monitoring, not counted in the solver's oracle calls), primal, dual, train / test
    error, and solver seconds; logs the solver's scalars and the errors to TensorBoard. Stops after
    ``passes`` steps, on a certified gap ``<= gap_tol``, or after ``time_budget`` solver seconds. On
    ``device="cuda"`` the blocks, the caches, ``w`` and the oracle calls live on the GPU."""
    from . import optim

    dev = _check_device(device)
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
        raise ValueError(f"solver must be one of {SOLVERS[:3]} here, got {solver!r}")
    metrics, printer = {}, (lambda line: print(line, file=out or sys.stdout, flush=True))
    for k in range(1, passes + 1):
        r = s.step()
        if solver == "ssg":
            gap_txt = f"primal {r['primal']:.5f}"
            cert = {"primal": r["primal"]}
        else:
            cert = s.duality_gap()
            gap_txt = f"gap {cert['gap']:.3e}  primal {cert['primal']:.5f}  dual {cert['dual']:.5f}"
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
        if "gap" in cert:
            log_scalars(writer, {"duality_gap": cert["gap"]}, k, "certificate")
        f1 = f"  test chunk F1 {te['chunk_f1']:.2f}" if "chunk_f1" in te else ""
        printer(f"pass {k:3d} ({r['passes']:5.1f} effective)  {gap_txt}  train error {tr['token_error']:.4f}  "
                f"test error {te['token_error']:.4f}{f1}  ({r['time']:.1f}s)")
        if _stop(cert, r, gap_tol, time_budget):
            break
    return _close(writer, metrics)


def train_pose(train, test, *, solver: str = "bcfw", lam: float = 1e-2, passes: int = 10,
               gap_tol: Optional[float] = None, time_budget: Optional[float] = None, sampling: str = "gap",
               step: str = "fw", cache_size: int = 0, batch_size: int = 1, gap_check_every: int = 10,
               positivity: bool = True, types: int = 1, backend: str = "auto", device: str = "cpu",
               logdir: Optional[str] = "runs", run_name: str = "train-pose", seed: int = 0, out=None) -> dict:
    """Train pictorial structures (`optim.SpatialTreeProblem` on `PoseDataset`s; with ``types`` T > 1
    `optim.MixtureSpatialTreeProblem`, T K-means deformation types per edge) with a dual solver and the
    positivity box on the quadratic deformation weights (note 001 section 2.7; ``positivity=False`` drops it,
    and the oracle then raises as soon as a quadratic weight turns negative).

    Prints one line per pass: effective passes, the exact duality gap of the current iterate (a monitoring
    pass, not counted), primal, dual, train / test LSP loss and PCK (nodes within s/2 of the truth), and
    the smallest quadratic weight; logs the same to TensorBoard. Returns the last pass's metrics."""
    import dataclasses

    from . import optim

    dev = _check_device(device)
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
        raise ValueError(f"solver must be one of {SOLVERS[:3]} here (train_pose_hinge: 'torch'), got {solver!r}")
    metrics, printer = {}, (lambda line: print(line, file=out or sys.stdout, flush=True))
    for k in range(1, passes + 1):
        r = s.step()
        w = problem.weight.clone()  # the solver's output (SSG: its average)
        if solver == "ssg":
            gap_txt, cert = f"primal {r['primal']:.5f}", {"primal": r["primal"]}
        else:
            cert = s.duality_gap()
            gap_txt = f"gap {cert['gap']:.3e}  primal {cert['primal']:.5f}  dual {cert['dual']:.5f}"
        tr, te = problem.evaluate(w), problem.evaluate(w, test)
        min_quad = float(problem.weights(w)[-1][..., 1::2].min())  # w_P: (E, 4), or (E, T, 4) with types
        metrics = {"pass": k, "passes": r["passes"], "seconds": r["time"], "train_lsp_loss": tr["lsp_loss"],
                   "test_lsp_loss": te["lsp_loss"], "train_pck": tr["pck"], "test_pck": te["pck"],
                   "min_quadratic_weight": min_quad,
                   **{key: cert[key] for key in ("primal", "dual", "gap") if key in cert}}
        log_scalars(writer, {"lsp_loss": tr["lsp_loss"], "pck": tr["pck"]}, k, "train")
        log_scalars(writer, {"lsp_loss": te["lsp_loss"], "pck": te["pck"]}, k, "test")
        log_scalars(writer, {"min_quadratic_weight": min_quad}, k, "box")
        if "gap" in cert:
            log_scalars(writer, {"duality_gap": cert["gap"]}, k, "certificate")
        printer(f"pass {k:3d} ({r['passes']:5.1f} effective)  {gap_txt}  train LSP loss {tr['lsp_loss']:.4f}  "
                f"test LSP loss {te['lsp_loss']:.4f}  test PCK {te['pck']:.3f}  min w_quad {min_quad:.2e}  "
                f"({r['time']:.1f}s)")
        if _stop(cert, r, gap_tol, time_budget):
            break
    return _close(writer, metrics)


def train_pose_hinge(train, test, *, epochs: int, batch_size: int, lr: float, lam: float, optimizer: str = "adam",
                     backend: str = "auto", logdir: Optional[str] = "runs", run_name: str = "train-pose-torch",
                     seed: int = 0, out=None) -> dict:
    """Minimize ``lam/2 ||w||^2 + mean_i hinge_i(w)`` of the pictorial-structure model of
    `optim.SpatialTreeProblem` (same parameters ``w = [w_U | w_P]``, LSP loss) with a torch optimizer and the
    structured hinge loss, projecting ``w_xx, w_yy`` onto ``>= 0`` after every step (projected (sub)gradient:
    the distance-transform oracle needs them). Prints one line per epoch and logs to TensorBoard."""
    from . import optim
    from .structures.tree import SpatialTreePotentials

    torch.manual_seed(seed)
    problem = optim.SpatialTreeProblem(train, backend=backend)
    w = torch.zeros(problem.d, dtype=torch.float64, requires_grad=True)
    if optimizer == "adam":
        opt = torch.optim.Adam([w], lr=lr)
    elif optimizer == "sgd":
        opt = torch.optim.SGD([w], lr=lr, momentum=0.9)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    criterion = StructuredHingeLoss(problem.structure, backend=backend)
    writer = make_writer(logdir, run_name) if logdir else None
    gen = torch.Generator().manual_seed(seed)
    t0, metrics, step = time.perf_counter(), {}, 0
    for epoch in range(1, epochs + 1):
        total = 0.0
        for idx in torch.randperm(problem.n, generator=gen).split(batch_size):
            wu, wp = problem.weights(w)
            pot = SpatialTreePotentials(torch.einsum("bvfl,vf->bvl", problem.features[idx], wu),
                                        wp * problem.per_pixel, problem.rest)
            loss = criterion(pot, problem.truth[idx], problem.scale[idx]) + 0.5 * lam * (w * w).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():  # projection onto the box: the quadratic deformation weights stay >= 0
                problem.weights(w)[1][:, 1::2].clamp_(min=0.0)
            total += float(loss.detach()) * idx.shape[0]
            step += 1
            if writer is not None:
                writer.add_scalar("train/batch_loss", float(loss.detach()), step)
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
        print(f"epoch {epoch:3d}  objective {metrics['objective']:.4f}  train LSP loss {tr['lsp_loss']:.4f}  "
              f"test LSP loss {te['lsp_loss']:.4f}  test PCK {te['pck']:.3f}  min w_quad "
              f"{metrics['min_quadratic_weight']:.2e}  ({metrics['seconds']:.1f}s)", file=out or sys.stdout, flush=True)
    problem.write_model(w.detach())
    if writer is not None:
        metrics["logdir"] = writer.log_dir
        writer.close()
    return metrics


def _add_solver_args(p: argparse.ArgumentParser, *, solver: str, passes: int):
    p.add_argument("--solver", choices=SOLVERS, default=solver,
                   help="dual solver (bcfw, fw: batch Frank-Wolfe, ssg: stochastic subgradient) or 'torch' "
                        "(the hinge loss with a torch optimizer)")
    p.add_argument("--passes", type=int, default=passes, help="dual solvers: passes over the data")
    p.add_argument("--gap-tol", type=float, default=None, help="dual solvers: stop at this duality gap")
    p.add_argument("--time-budget", type=float, default=None, help="dual solvers: solver seconds")
    p.add_argument("--sampling", choices=("uniform", "gap"), default="gap")
    p.add_argument("--step", choices=("fw", "pairwise", "away"), default="fw")
    p.add_argument("--cache-size", type=int, default=0)
    p.add_argument("--gap-check-every", type=int, default=10)
    p.add_argument("--block-batch", type=int, default=1, help="bcfw: blocks per coordinated step")
    p.add_argument("--nonneg-transition", action="store_true", help="box constraint: transition >= 0")
    p.add_argument("--rescaling", choices=("margin", "slack"), default="margin",
                   help="dual solvers: margin- or slack-rescaled hinge")


def _add_train_args(p: argparse.ArgumentParser, *, epochs: int, lr: float, lam: float, batch_size: int):
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--lam", type=float, default=lam, help="L2 regularization: lam/2 ||w||^2")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--device", default="cpu", help="cpu or cuda (dual solvers and torch optimizers)")
    p.add_argument("--backend", choices=("auto", "torch", "triton"), default="auto")
    p.add_argument("--logdir", default="runs", help="TensorBoard log folder ('' to disable)")
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchssvm", description="Structured SVMs in PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a chain SSVM with BCFW on synthetic data (under a minute on CPU)")
    _add_train_args(demo, epochs=8, lr=0.005, lam=1.0, batch_size=32)
    _add_solver_args(demo, solver="bcfw", passes=8)
    train = sub.add_parser("train", help="train a linear chain SSVM")
    train.add_argument("--data", choices=DATASETS, default="synthetic")
    train.add_argument("--root", default=None, help="data folder (default: $TORCHSSVM_DATA or the cache)")
    train.add_argument("--min-count", type=int, default=1, help="CoNLL: keep attributes seen this often")
    train.add_argument("--num-train", type=int, default=None, help="pose: training examples (default 16)")
    train.add_argument("--num-test", type=int, default=None, help="pose: test examples (default 16)")
    train.add_argument("--grid", type=int, default=12, help="pose: the board is grid x grid positions")
    train.add_argument("--types", type=int, default=1,
                       help="pose: deformation types per edge (K-means on the training displacements; > 1 needs a "
                            "dual solver)")
    train.add_argument("--limb-modes", type=int, default=1, help="pose: limbs bent in this many modes")
    train.add_argument("--no-positivity", action="store_true",
                       help="pose: drop the box w_xx, w_yy >= 0 (the distance-transform oracle then fails)")
    _add_train_args(train, epochs=10, lr=0.01, lam=1e-2, batch_size=32)
    _add_solver_args(train, solver="bcfw", passes=10)
    return parser


def _check_args(args, name: str) -> None:
    """Every numeric flag in its range, and no flag that the chosen data or solver would ignore (ValueError naming
    the flag), before any data are loaded."""
    at_least = {"--epochs": (args.epochs, 1), "--batch-size": (args.batch_size, 1), "--passes": (args.passes, 1),
                "--block-batch": (args.block_batch, 1), "--gap-check-every": (args.gap_check_every, 1),
                "--cache-size": (args.cache_size, 0), "--seed": (args.seed, 0)}
    if args.command == "train":
        at_least.update({"--min-count": (args.min_count, 1), "--grid": (args.grid, 8), "--types": (args.types, 1),
                         "--limb-modes": (args.limb_modes, 1), "--num-train": (args.num_train, 1),
                         "--num-test": (args.num_test, 1)})
    for flag, (value, low) in at_least.items():
        if value is not None and value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    for flag, value in (("--lam", args.lam), ("--lr", args.lr), ("--gap-tol", args.gap_tol),
                        ("--time-budget", args.time_budget)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a finite number > 0, got {value}")
    _check_device(args.device)
    dual = args.solver != "torch"
    pose = name == "pose"
    ignored = [("--rescaling slack", args.rescaling == "slack" and (pose or not dual),
                "needs a dual solver on chain data"),
               ("--nonneg-transition", args.nonneg_transition and (pose or not dual),
                "needs a dual solver on chain data (pose has its own box, see --no-positivity)")]
    if args.command == "train":
        ignored += [("--types", args.types != 1 and not pose, "is for --data pose"),
                    ("--no-positivity", args.no_positivity and not pose, "is for --data pose"),
                    ("--limb-modes", args.limb_modes != 1 and not pose, "is for --data pose"),
                    ("--num-train / --num-test", (args.num_train, args.num_test) != (None, None) and not pose,
                     "is for --data pose (the other data sets have fixed splits)"),
                    ("--types", args.types != 1 and not dual,
                     "> 1 needs a dual solver (--solver bcfw, fw or ssg), not --solver torch"),
                    ("--no-positivity", args.no_positivity and not dual,
                     "needs a dual solver (--solver torch always projects w_xx, w_yy onto >= 0)"),
                    ("--device", pose and not dual and torch.device(args.device).type != "cpu",
                     "must be 'cpu' for --data pose --solver torch")]
    # flags set away from their defaults that this solver or data set would not read
    defaults = vars(build_parser().parse_args([args.command]))

    def changed(*dests):
        return [f"--{d.replace('_', '-')}" for d in dests if getattr(args, d) != defaults[d]]

    if dual:
        ignored += [(flag, True, f"is for --solver torch (the dual solver {args.solver!r} runs --passes)")
                    for flag in changed("epochs", "batch_size", "lr", "optimizer")]
    else:
        ignored += [(flag, True, "is for the dual solvers, not --solver torch (it runs --epochs)")
                    for flag in changed("passes", "gap_tol", "time_budget", "sampling", "step", "cache_size",
                                        "gap_check_every", "block_batch")]
    if args.solver in ("fw", "ssg"):
        ignored += [(flag, True, f"is for --solver bcfw, not {args.solver!r}")
                    for flag in changed("sampling", "step", "cache_size", "gap_check_every", "block_batch")]
    if args.solver == "ssg":
        ignored += [(flag, True, "is for the solvers with a duality gap (bcfw, fw); ssg reports none")
                    for flag in changed("gap_tol")]
    if args.command == "train":
        ignored += [(flag, True, "is for --data conll2000-chunk") for flag in changed("min_count")
                    if name != "conll2000-chunk"]
        ignored += [(flag, True, "is for --data pose") for flag in changed("grid") if not pose]
    for flag, bad, why in ignored:
        if bad:
            raise ValueError(f"{flag} {why}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        name, root, min_count = "synthetic", None, 1
    else:
        name, root, min_count = args.data, args.root, args.min_count
    _check_args(args, name)
    pose = {"num_train": args.num_train, "num_test": args.num_test, "grid": args.grid,
            "limb_modes": args.limb_modes} if name == "pose" else {}
    train, test = load_datasets(name, root, seed=args.seed, min_count=min_count, **pose)
    print(f"{args.command}: {train!r}\n{' ' * len(args.command)}  {test!r}")
    if name == "pose":
        if args.solver == "torch":
            metrics = train_pose_hinge(train, test, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                       lam=args.lam, optimizer=args.optimizer, backend=args.backend,
                                       logdir=args.logdir or None, seed=args.seed)
            if "logdir" in metrics:
                print(f"TensorBoard logs: {metrics['logdir']}  (tensorboard --logdir {args.logdir})")
            return 0
        print(f"solver {args.solver}, lam {args.lam}, box {'none' if args.no_positivity else 'w_xx, w_yy >= 0'}"
              + (f", {args.types} types per edge" if args.types > 1 else ""))
        metrics = train_pose(train, test, solver=args.solver, lam=args.lam, passes=args.passes, gap_tol=args.gap_tol,
                             time_budget=args.time_budget, sampling=args.sampling, step=args.step,
                             cache_size=args.cache_size, batch_size=args.block_batch,
                             gap_check_every=args.gap_check_every, positivity=not args.no_positivity,
                             types=args.types, backend=args.backend, device=args.device, logdir=args.logdir or None,
                             run_name=f"train-pose-{args.solver}", seed=args.seed)
        if "logdir" in metrics:
            print(f"TensorBoard logs: {metrics['logdir']}  (tensorboard --logdir {args.logdir})")
        return 0
    if args.solver != "torch":
        print(f"solver {args.solver}, lam {args.lam}" + (f", sampling {args.sampling}, step {args.step}, cache "
                                                        f"{args.cache_size}" if args.solver == "bcfw" else ""))
        metrics = train_dual(train, test, solver=args.solver, lam=args.lam, passes=args.passes, gap_tol=args.gap_tol,
                             time_budget=args.time_budget, sampling=args.sampling, step=args.step,
                             cache_size=args.cache_size, batch_size=args.block_batch,
                             gap_check_every=args.gap_check_every, backend=args.backend, device=args.device,
                             box={"transition": (0.0, None)} if args.nonneg_transition else None,
                             logdir=args.logdir or None, run_name=f"{args.command}-{name}-{args.solver}",
                             seed=args.seed, rescaling=args.rescaling)
        if "logdir" in metrics:
            print(f"TensorBoard logs: {metrics['logdir']}  (tensorboard --logdir {args.logdir})")
        return 0
    metrics = train_chain(train, test, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, lam=args.lam,
                          optimizer=args.optimizer, device=args.device, backend=args.backend,
                          logdir=args.logdir or None, run_name=f"{args.command}-{name}", seed=args.seed)
    if "logdir" in metrics:
        print(f"TensorBoard logs: {metrics['logdir']}  (tensorboard --logdir {args.logdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
