"""Checkpoints: files that are whole or absent, verified when read, and runs that resume where they were killed.

`save_checkpoint` writes atomically with a digest; `load_checkpoint` refuses a file cut short or corrupted, naming
it; ``fit(checkpoint=PATH)`` resumes from PATH and writes it every ``checkpoint_every`` steps, on every solver. The
last test kills a training process at random points, some of them inside the write, and resumes it each time: every
run resumes from its last written checkpoint and the last one ends bitwise equal to the uninterrupted run.
"""

import multiprocessing
import os
import random
import stat
import time

import pytest
import torch
from test_cutting_plane import random_table

import torchssvm as ts
from torchssvm import optim
from torchssvm.optim import CheckpointError, load_checkpoint, save_checkpoint


# -- the file ---------------------------------------------------------------------------------------------------------
def _state():
    return {"z": torch.randn(5, 3, dtype=torch.float64), "n": 5, "lam": 0.1, "box": None, "name": "margin",
            "atoms": {"alpha": torch.rand(5, 2, dtype=torch.float64)}}


def test_a_checkpoint_round_trips_and_leaves_no_temporary_file(tmp_path):
    s = _state()
    path = save_checkpoint(s, tmp_path / "run.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt"]
    back = load_checkpoint(path)
    assert torch.equal(back["z"], s["z"]) and back["n"] == 5 and back["box"] is None
    assert torch.equal(back["atoms"]["alpha"], s["atoms"]["alpha"])


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "appended", "not-a-checkpoint", "header-only"])
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, damage):
    path = save_checkpoint(_state(), tmp_path / "run.ckpt")
    data = bytearray(path.read_bytes())
    header = data.index(b"\n") + 1
    if damage == "empty":
        data = b""
    elif damage == "truncated":
        data = data[: len(data) - 7]
    elif damage == "flipped":
        data[header + (len(data) - header) // 2] ^= 0x10
    elif damage == "appended":
        data += b"\0"
    elif damage == "not-a-checkpoint":
        data = b"PK\x03\x04" + bytes(data[4:])
    else:
        data = data[:header]
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(path).replace("\\", "\\\\")):
        load_checkpoint(path)


def test_a_write_that_fails_midway_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint({"step": 1}, tmp_path / "run.ckpt")
    before = path.read_bytes()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["run.ckpt"]
    assert load_checkpoint(path) == {"step": 1}


def test_a_checkpoint_holding_code_is_not_run(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    save_checkpoint({"x": Evil()}, tmp_path / "evil.ckpt")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "pwned").exists()


# -- fit(checkpoint=...) on every solver ---------------------------------------------------------------------------
def _chain():
    return ts.data.synthetic_chain("train", n=12, num_labels=3, num_features=4, min_length=2, max_length=5, seed=2,
                                   dtype=torch.float64)


def _m(ds):
    return ts.models.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)


def _xy(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.where(x[:, 0] + 0.3 * torch.randn(n, generator=g, dtype=torch.float64) > 0, 1, -1)
    return x, y


def _xk(n=30, K=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return x, (x[:, :K] + 0.3 * torch.randn(n, K, generator=g, dtype=torch.float64)).argmax(1)


def _multilabel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 3, generator=g, dtype=torch.float64)
    y = (x @ torch.randn(3, 3, generator=g, dtype=torch.float64) > 0).long()
    return optim.MultiLabelProblem(x, y, ts.MultiLabel(3, edges="full", normalize=False))


# (make, the limit's keyword, its value at the kill, its value at the end)
SOLVERS = {
    "BCFW": (lambda: optim.BCFW(_m(_chain()), _chain(), lam=0.1, step="pairwise", cache_size=3, batch_size=2,
                                sampling="gap", gap_check_every=1), "max_passes", 2, 5),
    "FrankWolfe": (lambda: optim.FrankWolfe(FeatureTableProblem(*random_table(n=12)), lam=0.1), "max_passes", 2, 5),
    "NSlackCuttingPlane": (lambda: optim.NSlackCuttingPlane(_m(_chain()), _chain(), lam=0.1, eps=1e-6),
                           "max_passes", 2, 4),
    "BMRM": (lambda: optim.BMRM(_m(_chain()), _chain(), lam=0.1), "max_passes", 2, 5),
    "OneSlackCuttingPlane": (lambda: optim.OneSlackCuttingPlane(_m(_chain()), _chain(), lam=0.1, eps=1e-6),
                             "max_passes", 2, 5),
    "SSG": (lambda: optim.SSG(_m(_chain()), _chain(), lam=0.1, seed=1), "max_passes", 2, 5),
    "GDMM": (lambda: optim.GDMM(ts.LinearChainModel(4, 3), _chain(), lam=0.1, primal_every=2, engine="torch"),
             "max_iter", 3, 7),
    "MultiLabelGDMM": (lambda: optim.GDMM(_multilabel(), lam=0.1, primal_every=2), "max_iter", 3, 7),
    "Pragam": (lambda: optim.Pragam(*_xy(), 0.1), "max_iter", 4, 9),
    "MulticlassPragam": (lambda: optim.MulticlassPragam(*_xk(), 0.1), "max_iter", 4, 9),
    "KernelCuttingPlane": (lambda: optim.KernelCuttingPlane(*_xy(), lam=0.25, gamma=0.5, sampling="exact",
                                                            eps=1e-9), "max_iter", 3, 6),
}
FeatureTableProblem = optim.FeatureTableProblem


def _tensors(solver) -> dict:
    flat = {}
    for k, v in solver.state_dict().items():
        if isinstance(v, torch.Tensor):
            flat[k] = v
        elif isinstance(v, dict):
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items() if isinstance(vv, torch.Tensor)})
    return flat


@pytest.mark.parametrize("name", list(SOLVERS))
def test_fit_with_a_checkpoint_resumes_bitwise_on_every_solver(tmp_path, name):
    make, key, kill_at, end = SOLVERS[name]
    path = tmp_path / f"{name}.ckpt"
    whole = make()
    whole.fit(**{key: end})
    first = make()
    first.fit(**{key: kill_at}, checkpoint=path, checkpoint_every=1)  # then the process "dies"
    assert path.exists()
    again = make()
    again.fit(**{key: end}, checkpoint=path, checkpoint_every=2)  # the same call in a new process
    a, b = _tensors(whole), _tensors(again)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{name}: {k} differs after the resume"


def test_a_checkpoint_of_another_run_is_refused_with_the_file_untouched(tmp_path):
    path = tmp_path / "run.ckpt"
    optim.FrankWolfe(FeatureTableProblem(*random_table(n=12)), lam=0.1).fit(max_passes=2, checkpoint=path)
    before = path.read_bytes()
    other = optim.FrankWolfe(FeatureTableProblem(*random_table(n=12, seed=4)), lam=0.1)
    with pytest.raises(ValueError, match="other training data"):
        other.fit(max_passes=3, checkpoint=path)
    with pytest.raises(ValueError, match="lam"):
        optim.FrankWolfe(FeatureTableProblem(*random_table(n=12)), lam=0.2).fit(max_passes=3, checkpoint=path)
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match="checkpoint_every must be an int >= 1"):
        other.fit(max_passes=3, checkpoint=tmp_path / "x.ckpt", checkpoint_every=0)
    with pytest.raises(ValueError, match="folder"):
        other.fit(max_passes=3, checkpoint=tmp_path)
    with pytest.raises(TypeError, match="checkpoint must be a path"):
        other.fit(max_passes=3, checkpoint=3)


# -- kills ---------------------------------------------------------------------------------------------------------
KILL_PASSES = 150


def _kill_problem():
    return optim.BCFW(FeatureTableProblem(*random_table(n=60, K=6, d=8, seed=7)), lam=0.01, step="pairwise",
                      cache_size=4, batch_size=3, sampling="gap", gap_check_every=2, seed=11)


def _train_child(path: str, log: str, started, writing, slow: float) -> None:
    """The killed process: trains with a checkpoint every pass, logging the step it resumed from and each finished
    write; ``started`` is set after its first step, ``writing`` while a checkpoint is being written (after its bytes,
    before its rename)."""
    import torchssvm._atomic as atomic

    torch.set_num_threads(1)
    real_fsync = os.fsync

    def fsync(fd):
        real_fsync(fd)
        if slow and not stat.S_ISDIR(os.fstat(fd).st_mode):  # the file's sync, before its rename
            writing.set()
            time.sleep(slow)  # a window for the parent to kill us inside the write
            writing.clear()

    atomic.os.fsync = fsync
    solver = _kill_problem()
    with open(log, "a", buffering=1) as out:
        real_save = optim.solver.save_checkpoint

        def save(state, p):
            real_save(state, p)
            out.write(f"saved {state['steps_done']}\n")

        optim.solver.save_checkpoint = save

        def callback(r):
            if not started.is_set():
                out.write(f"resumed {solver.steps_done - 1}\n")  # logged after the run's first step
                started.set()
            time.sleep(0.005)

        solver.fit(max_passes=KILL_PASSES, checkpoint=path, callback=callback)
        out.write(f"done {solver.steps_done}\n")


def test_killed_training_resumes_from_its_last_checkpoint_and_ends_bitwise_equal(tmp_path):
    torch.set_num_threads(1)
    whole = _kill_problem()
    whole.fit(max_passes=KILL_PASSES)
    path, log = str(tmp_path / "run.ckpt"), str(tmp_path / "log.txt")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchssvm"])
    started, writing = ctx.Event(), ctx.Event()
    rng = random.Random(0)
    kills = {"at start-up": 0, "inside a write": 0, "between writes": 0}
    while sum(kills.values()) < 24:
        started.clear()
        writing.clear()
        where = list(kills)[sum(kills.values()) % 3]
        child = ctx.Process(target=_train_child, args=(path, log, started, writing,
                                                       0.05 if where == "inside a write" else 0.0))
        child.start()
        if where == "at start-up":
            time.sleep(rng.uniform(0.0, 0.3))
        elif not (writing if where == "inside a write" else started).wait(timeout=60):
            break
        else:
            time.sleep(0.0 if where == "inside a write" else rng.uniform(0.0, 0.2))
        child.kill()
        child.join()
        kills[where] += 1
        assert "done" not in open(log).read() if os.path.exists(log) else True, "the run ended before its kills"
    started.clear()
    child = ctx.Process(target=_train_child, args=(path, log, started, writing, 0.0))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert sum(kills.values()) >= 24 and kills["inside a write"] >= 8, kills
    # every run resumed from the last checkpoint written before it started: at most one pass (one interval) lost
    saved = resumes = 0
    for line in open(log).read().splitlines():
        what, steps = line.split()
        if what == "saved":
            saved = max(saved, int(steps))
        elif what == "resumed":
            assert int(steps) >= saved, f"resumed at step {steps} after a checkpoint at step {saved}"
            resumes += int(steps) > 0
    assert resumes >= 10
    a, b = _tensors(whole), _tensors(_restore(path))
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs from the uninterrupted run"
    assert sorted(os.listdir(tmp_path)) == ["log.txt", "run.ckpt"]
    print(f"\nkills: {kills}; runs resumed from a checkpoint: {resumes}; passes: {KILL_PASSES}")


def _restore(path):
    s = _kill_problem()
    s.load_state_dict(load_checkpoint(path))
    return s


def test_fit_raises_on_a_nan_report_instead_of_converging():
    class Broken(optim.Solver):
        limit_name = "max_iter"

        def __init__(self):
            self.steps_done = 0

        def _progress(self):
            return self.steps_done

        def step(self):
            self.steps_done += 1
            return {"primal": float("nan"), "gap": float("nan"), "converged": True}

    with pytest.raises(FloatingPointError, match="primal, gap = nan at step 1"):
        Broken().fit(max_iter=5)


def test_a_fw_state_with_untracked_weights_is_refused_by_pairwise_and_away_steps(tmp_path):
    """FW steps with a cache evict atoms that carry weight (their blocks' weights stop describing z); pairwise and away
    steps resumed from such a state skipped those blocks for the rest of the run (an exact gap of 2.1e-2 where a fresh
    pairwise run reached 2.8e-3). Refused, naming the step; FW steps resume it."""
    ds = ts.data.synthetic_chain("train", n=12, num_labels=4, num_features=5, min_length=2, max_length=6, seed=0,
                                 dtype=torch.float64)
    source = optim.BCFW(_m(ds), ds, lam=0.1, step="fw", cache_size=2, gap_check_every=1)
    source.fit(max_passes=20)
    state = source.state_dict()
    assert not bool(state["atoms"]["alpha_valid"].all())  # the case: some weights untracked
    for step in ("pairwise", "away"):
        with pytest.raises(ValueError, match=f"saved with step='fw'.*step='{step}' needs every block's weights"):
            optim.BCFW(_m(ds), ds, lam=0.1, step=step, cache_size=2).load_state_dict(state)
    optim.BCFW(_m(ds), ds, lam=0.1, step="fw", cache_size=2, gap_check_every=1).load_state_dict(state)


def test_fit_past_its_limit_with_a_tolerance_warns(tmp_path):
    """Calling the same fit(max_passes=..., gap_tol=..., checkpoint=...) again after it stopped at its limit takes no
    step (the limit counts from the start of training): it says so instead of returning silently."""
    path = tmp_path / "run.ckpt"
    with pytest.warns(optim.ConvergenceWarning, match="stopped by max_passes"):
        optim.BCFW(_m(_chain()), _chain(), lam=1.0).fit(max_passes=2, gap_tol=1e-12, checkpoint=path)
    with pytest.warns(optim.ConvergenceWarning, match="took no step: max_passes = 2 is already reached"):
        history = optim.BCFW(_m(_chain()), _chain(), lam=1.0).fit(max_passes=2, gap_tol=1e-12, checkpoint=path)
    assert len(history) == 0
