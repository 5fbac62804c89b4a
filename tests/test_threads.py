"""The library leaves the caller's thread settings alone: after ``torch.set_num_threads`` (and
``numba.set_num_threads``), the numba twins' parallel kernels, a BCFW step with them and a chain loss call keep
``torch.get_num_threads()``, ``torch.get_num_interop_threads()`` and ``numba.get_num_threads()`` as set, and a
parallel loop runs on at most the smaller of torch's and numba's counts (docs/benchmarks/contention.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

numba = pytest.importorskip("numba")

from torchssvm.kernels import _numba  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def restore_threads():
    """Puts torch's and numba's (this thread's) counts back after the test."""
    torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    yield
    torch.set_num_threads(torch_threads)
    numba.set_num_threads(numba_threads)


def _loop_threads_py(out):
    """Each item: the thread count the loop ran with."""
    for i in numba.prange(out.shape[0]):
        out[i] = numba.get_num_threads()


_loop_threads = _numba._Parallel(numba.njit(parallel=True)(_loop_threads_py))  # as `_numba.jit`, uncached


def _settings():
    return torch.get_num_threads(), torch.get_num_interop_threads(), numba.get_num_threads()


def _block_step():
    from torchssvm.kernels.step.block_step_numba import apply_block_step_numba

    n, B, M = 80, 64, 1024  # B M >= the kernel's parallel threshold (2**15)
    g = torch.Generator().manual_seed(0)
    z, ell = torch.randn(n, M, dtype=torch.float64, generator=g), torch.zeros(n, dtype=torch.float64)
    idx = torch.randperm(n, generator=g)[:B]
    direction = torch.randn(B, M, dtype=torch.float64, generator=g)
    apply_block_step_numba(z, ell, idx, z[idx].clone(), ell[idx].clone(), torch.full((B,), 0.5, dtype=torch.float64),
                           direction, torch.zeros(B, dtype=torch.float64))


def _viterbi():
    from torchssvm.kernels.chain.viterbi_numba import viterbi_numba

    B, T, K = 64, 16, 32  # B T K^2 >= 2**20
    unary = torch.randn(B, T, K, dtype=torch.float64)
    viterbi_numba(unary, torch.randn(K, K, dtype=torch.float64), None, None, torch.full((B,), T))


def _marginals():
    from torchssvm.kernels.chain.chain_marginals_numba import chain_marginals_numba

    B, T, K = 64, 16, 32
    chain_marginals_numba(torch.randint(0, K, (B, T)), torch.full((B,), T), K)


def _distance_transforms():
    from torchssvm.kernels.tree.distance_transform_numba import distance_transform_1d_numba, distance_transform_2d_numba

    R = 4
    ones = torch.ones(R, dtype=torch.float64)
    distance_transform_1d_numba(torch.randn(R, 16, dtype=torch.float64), ones, ones * 0, ones * 0)
    distance_transform_2d_numba(torch.randn(R, 8, 8, dtype=torch.float64), ones, ones * 0, ones * 0, ones, ones * 0,
                                ones * 0)


def _chain_loss():
    import torchssvm as ts
    from torchssvm.structures.chain import ChainPotentials

    B, T, K = 64, 16, 32
    unary = torch.randn(B, T, K, dtype=torch.float64, requires_grad=True)
    transition = torch.randn(K, K, dtype=torch.float64, requires_grad=True)
    loss = ts.StructuredHingeLoss(ts.Chain(K), backend="numba")
    loss(ChainPotentials(unary, transition, None, None), torch.randint(0, K, (B, T)), torch.full((B,), T)).backward()


CALLS = {"block_step": _block_step, "viterbi": _viterbi, "marginals": _marginals,
         "distance_transforms": _distance_transforms, "chain_loss": _chain_loss}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_calls_keep_thread_settings(restore_threads, monkeypatch, call, threads):
    _check_keeps_settings(monkeypatch, threads, CALLS[call])


@pytest.mark.parametrize("threads", [1, 3])
def test_bcfw_step_keeps_thread_settings(restore_threads, monkeypatch, data_root, threads):
    """The issue's case: one mini-batch BCFW pass on OCR-small (the parallel marginals and block step)."""
    import torchssvm as ts

    train = ts.data.ocr("train", "small", root=data_root)
    model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse)
    solver = ts.optim.BCFW(model, train, lam=1e-2, seed=0, batch_size=32)
    _check_keeps_settings(monkeypatch, threads, solver.step)


def _check_keeps_settings(monkeypatch, threads, call):
    parallel_calls = []
    counted = _numba.threads
    monkeypatch.setattr(_numba, "threads", lambda: parallel_calls.append(1) or counted())
    torch.set_num_threads(threads)
    before = _settings()
    call()
    assert _settings() == before
    assert parallel_calls  # the call took a parallel kernel


def test_user_numba_setting_kept_and_caps_the_loop(restore_threads):
    out = torch.zeros(8, dtype=torch.long).numpy()
    top = numba.config.NUMBA_NUM_THREADS
    torch.set_num_threads(top)
    numba.set_num_threads(1)
    _loop_threads(out)
    assert numba.get_num_threads() == 1 and torch.get_num_threads() == top
    assert set(out.tolist()) == {1}  # the user's numba count caps the loop
    if top > 1:
        numba.set_num_threads(top)
        torch.set_num_threads(1)
        _loop_threads(out)
        assert numba.get_num_threads() == top and torch.get_num_threads() == 1
        assert set(out.tolist()) == {1}  # so does torch's


_FIRST_CALL = textwrap.dedent("""
    import ctypes
    import torch
    levels = getattr(ctypes.CDLL(None), "omp_get_max_active_levels", lambda: -1)
    before = torch.get_num_threads(), levels()
    torch.set_num_threads({threads})
    from torchssvm.kernels.step.block_step_numba import apply_block_step_numba
    n, B, M = 80, 64, 1024
    z, ell = torch.randn(n, M, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    idx = torch.randperm(n)[:B]
    apply_block_step_numba(z, ell, idx, z[idx].clone(), ell[idx].clone(), torch.full((B,), 0.5, dtype=torch.float64),
                           torch.randn(B, M, dtype=torch.float64), torch.zeros(B, dtype=torch.float64))
    print(before[0], torch.get_num_threads(), before[1], levels())
""")


def test_first_parallel_call_keeps_torch_threads():
    """numba's OpenMP layer starts on the first parallel call and resets the OpenMP thread count torch reads: only
    a fresh process sees that start."""
    env = dict(os.environ, NUMBA_NUM_THREADS="2")  # numba starts 2 threads (the reset's value) on any machine
    run = subprocess.run([sys.executable, "-c", _FIRST_CALL.format(threads=1)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    _, threads, levels_before, levels = run.stdout.split()[-4:]
    assert (threads, levels) == ("1", levels_before)  # the nesting limit of torch's OpenMP pool too
