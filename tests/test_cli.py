"""The command line: the demo trains, prints progress and writes TensorBoard events that read back."""

import glob

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from torchssvm.cli import main


def read_scalars(logdir):
    (path,) = glob.glob(f"{logdir}/*")
    acc = EventAccumulator(path)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_demo_runs_bcfw_and_prints_the_gap(tmp_path, capsys):
    assert main(["demo", "--passes", "3", "--logdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("pass")]
    assert len(lines) == 3 and "TensorBoard logs" in out
    gaps = [float(ln.split("gap ")[1].split()[0]) for ln in lines]
    assert gaps[-1] < gaps[0] and gaps[-1] < 0.1
    scalars = read_scalars(tmp_path)
    assert len(scalars["certificate/duality_gap"]) == 3 and len(scalars["test/error"]) == 3
    assert scalars["test/error"][-1] < 0.2  # the unary-free baseline is about 0.8
    assert "bcfw/dual" in scalars and "bcfw/oracle_calls" in scalars


def test_train_other_solvers(tmp_path, capsys):
    for solver in ("fw", "ssg"):
        assert main(["train", "--solver", solver, "--passes", "2", "--lam", "1", "--logdir", ""]) == 0
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pass")]
        assert len(lines) == 2 and "primal" in lines[-1]
    argv = ["train", "--passes", "2", "--lam", "1", "--step", "pairwise", "--cache-size", "5", "--block-batch", "4",
            "--nonneg-transition", "--logdir", ""]
    assert main(argv) == 0
    assert "gap" in capsys.readouterr().out
    assert main(["train", "--passes", "3", "--lam", "0.1", "--rescaling", "slack", "--logdir", ""]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pass")]
    gaps = [float(ln.split("gap ")[1].split()[0]) for ln in lines]
    assert len(gaps) == 3 and 0 <= gaps[-1] < gaps[0]


def test_torch_optimizer_training_and_logs(tmp_path, capsys):
    assert main(["demo", "--solver", "torch", "--lam", "1e-4", "--epochs", "3", "--logdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "epoch   3" in out and "test error" in out and "TensorBoard logs" in out
    scalars = read_scalars(tmp_path)
    assert len(scalars["train/loss"]) == 3 and len(scalars["test/error"]) == 3
    assert scalars["train/loss"][-1] < scalars["train/loss"][0]
    assert scalars["test/error"][-1] < 0.3  # the unary-free baseline is about 0.8
    assert len(scalars["train/batch_loss"]) > 3


def test_train_on_ocr_small(data_root, tmp_path, capsys):
    argv = ["train", "--data", "ocr-small", "--root", data_root, "--solver", "torch", "--epochs", "1",
            "--logdir", ""]
    assert main(argv) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch")][-1]
    test_error = float(line.split("test error")[1].split()[0])
    assert test_error < 0.5


def test_train_rejects_a_bad_device():
    with pytest.raises(ValueError, match="device"):
        main(["train", "--passes", "1", "--device", "gpu0", "--logdir", ""])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            main(["train", "--passes", "1", "--device", "cuda", "--logdir", ""])


@pytest.mark.parametrize("argv, match", [
    (["--batch-size", "0", "--solver", "torch"], "--batch-size must be >= 1, got 0"),
    (["--passes", "0"], "--passes must be >= 1"),
    (["--epochs", "0", "--solver", "torch"], "--epochs must be >= 1"),
    (["--block-batch", "0"], "--block-batch must be >= 1"),
    (["--cache-size", "-1"], "--cache-size must be >= 0"),
    (["--lam", "-1", "--solver", "torch"], "--lam must be a finite number > 0"),
    (["--lam", "nan"], "--lam must be"),
    (["--lr", "0", "--solver", "torch"], "--lr must be"),
    (["--gap-tol", "0"], "--gap-tol must be"),
    (["--device", "meta"], "device must be 'cpu' or a CUDA device"),
    (["--types", "3"], "--types is for --data pose"),
    (["--num-train", "5"], "--num-train / --num-test is for --data pose"),
    (["--no-positivity"], "--no-positivity is for --data pose"),
    (["--solver", "torch", "--rescaling", "slack"], "--rescaling slack needs a dual solver on chain data"),
    (["--solver", "torch", "--nonneg-transition"], "--nonneg-transition needs a dual solver"),
    (["--data", "pose", "--rescaling", "slack"], "--rescaling slack needs a dual solver on chain data"),
    (["--data", "pose", "--nonneg-transition"], "--nonneg-transition needs"),
    (["--data", "pose", "--solver", "torch", "--no-positivity"], "--no-positivity needs a dual solver"),
    (["--data", "pose", "--grid", "7"], "--grid must be >= 8"),
    (["--seed", "-1"], "--seed must be >= 0"),
    # flags the chosen solver or data would not read
    (["--epochs", "3"], "--epochs is for --solver torch"),
    (["--lr", "0.5", "--optimizer", "sgd"], "--lr is for --solver torch"),
    (["--solver", "torch", "--passes", "3"], "--passes is for the dual solvers"),
    (["--solver", "torch", "--gap-tol", "0.1"], "--gap-tol is for the dual solvers"),
    (["--solver", "torch", "--block-batch", "4"], "--block-batch is for the dual solvers"),
    (["--solver", "fw", "--cache-size", "5"], "--cache-size is for --solver bcfw"),
    (["--solver", "ssg", "--step", "pairwise"], "--step is for --solver bcfw"),
    (["--solver", "ssg", "--gap-tol", "0.1"], "--gap-tol is for the solvers with a duality gap"),
    (["--min-count", "5"], "--min-count is for --data conll2000-chunk"),
    (["--grid", "20"], "--grid is for --data pose"),
])
def test_train_rejects_bad_or_ignored_flags(argv, match, capsys):
    """Checked before any data are loaded or any training starts: nothing is printed."""
    with pytest.raises(ValueError, match=match):
        main(["train", "--logdir", "", *argv])
    assert capsys.readouterr().out == ""


def test_train_resumes_from_its_checkpoint(tmp_path, capsys):
    ckpt = str(tmp_path / "run.ckpt")
    base = ["train", "--lam", "0.1", "--step", "pairwise", "--cache-size", "4", "--logdir", ""]
    assert main(base + ["--passes", "4"]) == 0
    whole = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pass")]
    assert main(base + ["--passes", "2", "--checkpoint", ckpt]) == 0  # stopped after 2 passes
    capsys.readouterr()
    assert main(base + ["--passes", "4", "--checkpoint", ckpt, "--checkpoint-every", "2"]) == 0  # resumed
    resumed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pass")]
    assert [ln.split()[1] for ln in resumed] == ["3", "4"]
    assert resumed[-1].split("gap ")[1].split()[0] == whole[-1].split("gap ")[1].split()[0]
    with pytest.raises(ValueError, match="lam"):  # another objective: refused, not adopted
        main(["train", "--lam", "0.5", "--step", "pairwise", "--cache-size", "4", "--logdir", "", "--passes", "5",
              "--checkpoint", ckpt])
    with pytest.raises(ValueError, match="--checkpoint is for the dual solvers"):
        main(["train", "--solver", "torch", "--checkpoint", ckpt])
