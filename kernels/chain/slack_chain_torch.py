"""Exact slack-rescaled oracle of a chain with Hamming loss, in plain torch (Choi et al., 2016).

``max_y Phi(y)``, ``Phi(y) = Delta(y*, y) (1 + s(y) - s(y*))``, does not decompose over the chain even
though ``s`` and ``Delta`` do. With a Hamming loss that charges the same cost ``c`` for every wrong
position (``c = 1/L`` normalized, or 1), ``Delta = c e(y)`` depends on ``y`` only through the number of
errors ``e(y)``, so

    max_y Phi(y) = max_e  c e (1 + S_e - s(y*)),     S_e = max_{y : e(y) = e} s(y),

and every ``S_e`` comes from one Viterbi pass over the augmented state (position, label, errors so
far): a wrong label moves the error count up by one. The state has ``T + 1`` error counts, so the cost
is ``O(T^2 K^2)`` per sequence against Viterbi's ``O(T K^2)`` (about ``T / 2`` times more work, the
same number of sequential steps: step t only touches the ``t + 1`` reachable counts, which halves it).
Exact, with the Viterbi twin's tie rule (smallest index) in every argmax
and the smallest error count among equally violating ones (``e = 0``, the truth, when nothing violates).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

# Above this many stored forward scores (T, B, T+1, K) the batch is processed in chunks.
_MAX_HISTORY_ELEMENTS = 1 << 25


def slack_viterbi_torch(
    unary: torch.Tensor,
    transition: torch.Tensor,
    start: Optional[torch.Tensor],
    end: Optional[torch.Tensor],
    lengths: torch.Tensor,
    target: torch.Tensor,
    cost: torch.Tensor,
    target_score: torch.Tensor,
    margin=1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Most violating labelling under slack rescaling.

    Args:
        unary ``(B, T, K)``, transition ``(K, K)`` or ``(B, T-1, K, K)``, start / end ``(K,)`` or None,
        lengths ``(B,)``: the chain potentials (see `viterbi_torch`).
        target: ``(B, T)`` true labels (padding ignored).
        cost: ``(B,)`` loss of one wrong position (``1 / length`` for the normalized Hamming loss).
        target_score: ``(B,)`` ``s(y*)``.
        margin: the 1 of ``1 + s(y) - s(y*)``: the overflow guard passes ``2**-s`` (a number or a 0-dim tensor on
            the device) with the potentials times ``2**-s``, for ``Phi`` at ``2**-s`` of its size.

    Returns:
        labels ``(B, T)`` long (-1 padded) and ``value (B,)`` = ``max(0, max_y Phi(y))`` (the truth,
        with ``Phi = 0``, is returned when no labelling has ``Phi > 0``).
    """
    B, T, K = unary.shape
    per_step = T * (T + 1) * K
    if B > 1 and B * per_step > _MAX_HISTORY_ELEMENTS:
        chunk = max(1, _MAX_HISTORY_ELEMENTS // per_step)
        parts = [
            slack_viterbi_torch(unary[s : s + chunk],
                                transition[s : s + chunk] if transition.dim() == 4 else transition, start, end,
                                lengths[s : s + chunk], target[s : s + chunk], cost[s : s + chunk],
                                target_score[s : s + chunk], margin)
            for s in range(0, B, chunk)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    E = T + 1
    dev, dt = unary.device, unary.dtype
    per_position = transition.dim() == 4
    y = target.clamp_min(0)
    hit = torch.nn.functional.one_hot(y, K).bool()  # (B, T, K): label k is the truth at t
    neg = torch.full((), -torch.inf, dtype=dt, device=dev)  # a fill on the device, not a copy from the host
    a0 = unary[:, 0] + start if start is not None else unary[:, 0]
    alpha = torch.full((B, E, K), -torch.inf, dtype=dt, device=dev)
    alpha[:, 0] = torch.where(hit[:, 0], a0, neg)
    alpha[:, 1] = torch.where(hit[:, 0], neg, a0)  # E = T + 1 >= 2
    hist = [alpha]
    pad = alpha.new_full((B, 1, K), -torch.inf)
    for t in range(1, T):
        # positions 0..t-1 hold at most t errors: only counts 0..t are reachable (half the work overall)
        tr = transition[:, t - 1].unsqueeze(1) if per_position else transition  # (B, 1, K, K) or (K, K)
        m = torch.amax(alpha[:, : t + 1].unsqueeze(3) + tr, dim=2)  # (B, t+1, K): best previous label
        stay = torch.cat([m, pad], 1)  # the true label: same error count
        up = torch.cat([pad, m], 1)  # a wrong label: e - 1 -> e
        step = torch.where(hit[:, t].unsqueeze(1), stay, up) + unary[:, t].unsqueeze(1)  # (B, t+2, K)
        new = alpha.new_full((B, E, K), -torch.inf)
        new[:, : t + 2] = step
        alpha = torch.where((lengths > t).view(B, 1, 1), new, alpha)
        hist.append(alpha)
    final = alpha + end if end is not None else alpha
    best, last = final.max(2)  # S_e and its last label, (B, E)
    errors = torch.arange(E, device=dev, dtype=dt)
    one = margin.to(dt) if isinstance(margin, torch.Tensor) else margin
    phi = cost.to(dt).unsqueeze(1) * errors * (one + best - target_score.to(dt).unsqueeze(1))
    phi = torch.where(torch.isfinite(best), phi, neg)
    phi[:, 0] = 0.0  # e = 0 is the truth itself
    value, e = phi.max(1)  # first maximum: the smallest error count
    labels = _backtrack(hist, transition, y, lengths, e, last.gather(1, e.unsqueeze(1)).squeeze(1))
    # nothing violates: the truth itself (walking back could leave it where every score is -inf)
    inside = torch.arange(T, device=dev) < lengths.unsqueeze(1)
    return torch.where((e == 0).unsqueeze(1) & inside, y, labels), value


def _backtrack(hist, transition, y, lengths, e, cur):
    """Labels ``(B, T)`` (-1 padded) walking back from the last label ``cur`` with ``e`` errors."""
    B, T = y.shape
    per_position = transition.dim() == 4
    batch = torch.arange(B, device=y.device)
    out = torch.full((B, T), -1, dtype=torch.long, device=y.device)
    out[batch, lengths - 1] = cur
    for t in range(T - 1, 0, -1):
        active = lengths > t  # position t is inside the sequence: step back to t - 1
        e_prev = e - (cur != y[:, t]).long()
        col = transition[batch, t - 1, :, cur] if per_position else transition[:, cur].t()  # (B, K)
        prev = (hist[t - 1][batch, e_prev.clamp_min(0)] + col).argmax(1)
        e = torch.where(active, e_prev, e)
        cur = torch.where(active, prev, cur)
        out[:, t - 1] = torch.where(active, cur, out[:, t - 1])
    return out
