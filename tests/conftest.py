import inspect
import itertools
import os
from pathlib import Path

import pytest


def _one_share_of_the_cores_per_worker():
    """Under pytest-xdist (``-n N``): each worker's OpenMP pool (torch's, and numba's loops, which take torch's
    count) gets its share of the usable cores, ``cores // N``, at least 1, unless ``OMP_NUM_THREADS`` is set.
    N workers at the default of every core each oversubscribe the machine N times over, and spinning OpenMP
    workers then cost far more than N (docs/design.md, "Threads"; on 2 cores, 5 test files: serial 426 s, two
    workers at 2 threads 396 s, at 1 thread 204 s). Set in the environment before ``import torch`` so that the
    processes a test starts (ranks, killed children) inherit it."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // workers))


_one_share_of_the_cores_per_worker()

import torch  # noqa: E402  (after the thread count is in the environment)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _interpreted_helpers_patch_once():
    """Under ``TRITON_INTERPRET=1``: a ``@triton.jit`` helper called inside a kernel skips the interpreter's
    re-patching of ``triton.language`` when the enclosing launch has already patched every language module the
    helper sees. Triton's interpreter (3.x) patches on every helper call (``inspect.getmembers`` over the language
    modules, a no-op after the first: patched members are no longer builtins); skipping it took the Triton CUDA-graph
    step test from 256 s to 182 s. The launch's own patch and restore are untouched, so what a kernel
    computes is the same. Applied only where ``InterpretedFunction.__call__`` is the one this was written for."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter
        call = interpreter.InterpretedFunction.__call__
        source = inspect.getsource(call)
    except Exception:  # no triton, or another interpreter: leave it as it is
        return
    if "_patch_lang(self.fn)" not in source or not callable(getattr(interpreter, "_patch_lang", None)):
        return

    def patched(lang) -> bool:
        return not tl.core.is_builtin(getattr(lang, "load", None))

    seen = {}  # a helper's language modules: its module's imports, looked up once

    def helper_call(self, *args, **kwargs):
        langs = seen.get(self.fn)
        if langs is None:
            langs = seen[self.fn] = [v for v in self.fn.__globals__.values()
                                     if inspect.ismodule(v) and v in (tl, tl.core)]
        if not langs or not all(patched(lang) for lang in langs):
            return call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.InterpretedFunction.__call__ = helper_call


_interpreted_helpers_patch_once()


@pytest.fixture(scope="session")
def data_root():
    """The benchmark data folder; in CI (``CI`` set) missing data is a failure, not a skip."""
    root = Path(os.environ.get("TORCHSSVM_DATA", SHARED_DATA))
    if not (root / "ocr" / "letters.npz").exists():
        if os.environ.get("CI"):
            pytest.fail(f"benchmark data not found under {root} (CI must have ../shared/data)")
        pytest.skip(f"benchmark data not found under {root}")
    return str(root)


def needs_triton():
    """Skip Triton tests where they cannot run (no triton, or CPU without TRITON_INTERPRET=1), except
    in CI, where they must run: there a missing prerequisite fails the test instead."""
    try:
        import triton  # noqa: F401

        ok = os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    except Exception:
        ok = False
    return pytest.mark.skipif(not ok and not os.environ.get("CI"),
                              reason="needs triton and TRITON_INTERPRET=1 on CPU")


def needs_numba():
    """Skip tests of the compiled CPU twins where numba is not installed, except in CI (the dev extra has it)."""
    from torchssvm.kernels import numba_available

    return pytest.mark.skipif(not numba_available() and not os.environ.get("CI"), reason="needs numba")


class ScalarRecorder:
    """A stand-in for a TensorBoard ``SummaryWriter``: ``scalars[tag]`` lists ``(step, value)``, ``hists`` lists
    ``(tag, step, number of values)``."""

    def __init__(self):
        self.scalars, self.hists = {}, []

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, []).append((step, value))

    def add_histogram(self, tag, values, step):
        self.hists.append((tag, step, values.numel()))


def brute_force_chain(unary, transition, start, end, length, loss=None):
    """Best labelling of one chain by enumerating all K^length labellings, in float64.

    ``loss(Y) -> (N,)`` adds a task loss to the scores of the labellings ``Y (N, length)``. Ties go to the
    smallest labelling in reverse-lexicographic order (the documented Viterbi rule). Returns
    (labels list, best value).
    """
    K = unary.shape[-1]
    Y = torch.tensor(list(itertools.product(range(K), repeat=length)), dtype=torch.long).view(-1, length)
    u = unary.double()
    s = u[torch.arange(length), Y].sum(1)
    for t in range(1, length):
        tr = (transition[t - 1] if transition.dim() == 3 else transition).double()
        s = s + tr[Y[:, t - 1], Y[:, t]]
    if start is not None:
        s = s + start.double()[Y[:, 0]]
    if end is not None:
        s = s + end.double()[Y[:, -1]]
    if loss is not None:
        s = s + loss(Y)
    best = s.max()
    ties = Y[s == best]
    # reverse-lexicographic minimum: compare from the last position backwards
    key = (ties.flip(1) * (K ** torch.arange(length - 1, -1, -1))).sum(1)
    return ties[key.argmin()].tolist(), float(best)


def linear_classes(n, d, K, noise, seed):
    """Seeded multiclass data ``(x (n, d) float64, y (n,) long)``: ``y = argmax(x W + noise * N(0, I))`` with a
    random ``W (d, K)``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    W = torch.randn(d, K, generator=g, dtype=torch.float64)
    y = (x @ W + noise * torch.randn(n, K, generator=g, dtype=torch.float64)).argmax(1)
    return x, y
