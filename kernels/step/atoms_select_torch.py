"""The BCFW step's choice of atoms on a device: the cache test and the away atom; the torch twin of
`select_atoms_triton`. Store layout and rules: `torchssvm.optim.frank_wolfe.atoms.AtomStore` and `torchssvm.optim.BCFW`.

Per block b of a mini-batch, from the scores ``a_H (B, C)`` of its cached labellings (``H_i(y; w)``, slot 0 the
truth) and the oracle's answer for the whole batch:

- cache test (the hit criterion of Osokin et al., 2016): the best cached atom ``best = argmax_{used} a_H``;
  a hit when ``g_hat = (base + a_H[best]) / n - ell >= max(factor * gaps[i], floor)``; the FW atom is the best
  cached atom on a hit, the oracle's labelling otherwise (its ``H`` clamped at 0), and a miss refreshes the block gap
  ``gaps[i] = (base + H) / n - ell`` (in place) and counts in ``misses`` (a 0-dim device counter, in place);
- away atom (pairwise / away steps): ``argmin a_H`` over the active atoms (``alpha > 0``), with its ``H``,
  weight, labels and loss.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def select_atoms_torch(a_H: torch.Tensor, count: torch.Tensor, a_labels: torch.Tensor, a_loss: torch.Tensor,
                       a_alpha: torch.Tensor, idx: torch.Tensor, base: torch.Tensor, ell: torch.Tensor,
                       gaps: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor, H: torch.Tensor, n: int,
                       factor: Optional[float], floor: float, misses: Optional[torch.Tensor], away: bool):
    """Args:
        a_H, a_loss, a_alpha: ``(B, C)`` float64; a_labels ``(B, C, W)`` long.
        count ``(n,)``: the store's atoms per block (slot j of block i is used iff ``j < count[i]``).
        idx ``(B,)``: the blocks; base, ell ``(B,)``: ``<theta_i, z_i>`` and ``l_i``; gaps ``(n,)``: the block
        gaps (updated in place for the misses).
        labels ``(B, W)``, loss, H ``(B,)``: the oracle's answer for every block.
        n: the number of blocks; factor, floor: the cache test's ``F`` and ``nu / n * g_global`` (``factor``
        None: no cache, every block takes the oracle's answer); misses: the counter of cache misses.
        away: whether to find the away atoms.

    Returns ``(s_labels (B, W), s_loss (B,), s_H (B,), away)`` with ``away`` None or ``(slot (B,), H (B,),
    alpha (B,), labels (B, W), loss (B,))``."""
    H = H.clamp_min(0)
    used = used_slots(count, idx, a_H.shape[1])
    if factor is None:
        s_labels, s_loss, s_H = labels, loss, H
        gaps[idx] = (base + H) / n - ell
    else:
        rows = torch.arange(a_H.shape[0], device=a_H.device)
        hit, best, best_H = cache_test_torch(a_H, used, base, ell, gaps[idx], n, factor, floor)
        s_labels = torch.where(hit.unsqueeze(1), a_labels[rows, best], labels)
        s_loss = torch.where(hit, a_loss[rows, best], loss)
        s_H = torch.where(hit, best_H, H)
        gaps[idx] = torch.where(hit, gaps[idx], (base + H) / n - ell)
        misses += (~hit).sum()
    return s_labels, s_loss, s_H, (away_atoms_torch(a_H, used, a_alpha, a_labels, a_loss) if away else None)


def used_slots(count: torch.Tensor, idx: torch.Tensor, C: int) -> torch.Tensor:
    """``(B, C)`` bool: slot j of block ``idx[b]`` holds an atom (``j < count[idx[b]]``)."""
    return torch.arange(C, device=idx.device).unsqueeze(0) < count[idx].unsqueeze(1)


def cache_test_torch(a_H: torch.Tensor, used: torch.Tensor, base: torch.Tensor, ell: torch.Tensor,
                     gaps_idx: torch.Tensor, n: int, factor: float, floor: float):
    """The cache test of Osokin et al. (2016), from the blocks' gaps ``gaps_idx (B,)``: ``(hit (B,) bool, best (B,),
    best_H (B,))``, the best cached atom (the first of equal scores) and its score. A block never visited
    (``gap = inf``) misses, for any ``factor`` (``0 * inf`` would be NaN)."""
    best_H, best = a_H.masked_fill(~used, -math.inf).max(1)
    hit = ((base + best_H) / n - ell >= (factor * gaps_idx).clamp_min(floor)) & (gaps_idx < math.inf)
    return hit, best, best_H


def away_atoms_torch(a_H: torch.Tensor, used: torch.Tensor, a_alpha: torch.Tensor, a_labels: torch.Tensor,
                     a_loss: torch.Tensor):
    """The away atom of each block: ``argmin a_H`` over its active atoms (``used`` and ``alpha > 0``; the first of
    equal scores). Returns ``(slot (B,), H (B,), alpha (B,), labels (B, W), loss (B,))``."""
    rows = torch.arange(a_H.shape[0], device=a_H.device)
    away_H, slot = a_H.masked_fill(~((a_alpha > 0) & used), math.inf).min(1)
    return slot, away_H, a_alpha[rows, slot], a_labels[rows, slot], a_loss[rows, slot]
