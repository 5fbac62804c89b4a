"""Tiny steps run their products on one MKL thread, for the calling thread only, and put the setting back
(`torchssvm._blas`): no OpenMP fork-join per product in a BCFW pass at ``batch_size=1`` or an SSG pass, the same
iterates as with MKL's team, and the user's settings untouched (docs/benchmarks/contention.md)."""

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
from torchssvm import _blas

ROOT = Path(__file__).resolve().parents[1]

needs_mkl = pytest.mark.skipif(_blas.blas_threads() is None, reason="torch is not linked with an MKL we can reach")


def _chain(n=24, seed=0):
    # OCR's shapes: a word's (T, 128) @ (128, 26) product is one MKL forks a team for
    return ts.data.synthetic_chain("train", n, num_labels=26, num_features=128, seed=seed)


@pytest.fixture
def two_threads():
    """torch (and with it MKL's global count) at two threads, so that one thread inside the scope is a change; the
    caller's count back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    if _blas.blas_threads() != 2:
        torch.set_num_threads(before)
        pytest.skip("MKL's count does not follow torch.set_num_threads here")
    yield
    torch.set_num_threads(before)


@needs_mkl
def test_sequential_blas_sets_one_thread_here_only_and_puts_it_back(two_threads):
    set_local = _blas._mkl()[0]
    before, torch_threads = _blas.blas_threads(), torch.get_num_threads()
    seen = {}
    with _blas.sequential_blas():
        seen["inside"] = _blas.blas_threads()
        other = threading.Thread(target=lambda: seen.__setitem__("other thread", _blas.blas_threads()))
        other.start()
        other.join()
        with _blas.sequential_blas(False):
            seen["disabled"] = _blas.blas_threads()
    assert seen == {"inside": 1, "other thread": before, "disabled": 1}
    assert _blas.blas_threads() == before and torch.get_num_threads() == torch_threads
    # a thread-local count the user set is put back, also after an exception inside
    set_local(3)
    try:
        with pytest.raises(RuntimeError), _blas.sequential_blas():
            assert _blas.blas_threads() == 1
            raise RuntimeError
        assert _blas.blas_threads() == 3
    finally:
        set_local(0)
    assert _blas.blas_threads() == before


def test_small_step_is_by_blocks_work_and_device():
    d = 4082  # OCR's weights
    assert _blas.small_step(1, d, "cpu") and _blas.small_step(_blas.SMALL_STEP_BLOCKS, d, torch.device("cpu"))
    assert not _blas.small_step(_blas.SMALL_STEP_BLOCKS + 1, d, "cpu")
    assert not _blas.small_step(1, _blas.SMALL_STEP_WORK + 1, "cpu")  # a large model keeps MKL's team
    assert not _blas.small_step(1, d, "meta")  # a device: no MKL there


@needs_mkl
@pytest.mark.parametrize("solver", ["bcfw", "ssg"])
def test_tiny_steps_give_the_iterates_of_mkl_team(monkeypatch, two_threads, solver):
    """A pass with the products on one thread and one with MKL's team: the same weights, bitwise (MKL splits a
    small product's output between threads, not its sums), and MKL's count as before after each."""
    ds = _chain()
    out = {}
    before = _blas.blas_threads()
    for blocks in (_blas.SMALL_STEP_BLOCKS, 0):  # 0: the scope off
        monkeypatch.setattr(_blas, "SMALL_STEP_BLOCKS", blocks)
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
        s = (ts.optim.BCFW(model, ds, lam=0.01, seed=0) if solver == "bcfw" else
             ts.optim.SSG(model, ds, lam=0.01, seed=0, eval_every=0))
        s.step()
        s.step()
        out[blocks] = s.w.clone()
        assert _blas.blas_threads() == before
    assert torch.equal(out[_blas.SMALL_STEP_BLOCKS], out[0])


_COUNT_FORKS = textwrap.dedent("""
    import ctypes, json, sys
    import torch
    import torchssvm as ts
    from torchssvm import _blas
    torch.set_num_threads(2)
    shim = ctypes.CDLL(sys.argv[1])
    shim.forks.restype = ctypes.c_long
    ds = ts.data.synthetic_chain("train", 24, num_labels=26, num_features=128, seed=0)
    counts = {}
    for blocks in (_blas.SMALL_STEP_BLOCKS, 0):
        _blas.SMALL_STEP_BLOCKS = blocks
        for name in ("bcfw", "bcfw4", "ssg"):
            model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
            s = (ts.optim.BCFW(model, ds, lam=0.01, seed=0, batch_size=4 if name == "bcfw4" else 1)
                 if name != "ssg" else ts.optim.SSG(model, ds, lam=0.01, seed=0, eval_every=0))
            s.step()
            before = shim.forks()
            s.step()
            counts[f"{name} {blocks}"] = shim.forks() - before
    print(json.dumps(counts))
""")

_SHIM = textwrap.dedent("""
    #define _GNU_SOURCE
    #include <dlfcn.h>
    static long count = 0;
    long forks(void) { return count; }
    typedef void (*fn_t)(void (*)(void *), void *, unsigned, unsigned);
    void GOMP_parallel(void (*f)(void *), void *data, unsigned n, unsigned flags) {
        static fn_t real = 0;
        if (!real) real = (fn_t)dlsym(RTLD_NEXT, "GOMP_parallel");
        count++;
        real(f, data, n, flags);
    }
""")


@needs_mkl
@pytest.mark.skipif(sys.platform != "linux" or shutil.which("cc") is None, reason="needs Linux and a C compiler")
def test_tiny_steps_fork_no_openmp_team(tmp_path):
    """OpenMP fork-joins (libgomp's ``GOMP_parallel``, counted by a preloaded shim) in a pass of BCFW at
    ``batch_size=1`` and 4 and of SSG, at two torch threads: none with the scope (and the gathers by
    ``index_select``), and one or more per product without it (the count a busy machine pays a scheduler slice
    for)."""
    src, lib = tmp_path / "shim.c", tmp_path / "libshim.so"
    src.write_text(_SHIM)
    built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], capture_output=True,
                           text=True)
    if built.returncode:
        pytest.skip(f"the shim does not build here: {built.stderr.strip()[:200]}")
    env = {**os.environ, "LD_PRELOAD": str(lib)}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", _COUNT_FORKS, str(lib)], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr

    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    if counts["bcfw 0"] == 0 or counts["ssg 0"] == 0:
        pytest.skip(f"MKL forks no team here without the scope either ({counts})")
    assert counts[f"bcfw {_blas.SMALL_STEP_BLOCKS}"] == 0 and counts[f"bcfw4 {_blas.SMALL_STEP_BLOCKS}"] == 0, counts
    assert counts[f"ssg {_blas.SMALL_STEP_BLOCKS}"] == 0, counts  # eval_every=0: no primal evaluation
