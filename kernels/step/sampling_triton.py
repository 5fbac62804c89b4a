"""The device sampler's keys as one Triton kernel: twin of `sampling_torch.sampling_keys_torch`, where the torch ops
take about twenty launches for the uniforms (the SplitMix64 finalizer on int64 tensors, its logical shifts as
shift-and-mask pairs) and about fifteen more for the gap tiers. The uniforms are the twin's bit for bit (integer
arithmetic, an exact conversion); the keys of gap sampling go through ``log`` twice, which may round otherwise than
torch's on the same device, so a draw can differ only where two keys tie to the last bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sampling_torch import _SEED_MIX, _UNSEEN, _ZERO, _signed

_BLOCK = 1024


@triton.jit
def _splitmix64(x):
    """SplitMix64's output function on uint64 (wrapping arithmetic)."""
    z = x + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit(do_not_specialize=["base"])
def _sampling_keys_kernel(gaps_ptr, rank_ptr, counter_ptr, keys_ptr, n, base, seed_mix,
                          GAPS: tl.constexpr, COUNTER_ON_DEVICE: tl.constexpr, UNSEEN: tl.constexpr,
                          ZERO: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if COUNTER_ON_DEVICE:  # a CUDA graph's replay reads the draw number here
        start = tl.load(counter_ptr) * n + seed_mix
    else:
        start = base + i * 0
    bits = _splitmix64((i + start).to(tl.uint64, bitcast=True))
    u = ((bits >> 12).to(tl.float64) + 0.5) * 2.220446049250313e-16  # 2^-52
    if GAPS:
        gap = tl.load(gaps_ptr + i, mask=m, other=0.0)
        g = -tl.log(-tl.log(u))
        positive = gap > 0
        key = tl.where(positive, tl.log(tl.where(positive, gap, 1.0)) + g, ZERO + g)
        rank = tl.load(rank_ptr + i, mask=m, other=0.0)
        key = tl.where(gap == float("inf"), UNSEEN + (n - rank), key)
    else:
        key = u
    tl.store(keys_ptr + i, key, mask=m)


def sampling_keys_triton(gaps, first_rank, seed: int, counter, n: int, device) -> torch.Tensor:
    """`sampling_keys_torch` in one launch (see there for the contract)."""
    keys = torch.empty(n, dtype=torch.float64, device=device)
    seed_mix = _signed(seed * _SEED_MIX)
    on_device = isinstance(counter, torch.Tensor)
    base = 0 if on_device else _signed(seed_mix + counter * n)
    gap_args = (gaps.contiguous(), first_rank.contiguous()) if gaps is not None else (keys, keys)
    _sampling_keys_kernel[(triton.cdiv(n, _BLOCK),)](
        *gap_args, counter if on_device else keys, keys, n, base, seed_mix, GAPS=gaps is not None,
        COUNTER_ON_DEVICE=on_device, UNSEEN=_UNSEEN, ZERO=_ZERO, BLOCK=_BLOCK)
    return keys
