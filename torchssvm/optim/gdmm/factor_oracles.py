"""The factorwise maximization oracle (FMO) of GDMM for the bigram factors of a linear chain.

GDMM (Yen et al., NIPS 2016, "Dual decomposed learning with factorwise oracles") keeps the dual of each
bigram factor ``b`` over the ``K * K`` label pairs as a sparse active set and asks, per factor, for

    argmax over (k1, k2) not in exclude[b]  of  g_b(k1, k2) = v[k1, k2] + rho * (mL[b, k1] + mR[b, k2])

with ``v (K, K)`` a score table shared by all factors and ``mL, mR (B, K)`` per-factor messages. Brute force
reads all ``K^2`` entries of ``v`` per factor. `bigram_fmo` with ``method="index"`` is exact for any
input and reads far fewer when messages and exclusions touch few labels. With ``S_L[b]`` the labels where
``mL[b] != 0`` plus the rows of the excluded pairs (``S_R[b]`` likewise with ``mR`` and columns):

(a) rows ``k1`` in ``S_L``: scan the whole row of ``g_b``, excluded pairs masked out;
(b) columns ``k2`` in ``S_R``: scan the whole column;
(c) the rest, ``k1 not in S_L, k2 not in S_R``, where ``g_b = v`` and nothing is excluded: scan the first
    ``top_rows`` rows not in ``S_L`` of the order of decreasing row maximum (`BigramIndex`). Every row left
    is bounded by the row maximum of the next one, and every column not in ``S_R`` by its column maximum, so
    the scan is certified when its best is ``>=`` the smaller of these two bounds. Uncertified factors
    (rare) fall back to brute force over that area.

The answer is the best of (a), (b), (c). Everything is batched over factors (chunked to bound memory).
"""

from __future__ import annotations

import numbers
from typing import Callable, Optional, Tuple

import torch

from ..._validation import check_finite, check_positive_int, check_shape, check_tensor

_CHUNK_ELEMENTS = 1 << 24  # scan blocks hold at most this many entries (128 MiB in float64)
_METHODS = ("index", "brute")


class BigramIndex:
    """Row and column maxima of a score table ``v (K, K)``, sorted, for `bigram_fmo`.

    Holds a reference to ``v`` (no copy): after changing ``v`` in place, call `refresh` before the next
    oracle call, or the oracle may return a wrong answer.

    Attributes
    ----------
    v : (K, K) tensor, the indexed table; ``vt`` its transpose (contiguous, kept in sync by `refresh`).
    row_max, row_arg : (K,) the maximum of each row and a column where it is reached.
    row_order : (K,) long, rows by decreasing ``row_max`` (stable, so ties keep row order).
    col_max, col_arg, col_order : (K,) the same for columns (``col_arg`` holds rows).
    refresh_visits : int, entries of ``v`` read by the last build or `refresh`.
    """

    def __init__(self, v: torch.Tensor):
        check_tensor("v", v, ndim=2, floating=True)
        if v.shape[0] != v.shape[1] or v.shape[0] == 0:
            raise ValueError(f"v must be square (K, K) with K >= 1, got shape {tuple(v.shape)}")
        check_finite({"v": v})
        self.v = v
        self.K = v.shape[0]
        self.vt = v.t().contiguous()  # columns of v as contiguous rows: scanning them is 2-3x faster
        self.row_max, self.row_arg = v.max(dim=1)
        self.col_max, self.col_arg = self.vt.max(dim=1)
        self._sort()
        self.refresh_visits = self.K * self.K

    def _sort(self) -> None:
        self.row_order = torch.sort(self.row_max, descending=True, stable=True).indices
        self.col_order = torch.sort(self.col_max, descending=True, stable=True).indices

    def refresh(self, rows: Optional[torch.Tensor] = None, cols: Optional[torch.Tensor] = None) -> None:
        """Recompute the maxima of ``rows`` and ``cols`` (1-D long; None = all) and re-sort.

        Every entry ``v[i, j]`` changed since the last build or refresh must have ``i`` in ``rows`` and
        ``j`` in ``cols``: a change anywhere in a row may move the maximum of any column, so after
        rewriting whole rows pass ``cols=None``. Reads ``(len(rows) + len(cols)) * K`` entries."""
        K = self.K
        rows = self._check_lines("rows", rows)
        cols = self._check_lines("cols", cols)
        row_lines = self.v if rows is None else self.v.index_select(0, rows)
        col_lines = self.v if cols is None else self.v.index_select(1, cols)
        check_finite({"v": row_lines})  # every changed entry lies in these rows
        if rows is None:
            self.row_max, self.row_arg = self.v.max(dim=1)
        elif rows.numel():
            self.row_max[rows], self.row_arg[rows] = row_lines.max(dim=1)
        if cols is None:
            self.vt = self.v.t().contiguous()
            self.col_max, self.col_arg = self.vt.max(dim=1)
        elif cols.numel():
            self.vt[cols] = col_lines.t()  # every changed entry lies in these columns
            self.col_max[cols], self.col_arg[cols] = col_lines.max(dim=0)
        self._sort()
        n_rows = K if rows is None else rows.numel()
        n_cols = K if cols is None else cols.numel()
        self.refresh_visits = (n_rows + n_cols) * K

    def _check_lines(self, name: str, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if t is None:
            return None
        check_tensor(name, t, ndim=1, integer=True, device=self.v.device)
        if t.numel():
            lo, hi = torch.stack([t.min(), t.max()]).tolist()
            if lo < 0 or hi >= self.K:
                raise ValueError(f"{name} holds {lo if lo < 0 else hi}, outside [0, {self.K})")
        return torch.unique(t.long())  # duplicate indices would make the scattered writes ambiguous


def bigram_fmo(
    v: torch.Tensor,
    mL: torch.Tensor,
    mR: torch.Tensor,
    rho: float,
    exclude: Optional[torch.Tensor] = None,
    *,
    index: Optional[BigramIndex] = None,
    method: str = "index",
    top_rows: int = 32,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact argmax of ``g_b(k1, k2) = v[k1, k2] + rho * (mL[b, k1] + mR[b, k2])`` over allowed pairs.

    Parameters
    ----------
    v : (K, K) floating tensor, finite.
    mL, mR : (B, K) messages, same dtype and device as ``v``, finite.
    rho : positive finite number.
    exclude : (B, A) integer tensor of flat pair ids ``k1 * K + k2`` that may not be returned; -1 pads.
    index : `BigramIndex` of the current ``v``; required for ``method="index"``.
    method : ``"index"`` (see the module docstring) or ``"brute"`` (all ``K^2`` pairs, chunked over B).
    top_rows : rows of the row order scanned in the area where messages vanish (``method="index"``).

    Returns
    -------
    k1, k2 : (B,) long, a maximizer (any one on ties); -1 where every pair is excluded.
    value : (B,) ``g_b(k1, k2)``; -inf where every pair is excluded.
    visited : (B,) long, entries of ``v`` read per factor: ``K^2`` for brute force; for the index,
        ``(|S_L| + |S_R| + r) * K`` with ``r`` the rows of part (c) up to the certificate (see
        `_scan_area`), or ``(|S_L| + |S_R| + top_rows) * K + K^2`` where it fell back to brute force.
    """
    K, B = _check_inputs(v, mL, mR, rho, exclude, index, method, top_rows)
    if exclude is None:
        exclude = torch.full((B, 0), -1, dtype=torch.long, device=v.device)
    exclude = exclude.long()
    if B == 0:
        empty = torch.empty(0, dtype=torch.long, device=v.device)
        return empty, empty.clone(), torch.empty(0, dtype=v.dtype, device=v.device), empty.clone()
    if method == "brute":
        value, k1, k2 = _brute(v, mL, mR, rho, exclude)
        return k1, k2, value, torch.full_like(k1, K * K)

    # S_L, S_R as (B, K) masks, then as padded member lists
    in_L, in_R = mL != 0, mR != 0
    ex_b, ex_k1, ex_k2 = _excluded_pairs(exclude, K)
    in_L[ex_b, ex_k1] = True
    in_R[ex_b, ex_k2] = True
    idx_L, ok_L, slot_L = _members(in_L)
    idx_R, ok_R, slot_R = _members(in_R)

    rows_g = _scan_lines(lambda ids: v.index_select(0, ids), idx_L, ok_L, slot_L, mL, mR, rho, exclude, K, False)
    cols_g = _scan_lines(lambda ids: index.vt.index_select(0, ids), idx_R, ok_R, slot_R, mR, mL, rho, exclude, K,
                         True)
    area, n_scanned = _scan_area(v, index, in_L, in_R, idx_L.shape[1], idx_R.shape[1], top_rows)

    values = torch.stack([rows_g[0], cols_g[0], area[0]], dim=1)  # (B, 3)
    value, which = values.max(dim=1)
    k1 = torch.stack([rows_g[1], cols_g[1], area[1]], dim=1).gather(1, which[:, None]).squeeze(1)
    k2 = torch.stack([rows_g[2], cols_g[2], area[2]], dim=1).gather(1, which[:, None]).squeeze(1)
    none = value == float("-inf")
    k1, k2 = k1.masked_fill(none, -1), k2.masked_fill(none, -1)
    visited = (ok_L.sum(1) + ok_R.sum(1) + n_scanned) * K
    return k1, k2, value, visited


def _check_inputs(v, mL, mR, rho, exclude, index, method, top_rows) -> Tuple[int, int]:
    check_tensor("v", v, ndim=2, floating=True)
    if v.shape[0] != v.shape[1] or v.shape[0] == 0:
        raise ValueError(f"v must be square (K, K) with K >= 1, got shape {tuple(v.shape)}")
    K = v.shape[0]
    check_tensor("mL", mL, ndim=2, floating=True, device=v.device, dtype=v.dtype)
    B = mL.shape[0]
    check_shape("mL", mL, (B, K), "(B, K) with K = v.shape[0]")
    check_tensor("mR", mR, ndim=2, floating=True, device=v.device, dtype=v.dtype)
    check_shape("mR", mR, (B, K), "(B, K), like mL")
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real):
        raise TypeError(f"rho must be a real number, got {type(rho).__name__}")
    if not (0 < rho < float("inf")):
        raise ValueError(f"rho must be positive and finite, got {rho}")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    check_positive_int("top_rows", top_rows)
    if exclude is not None:
        check_tensor("exclude", exclude, ndim=2, integer=True, device=v.device)
        if exclude.shape[0] != B:
            raise ValueError(f"exclude must have shape (B, A) with B = {B}, got {tuple(exclude.shape)}")
        if exclude.numel():
            lo, hi = torch.stack([exclude.min(), exclude.max()]).tolist()
            if lo < -1 or hi >= K * K:
                raise ValueError(f"exclude holds {lo if lo < -1 else hi}, outside [-1, K*K = {K * K})")
    if method == "index":
        if not isinstance(index, BigramIndex):
            raise TypeError(f"index must be a BigramIndex of v for method='index', got {type(index).__name__}")
        same = index.v.data_ptr() == v.data_ptr() and index.v.stride() == v.stride() and index.K == K
        if not same or index.v.device != v.device:
            raise ValueError("index must be built from v itself (the same tensor, updated in place)")
        # v was checked by the index when built and refreshed: re-reading all of it here would cost K^2.
        check_finite({"mL": mL, "mR": mR})
    else:
        check_finite({"v": v, "mL": mL, "mR": mR})
    return K, B


def _excluded_pairs(exclude: torch.Tensor, K: int):
    """The valid entries of ``exclude (B', A)`` as (edge, k1, k2), each (n,) long."""
    b, a = (exclude >= 0).nonzero(as_tuple=True)
    pair = exclude[b, a]
    return b, pair // K, pair % K


def _members(mask: torch.Tensor):
    """A (B, K) membership mask as padded lists: ``idx (B, M)`` (0 on padding), ``ok (B, M)`` marking
    real members, ``slot (B, K)`` the position of each member in its list."""
    B = mask.shape[0]
    slot = mask.long().cumsum(1) - 1
    M = int(slot[:, -1].max()) + 1
    b, k = mask.nonzero(as_tuple=True)
    idx = torch.zeros(B, M, dtype=torch.long, device=mask.device)
    idx[b, slot[b, k]] = k
    ok = torch.arange(M, device=mask.device) <= slot[:, -1:]
    return idx, ok, slot


def _scan_lines(read: Callable, idx, ok, slot, own, other, rho, exclude, K, transpose):
    """Parts (a) and (b): the best of ``g_b`` over whole lines (rows, or columns with ``transpose``).

    ``read(ids) -> (n, K)`` returns lines of ``v``; ``own``/``other`` are the messages along / across the
    lines. Returns (value, k1, k2), each (B,), value -inf where a factor has no allowed entry."""
    B, M = idx.shape
    value = torch.full((B,), float("-inf"), dtype=own.dtype, device=own.device)
    if M == 0:
        none = torch.full((B,), -1, dtype=torch.long, device=own.device)
        return value, none, none.clone()
    pos = torch.empty(B, dtype=torch.long, device=own.device)
    own_sel = own.gather(1, idx).masked_fill(~ok, float("-inf"))  # padding lines score -inf
    step = max(1, _CHUNK_ELEMENTS // (M * K))
    for s in range(0, B, step):
        e = min(B, s + step)
        # v + rho * (own + other), the same rounding as brute force, in place on one (e - s, M, K) block
        g = own_sel[s:e, :, None] + other[s:e, None, :]
        g.mul_(rho).add_(read(idx[s:e].reshape(-1)).view(e - s, M, K))
        b, k1, k2 = _excluded_pairs(exclude[s:e], K)
        line, across = (k2, k1) if transpose else (k1, k2)
        g[b, slot[s + b, line], across] = float("-inf")
        value[s:e], pos[s:e] = g.view(e - s, M * K).max(dim=1)
    line = idx.gather(1, (pos // K)[:, None]).squeeze(1)
    across = pos % K
    return (value, across, line) if transpose else (value, line, across)


def _scan_area(v, index, in_L, in_R, M_L, M_R, top_rows):
    """Part (c): the max of ``v`` over rows not in ``S_L`` and columns not in ``S_R``.

    The first ``top_rows`` rows outside ``S_L`` of every factor are read once for the whole batch (at most
    ``top_rows + max |S_L| + 1`` rows of ``v``). Returns ((value, k1, k2), rows_scanned), each (B,), where
    ``rows_scanned`` is the shortest prefix of a factor's rows whose best certifies its area: what a
    factor-by-factor search stopping at the certificate reads. Factors not certified within ``top_rows``
    rows get the brute-force answer over the area and ``top_rows + K`` rows counted."""
    B, K = in_L.shape
    ninf = float("-inf")
    # Among the first top_rows + M_L + 1 rows of the order, top_rows + 1 lie outside S_L (if K allows).
    T = min(K, top_rows + M_L + 1)
    rows = index.row_order[:T]
    not_L = ~in_L[:, rows]  # (B, T)
    rank = not_L.long().cumsum(1)  # 1-based rank among the rows outside S_L
    # The best column of a row outside S_R is among the M_R + 1 largest entries of the row.
    m = min(K, M_R + 1)
    top_v, top_c = v.index_select(0, rows).topk(m, dim=1)  # (T, m)
    row_best = torch.empty(B, T, dtype=v.dtype, device=v.device)
    row_pick = torch.empty(B, T, dtype=torch.long, device=v.device)
    step = max(1, _CHUNK_ELEMENTS // (T * m))  # (T, m) reaches (K, K) when messages are dense
    for s in range(0, B, step):
        e = min(B, s + step)
        blocked = in_R[s:e, top_c.reshape(-1)].reshape(e - s, T, m)
        row_best[s:e], row_pick[s:e] = top_v.expand(e - s, T, m).masked_fill(blocked, ninf).max(dim=2)

    # Per factor, by rank: the best of each row outside S_L and its row maximum (an upper bound on it).
    R = top_rows + 1
    slot = torch.where(not_L & (rank <= R), rank - 1, R)  # slot R collects everything else
    by_rank = torch.full((B, R + 1), ninf, dtype=v.dtype, device=v.device)
    best_by_rank = by_rank.scatter(1, slot, row_best)[:, :top_rows]
    pos_by_rank = torch.zeros(B, R + 1, dtype=torch.long, device=v.device)
    pos_by_rank = pos_by_rank.scatter(1, slot, torch.arange(T, device=v.device).expand(B, T))[:, :top_rows]
    max_by_rank = by_rank.scatter(1, slot, index.row_max[rows].expand(B, T))[:, :R]
    cols = index.col_order[:m]
    col_bound = index.col_max[cols].expand(B, m).masked_fill(in_R[:, cols], ninf).max(dim=1).values

    # After the first r rows, all the area left is bounded by min(max of row r+1, best column max).
    bound = torch.minimum(max_by_rank, col_bound[:, None])  # (B, R): bound[:, r] after r rows
    running, arg = best_by_rank.cummax(dim=1)  # (B, top_rows): best of the first r + 1 rows
    certified = torch.cat([bound[:, :1] == ninf, running >= bound[:, 1:]], dim=1)  # after 0..top_rows rows
    done = certified.any(dim=1)
    n_rows = certified.int().argmax(dim=1)  # the first prefix that certifies
    value = running[:, -1]
    t = pos_by_rank.gather(1, arg[:, -1:]).squeeze(1)
    k1, k2 = rows[t], top_c[t, row_pick.gather(1, t[:, None]).squeeze(1)]

    fallback = (~done).nonzero(as_tuple=True)[0]
    if fallback.numel():
        step = max(1, _CHUNK_ELEMENTS // (K * K))
        for s in range(0, fallback.numel(), step):
            f = fallback[s:s + step]
            blocked = in_L[f][:, :, None] | in_R[f][:, None, :]
            best, pos = v.expand(f.numel(), K, K).masked_fill(blocked, ninf).reshape(f.numel(), K * K).max(1)
            value[f], k1[f], k2[f] = best, pos // K, pos % K
        n_rows = n_rows.masked_fill(~done, top_rows + K)
    return (value, k1, k2), n_rows


def _brute(v, mL, mR, rho, exclude):
    """All ``K^2`` pairs per factor, chunked over factors. Returns (value, k1, k2), each (B,)."""
    B, K = mL.shape
    value = torch.empty(B, dtype=v.dtype, device=v.device)
    pos = torch.empty(B, dtype=torch.long, device=v.device)
    step = max(1, _CHUNK_ELEMENTS // (K * K))
    for s in range(0, B, step):
        e = min(B, s + step)
        g = (mL[s:e, :, None] + mR[s:e, None, :]).mul_(rho).add_(v).view(e - s, K * K)  # v + rho * (mL + mR)
        b, a = (exclude[s:e] >= 0).nonzero(as_tuple=True)
        g[b, exclude[s:e][b, a]] = float("-inf")
        value[s:e], pos[s:e] = g.max(dim=1)
    none = value == float("-inf")
    return value, (pos // K).masked_fill(none, -1), (pos % K).masked_fill(none, -1)
