"""Small steps run on one thread, for the calling thread only, and put the settings back (`torchssvm._threads`):
no OpenMP team in a BCFW pass at ``batch_size`` 1 to 8 or an SSG pass, reproducible iterates equal to the teams'
to rounding, and the user's settings untouched (docs/benchmarks/contention.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import torchssvm as ts
from torchssvm import _threads

ROOT = Path(__file__).resolve().parents[1]

needs_mkl = pytest.mark.skipif(_threads.blas_threads() is None, reason="torch is not linked with an MKL we can reach")
needs_openmp = pytest.mark.skipif(_threads._openmp() is None, reason="torch's parallel backend is not OpenMP")


def _chain(n=24, seed=0):
    # OCR's shapes: a word's (T, 128) @ (128, 26) product is one MKL forks a team for
    return ts.data.synthetic_chain("train", n, num_labels=26, num_features=128, seed=seed)


@pytest.fixture
def two_threads():
    """torch (and with it MKL's global count) at two threads, so that one thread inside the scope is a change; the
    caller's count back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    if _threads.blas_threads() not in (None, 2):
        torch.set_num_threads(before)
        pytest.skip("MKL's count does not follow torch.set_num_threads here")
    yield
    torch.set_num_threads(before)


def _counts():
    """(torch's count, MKL's count) as the calling thread sees them."""
    return torch.get_num_threads(), _threads.blas_threads()


@needs_openmp
def test_one_thread_sets_one_thread_here_only_and_puts_it_back(two_threads):
    before = _counts()
    seen = {}
    with _threads.one_thread():
        seen["inside"] = _counts()
        other = threading.Thread(target=lambda: seen.__setitem__("other thread", _counts()))
        other.start()
        other.join()
        with _threads.one_thread(False):
            seen["disabled"] = _counts()
        with _threads.one_thread():
            seen["nested"] = _counts()
        seen["after nested"] = _counts()
    one = (1, None if before[1] is None else 1)
    assert seen == {"inside": one, "other thread": before, "disabled": one, "nested": one, "after nested": one}
    assert _counts() == before
    # after an exception inside too
    with pytest.raises(RuntimeError), _threads.one_thread():
        assert _counts() == one
        raise RuntimeError
    assert _counts() == before


@needs_mkl
def test_one_thread_keeps_a_thread_local_mkl_count_the_user_set(two_threads):
    set_local = _threads._mkl()[0]
    set_local(3)
    try:
        with _threads.one_thread():
            assert _threads.blas_threads() == 1
        assert _threads.blas_threads() == 3
    finally:
        set_local(0)
    assert _threads.blas_threads() == 2


@needs_openmp
def test_one_thread_runs_torch_loops_and_numba_kernels_on_one_thread(two_threads):
    """Inside the scope a numba kernel runs on one thread (it takes torch's count), and torch's parallel loops see
    one thread."""
    numba = pytest.importorskip("numba")
    from torchssvm.kernels import _numba

    def loop_threads_py(out):
        for i in numba.prange(out.shape[0]):
            out[i] = numba.get_num_threads()

    loop_threads = _numba._Parallel(numba.njit(parallel=True)(loop_threads_py))  # as `_numba.jit`, uncached
    out = torch.zeros(8, dtype=torch.long).numpy()
    loop_threads(out)
    assert set(out.tolist()) == {min(2, numba.config.NUMBA_NUM_THREADS)}
    with _threads.one_thread():
        loop_threads(out)
        assert set(out.tolist()) == {1}
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_small_step_is_by_blocks_work_and_device():
    d, m = 4082, 14 * 26 + 26 * 26 + 2 * 26  # OCR's weights and block coordinates
    assert _threads.small_step(1, d, m, "cpu") and _threads.small_step(8, d, m, torch.device("cpu"))
    assert _threads.SMALL_STEP_BLOCKS == 8  # a mini-batch of 8 OCR words is a small step
    assert not _threads.small_step(_threads.SMALL_STEP_BLOCKS + 1, d, m, "cpu")
    assert not _threads.small_step(1, _threads.SMALL_STEP_WORK, 1, "cpu")  # a large model keeps its threads
    assert not _threads.small_step(1, 2000, 3000 * 26 + 26 * 26 + 52, "cpu")  # so does a sequence of 3,000 tokens
    assert not _threads.small_step(1, d, m, "meta")  # a device: its own kernels


def test_one_thread_puts_openmp_back_when_setting_mkl_fails(monkeypatch, two_threads):
    """An exception (an interrupt) between the two settings still puts the first back."""
    if _threads._openmp() is None:
        pytest.skip("torch's parallel backend is not OpenMP")

    def failing_set(n):
        raise KeyboardInterrupt

    monkeypatch.setattr(_threads, "_mkl", lambda: (failing_set, lambda: 2))
    with pytest.raises(KeyboardInterrupt), _threads.one_thread():
        pass
    assert torch.get_num_threads() == 2


def test_openmp_runtime_is_the_one_torch_reads(two_threads):
    """A runtime whose count does not move ``torch.get_num_threads()`` (one loaded beside torch's, unused) is not
    taken; the one found moves it."""
    own = [5]
    unused = (lambda n: own.__setitem__(0, n), lambda: own[0])
    assert not _threads._moves_torch(unused) and own == [5]
    found = _threads._openmp()
    if found is None:
        pytest.skip("torch's parallel backend is not OpenMP")
    assert _threads._moves_torch(found) and torch.get_num_threads() == 2


@pytest.mark.parametrize("solver, batch_size", [("bcfw", 1), ("bcfw", 8), ("ssg", 1)])
def test_small_steps_are_reproducible_and_close_to_the_teams(monkeypatch, two_threads, solver, batch_size):
    """Passes on one thread: the same weights in two runs, bitwise, and those of the teams of two to rounding (a team
    can split a sum, so not bitwise in general); the counts as before after each."""
    ds = _chain()
    out = {}
    before = _counts()
    for key, blocks in (("one", _threads.SMALL_STEP_BLOCKS), ("again", _threads.SMALL_STEP_BLOCKS), ("teams", 0)):
        monkeypatch.setattr(_threads, "SMALL_STEP_BLOCKS", blocks)  # 0: the scope off
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
        s = (ts.optim.BCFW(model, ds, lam=0.01, seed=0, batch_size=batch_size) if solver == "bcfw" else
             ts.optim.SSG(model, ds, lam=0.01, seed=0, eval_every=0))
        assert _threads.small_step(batch_size, s.problem.d, s.problem.m, "cpu") == (blocks > 0)
        s.step()
        s.step()
        out[key] = s.w.clone()
        assert _counts() == before
    assert torch.equal(out["one"], out["again"])
    torch.testing.assert_close(out["one"], out["teams"], rtol=1e-12, atol=1e-12 * float(out["teams"].abs().max()))


_COUNT_TEAMS = textwrap.dedent("""
    import ctypes, json, sys
    import torch
    import torchssvm as ts
    from torchssvm import _threads
    torch.set_num_threads(2)
    shim = ctypes.CDLL(sys.argv[1])
    shim.teams.restype = ctypes.c_long
    ds = ts.data.synthetic_chain("train", 48, num_labels=26, num_features=128, seed=0)
    counts = {}
    for blocks in (_threads.SMALL_STEP_BLOCKS, 0):
        _threads.SMALL_STEP_BLOCKS = blocks
        for name, batch in (("bcfw", 1), ("bcfw4", 4), ("bcfw8", 8), ("ssg", 1)):
            model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
            s = (ts.optim.BCFW(model, ds, lam=0.01, seed=0, batch_size=batch)
                 if name != "ssg" else ts.optim.SSG(model, ds, lam=0.01, seed=0, eval_every=0))
            s.step()
            before = shim.teams()
            s.step()
            counts[f"{name} {blocks}"] = shim.teams() - before
    print(json.dumps(counts))
""")

# Counts the OpenMP regions that run a team of more than one thread (what a busy machine pays a scheduler slice
# for): libgomp's ``GOMP_parallel`` wrapped, the region's function wrapped to look at its team from thread 0.
_SHIM = textwrap.dedent("""
    #define _GNU_SOURCE
    #include <dlfcn.h>
    static long count = 0;
    long teams(void) { return __atomic_load_n(&count, __ATOMIC_RELAXED); }
    typedef void (*fn_t)(void (*)(void *), void *, unsigned, unsigned);
    typedef int (*int_fn)(void);
    struct region { void (*f)(void *); void *data; int_fn num, id; };
    static void run(void *p) {
        struct region *r = p;
        if (r->id() == 0 && r->num() > 1) __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED);
        r->f(r->data);
    }
    void GOMP_parallel(void (*f)(void *), void *data, unsigned n, unsigned flags) {
        static fn_t real = 0;
        static int_fn num = 0, id = 0;
        if (!real) {
            real = (fn_t)dlsym(RTLD_NEXT, "GOMP_parallel");
            num = (int_fn)dlsym(RTLD_NEXT, "omp_get_num_threads");
            id = (int_fn)dlsym(RTLD_NEXT, "omp_get_thread_num");
        }
        struct region r = {f, data, num, id};
        real(run, &r, n, flags);
    }
""")


def _build_shim(tmp_path):
    src, lib = tmp_path / "shim.c", tmp_path / "libshim.so"
    src.write_text(_SHIM)
    built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], capture_output=True,
                           text=True)
    if built.returncode:
        pytest.skip(f"the shim does not build here: {built.stderr.strip()[:200]}")
    return lib


@needs_openmp
@pytest.mark.skipif(sys.platform != "linux" or shutil.which("cc") is None, reason="needs Linux and a C compiler")
def test_small_steps_fork_no_openmp_team(tmp_path):
    """OpenMP teams of two (counted by a preloaded shim) in a pass of BCFW at ``batch_size`` 1, 4 and 8 and of SSG,
    at two torch threads: none with the scope, and several without it."""
    lib = _build_shim(tmp_path)
    env = {**os.environ, "LD_PRELOAD": str(lib)}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", _COUNT_TEAMS, str(lib)], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr

    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    blocks = _threads.SMALL_STEP_BLOCKS
    assert [counts[f"{name} {blocks}"] for name in ("bcfw", "bcfw4", "bcfw8", "ssg")] == [0, 0, 0, 0], counts
    # without the scope a pass of 8-block steps forks torch's and numba's teams (6 steps here); whether MKL forks
    # for one word's product depends on the processor (it did on an AMD EPYC, not on an Intel Xeon)
    assert counts["bcfw8 0"] > 0, counts


_START_INSIDE = textwrap.dedent("""
    import threading
    import torch
    from torchssvm import _threads
    torch.set_num_threads(2)
    before = torch.get_num_threads(), _threads.blas_threads()
    with _threads.one_thread():
        from torchssvm.kernels.step.block_step_numba import apply_block_step_numba
        n, B, M = 80, 64, 1024
        z, ell = torch.randn(n, M, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
        idx = torch.randperm(n)[:B]
        apply_block_step_numba(z, ell, idx, z[idx].clone(), ell[idx].clone(),
                               torch.full((B,), 0.5, dtype=torch.float64), torch.randn(B, M, dtype=torch.float64),
                               torch.zeros(B, dtype=torch.float64))
    later = []
    thread = threading.Thread(target=lambda: later.append((torch.get_num_threads(), _threads.blas_threads())))
    thread.start()
    thread.join()
    print(before, (torch.get_num_threads(), _threads.blas_threads()), later[0])
""")


@needs_openmp
def test_numba_start_inside_the_scope_changes_nothing_after_it():
    """numba's threading layer starting inside `one_thread` (a fresh process's first parallel kernel in a small
    step) sets OpenMP's count on its start; the library puts it back on the calling thread only (with
    `torch.set_num_threads` it recorded the scope's 1 for every thread started later), so after the scope torch's
    and MKL's counts are the caller's, in this thread and in a thread started after."""
    pytest.importorskip("numba")
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    run = subprocess.run([sys.executable, "-c", _START_INSIDE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)
    before, after, later = run.stdout.strip().splitlines()[-1].split(") (")
    assert before + ")" == "(" + after + ")" == "(" + later
