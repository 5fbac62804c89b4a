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

from ...kernels import sampling_keys
from ...kernels.step.sampling_torch import gumbel, uniform

__all__ = ["uniform", "gumbel", "sample_uniform", "sample_gap"]


def sample_uniform(seed: int, counter, n: int, B: int, device, backend: str = "auto") -> torch.Tensor:
    """``B`` distinct blocks of ``range(n)`` uniformly at random, ``(B,)`` long on ``device``: the ``B`` largest of
    draw ``counter``'s uniforms (`kernels.sampling_keys`; ``backend``: its torch or Triton form)."""
    return _largest(sampling_keys(None, None, seed, counter, n, device, backend=backend), B)


def sample_gap(gaps: torch.Tensor, first_rank: torch.Tensor, seed: int, counter, B: int,
               backend: str = "auto") -> torch.Tensor:
    """``B`` distinct blocks, ``(B,)`` long on the device of ``gaps``, drawn as the host sampler of BCFW draws them.

    Args:
        gaps: ``(n,)`` gap estimates; ``+inf`` marks a block never seen.
        first_rank: ``(n,)`` float64 position of each block in the solver's first-visit permutation.
        seed, counter: the generator and the draw (`uniform`).
        B: blocks to draw, ``<= n``.
        backend: the keys' form (`kernels.sampling_keys`: torch, or one Triton launch on CUDA).

    Unseen blocks come first, in first-visit order; then Gumbel-top-k on the positive gaps (draws without
    replacement proportional to the gaps); then blocks whose gap is <= 0, uniformly."""
    return _largest(sampling_keys(gaps, first_rank, seed, counter, gaps.shape[0], gaps.device, backend=backend), B)


def _largest(keys: torch.Tensor, B: int) -> torch.Tensor:
    """The positions of the ``B`` largest ``keys``, ``(B,)`` long (one launch: an argmax for one)."""
    if B == 1:
        return keys.argmax().view(1)
    return torch.topk(keys, B, sorted=False).indices
