"""The end of a mini-batch BCFW step: move the chosen blocks along their directions and update their explicit
duals; the torch twin of `apply_block_step_triton`. Rules: `torchssvm.optim.BCFW` (Osokin et al., 2016, and
docs/design.md, "The exact mini-batch step").

For each block ``b`` of the batch, block ``i = idx[b]`` with step size ``gamma[b]``:

- ``z[i] = z_i + gamma d_b`` and ``l[i] = l_i + gamma dl_b`` (the block's dual variables, docs/design.md);
- with an atom store, the weights ``alpha[i]`` of its atoms, when ``gamma != 0`` and ``alpha_valid[i]``:
  - FW step: ``alpha <- (1 - g) alpha + g e_s`` with ``g = min(gamma, 1)``;
  - pairwise step: mass ``gamma`` from the away atom ``a`` to the FW atom ``s``;
  - away step: ``alpha <- (1 + gamma) alpha - gamma e_a`` (``kind[b] = 2``), or a FW step (``kind[b] = 0``);
  - the away atom's weight is set to exactly 0 when ``gamma`` reaches its bound ``upper[b]`` (a drop step),
    and every weight is clamped at 0 against rounding.
"""

from __future__ import annotations

from typing import Optional

import torch

STEP_TYPES = ("fw", "pairwise", "away")


def apply_block_step_torch(z: torch.Tensor, ell: torch.Tensor, idx: torch.Tensor, zi: torch.Tensor,
                           ell_i: torch.Tensor, gamma: torch.Tensor, direction: torch.Tensor, d_ell: torch.Tensor,
                           alpha: Optional[torch.Tensor] = None, alpha_valid: Optional[torch.Tensor] = None,
                           step: str = "fw", s_slot: Optional[torch.Tensor] = None,
                           away: Optional[torch.Tensor] = None, upper: Optional[torch.Tensor] = None,
                           kind: Optional[torch.Tensor] = None) -> None:
    """In place on ``z (n, m)``, ``ell (n,)`` and, when given, ``alpha (n, C)``.

    Args:
        idx ``(B,)``: distinct blocks; zi ``(B, m)``, ell_i ``(B,)``: their current ``z`` and ``l``.
        gamma ``(B,)``: the step sizes; direction ``(B, m)``, d_ell ``(B,)``: the moves of ``z`` and ``l``.
        alpha ``(n, C)`` float64, alpha_valid ``(n,)`` bool: the atom store's weights and whether each block's
        are valid (None: no explicit duals).
        step: ``"fw"``, ``"pairwise"`` or ``"away"``; s_slot ``(B,)``: the FW atoms' slots; away ``(B,)``: the
        away atoms' slots, upper ``(B,)``: the step bounds (pairwise and away steps); kind ``(B,)``: 0 FW or
        2 away, per block of an away step."""
    z[idx] = zi + gamma.unsqueeze(1) * direction
    ell[idx] = ell_i + gamma * d_ell
    if alpha is None:
        return
    a = alpha[idx]
    s_col = s_slot.unsqueeze(1)
    if step == "fw":  # alpha <- (1 - gamma) alpha + gamma e_s (gamma = 1: e_s)
        g = gamma.clamp_max(1.0)
        out = ((1.0 - g).unsqueeze(1) * a).scatter_add_(1, s_col, g.unsqueeze(1))
    elif step == "pairwise":  # mass gamma from the away atom to the FW atom
        out = a.scatter_add(1, s_col, gamma.unsqueeze(1))
    else:  # per block, a FW step (kind 0) or an away step (kind 2): alpha <- (1 + gamma) alpha - gamma e_a
        fw = kind == 0
        g = gamma.clamp_max(1.0)
        scale = torch.where(fw, 1.0 - g, 1.0 + gamma)
        out = (scale.unsqueeze(1) * a).scatter_add_(1, s_col, torch.where(fw, g, 0.0).unsqueeze(1))
    if step != "fw":  # the away atom loses gamma (all of it at the bound)
        a_col = away.unsqueeze(1)
        at_away = out.gather(1, a_col).squeeze(1)
        moved = torch.where(gamma >= upper, 0.0, at_away - gamma)
        if step == "away":
            moved = torch.where(fw, at_away, moved)
        out.scatter_(1, a_col, moved.unsqueeze(1))
    change = (gamma != 0) & alpha_valid[idx]
    alpha[idx] = torch.where(change.unsqueeze(1), out.clamp_min(0.0), a)
