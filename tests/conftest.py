import itertools
import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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


def brute_force_chain(unary, transition, start, end, length, loss=None):
    """Best labelling of one chain by enumeration, in float64.

    ``loss(y) -> float`` is added to the score when given. Ties go to the smallest labelling in
    reverse-lexicographic order (the documented Viterbi rule). Returns (labels list, best value).
    """
    K = unary.shape[-1]
    u = unary.double()
    best, best_y = None, None
    for y in itertools.product(range(K), repeat=length):
        s = sum(float(u[t, y[t]]) for t in range(length))
        for t in range(1, length):
            tr = transition[t - 1] if transition.dim() == 3 else transition
            s += float(tr[y[t - 1], y[t]])
        if start is not None:
            s += float(start[y[0]])
        if end is not None:
            s += float(end[y[-1]])
        if loss is not None:
            s += loss(y)
        if best is None or s > best or (s == best and y[::-1] < best_y[::-1]):
            best, best_y = s, y
    return list(best_y), best
