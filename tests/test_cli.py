"""The command line: the demo trains, prints progress and writes TensorBoard events that read back."""

import glob
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from torchssvm import cli, recipes
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


def test_threads_flag_sets_torchs_thread_count_for_the_run(capsys):
    before = torch.get_num_threads()
    n = before + 1  # not the count the process already has, whatever the test worker's setting
    try:
        assert main(["train", "--passes", "1", "--lam", "1", "--threads", str(n), "--logdir", ""]) == 0
        assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(before)
    assert "pass   1" in capsys.readouterr().out


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


def usage_error(argv, capsys, quiet: bool = False) -> str:
    """``main(argv)``'s usage error: exit status 2, no traceback (with ``quiet``, nothing on stdout); its stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "error: " in err
    assert not quiet or out == "", out
    return err


def test_train_rejects_a_bad_device(capsys):
    assert "--device gpu0" in usage_error(["train", "--passes", "1", "--device", "gpu0", "--logdir", ""], capsys)
    if not torch.cuda.is_available():
        err = usage_error(["demo", "--passes", "1", "--device", "cuda", "--logdir", ""], capsys)
        assert "--device cuda" in err and "CUDA is not available" in err


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
    (["--device", "meta"], "--device meta: device must be 'cpu' or a CUDA device"),
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
    (["--threads", "0"], "--threads must be >= 1"),
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
    (["--root", "/tmp", "--data", "pose"], "--root is for the real data sets"),
    (["--download"], "--download is for the real data sets"),
    (["--data", "ocr-small", "--root", "/nonexistent/folder"], "--root /nonexistent/folder: no such folder"),
    (["--passes", "two"], "--passes: invalid int value"),
])
def test_train_rejects_bad_or_ignored_flags(argv, match, capsys):
    """Usage errors (exit status 2, the flag named) before any data are loaded or any training starts: nothing is
    printed on stdout."""
    assert match in usage_error(["train", "--logdir", "", *argv], capsys, quiet=True)


@pytest.mark.parametrize("data, relpath", [("ocr-small", "ocr/letters.npz"),
                                           ("conll2000-chunk", "conll2000/train.txt.gz")])
def test_missing_data_is_a_usage_error_in_the_commands_terms(data, relpath, tmp_path, monkeypatch, capsys):
    err = usage_error(["train", "--data", data, "--root", str(tmp_path), "--logdir", ""], capsys)
    assert f"{tmp_path / relpath} not found" in err and f"--root {tmp_path}" in err
    assert "--root DIR" in err and "$TORCHSSVM_DATA" in err and "--download" in err
    assert "root=" not in err.replace("root='DIR'", "")  # no API argument, but the Python call that fetches it
    monkeypatch.setenv("TORCHSSVM_DATA", str(tmp_path))
    err = usage_error(["train", "--data", data, "--logdir", ""], capsys)
    assert f"{tmp_path / relpath} not found" in err and "data folder: $TORCHSSVM_DATA" in err


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for default in ("--passes PASSES dual solvers: passes over the data (default: 10)", "(default: bcfw)",
                    "L2 regularization: lam/2 ||w||^2 (default: 0.01)", "(default: runs)", "(default: gap)"):
        assert default in out, default
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 8)" in out and "(default: 1.0)" in out and "10-20 seconds on 2 idle CPU cores" in out


def test_progress_lines_say_how_far_the_running_pass_is(monkeypatch):
    """The recipes' progress hook (`Solver.progress`) goes into the periodic line: blocks visited, the exact gap
    pass, and the time left in the pass estimated from the blocks once a tenth is done."""
    import io
    import time

    monkeypatch.setattr(cli, "PROGRESS_EVERY", 0.01)
    out = io.StringIO()
    progress = cli._Progress(lambda m: f"pass {m['pass']}", "pass", 3, out=out)
    try:
        def wait_for(text):
            deadline = time.monotonic() + 10
            while text not in out.getvalue() and time.monotonic() < deadline:
                time.sleep(0.01)
            return out.getvalue()

        progress.inside("pass", 5, 100)
        assert "(the first pass running for" in wait_for(": 5 of 100 blocks")
        progress.inside("pass", 50, 100)
        text = wait_for(": 50 of 100 blocks, about ")
        assert ": 50 of 100 blocks, about " in text and "left in it" in text
        progress.inside("gap", 7, 100)
        assert ": exact gap pass, 7 of 100 blocks" in wait_for("exact gap pass, 7 of 100")
        progress({"pass": 1})
        assert progress.within is None  # a new pass starts with no position
    finally:
        progress.close()


def test_dual_solvers_report_progress_within_a_pass(monkeypatch, capsys):
    """A line every PROGRESS_EVERY seconds while a pass runs, and the elapsed time and the time left on each pass's
    line."""
    monkeypatch.setattr(cli, "PROGRESS_EVERY", 0.01)
    assert main(["demo", "--passes", "3", "--logdir", ""]) == 0
    out = capsys.readouterr().out.splitlines()
    passes = [ln for ln in out if ln.startswith("pass")]
    assert len(passes) == 3 and "s elapsed, about" in passes[0] and passes[-1].endswith(" s elapsed]")
    running = [ln for ln in out if ln.startswith("  (")]
    assert any(ln.startswith("  (the first pass running for") for ln in running), running
    assert any(ln.startswith("  (pass 3 running for") and "left in it" in ln for ln in running), running


def test_settings_refused_before_training_are_usage_errors_and_bugs_are_not(monkeypatch, capsys):
    def refuses(train, test, **kwargs):
        raise ValueError("batch_size must be at most the number of blocks")

    monkeypatch.setattr(recipes, "train_chain_dual", refuses)
    err = usage_error(["demo", "--passes", "2", "--logdir", ""], capsys)
    assert "refused before training started: batch_size must be at most" in err

    def fails_in_pass_2(train, test, callback, **kwargs):
        callback({"pass": 1, "passes": 1.0, "seconds": 0.1, "train_error": 0.5, "test_error": 0.5, "primal": 1.0})
        raise ValueError("a bug")

    monkeypatch.setattr(recipes, "train_chain_dual", fails_in_pass_2)
    with pytest.raises(ValueError, match="a bug"):  # a traceback, not a usage error
        main(["demo", "--passes", "2", "--logdir", ""])


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
    err = usage_error(["train", "--lam", "0.5", "--step", "pairwise", "--cache-size", "4", "--logdir", "",
                       "--passes", "5", "--checkpoint", ckpt], capsys)  # another objective: refused, not adopted
    assert f"--checkpoint {ckpt} was refused" in err and "lam" in err
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    err = usage_error(base + ["--passes", "1", "--checkpoint", str(tmp_path / "junk.ckpt")], capsys)
    assert f"--checkpoint {tmp_path / 'junk.ckpt'} was refused" in err
    assert "--checkpoint is for the dual solvers" in usage_error(["train", "--solver", "torch", "--checkpoint", ckpt],
                                                                  capsys)


def test_unwritable_outputs_and_unusable_backends_are_usage_errors_before_training(tmp_path, monkeypatch, capsys):
    """A log folder or checkpoint under a file, a checkpoint path that is a folder, a folder where nothing can be
    written, and a backend that cannot run here: usage errors naming the flag, before any data are loaded (a
    checkpoint under a file failed with a traceback after the first pass)."""
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = [(["--logdir", f"{afile}/runs"], f"--logdir {afile}/runs: {afile} is a file, not a folder"),
             (["--logdir", "", "--checkpoint", f"{afile}/sub/ck.pt"], f"{afile} is a file, not a folder"),
             (["--logdir", "", "--checkpoint", str(tmp_path)], "is a folder: name the checkpoint file")]
    if os.path.isdir("/proc/self"):  # Linux: a folder no file can be made in, even as root
        cases.append((["--logdir", "", "--checkpoint", "/proc/torchssvm/ck.pt"],
                      "--checkpoint /proc/torchssvm/ck.pt: cannot write in /proc"))
    for argv, match in cases:
        assert match in usage_error(["demo", "--passes", "1", *argv], capsys, quiet=True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    err = usage_error(["demo", "--passes", "1", "--logdir", "", "--backend", "triton"], capsys, quiet=True)
    assert "--backend triton: " in err


def test_a_diverging_hinge_run_says_so_and_names_the_learning_rate(capsys):
    err = usage_error(["demo", "--solver", "torch", "--epochs", "1", "--lr", "1e20", "--logdir", ""], capsys)
    assert "training diverged in epoch 1" in err and "lower --lr" in err and "refused before" not in err
    assert "learning rate 1e+20" in err


def test_python_dash_m_runs_the_command_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "torchssvm", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage: torchssvm" in out.stdout
