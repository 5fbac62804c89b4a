"""The backend table: which operation has which forms, on which devices, and what ``backend="auto"`` picks.

Every kernel family dispatches through `resolve`, and every caller above the kernels (structures, losses,
problems, solvers) passes the user's ``backend`` string down unchanged: the string is resolved once, where the
operation runs, and a form that does not exist is refused here, naming the operation and the forms it has.

The forms (``FORMS``):

- ``"torch"``: the pure-torch twin, on any device; every operation has one (the reference of the others).
- ``"triton"``: a Triton kernel, on CUDA tensors (on CPU tensors only in the Triton interpreter,
  ``TRITON_INTERPRET=1``).
- ``"numba"``: a compiled CPU loop, on CPU tensors, float32 or float64 (no half types).

``"auto"`` picks Triton for CUDA tensors when the operation has a Triton form and triton imports; numba for CPU
tensors when the operation has a numba form, numba imports and the float tensors given share one dtype the
compiled loop takes (torch promotes mixed dtypes, the loops compute in one); torch otherwise.

``STRUCTURE_ORACLE`` is the row of a structure's oracles without kernels of their own (the operations on their
potentials are torch ops on whatever device holds them): ``"triton"`` there is accepted and means the GPU's
torch ops, as ``"auto"`` does.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

BACKENDS = ("auto", "torch", "triton", "numba")
ALL, GPU = ("torch", "triton", "numba"), ("torch", "triton")

# operation -> its forms (besides "auto"); grouped as the kernel families are
FORMS: dict[str, tuple[str, ...]] = {
    # chains (`kernels.chain`)
    "viterbi": ALL,
    "chain_labels_score": ALL,
    "chain_inner": ALL,
    "chain_marginals": ALL,
    "slack_viterbi": GPU,
    "chain_hinge": GPU,  # the fused margin-rescaled hinge of `Chain` (`chain_hinge_triton`)
    # trees and distance transforms (`kernels.tree`)
    "tree_max_sum": GPU,
    "spatial_tree_max_sum": ALL,
    "mixture_tree_max_sum": ALL,
    "distance_transform_1d": ALL,
    "distance_transform_2d": ALL,
    # projections (`kernels.projections`)
    "project_simplex": GPU,
    "project_box_equality": GPU,
    # the mini-batch BCFW step's bookkeeping (`kernels.step`)
    "select_atoms": GPU,
    "insert_atoms": GPU,
    "apply_block_step": ALL,
    "sampling_keys": GPU,  # the host-free step's draw (`sampling_triton`)
    "box_qp_newton": GPU,  # the host-free step's B x B box QP (`box_qp_triton`; the torch twin in `optim`)
    # a structure's oracle without kernels of its own (see the module's docstring)
    "structure_oracle": GPU,
}
STRUCTURE_ORACLE = "structure_oracle"
WHERE = {"torch": "any device", "triton": "CUDA tensors (CPU tensors with TRITON_INTERPRET=1)",
         "numba": "CPU tensors"}
NUMBA_DTYPES = (torch.float32, torch.float64)

# What "auto" picks on CUDA when an operation has a Triton form. The simulated CUDA device of the tests turns it
# off: interpreted Triton is too slow for whole training runs (tests that name "triton" still run the kernels).
AUTO_TRITON_ON_CUDA = True


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def numba_available() -> bool:
    from . import _numba

    return _numba.available()


def check_backend(backend) -> str:
    """``backend`` if it names a backend, else a ValueError naming the argument (for the boundary, before any
    tensor is seen)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def forms(op: str) -> tuple[str, ...]:
    """The forms of ``op`` (a KeyError names an unknown operation: a programming error, not the user's)."""
    try:
        return FORMS[op]
    except KeyError:
        raise KeyError(f"no operation {op!r} in the backend table (kernels/backends.py)") from None


def resolve(op: str, backend: str, device: torch.device, *tensors) -> str:
    """The form of ``op`` that runs for ``backend`` on tensors of ``device``: ``"torch"``, ``"triton"`` or
    ``"numba"``. ``tensors``: the float tensors the numba form would read (None entries skipped), whose dtypes
    decide whether ``"auto"`` may take it. Raises a ValueError for an unknown backend or one that ``op`` has no form
    of (naming its forms) or that cannot run on ``device``, a RuntimeError when its package is missing."""
    check_backend(backend)
    have = forms(op)
    device = torch.device(device)
    if backend == "auto":
        if device.type == "cuda":
            return "triton" if "triton" in have and AUTO_TRITON_ON_CUDA and triton_available() else "torch"
        if "numba" in have and device.type == "cpu" and numba_available():
            dtypes = {t.dtype for t in tensors if t is not None}
            if not tensors or (len(dtypes) == 1 and dtypes <= set(NUMBA_DTYPES)):
                return "numba"
        return "torch"
    if backend not in have:
        raise ValueError(f"backend={backend!r}: {op} has no {backend} form; its forms: "
                         + ", ".join(f"{f} ({WHERE[f]})" for f in have) + ", or 'auto'")
    if backend == "numba":
        if not numba_available():
            raise RuntimeError("backend='numba' needs the numba package (pip install torchssvm[cpu])")
        if device.type != "cpu":
            raise ValueError(f"backend='numba' runs on CPU tensors, got tensors on {device}")
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' needs the triton package (pip install torchssvm[triton])")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("backend='triton' on CPU tensors needs TRITON_INTERPRET=1 (the Triton interpreter)")
    return backend


def resolve_backend(backend: str, device: torch.device, has_numba: bool = False) -> str:
    """Deprecated: `resolve` names the operation. Resolves ``backend`` for an operation with torch and Triton forms,
    and a numba form when ``has_numba``."""
    warnings.warn("resolve_backend is deprecated: use torchssvm.kernels.resolve(op, backend, device), which names "
                  "the operation's row of the backend table", DeprecationWarning, stacklevel=2)
    return resolve("viterbi" if has_numba else STRUCTURE_ORACLE, backend, device)
