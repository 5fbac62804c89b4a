"""The end of a mini-batch BCFW step as a compiled CPU loop (numba): the CPU twin of `apply_block_step_torch` (rules
there) and of `apply_block_step_triton`, bitwise.

As torch ops the update is about twenty small operations, each a pass over the batch's ``(B, m)`` block vectors or
its atom weights (docs/benchmarks/bcfw_backends.md); here one loop per block moves ``z`` and ``l`` and
updates the block's weights, and a large batch's blocks (distinct, checked) run on threads. The arithmetic is the
torch twin's, operation by operation and in its order (``zi + (gamma d)``, the scaled weights, then the FW atom's
and the away atom's entries), compiled without fused multiply-adds, so the results are bitwise equal; the tests
assert it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .. import _numba
from .._numba import jit as _jit
from .._numba import prange as _prange
from .block_step_torch import STEP_TYPES


@_jit()
def _check_blocks(n, idx, C, s_slot, away, step, has_alpha):
    """0, or 1 for a block outside ``z``, 2 for an atom slot outside ``alpha``, 3 for a block given twice (the
    blocks' loops then write the same row): checked before anything is written, as the writes are not."""
    for b in range(idx.shape[0]):
        if idx[b] < 0 or idx[b] >= n:
            return 1
        if has_alpha and (s_slot[b] < 0 or s_slot[b] >= C or (step != 0 and (away[b] < 0 or away[b] >= C))):
            return 2
    ordered = np.sort(idx)  # O(B log B), whatever the number of blocks n
    for b in range(1, ordered.shape[0]):
        if ordered[b] == ordered[b - 1]:
            return 3
    return 0


@_jit()
def _move_block(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, valid, s_slot, away, upper, kind, step,
                has_alpha, b):
    """Block ``b`` of the batch: its row of ``z``, its ``l`` and its atoms' weights (row ``alpha[i]`` in place:
    each weight is computed from its own old value, in the torch twin's order)."""
    i = idx[b]
    g = gamma[b]
    for m in range(direction.shape[1]):
        z[i, m] = zi[b, m] + g * direction[b, m]
    ell[i] = ell_i[b] + g * d_ell[b]
    if not has_alpha or g == 0.0 or not valid[i]:
        return  # the weights stay as they are
    C = alpha.shape[1]
    s = s_slot[b]
    a = away[b] if step != 0 else 0
    fw = step == 0 or (step == 2 and kind[b] == 0)
    gc = min(g, 1.0)
    if step == 1:  # pairwise: mass gamma to the FW atom
        alpha[i, s] = alpha[i, s] + g
    else:  # FW: (1 - g) alpha + g e_s; away (kind 2): (1 + gamma) alpha
        scale = 1.0 - gc if fw else 1.0 + g
        for j in range(C):
            alpha[i, j] = scale * alpha[i, j]
        alpha[i, s] = alpha[i, s] + (gc if fw else 0.0)
    if step != 0 and not (step == 2 and fw):  # the away atom loses gamma (all of it at the bound)
        alpha[i, a] = 0.0 if g >= upper[b] else alpha[i, a] - g
    for j in range(C):
        if alpha[i, j] < 0.0:
            alpha[i, j] = 0.0


@_jit()
def _block_step(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, valid, s_slot, away, upper, kind, step,
                has_alpha):
    """In place, block after block; returns `_check_blocks`' code."""
    code = _check_blocks(z.shape[0], idx, alpha.shape[1], s_slot, away, step, has_alpha)
    if code == 0:
        for b in range(idx.shape[0]):
            _move_block(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, valid, s_slot, away, upper, kind,
                        step, has_alpha, b)
    return code


@_jit(parallel=True)
def _block_step_parallel(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, valid, s_slot, away, upper, kind,
                         step, has_alpha):
    """`_block_step` with the blocks on threads: they are distinct (checked), so no two write the same row."""
    code = _check_blocks(z.shape[0], idx, alpha.shape[1], s_slot, away, step, has_alpha)
    if code == 0:
        for j in _prange(idx.shape[0]):
            _move_block(z, ell, idx, zi, ell_i, gamma, direction, d_ell, alpha, valid, s_slot, away, upper, kind,
                        step, has_alpha, np.int64(j))  # prange's index is unsigned
    return code


# Above this many entries of the directions (B m) the blocks run on threads: the loop is a stream over B rows of
# z, the batch's z_i and the directions, and two threads move more memory than one.
_PARALLEL_MIN_WORK = 1 << 15


_NO_FLOATS, _NO_LONGS = np.zeros(1), np.zeros(1, dtype=np.int64)
_NO_ALPHA, _NO_VALID = np.zeros((1, 1)), np.zeros(1, dtype=np.bool_)


def _np(t: Optional[torch.Tensor], dtype: torch.dtype, absent: Optional[np.ndarray] = None) -> np.ndarray:
    """``t`` as a contiguous array of ``dtype``; ``absent`` stands in for an optional argument left out."""
    return absent if t is None else t.to(dtype).contiguous().numpy()


def apply_block_step_numba(z: torch.Tensor, ell: torch.Tensor, idx: torch.Tensor, zi: torch.Tensor,
                           ell_i: torch.Tensor, gamma: torch.Tensor, direction: torch.Tensor, d_ell: torch.Tensor,
                           alpha: Optional[torch.Tensor] = None, alpha_valid: Optional[torch.Tensor] = None,
                           step: str = "fw", s_slot: Optional[torch.Tensor] = None,
                           away: Optional[torch.Tensor] = None, upper: Optional[torch.Tensor] = None,
                           kind: Optional[torch.Tensor] = None) -> None:
    """`apply_block_step_torch` (same arguments, in place) on CPU tensors; ``z``, ``ell`` and ``alpha`` must be
    contiguous float64. The blocks (in range and distinct) and the atom slots are checked before the loop, which does
    not check its writes."""
    for name, t in (("z", z), ("ell", ell), ("alpha", alpha)):
        if t is not None and not (t.is_contiguous() and t.dtype == torch.float64 and t.device.type == "cpu"):
            raise ValueError(f"{name} must be a contiguous float64 CPU tensor (the loop writes it in place)")
    B, M = direction.shape
    n = z.shape[0]
    if z.shape[1] != M or tuple(zi.shape) != (B, M) or ell.shape[0] != n or (alpha is not None and
                                                                          alpha.shape[0] != n):
        raise ValueError(f"z must be (n, {M}) with zi ({B}, {M}), ell (n,) and alpha (n, C), got z "
                         f"{tuple(z.shape)}, zi {tuple(zi.shape)}, ell {tuple(ell.shape)}")
    f64, i64 = torch.float64, torch.long
    fn = _numba.serial_or_parallel(_block_step, _block_step_parallel, B, B * M, _PARALLEL_MIN_WORK)
    code = fn(z.numpy(), ell.numpy(), _np(idx, i64), _np(zi, f64), _np(ell_i, f64), _np(gamma, f64),
              _np(direction, f64), _np(d_ell, f64), _NO_ALPHA if alpha is None else alpha.numpy(),
              _np(alpha_valid, torch.bool, _NO_VALID), _np(s_slot, i64, _NO_LONGS), _np(away, i64, _NO_LONGS),
              _np(upper, f64, _NO_FLOATS), _np(kind, i64, _NO_LONGS), STEP_TYPES.index(step), alpha is not None)
    if code:
        raise ValueError({1: "idx must lie in [0, n), the blocks of z",
                          2: "the atom slots (s_slot, away) must lie in [0, C), the columns of alpha",
                          3: "idx must hold distinct blocks"}[code])
