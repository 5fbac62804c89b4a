"""One-hot factor marginals of chain labellings, flat; the torch twin of `chain_marginals_triton`.

Layout of a row (size ``m = T K + K^2 + 2 K``): ``[unary (T, K) | transition counts (K, K) | start (K) | end (K)]``,
the block vectors of the chain SSVM's dual (`torchssvm.optim.ChainProblem`).
"""

from __future__ import annotations

from typing import Optional

import torch


def chain_marginals_torch(labels: torch.Tensor, lengths: torch.Tensor, num_labels: int,
                          minus: Optional[torch.Tensor] = None, dtype=torch.float64) -> torch.Tensor:
    """``m(y)`` ``(B, m)`` of labellings ``labels (B, T)`` padded with -1 past ``lengths (B,)``; with ``minus``
    (``(B, T)``, the same lengths), ``m(y) - m(y')``. Entries are counts, so exact in any float dtype."""
    B, T = labels.shape
    K = num_labels
    a, b, c = T * K, T * K + K * K, T * K + K * K + K
    ys = labels if minus is None else torch.cat([labels, minus], 1)  # (B, T) or (B, 2T)
    n_lab = 1 if minus is None else 2
    sign = torch.ones(B, n_lab, 1, dtype=dtype, device=labels.device)
    if minus is not None:
        sign[:, 1] = -1.0
    valid = (ys >= 0).view(B, n_lab, T)
    yc = ys.clamp_min(0).view(B, n_lab, T)
    vs = valid * sign  # (B, n_lab, T) signed weights
    offs = torch.arange(T, device=labels.device) * K
    cols = [(yc + offs).view(B, n_lab * T)]
    vals = [vs.view(B, n_lab * T)]
    if T > 1:
        cols.append((a + yc[:, :, :-1] * K + yc[:, :, 1:]).reshape(B, n_lab * (T - 1)))  # not -1: B may be 0
        vals.append(vs[:, :, 1:].reshape(B, n_lab * (T - 1)))
    last = yc.gather(2, (lengths - 1).view(B, 1, 1).expand(B, n_lab, 1)).squeeze(2)
    cols += [b + yc[:, :, 0], c + last]
    vals += [sign.squeeze(2), sign.squeeze(2)]
    out = torch.zeros(B, T * K + K * K + 2 * K, dtype=dtype, device=labels.device)
    return out.scatter_add_(1, torch.cat(cols, 1), torch.cat(vals, 1))
