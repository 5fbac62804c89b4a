"""The chain oracles' overflow guard on a device, as Triton code: bound the sums without a host read.

On the CPU (and in debug mode) the structures read their potentials' largest magnitudes with the finiteness check and
choose float64 or a power-of-two scale on the host (`torchssvm.structures.base`, "numerics at the dtype's limits").
On a device outside debug mode the host reads nothing, since every read makes it wait for the device. There the
fused hinge and the Triton Viterbi guard themselves:

1. `chain_guard_partials` (one launch, `_chain_bound_kernel`): each of P programs reduces a chunk of the unary and
   of the transitions to ``max |.|``; program 0 also ``max(max |start|, max |end|)`` and the largest Hamming weight
   ``max loss_weight x max class_weight`` (dividing by a length >= 1 only lowers it). Four columns of P float64
   partials; no host read.
2. Every consumer kernel (`guard_shift`) reduces the partials to ``M``, the largest of the four, and bounds every sum
   an oracle forms by ``4 (3T + 1) M``: ``T (u + w) + (T - 1) tr + start + end <= (3T + 1) M`` is `Chain._score_bound`
   without its sum of magnitudes (which could itself overflow), and 4 is its margin (an oracle forms differences of
   two bounded sums, plus rounding). Where the bound passes the compute dtype's largest value it takes the smallest
   ``s`` with ``4 (3T + 1) M 2**-s`` within it, and runs on the potentials times ``2**-s``: exact (a power of two),
   so the labelling and the sums are those of the dtype's arithmetic with an unbounded exponent, and the results are
   scaled back by ``2**s``. An oracle value or hinge the dtype cannot hold becomes an honest +-inf (the CPU raises an
   OverflowError; a device cannot without a read).

One ``s`` serves the whole call (the transitions are shared, and the GPU-wide Viterbi kernel reads one transition
tile for a block of sequences): one example's huge potentials or loss weight scale the others' too, whose entries
below ``2**(s - 126)`` in float32 then lose bits to subnormals, far below the rounding of the sums that needed the
scale. Far from the limits ``s = 0`` and every value is bitwise what the unguarded kernels give. All this holds for
finite potentials and valid labels, lengths and weights; NaN and inf inputs propagate as they did (``s`` is 0 where
``M`` is not finite). ``s`` is at most `MAX_SHIFT`: potentials alone never need more than ``log2(4 (3T + 1)) + 1``
bits of scaling; past that only a loss weight drives the bound, and the hinge is +inf anyway.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

# The bound kernel: at most this many programs, each reducing at least _CHUNK unary entries; a consumer reduces
# their partials in one load of next_power_of_2(P) entries per column.
_PROGRAMS = 256
_CHUNK = 4096
_BLOCK = 1024
MAX_SHIFT = tl.constexpr(64)


class ChainGuard(NamedTuple):
    """What a guarded kernel takes: ``parts`` (4 P float64 partial maxima, `chain_guard_partials`), ``programs`` (P)
    and ``T``, the padded length the bound counts."""

    parts: torch.Tensor
    programs: int
    T: int

    def limit(self, dtype: torch.dtype) -> float:
        """``log2(max of dtype) - log2(4 (3T + 1))``: the largest ``log2 M`` that needs no scaling, computed on the
        host (T may be 1, which Triton would make a constant of, and ``4 (3T + 1)`` is not an int32 for every T),
        passed to every consumer alike so that they all find the same ``s``."""
        return math.log2(torch.finfo(dtype).max) - math.log2(4 * (3 * self.T + 1))

    def block(self) -> int:
        """The consumers' `guard_shift` ``BLOCK_P`` (a constexpr)."""
        return triton.next_power_of_2(self.programs)


@triton.jit
def _abs_max(ptr, begin, end, BLOCK: tl.constexpr, stride=1):
    """``max |ptr[i * stride]|`` over ``begin <= i < end`` in float64 (0 for an empty range; the maximum skips NaN
    entries)."""
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for i0 in range(begin, end, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.abs(tl.load(ptr + i * stride, mask=i < end, other=0.0).to(tl.float64)))
    return tl.max(acc, axis=0)


@triton.jit
def _chain_bound_kernel(unary_ptr, trans_ptr, start_ptr, end_ptr, lw_ptr, cw_ptr, part_ptr,
                        n_unary, n_trans, chunk_u, chunk_t, K, n_lw, lw_sb, lw_value,
                        HAS_START: tl.constexpr, HAS_END: tl.constexpr, HAS_CW: tl.constexpr,
                        LW_TENSOR: tl.constexpr, BLOCK: tl.constexpr):
    """Program p: ``part[0, p] = max |unary|`` over its chunk, ``part[1, p] = max |transition|`` over its chunk;
    program 0 also ``part[2, 0] = max(max |start|, max |end|)`` and ``part[3, 0] = max loss_weight x max
    class_weight``; the other programs write 0 there."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    u0 = p.to(tl.int64) * chunk_u
    t0 = p.to(tl.int64) * chunk_t
    tl.store(part_ptr + p, _abs_max(unary_ptr, u0, tl.minimum(u0 + chunk_u, n_unary), BLOCK))
    tl.store(part_ptr + P + p, _abs_max(trans_ptr, t0, tl.minimum(t0 + chunk_t, n_trans), BLOCK))
    se = tl.cast(0.0, tl.float64)
    aug = tl.cast(0.0, tl.float64)
    if p == 0:
        if HAS_START:
            se = _abs_max(start_ptr, 0, K, BLOCK)
        if HAS_END:
            se = tl.maximum(se, _abs_max(end_ptr, 0, K, BLOCK))
        if LW_TENSOR:
            aug = _abs_max(lw_ptr, 0, n_lw, BLOCK, lw_sb)
        else:
            aug = tl.abs(tl.cast(lw_value, tl.float64))
        if HAS_CW:
            aug = aug * _abs_max(cw_ptr, 0, K, BLOCK)
    tl.store(part_ptr + 2 * P + p, se)
    tl.store(part_ptr + 3 * P + p, aug)


@triton.jit
def guard_shift(part_ptr, P, limit, BLOCK_P: tl.constexpr):
    """The guard's exponent s (int32, ``0 <= s <= MAX_SHIFT``) from `chain_guard_partials`' ``P`` partials: the
    smallest with ``log2 M - s <= limit`` (`ChainGuard.limit`: ``4 (3T + 1) M 2**-s`` within the compute dtype's
    largest value), 0 where the bound fits or ``M`` is not finite."""
    i = tl.arange(0, BLOCK_P)
    m = i < P
    M = tl.max(tl.load(part_ptr + i, mask=m, other=0.0), axis=0)
    M = tl.maximum(M, tl.max(tl.load(part_ptr + P + i, mask=m, other=0.0), axis=0))
    M = tl.maximum(M, tl.max(tl.load(part_ptr + 2 * P + i, mask=m, other=0.0), axis=0))
    M = tl.maximum(M, tl.max(tl.load(part_ptr + 3 * P + i, mask=m, other=0.0), axis=0))
    x = tl.log2(M) - limit
    ok = (x > 0) & (x < 1e30)  # False for log2(0) = -inf, an infinite or NaN bound
    x = tl.minimum(tl.where(ok, x, 0.0), MAX_SHIFT)
    t = x.to(tl.int32)  # x >= 0: truncation is the floor
    return tl.where(ok, t + (x > t).to(tl.int32), 0)  # the ceiling


@triton.jit
def pow2(e):
    """``2**e`` exactly, in float64, from the exponent's bits (``|e| <= 1022``; a cast to float32 stays exact for
    ``|e| <= 126``)."""
    return ((e.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


def loss_weight_arg(loss_weight, device):
    """``(loss_weight, is_tensor)`` as a kernel takes it: a number that float32 holds exactly stays a number (a
    Triton float argument is float32); any other number becomes a ``(1,)`` float64 tensor on ``device``, and a
    0-dim tensor a ``(1,)`` view."""
    if not isinstance(loss_weight, torch.Tensor):
        x = float(loss_weight)
        if float(torch.tensor(x, dtype=torch.float32)) == x:
            return x, False
        return torch.full((1,), x, dtype=torch.float64, device=device), True
    return (loss_weight.view(1) if loss_weight.dim() == 0 else loss_weight), True


def chain_guard_partials(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                         end: Optional[torch.Tensor], loss_weight=0.0,
                         class_weights: Optional[torch.Tensor] = None) -> ChainGuard:
    """The guard's partial maxima of chain potentials, in one launch and without a host read.

    Args:
        unary ``(B, T, K)``, transition ``(K, K)`` or ``(B, T-1, K, K)``, start, end ``(K,)`` or None: any float
            dtypes.
        loss_weight: a number or a ``(B,)`` / ``(1,)`` tensor: the Hamming weights a consumer adds to the unary
            (0: none, or the unary is augmented already).
        class_weights: ``(K,)`` on the device, or None.
    """
    dev = unary.device
    unary, transition = unary.contiguous(), transition.contiguous()
    P = max(1, min(_PROGRAMS, triton.cdiv(max(unary.numel(), transition.numel()), _CHUNK)))
    parts = torch.empty(4 * P, dtype=torch.float64, device=dev)
    loss_weight, lw_tensor = loss_weight_arg(loss_weight, dev)
    n_lw = loss_weight.shape[0] if lw_tensor else 0
    _chain_bound_kernel[(P,)](
        unary, transition, unary if start is None else start.contiguous(), unary if end is None else end.contiguous(),
        loss_weight if lw_tensor else parts, parts if class_weights is None else class_weights.contiguous(), parts,
        unary.numel(), transition.numel(), triton.cdiv(unary.numel(), P), triton.cdiv(transition.numel(), P),
        unary.shape[2], n_lw, loss_weight.stride(0) if lw_tensor and n_lw else 0,
        0.0 if lw_tensor else float(loss_weight),
        HAS_START=start is not None, HAS_END=end is not None, HAS_CW=class_weights is not None, LW_TENSOR=lw_tensor,
        BLOCK=_BLOCK, num_warps=4)
    return ChainGuard(parts, P, unary.shape[1])
