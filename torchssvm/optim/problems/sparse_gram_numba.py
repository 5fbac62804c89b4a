"""The sparse-attribute Gram matrix's sort-and-join steps as compiled CPU loops (numba): the CPU twin of
`sparse_gram.attribute_rows`, of the rare-attribute part of `sparse_gram.sparse_emission_gram` and of the update of
``w`` from the same rows (``index_add_``).

On a CPU the torch code's sort, unique, repeat and scatter steps are some forty tensor operations per mini-batch, a
large part of a BCFW step on CoNLL-2000 (docs/benchmarks/bcfw_backends.md). Here one loop collects the (attribute,
block, token) entries, reading the data set's attribute arrays in place when given the blocks' ``index`` (no gathered
copy); a stable sort orders them by attribute then block (a counting sort on the attribute: the entries already come in
block order); one walk sums each pair's row ``V`` in token order (the order of torch's ``index_add_``, so the rows are
bitwise equal); a second loop adds each rare attribute's block pairs to ``G``, each pair once. The attributes carried by
many blocks still go through one dense product in torch (BLAS), as in the torch code. The rare part sums its dot
products in a fixed order, so ``G`` equals the torch code's to rounding. `add_attribute_rows_numba` applies the rows to
``w`` in their order, bitwise as ``index_add_``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ...kernels._numba import jit as _jit


@_jit()
def _entries(ids, values, has_values, index, u):
    """The token attributes whose token vector is nonzero, block by block in token order: attribute, block, token
    index (into ``u``'s ``(R T)`` tokens) and value; block ``r`` reads row ``index[r]`` of ``ids`` and ``values``.
    Also returns the largest attribute (-1 without entries)."""
    R, T, K = u.shape
    A = ids.shape[2]
    n = 0
    top = -1
    nonzero = np.zeros(R * T, dtype=np.bool_)
    for r in range(R):
        i = index[r]
        for t in range(T):
            for k in range(K):
                if u[r, t, k] != 0:
                    nonzero[r * T + t] = True
                    break
            if nonzero[r * T + t]:
                for a in range(A):
                    if ids[i, t, a] >= 0:
                        n += 1
                        top = max(top, ids[i, t, a])
    attr = np.empty(n, dtype=np.int64)
    block = np.empty(n, dtype=np.int64)
    token = np.empty(n, dtype=np.int64)
    val = np.empty(n, dtype=u.dtype)
    e = 0
    for r in range(R):
        i = index[r]
        for t in range(T):
            if nonzero[r * T + t]:
                for a in range(A):
                    if ids[i, t, a] >= 0:
                        attr[e] = ids[i, t, a]
                        block[e] = r
                        token[e] = r * T + t
                        val[e] = values[i, t, a] if has_values else 1.0
                        e += 1
    return attr, block, token, val, top


@_jit()
def _rows(attr, block, token, val, top, has_values, u_flat):
    """``(attr, row, V)`` of the distinct (attribute, block) keys, sorted, each row summed in token order.

    The entries come block by block in token order, so a stable sort on the attribute alone orders them by
    attribute, then block, then token: the order of a stable sort on ``attr * R + block``. A counting sort (linear
    in the entries and the largest attribute) where the entries are many, a merge sort where they are few."""
    n = attr.shape[0]
    K = u_flat.shape[1]
    if n * 16 < top:  # few entries (a small batch) over many attributes: a comparison sort, also stable
        order = np.argsort(attr, kind="mergesort")
    else:
        start = np.zeros(top + 2, dtype=np.int64)
        for e in range(n):
            start[attr[e] + 1] += 1
        for a in range(top + 1):
            start[a + 1] += start[a]
        order = np.empty(n, dtype=np.int64)
        for e in range(n):
            order[start[attr[e]]] = e
            start[attr[e]] += 1
    P = 0
    for i in range(n):
        if i == 0 or attr[order[i]] != attr[order[i - 1]] or block[order[i]] != block[order[i - 1]]:
            P += 1
    out_attr = np.empty(P, dtype=np.int64)
    row = np.empty(P, dtype=np.int64)
    V = np.zeros((P, K), dtype=u_flat.dtype)
    p = -1
    for i in range(n):
        e = order[i]
        if i == 0 or attr[e] != attr[order[i - 1]] or block[e] != block[order[i - 1]]:
            p += 1
            out_attr[p] = attr[e]
            row[p] = block[e]
        tk = token[e]
        if has_values:
            for k in range(K):
                V[p, k] += u_flat[tk, k] * val[e]
        else:
            for k in range(K):
                V[p, k] += u_flat[tk, k]
    return out_attr, row, V


@_jit()
def _add_rows(E, attr, row, V, coef):
    """``E[attr[p]] += V[p] coef[row[p]]`` in the order of ``p`` (that of ``index_add_``)."""
    for p in range(attr.shape[0]):
        c = coef[row[p]]
        a = attr[p]
        for k in range(V.shape[1]):
            E[a, k] += V[p, k] * c


@_jit()
def _rare_pairs(attr, row, V, dense_min, G):
    """``G[r, s] += <V_i, V_j>`` for the entries ``i, j`` (blocks ``r, s``) of each attribute carried by fewer than
    ``dense_min`` blocks, the diagonal included. Returns, per entry, the column of its attribute among the dense
    ones (-1 for a rare attribute), and the number of dense attributes."""
    P, K = V.shape
    column = np.full(P, -1, dtype=np.int64)
    F = 0
    start = 0
    while start < P:
        end = start + 1
        while end < P and attr[end] == attr[start]:
            end += 1
        if end - start >= dense_min:
            for i in range(start, end):
                column[i] = F
            F += 1
        else:  # each pair once: <V_i, V_j> and <V_j, V_i> are the same products summed in the same order
            for i in range(start, end):
                for j in range(i, end):
                    d = V.dtype.type(0)
                    for k in range(K):
                        d += V[i, k] * V[j, k]
                    G[row[i], row[j]] += d
                    if j != i:
                        G[row[j], row[i]] += d
        start = end
    return column, F


@_jit()
def _dense_rows(row, V, column, Vd):
    """``Vd[row[i], column[i]] = V[i]`` for the dense attributes' entries: the ``(R, F, K)`` layout of their
    product."""
    for i in range(V.shape[0]):
        if column[i] >= 0:
            for k in range(V.shape[1]):
                Vd[row[i], column[i], k] = V[i, k]


def _check(ids: torch.Tensor, values: Optional[torch.Tensor], u: torch.Tensor, index: Optional[torch.Tensor]):
    if u.device.type != "cpu" or u.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"the numba twin runs on CPU float32/float64 tensors, got u of {u.dtype} on {u.device}")
    if ids.dim() != 3 or u.dim() != 3:
        raise ValueError(f"ids must be (R, T, A) with u (R, T, K), got {tuple(ids.shape)} and {tuple(u.shape)}")
    if values is not None and values.shape != ids.shape:
        raise ValueError(f"values must have the shape of ids {tuple(ids.shape)}, got {tuple(values.shape)}")
    if index is None:
        if tuple(u.shape[:2]) != tuple(ids.shape[:2]):
            raise ValueError(f"ids must be (R, T, A) with u (R, T, K), got {tuple(ids.shape)} and {tuple(u.shape)}")
        return
    if index.dim() != 1 or index.shape[0] != u.shape[0] or u.shape[1] > ids.shape[1]:
        raise ValueError(f"with index (R,), u must be (R, T, K) with T <= ids.shape[1]; got index "
                         f"{tuple(index.shape)}, u {tuple(u.shape)}, ids {tuple(ids.shape)}")
    if index.numel() and not (0 <= int(index.min()) and int(index.max()) < ids.shape[0]):
        raise ValueError(f"index must lie in [0, {ids.shape[0]}), got values in [{int(index.min())}, "
                         f"{int(index.max())}]")


def attribute_rows_numba(ids: torch.Tensor, values: Optional[torch.Tensor], u: torch.Tensor,
                         index: Optional[torch.Tensor] = None):
    """Same contract and result as `sparse_gram.attribute_rows` (bitwise): ``(attr (P,), row (P,), V (P, K))`` sorted
    by attribute then block. With ``index``, ``ids`` and ``values`` are read in place (no gathered copy)."""
    _check(ids, values, u, index)
    R, T, _ = u.shape
    if index is None:
        index = torch.arange(R)
    uu = u.detach().contiguous()
    ids_np = ids.detach().to(torch.long).contiguous().numpy()
    vals = uu.new_zeros(1, 1, 1) if values is None else values.detach().to(u.dtype).contiguous()
    attr, block, token, val, top = _entries(ids_np, vals.numpy(), values is not None,
                                            index.to(torch.long).contiguous().numpy(), uu.numpy())
    attr, row, V = _rows(attr, block, token, val, top, values is not None, uu.reshape(R * T, u.shape[2]).numpy())
    return torch.from_numpy(attr), torch.from_numpy(row), torch.from_numpy(V)


def sparse_emission_gram_numba(ids: torch.Tensor, values: Optional[torch.Tensor], u: torch.Tensor,
                               dense_min: Optional[int] = None, rows=None,
                               index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Same contract as `sparse_gram.sparse_emission_gram`; equal to it to rounding. The default ``dense_min`` is
    ``max(2, R // 4)``, not ``R // 8``: the compiled pair loop is cheaper than torch's gathered pairs, so fewer
    attributes pay for the dense product (3% of a CoNLL pass at B = 64 on the development VM)."""
    R = u.shape[0]
    if dense_min is None:
        dense_min = max(2, R // 4)
    attr, row, V = attribute_rows_numba(ids, values, u, index) if rows is None else rows
    G = torch.zeros(R, R, dtype=u.dtype)
    if attr.numel() == 0:
        return G
    rare = torch.zeros(R, R, dtype=u.dtype)
    row_np, V_np = row.numpy(), V.contiguous().numpy()
    column, F = _rare_pairs(attr.numpy(), row_np, V_np, int(dense_min), rare.numpy())
    if F:  # the frequent attributes: one dense product, as the torch code
        Vd = torch.zeros(R, F, V.shape[1], dtype=V.dtype)
        _dense_rows(row_np, V_np, column, Vd.numpy())
        Vd = Vd.view(R, -1)
        G += Vd @ Vd.T
    return G + rare


def add_attribute_rows_numba(E: torch.Tensor, rows, coef: torch.Tensor) -> None:
    """`sparse_gram.add_attribute_rows` (same arguments, in place), bitwise: the same products, added in the same
    order."""
    attr, row, V = rows
    if not (E.is_contiguous() and E.device.type == "cpu" and E.dtype == V.dtype == coef.dtype):
        raise ValueError(f"E must be a contiguous CPU tensor of V's and coef's dtype, got E {E.dtype} on {E.device}, "
                         f"V {V.dtype}, coef {coef.dtype}")
    if attr.numel():
        if int(attr[-1]) >= E.shape[0] or int(row.max()) >= coef.shape[0]:  # attr is sorted: its last is its max
            raise ValueError(f"the rows name attribute {int(attr[-1])} and block {int(row.max())}, outside E "
                             f"{tuple(E.shape)} or coef {tuple(coef.shape)}")
        _add_rows(E.detach().numpy(), attr.numpy(), row.numpy(), V.contiguous().numpy(),
                  coef.detach().contiguous().numpy())
