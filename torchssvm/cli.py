"""The ``torchssvm`` command: ``demo`` (BCFW on synthetic data, about 10-20 seconds on 2 idle CPU cores) and ``train``
(``--solver bcfw|fw|ssg`` on fixed features, or ``--solver torch``: the hinge loss with a torch optimizer;
``--data pose``: pictorial structures on `data.synthetic_pose`, w_xx, w_yy >= 0 by the box or a projection).

It parses and checks the flags, loads the data, runs one recipe of `torchssvm.recipes` and prints a line per
epoch or pass (the recipes themselves print nothing), with the elapsed time and an estimate of the time left, and
between them a line every `PROGRESS_EVERY` seconds (a tqdm bar on a terminal). A bad flag, a bad combination of
settings that a recipe or solver refuses before training starts, missing data or a refused ``--checkpoint`` is a
usage error (exit status 2, the message names the flag); anything else is a bug and shows its traceback."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import threading
import time
import warnings
from typing import Optional, Sequence

import torch

from . import recipes
from .recipes import DATASETS, check_device, load_datasets
from .recipes import run as _recipe_run

# seconds between the progress lines printed while an epoch or pass runs (when stdout is not a terminal)
PROGRESS_EVERY = 10.0
# the real data sets' download from Python (what ``train --download`` does)
_DOWNLOAD = {"ocr-large": "ts.data.ocr(download=True)", "ocr-small": "ts.data.ocr(download=True)",
             "conll2000-chunk": "ts.data.conll2000(download=True)"}

SOLVERS = (*recipes.DUAL_SOLVERS, "torch")


# -- the lines printed per epoch / pass, from a recipe's metrics -------------------------------------------------
def _chain_hinge_line(m: dict) -> str:
    f1 = f"  test chunk F1 {m['test_chunk_f1']:.2f}" if "test_chunk_f1" in m else ""
    return (f"epoch {m['epoch']:3d}  objective {m['objective']:.4f}  train error {m['train_error']:.4f}  "
            f"test error {m['test_error']:.4f}{f1}  ({m['seconds']:.1f}s)")


def _certificate(m: dict) -> str:
    if "gap" in m:
        return f"gap {m['gap']:.3e}  primal {m['primal']:.5f}  dual {m['dual']:.5f}"
    return f"primal {m['primal']:.5f}"  # SSG: no dual, no gap


def _chain_dual_line(m: dict) -> str:
    f1 = f"  test chunk F1 {m['test_chunk_f1']:.2f}" if "test_chunk_f1" in m else ""
    return (f"pass {m['pass']:3d} ({m['passes']:5.1f} effective)  {_certificate(m)}  train error "
            f"{m['train_error']:.4f}  test error {m['test_error']:.4f}{f1}  ({m['seconds']:.1f}s)")


def _pose_dual_line(m: dict) -> str:
    return (f"pass {m['pass']:3d} ({m['passes']:5.1f} effective)  {_certificate(m)}  train LSP loss "
            f"{m['train_lsp_loss']:.4f}  test LSP loss {m['test_lsp_loss']:.4f}  test PCK {m['test_pck']:.3f}  "
            f"min w_quad {m['min_quadratic_weight']:.2e}  ({m['seconds']:.1f}s)")


def _pose_hinge_line(m: dict) -> str:
    return (f"epoch {m['epoch']:3d}  objective {m['objective']:.4f}  train LSP loss {m['train_lsp_loss']:.4f}  "
            f"test LSP loss {m['test_lsp_loss']:.4f}  test PCK {m['test_pck']:.3f}  min w_quad "
            f"{m['min_quadratic_weight']:.2e}  ({m['seconds']:.1f}s)")


def _printer(line, out=None):
    """A recipe callback printing ``line(metrics)`` to ``out`` (default: the current stdout)."""
    return lambda metrics: print(line(metrics), file=out or sys.stdout, flush=True)


def _deprecated(name: str, recipe, line):
    """A deprecated alias of a recipe of `torchssvm.recipes`, kept for callers of ``torchssvm.cli.<name>``: it
    warns, prints the recipe's lines to ``out`` and returns the last metrics, with ``logdir`` when logging."""

    def train(train, test, *, out=None, **kwargs) -> dict:
        warnings.warn(f"torchssvm.cli.{name} is deprecated: use torchssvm.recipes.{recipe.__name__}, which returns "
                      "a TrainingRun", DeprecationWarning, stacklevel=2)
        run = recipe(train, test, callback=_printer(line, out), **kwargs)
        return {**run.metrics, "logdir": run.logdir} if run.logdir is not None else dict(run.metrics)

    train.__name__ = train.__qualname__ = name
    train.__doc__ = f"Deprecated: `torchssvm.recipes.{recipe.__name__}` printing a line per epoch or pass."
    return train


train_chain = _deprecated("train_chain", recipes.train_chain_hinge, _chain_hinge_line)
train_dual = _deprecated("train_dual", recipes.train_chain_dual, _chain_dual_line)
train_pose = _deprecated("train_pose", recipes.train_pose_dual, _pose_dual_line)
train_pose_hinge = _deprecated("train_pose_hinge", recipes.train_pose_hinge, _pose_hinge_line)


# -- flags -----------------------------------------------------------------------------------------------------
class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each flag's default, except where there is none to show (None, False)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _add_solver_args(p: argparse.ArgumentParser, *, solver: str, passes: int):
    p.add_argument("--solver", choices=SOLVERS, default=solver,
                   help="dual solver (bcfw, fw: batch Frank-Wolfe, ssg: stochastic subgradient) or 'torch' "
                        "(the hinge loss with a torch optimizer)")
    p.add_argument("--passes", type=int, default=passes, help="dual solvers: passes over the data")
    p.add_argument("--gap-tol", type=float, default=None, help="dual solvers: stop at this duality gap")
    p.add_argument("--time-budget", type=float, default=None, help="dual solvers: solver seconds")
    p.add_argument("--sampling", choices=("uniform", "gap"), default="gap", help="bcfw: block sampling")
    p.add_argument("--step", choices=("fw", "pairwise", "away"), default="fw", help="bcfw: block step")
    p.add_argument("--cache-size", type=int, default=0, help="bcfw: cached corners per block")
    p.add_argument("--gap-check-every", type=int, default=10, help="bcfw: passes between exact gap refreshes")
    p.add_argument("--block-batch", type=int, default=1, help="bcfw: blocks per coordinated step")
    p.add_argument("--nonneg-transition", action="store_true", help="box constraint: transition >= 0")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="dual solvers: resume from PATH when it exists; write it (atomically) as the run goes")
    p.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                   help="dual solvers: passes between checkpoints (and one at the end)")
    p.add_argument("--rescaling", choices=("margin", "slack"), default="margin",
                   help="dual solvers: margin- or slack-rescaled hinge")


def _add_train_args(p: argparse.ArgumentParser, *, epochs: int, lr: float, lam: float, batch_size: int):
    p.add_argument("--epochs", type=int, default=epochs, help="--solver torch: epochs")
    p.add_argument("--batch-size", type=int, default=batch_size, help="--solver torch: examples per batch")
    p.add_argument("--lr", type=float, default=lr, help="--solver torch: learning rate")
    p.add_argument("--lam", type=float, default=lam, help="L2 regularization: lam/2 ||w||^2")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="--solver torch: the optimizer")
    p.add_argument("--device", default="cpu", help="cpu or cuda (dual solvers and torch optimizers)")
    p.add_argument("--backend", choices=("auto", "torch", "triton"), default="auto", help="the oracles' kernels")
    p.add_argument("--logdir", default="runs", help="TensorBoard log folder ('' to disable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data and of the solver's sampling")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch's CPU threads (default: torch's own, one per core); on a busy or shared machine 1 "
                        "avoids OpenMP's spinning waits, 10-70x slowdowns (docs/design.md, 'Threads')")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchssvm", description="Structured SVMs in PyTorch",
                                     formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", formatter_class=_HelpFormatter,
                          help="train a chain SSVM with BCFW on synthetic data (about 10-20 s on 2 idle CPU cores)",
                          description="Train a chain SSVM with BCFW on synthetic data: 8 passes, about 10-20 "
                                      "seconds on 2 idle CPU cores (longer when other jobs share them).")
    _add_train_args(demo, epochs=8, lr=0.005, lam=1.0, batch_size=32)
    _add_solver_args(demo, solver="bcfw", passes=8)
    train = sub.add_parser("train", help="train a linear chain SSVM", formatter_class=_HelpFormatter,
                           description="Train a linear chain SSVM (or pictorial structures: --data pose).")
    train.add_argument("--data", choices=DATASETS, default="synthetic", help="the data set")
    train.add_argument("--root", default=None, metavar="DIR",
                       help="folder of the real data sets (default: $TORCHSSVM_DATA or the cache)")
    train.add_argument("--download", action="store_true",
                       help="fetch the files of --data ocr-* / conll2000-chunk missing from the data folder")
    train.add_argument("--min-count", type=int, default=1, help="CoNLL: keep attributes seen this often")
    train.add_argument("--num-train", type=int, default=None, help="pose: training examples (default: 16)")
    train.add_argument("--num-test", type=int, default=None, help="pose: test examples (default: 16)")
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
                "--cache-size": (args.cache_size, 0), "--seed": (args.seed, 0),
                "--checkpoint-every": (args.checkpoint_every, 1), "--threads": (args.threads, 1)}
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
    try:
        check_device(args.device)
    except ValueError as e:
        raise ValueError(f"--device {args.device}: {e}") from None
    try:  # the backend's package and device, as the oracle will resolve them (triton on a CPU, numba on CUDA)
        _recipe_run.check_backend(args.backend, args.device, name)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"--backend {args.backend}: {e}") from None
    if args.logdir:
        _check_writable("--logdir", args.logdir, args.logdir)
    if args.checkpoint:
        if os.path.isdir(args.checkpoint):
            raise ValueError(f"--checkpoint {args.checkpoint} is a folder: name the checkpoint file")
        _check_writable("--checkpoint", args.checkpoint, os.path.dirname(os.path.abspath(args.checkpoint)))
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
                                        "gap_check_every", "block_batch", "checkpoint", "checkpoint_every")]
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
        ignored += [(flag, True, "is for the real data sets (--data ocr-large, ocr-small, conll2000-chunk)")
                    for flag in changed("root", "download") if name not in _DOWNLOAD]
    for flag, bad, why in ignored:
        if bad:
            raise ValueError(f"{flag} {why}")


def _check_writable(flag: str, value: str, folder: str) -> None:
    """``folder`` (created later, with its parents, where missing) can hold files: its nearest existing ancestor is a
    folder in which a file can be made (tried: a permission check alone passes as root on a read-only mount or in
    /proc). Checked before training, so that a run does not fail at its first log or checkpoint write."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{flag} {value}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {value}: cannot write in {existing} ({e.strerror or e})") from None


class _Progress:
    """The recipe callback of the command: each epoch's or pass's line (``line(metrics)``) with the elapsed time
    and an estimate of the time left, and while an epoch or pass runs, a line every `PROGRESS_EVERY` seconds
    (``"  (pass 3 running for 12.1 s, about 18 s left in it; 40.3 s in all)"``) when ``out`` is not a terminal,
    else a tqdm bar.

    `inside` is the recipes' ``progress`` hook (`optim.Solver.progress`): the blocks a pass has visited (or the
    batches of an epoch, or the blocks an exact gap pass has decoded) go into the periodic line and the bar, and the
    time left in a pass is estimated from them once a tenth of it is done (before that, from the passes before
    it)."""

    def __init__(self, line, unit: str, total: int, out=None):
        self.line, self.unit, self.total = line, unit, total
        self.out = out or sys.stdout
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.start = self.last = time.perf_counter()
        self.first, self.done, self.durations = None, None, []
        self.within = None  # (phase, done, total) of the running pass or epoch, from `inside`
        self.bar = None
        if _isatty(self.out):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit=unit, file=self.out, leave=False, dynamic_ncols=True)
        self.thread = threading.Thread(target=self._tick, name="torchssvm-progress", daemon=True)
        self.thread.start()

    def _write(self, text: str) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.write(text, file=self.out)
            else:
                self.out.write(text + "\n")
                self.out.flush()

    def _left(self, now: float) -> Optional[float]:
        """Seconds left to the end of the run: the mean epoch or pass so far times those left (None before one)."""
        if not self.durations or self.done is None:
            return None
        mean = sum(self.durations) / len(self.durations)
        return max(0.0, mean * (self.total - self.done) - (now - self.last))

    def _tick(self) -> None:
        every = 1.0 if self.bar is not None else PROGRESS_EVERY
        while not self.stop.wait(every):
            now = time.perf_counter()
            if self.bar is not None:
                with self.lock:
                    self.bar.refresh()
                continue
            running = f"{self.unit} {self.done + 1}" if self.done is not None else f"the first {self.unit}"
            text = f"  ({running} running for {now - self.last:.1f} s"
            within, left = self.within, None
            if within is not None:
                phase, done, total = within
                what = "batches" if phase == "epoch" else "blocks"
                text += (f": exact gap pass, {done} of {total} blocks" if phase == "gap"
                         else f": working-set QP, sweep {done} of at most {total}" if phase == "qp"
                         else f": {done} of {total} {what}")
                if phase not in ("gap", "qp") and total and done >= total / 10:
                    left = (now - self.last) * (total - done) / done
            if left is None and self.durations:
                left = max(0.0, sum(self.durations) / len(self.durations) - (now - self.last))
            if left is not None:
                text += f", about {left:.0f} s left in it"
            self._write(text + f"; {now - self.start:.1f} s in all)")

    def inside(self, phase: str, done: int, total: int) -> None:
        """The recipes' ``progress`` hook: where the running pass or epoch is (read by the periodic line)."""
        self.within = (phase, done, total)
        if self.bar is not None:
            what = {"gap": "gap pass", "epoch": "batches", "qp": "QP sweeps"}.get(phase, "blocks")
            self.bar.set_postfix_str(f"{what} {done}/{total}", refresh=False)

    def __call__(self, metrics: dict) -> None:
        now = time.perf_counter()
        self.within = None
        k = metrics.get("pass", metrics.get("epoch"))
        if self.first is None and k is not None:
            self.first = k
        self.durations.append(now - self.last)
        self.last, self.done = now, k
        left = self._left(now)
        eta = f", about {left:.0f} s left" if left is not None and k is not None and k < self.total else ""
        self._write(f"{self.line(metrics)}  [{now - self.start:.1f} s elapsed{eta}]")
        if self.bar is not None and k is not None:
            with self.lock:
                self.bar.update(k - self.bar.n)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        if self.bar is not None:
            self.bar.close()


def _isatty(out) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (its ``error`` prints its own usage line)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def _data_error(err: Exception, name: str, root: Optional[str]) -> str:
    """The usage error of data that could not be loaded, in the command's terms (``--root``, ``--download``)."""
    text = str(err)
    if isinstance(err, FileNotFoundError) and " not found" in text:
        missing = text.split(" not found", 1)[0]
        where = f"--root {root}" if root is not None else "$TORCHSSVM_DATA or the cache"
        fetch = (f", or add --download to fetch the data set there (from Python: {_DOWNLOAD[name]}, "
                 "with root='DIR' for another folder)" if name in _DOWNLOAD else "")
        return (f"--data {name}: {missing} not found (data folder: {where}). Point --root DIR or $TORCHSSVM_DATA "
                f"at the folder that holds it{fetch}")
    return f"--data {name}{f' --root {root}' if root is not None else ''}: {text}"


def _raised_in(err: BaseException, function) -> bool:
    """Whether ``err`` was raised from inside ``function`` (in its frame or one it called)."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is function.__code__:
            return True
        tb = tb.tb_next
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = _subparser(parser, args.command)
    if args.command == "demo":
        name, root, min_count, download = "synthetic", None, 1, False
    else:
        name, root, min_count, download = args.data, args.root, args.min_count, args.download
    try:
        _check_args(args, name)
    except ValueError as e:
        sub.error(str(e))
    if root is not None and not os.path.isdir(root):
        sub.error(f"--root {root}: no such folder")
    if args.threads is not None:  # the user's choice for this process, as torch.set_num_threads in a script
        torch.set_num_threads(args.threads)
    pose = {"num_train": args.num_train, "num_test": args.num_test, "grid": args.grid,
            "limb_modes": args.limb_modes} if name == "pose" else {}
    try:
        train, test = load_datasets(name, root, seed=args.seed, min_count=min_count, download=download, **pose)
    except (OSError, ValueError) as e:  # missing, unreadable, damaged or refused data files (DataFileError)
        sub.error(_data_error(e, name, root))
    print(f"{args.command}: {train!r}\n{' ' * len(args.command)}  {test!r}")
    logdir = args.logdir or None
    dual = {"solver": args.solver, "lam": args.lam, "passes": args.passes, "gap_tol": args.gap_tol,
            "time_budget": args.time_budget, "sampling": args.sampling, "step": args.step,
            "cache_size": args.cache_size, "batch_size": args.block_batch, "gap_check_every": args.gap_check_every,
            "backend": args.backend, "device": args.device, "logdir": logdir, "seed": args.seed,
            "checkpoint": args.checkpoint, "checkpoint_every": args.checkpoint_every}
    hinge = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "lam": args.lam,
             "optimizer": args.optimizer, "backend": args.backend, "logdir": logdir, "seed": args.seed}
    if name == "pose" and args.solver != "torch":
        print(f"solver {args.solver}, lam {args.lam}, box {'none' if args.no_positivity else 'w_xx, w_yy >= 0'}"
              + (f", {args.types} types per edge" if args.types > 1 else ""))
    elif args.solver != "torch":
        print(f"solver {args.solver}, lam {args.lam}" + (f", sampling {args.sampling}, step {args.step}, cache "
                                                        f"{args.cache_size}" if args.solver == "bcfw" else ""))
    sys.stdout.flush()
    if args.solver == "torch":
        progress = _Progress(_pose_hinge_line if name == "pose" else _chain_hinge_line, "epoch", args.epochs)
    else:
        progress = _Progress(_pose_dual_line if name == "pose" else _chain_dual_line, "pass", args.passes)
    try:
        if name == "pose" and args.solver == "torch":
            run = recipes.train_pose_hinge(train, test, callback=progress, progress=progress.inside, **hinge)
        elif name == "pose":
            run = recipes.train_pose_dual(train, test, positivity=not args.no_positivity, types=args.types,
                                          run_name=f"train-pose-{args.solver}", callback=progress,
                                          progress=progress.inside, **dual)
        elif args.solver != "torch":
            run = recipes.train_chain_dual(train, test, box={"transition": (0.0, None)} if args.nonneg_transition
                                           else None, run_name=f"{args.command}-{name}-{args.solver}",
                                           rescaling=args.rescaling, callback=progress,
                                           progress=progress.inside, **dual)
        else:
            run = recipes.train_chain_hinge(train, test, device=args.device, run_name=f"{args.command}-{name}",
                                            callback=progress, progress=progress.inside, **hinge)
    except (ValueError, TypeError) as e:
        # Refused before the first epoch or pass: the checkpoint (CheckpointError: not a checkpoint, damaged; a
        # ValueError: another objective or data) or the settings. Once training runs, an error is a bug.
        if _raised_in(e, _recipe_run.resume):
            sub.error(f"--checkpoint {args.checkpoint} was refused: {e}")
        if progress.done is None and progress.within is None:
            sub.error(f"these settings were refused before training started: {e}")
        raise
    except FloatingPointError as e:  # the hinge recipes' word for a learning rate too large (`check_diverged`)
        if args.solver != "torch":
            raise
        sub.error(f"{e}: lower --lr")
    finally:
        progress.close()
    if run.logdir is not None:
        print(f"TensorBoard logs: {run.logdir}  (tensorboard --logdir {args.logdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
