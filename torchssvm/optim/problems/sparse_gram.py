"""Gram matrix of sparse-attribute emission features, without building per-block ``D K`` vectors.

Block ``r`` of a sparse-feature chain has emission part ``E_r = sum_t x_{r,t} (outer) u_{r,t}``, a
``D x K`` matrix with ``x_{r,t}`` a sparse attribute vector (``A`` ids and values per token) and
``u_{r,t}`` the dense ``K``-vector of the block's unary marginals at position t. We need
``G_rs = <E_r, E_s>`` for a mini-batch (the curvature of the coordinated step, docs/design.md).

``E_r`` has a nonzero row only for the attributes the block's tokens carry, so we build its rows
``V_(r, a) = sum_{t: a in x_{r,t}} x_{r,t,a} u_{r,t}`` once per distinct (block, attribute) pair (one
sort and one ``index_add``), then ``G_rs = sum_a <V_(r, a), V_(s, a)>`` joins blocks on the attribute:

- attributes carried by at least ``dense_min`` blocks of the batch (frequent words, tags, shapes) are
  laid out densely, ``(R, F K)``, and contribute one matrix product;
- every other attribute contributes its few block pairs directly (``c^2`` dot products for an
  attribute carried by ``c`` blocks), processed in bounded chunks.

The split only moves work between an exact dense product and an exact gather; the result is the
same. Compared with a sparse ``(R, D K)`` COO matrix and a sparse-sparse product it sorts ``K`` times
fewer entries (one per token attribute, not per token attribute and label).
"""

from __future__ import annotations

from typing import Optional

import torch

# Elements of the pair products ``(pairs, K)`` materialized at once.
_PAIR_CHUNK_ELEMENTS = 1 << 23


def attribute_rows(ids: torch.Tensor, values: Optional[torch.Tensor], u: torch.Tensor,
                   index: Optional[torch.Tensor] = None):
    """The distinct (block, attribute) pairs of a batch and their rows ``V``.

    Args:
        ids: ``(R, T, A)`` long attribute ids, ``-1`` for absent (padding).
        values: ``(R, T, A)`` float attribute values, or None for all ones.
        u: ``(R, T, K)`` float, the per-token vectors (unary part of the block vectors).
        index: ``(R,)`` or None: ``ids`` and ``values`` are then a data set's ``(n, T', A)`` arrays (``T' >= T``)
            and block ``r`` is their row ``index[r]``.

    Returns ``(attr (P,), row (P,), V (P, K))`` sorted by attribute then block.
    """
    if index is not None:
        T = u.shape[1]
        ids = ids[index][:, :T]
        values = None if values is None else values[index][:, :T]
    R, T, A = ids.shape
    K = u.shape[2]
    # only tokens whose vector is nonzero contribute (few in a FW direction: positions where labellings differ)
    present = (ids >= 0) & (u != 0).any(2).unsqueeze(2)
    flat = present.reshape(-1).nonzero().squeeze(1)
    attr = ids.reshape(-1)[flat]
    row = flat // (T * A)
    token = flat // A  # index into the (R T) tokens
    keys, inverse = torch.unique(attr * R + row, return_inverse=True)
    contrib = u.reshape(R * T, K).index_select(0, token)
    if values is not None:
        contrib = contrib * values.reshape(-1)[flat].unsqueeze(1).to(u.dtype)
    V = torch.zeros(keys.shape[0], K, dtype=u.dtype, device=u.device).index_add_(0, inverse, contrib)
    return keys // R, keys % R, V


def sparse_emission_gram(ids: torch.Tensor, values: Optional[torch.Tensor], u: torch.Tensor,
                         dense_min: Optional[int] = None, rows=None, index: Optional[torch.Tensor] = None
                         ) -> torch.Tensor:
    """``G (R, R)`` with ``G_rs = <E_r, E_s>`` (see the module docstring; same arguments as
    `attribute_rows`). ``dense_min``: attributes carried by at least this many blocks go through the
    dense product (default ``max(2, R // 8)``). ``rows``: the output of `attribute_rows` for these
    arguments, if the caller already has it."""
    R = u.shape[0]
    if dense_min is None:
        dense_min = max(2, R // 8)
    attr, row, V = attribute_rows(ids, values, u, index) if rows is None else rows
    K = V.shape[1]
    G = torch.zeros(R, R, dtype=u.dtype, device=u.device)
    if attr.numel() == 0:
        return G
    _, counts = torch.unique_consecutive(attr, return_counts=True)
    per_entry = counts.repeat_interleave(counts)
    dense = per_entry >= dense_min
    if bool(dense.any()):
        group_dense = counts >= dense_min
        column = (torch.cumsum(group_dense, 0) - 1).repeat_interleave(counts)[dense]
        F = int(group_dense.sum())
        Vd = torch.zeros(R, F, K, dtype=V.dtype, device=V.device)
        Vd[row[dense], column] = V[dense]
        Vd = Vd.view(R, F * K)
        G += Vd @ Vd.T
    rare = ~dense
    if bool(rare.any()):
        # each block's own attributes (the diagonal), then the off-diagonal pairs of shared ones
        G.diagonal().index_add_(0, row[rare], (V[rare] * V[rare]).sum(1))
        shared = rare & (per_entry > 1)
        if bool(shared.any()):
            _pairs_into(G, row, V, counts, per_entry, shared)
    return G


def _pairs_into(G, row, V, counts, per_entry, shared):
    """``G[row_i, row_j] += <V_i, V_j>`` for every ordered pair ``i != j`` of ``shared`` entries with the
    same attribute (entries are grouped by attribute; ``counts`` are the group sizes)."""
    R, K = G.shape[0], V.shape[1]
    group_start = (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)
    entries = shared.nonzero().squeeze(1)
    c = per_entry[entries]
    total = int(c.sum())
    step = max(1, _PAIR_CHUNK_ELEMENTS // K)
    first = torch.cumsum(c, 0) - c  # offset of each entry's pair list
    for s in range(0, total, step):
        k = torch.arange(s, min(s + step, total), device=G.device)
        owner = torch.searchsorted(first, k, right=True) - 1
        i = entries[owner]
        j = group_start[i] + (k - first[owner])
        keep = i != j
        i, j = i[keep], j[keep]
        G.view(-1).index_add_(0, row[i] * R + row[j], (V[i] * V[j]).sum(1))


def sparse_emission_sqnorm(ids: torch.Tensor, values: Optional[torch.Tensor], u: torch.Tensor,
                           rows=None, index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(R,)``: ``||E_r||^2``, the diagonal of `sparse_emission_gram` (no block pairs); ``rows`` and ``index`` as
    there."""
    _, row, V = attribute_rows(ids, values, u, index) if rows is None else rows
    out = torch.zeros(u.shape[0], dtype=u.dtype, device=u.device)
    return out.index_add_(0, row, (V * V).sum(1))


def add_attribute_rows(E: torch.Tensor, rows, coef: torch.Tensor) -> None:
    """``E[attr[p]] += V[p] coef[row[p]]`` in place, for the rows ``(attr, row, V)`` of `attribute_rows`: the emission
    part of ``w += Phi^T coef``, one row per distinct (block, attribute) pair."""
    attr, row, V = rows
    E.index_add_(0, attr, V * coef[row].unsqueeze(1))
