"""The device sampler's keys as torch operations on any device (the twin of `sampling_triton`): counter-based
uniforms (SplitMix64 of ``seed`` and ``counter * n + i``) and the three-tier Gumbel keys of gap sampling, whose ``B``
largest are BCFW's draw. The sampler and its law: ``optim.frank_wolfe.device_sampling``.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """The int64 with the bits of the unsigned 64-bit ``x``."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_SEED_MIX = _signed(0xD1B54A32D192ED03)


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` on int64 is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 output function on int64 tensors (wrapping arithmetic, bit for bit the unsigned one): a
    bijection of the 64-bit values that spreads every input bit over the output (Steele, Lea and Flood, 2014)."""
    z = x + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def uniform(seed: int, counter, n: int, device) -> torch.Tensor:
    """``(n,)`` float64 uniforms in (0, 1) of draw ``counter`` (an int, or a 0-dim int64 tensor on ``device``, which
    a captured CUDA graph reads at each replay) of generator ``seed``, computed on ``device``:
    ``u_i = (top 52 bits of splitmix64(seed * c + counter * n + i) + 1/2) / 2^52``, in [2^-53, 1 - 2^-53] exactly
    (53 bits plus a half would round the largest to 1, and its Gumbel variable to +inf). No host work beyond the
    launches; the same values on every device."""
    if isinstance(counter, torch.Tensor):
        base = counter * n + _signed(seed * _SEED_MIX)
    else:
        base = _signed(_signed(seed * _SEED_MIX) + counter * n)
    bits = splitmix64(torch.arange(n, dtype=torch.int64, device=device) + base)
    return (_shift_right(bits, 12).to(torch.float64) + 0.5) * 2.0 ** -52


def _gumbel_of(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel variables ``-log(-log u)`` of uniforms ``u``."""
    return -torch.log(-torch.log(u))


def gumbel(seed: int, counter: int, n: int, device) -> torch.Tensor:
    """``(n,)`` standard Gumbel variables of `uniform`'s draw."""
    return _gumbel_of(uniform(seed, counter, n, device))


# Key offsets of the tiers: the Gumbel keys of positive gaps lie within about +-800 (log of float64's range plus
# the Gumbel draw, which is in [-3.6, 37] for these uniforms), far from both.
_UNSEEN = 1.0e6
_ZERO = -1.0e6


def sampling_keys_torch(gaps, first_rank, seed: int, counter, n: int, device) -> torch.Tensor:
    """``(n,)`` float64 keys of draw ``counter`` (an int, or a 0-dim int64 tensor on ``device``): the uniforms of
    `uniform` for uniform sampling (``gaps`` None), else the tiered keys of gap sampling: ``_UNSEEN + (n - rank)``
    for a block never seen (gap ``+inf``), ``log gap + G`` for a positive gap, ``_ZERO + G`` for the rest
    (``G = -log(-log u)``)."""
    u = uniform(seed, counter, n, device)
    if gaps is None:
        return u
    g = _gumbel_of(u)
    positive = gaps > 0
    # log of a non-positive gap is -inf or NaN: those rows take the last tier's key, so nothing NaN reaches topk
    keys = torch.where(positive, torch.log(torch.where(positive, gaps, 1.0)) + g, _ZERO + g)
    return torch.where(torch.isposinf(gaps), _UNSEEN + (n - first_rank), keys)
