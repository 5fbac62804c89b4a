"""Block sampling on the device, without the host: a counter-based generator and Gumbel-top-k.

BCFW draws ``B`` distinct blocks per step, uniformly or with probabilities proportional to their gap estimates
(Osokin et al., ICML 2016, Alg. 2). Drawn on the host, as `torch.multinomial` over a copy of the gaps, every step
waits for the device. Here the draw is whole-tensor device work:

- **Random numbers** come from a counter-based generator (the SplitMix64 finalizer of Steele, Lea and Flood,
  OOPSLA 2014, applied to ``seed`` and ``counter * n + i``): the draw of step ``counter`` is a pure function of
  ``(seed, counter)``, the same bits on every device, and the state is two integers on the host.
- **Sampling without replacement proportionally to weights** is Gumbel-top-k (Kool, van Hoof and Welling, ICML
  2019, eq. 1-3): the ``B`` largest keys ``log w_i + G_i`` (``G_i`` standard Gumbel) are distributed as ``B``
  successive draws without replacement with probabilities ``w_i / sum w`` -- the law of `torch.multinomial` with
  ``replacement=False``.

The keys of gap sampling rank three tiers, as the host sampler does: blocks never seen (gap ``+inf``) first, in
the solver's random first-visit order; then blocks with a positive gap, by Gumbel-top-k on their gaps; then the
rest (gap <= 0) uniformly.
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


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 output function on int64 tensors (wrapping arithmetic, bit for bit the unsigned one)."""
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
    bits = _splitmix64(torch.arange(n, dtype=torch.int64, device=device) + base)
    return (_shift_right(bits, 12).to(torch.float64) + 0.5) * 2.0 ** -52


def gumbel(seed: int, counter: int, n: int, device) -> torch.Tensor:
    """``(n,)`` standard Gumbel variables ``-log(-log u)`` from `uniform`."""
    return -torch.log(-torch.log(uniform(seed, counter, n, device)))


# Key offsets of the tiers: the Gumbel keys of positive gaps lie within about +-800 (log of float64's range plus
# the Gumbel draw, which is in [-3.6, 37] for these uniforms), far from both.
_UNSEEN = 1.0e6
_ZERO = -1.0e6


def sample_uniform(seed: int, counter: int, n: int, B: int, device) -> torch.Tensor:
    """``B`` distinct blocks of ``range(n)`` uniformly at random, ``(B,)`` long on ``device``."""
    u = uniform(seed, counter, n, device)
    if B == 1:
        return u.argmax().view(1)
    return torch.topk(u, B, sorted=False).indices


def sample_gap(gaps: torch.Tensor, first_rank: torch.Tensor, seed: int, counter: int, B: int) -> torch.Tensor:
    """``B`` distinct blocks, ``(B,)`` long on the device of ``gaps``, drawn as the host sampler of BCFW draws them.

    Args:
        gaps: ``(n,)`` gap estimates; ``+inf`` marks a block never seen.
        first_rank: ``(n,)`` float64 position of each block in the solver's first-visit permutation.
        seed, counter: the generator and the draw (`uniform`).
        B: blocks to draw, ``<= n``.

    Unseen blocks come first, in first-visit order; then Gumbel-top-k on the positive gaps (draws without
    replacement proportional to the gaps); then blocks whose gap is <= 0, uniformly."""
    n = gaps.shape[0]
    g = gumbel(seed, counter, n, gaps.device)
    positive = gaps > 0
    # log of a non-positive gap is -inf or NaN: those rows take the last tier's key, so nothing NaN reaches topk
    keys = torch.where(positive, torch.log(torch.where(positive, gaps, 1.0)) + g, _ZERO + g)
    keys = torch.where(torch.isposinf(gaps), _UNSEEN + (n - first_rank), keys)
    if B == 1:
        return keys.argmax().view(1)
    return torch.topk(keys, B, sorted=False).indices
