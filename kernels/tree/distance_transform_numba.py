"""The generalized distance transform as a compiled CPU loop (numba): the fast CPU twin of
`distance_transform_torch`.

The torch twin vectorizes over rows and advances every row by one step per Python-level iteration: about 35
small tensor ops per step, some 4n steps per 1-D pass, so on a CPU its time is per-op overhead and memory
traffic, not arithmetic. Here one compiled loop runs a row's whole sweep (the envelope, then the read-out),
the 2-D transform fuses the row pass, the column pass and the composition of the two argmaxes, and rows of
different images run on different threads (``prange``). The decisions, the arithmetic and its order of
operations are those of the torch twin and of the Triton kernel (same envelope test by cross-multiplication,
same value formula ``f[q] - a*d*d - b*d`` with ``d = (p - q) - r``, same ties: smallest q), and numba does not
contract or reorder float operations without ``fastmath``, so the three agree bitwise; the tests assert it.

float32 and float64 only (numba has no half types); `available()` is False when numba does not import, and
``backend="auto"`` then keeps the torch twin.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import _numba
from .._numba import jit as _jit
from .._numba import prange as _prange


def available() -> bool:
    return _numba.available()


@_jit()
def _gdt_row(f, a, b, r, out, arg, v, vf):
    """One row: ``f (n,)`` in, ``out (n,)`` and ``arg (n,)`` written; ``v (n,)`` int64 and ``vf (n,)``
    scratch (the q's of the envelope's parabolas and their f[q]). Positions are integers; their
    differences are cast to f's type before use."""
    n = f.shape[0]
    dt = f.dtype.type
    if a == 0:
        best = 0
        bestv = f[0] + b * dt(0)
        for q in range(1, n):
            val = f[q] + b * dt(q)
            if val > bestv:  # first maximum, as argmax
                best, bestv = q, val
        fb = f[best]
        for p in range(n):
            d = dt(p - best) - r
            out[p] = fb - a * d * d - b * d
            arg[p] = best
        return
    top = 0
    v[0] = 0
    vf[0] = f[0]
    for q in range(1, n):
        fq = f[q]
        while top > 0:
            t = v[top]
            s = v[top - 1]
            ft = vf[top]
            fs = vf[top - 1]
            qt = dt(q - t)
            ts = dt(t - s)
            lhs = a * dt(q - s) * qt * ts
            rhs = (fq - ft) * ts - (ft - fs) * qt
            if lhs <= rhs or ft == -np.inf:  # a -inf parabola is never on the envelope
                top -= 1
            else:
                break
        top += 1
        v[top] = q
        vf[top] = fq
    k = 0
    for p in range(n):
        q0 = v[k]
        d0 = dt(p - q0) - r
        v0 = vf[k] - a * d0 * d0 - b * d0
        while k < top:
            q1 = v[k + 1]
            d1 = dt(p - q1) - r
            v1 = vf[k + 1] - a * d1 * d1 - b * d1
            if v1 > v0:
                k += 1
                q0, v0 = q1, v1
            else:
                break
        out[p] = v0
        arg[p] = q0

@_jit(parallel=True)
def _gdt_1d(f, a, b, r, out, arg):
    R, n = f.shape
    for i in _prange(R):
        v = np.empty(n, dtype=np.int64)
        vf = np.empty(n, dtype=f.dtype)
        _gdt_row(f[i], a[i], b[i], r[i], out[i], arg[i], v, vf)

@_jit()
def _gdt_2d_one(f, ax, bx, rx, ay, by, ry, out, arg, g, argx, col, ocol, acol, v, vf):
    """One image ``f (H, W)``: the row pass into ``g``/``argx``, the column pass, the flat argmax
    ``acol * W + argx[acol, x]`` (as `distance_transform_torch.distance_transform_2d`). The other
    arguments are scratch: ``col, ocol, acol (H,)``, ``v, vf (max(H, W),)``."""
    H, W = f.shape
    for y in range(H):
        _gdt_row(f[y], ax, bx, rx, g[y], argx[y], v, vf)
    for x in range(W):
        for y in range(H):
            col[y] = g[y, x]
        _gdt_row(col, ay, by, ry, ocol, acol, v, vf)
        for y in range(H):
            out[y, x] = ocol[y]
            arg[y, x] = acol[y] * W + argx[acol[y], x]

@_jit(parallel=True)
def _gdt_2d(f, ax, bx, rx, ay, by, ry, out, arg):
    R, H, W = f.shape
    for i in _prange(R):
        g = np.empty((H, W), dtype=f.dtype)
        argx = np.empty((H, W), dtype=np.int64)
        col, ocol, acol = np.empty(H, dtype=f.dtype), np.empty(H, dtype=f.dtype), np.empty(H, dtype=np.int64)
        v, vf = np.empty(max(H, W), dtype=np.int64), np.empty(max(H, W), dtype=f.dtype)
        _gdt_2d_one(f[i], ax[i], bx[i], rx[i], ay[i], by[i], ry[i], out[i], arg[i],
                   g, argx, col, ocol, acol, v, vf)

@_jit()
def _node_belief(bel, unary_node, msgs, child_edges, lo, hi):
    """A node's belief into ``bel (H, W)``: ``unary_node`` plus the messages ``msgs[child_edges[c]]`` for c in
    ``[lo, hi)``, added in that (increasing edge) order, as `tree_torch.tree_max_sum_generic` adds them."""
    H, W = bel.shape
    for y in range(H):
        for x in range(W):
            bel[y, x] = unary_node[y, x]
    for c in range(lo, hi):
        m = msgs[child_edges[c]]
        for y in range(H):
            for x in range(W):
                bel[y, x] = bel[y, x] + m[y, x]


@_jit()
def _first_max(bel):
    """``(k, bel.flat[k])`` of the first maximum of ``bel (H, W)`` in row-major order, as torch.max."""
    H, W = bel.shape
    best = 0
    bestv = bel[0, 0]
    for k in range(1, H * W):
        if bel[k // W, k % W] > bestv:
            best, bestv = k, bel[k // W, k % W]
    return best, bestv


@_jit()
def _score_layout(child_scores, parent_scores):
    """Whether each score array is present, and per axis a stride of 1 where it varies and 0 where it does
    not (a type bias ``(B, E, T, 1, 1)``), so a 1-row grid's maps still read x: ``(has_child, has_parent, cy,
    cx, py, px)``."""
    return (child_scores.shape[0] > 0, parent_scores.shape[0] > 0,
            1 if child_scores.shape[3] > 1 else 0, 1 if child_scores.shape[4] > 1 else 0,
            1 if parent_scores.shape[3] > 1 else 0, 1 if parent_scores.shape[4] > 1 else 0)


@_jit(parallel=True)
def _spatial_tree(unary, weights, rest, child_scores, parent_scores, order, edge_child, edge_parent, child_ptr,
                 child_edges, root, labels, types, value):
    """Max-sum on a pictorial-structure tree with T mixture types per edge, one image per iteration of the
    parallel loop.

    ``unary (B, V, H, W)``, ``weights (B, E, T, 4)``, ``rest (E, T, 2)``; ``child_scores`` and
    ``parent_scores`` ``(B, E, T, H, W)``, ``(B, E, T, 1, 1)`` (a type bias), or an empty ``(0, 0, 0, 0, 0)``
    array for none; ``order (E,)``: the
    edges, children's levels first (`tree_torch.TreeSchedule.levels`); node v's child edges, increasing, are
    ``child_edges[child_ptr[v]:child_ptr[v + 1]]``. Writes ``labels (B, V)``, ``types (B, E)`` and ``value
    (B,)``. A node's belief is its unary plus its children's messages in increasing edge order, a message
    is the first maximal type per parent position, and the root's label is its belief's first maximum, as
    in `tree_torch.tree_max_sum_generic` and `tree_torch.mixture_tree_max_sum_torch`."""
    B, V, H, W = unary.shape
    E = order.shape[0]
    T = rest.shape[1]
    has_child, has_parent, cy, cx, py, px = _score_layout(child_scores, parent_scores)
    direct = T == 1 and not has_parent  # the transform writes the message itself
    for i in _prange(B):
        msgs = np.empty((max(E, 1), H, W), dtype=unary.dtype)
        args = np.empty((max(E, 1), H, W), dtype=np.int64)
        targs = np.zeros((max(E, 1), H, W) if T > 1 else (1, 1, 1), dtype=np.int64)  # types: only for T > 1
        bel = np.empty((H, W), dtype=unary.dtype)
        side = (H, W) if not direct else (1, 1)  # scratch of the type loop
        f = np.empty((H, W) if has_child else (1, 1), dtype=unary.dtype)  # belief + child scores
        out = np.empty(side, dtype=unary.dtype)
        arg = np.empty(side, dtype=np.int64)
        g = np.empty((H, W), dtype=unary.dtype)
        argx = np.empty((H, W), dtype=np.int64)
        col, ocol, acol = np.empty(H, dtype=unary.dtype), np.empty(H, dtype=unary.dtype), np.empty(H, np.int64)
        v, vf = np.empty(max(H, W), dtype=np.int64), np.empty(max(H, W), dtype=unary.dtype)
        for j in range(E + 1):
            node = root if j == E else edge_child[order[j]]
            _node_belief(bel, unary[i, node], msgs, child_edges, child_ptr[node], child_ptr[node + 1])
            if j == E:
                break
            e = order[j]
            for t in range(T):
                src = bel
                if has_child:
                    for y in range(H):
                        for x in range(W):
                            f[y, x] = bel[y, x] + child_scores[i, e, t, y * cy, x * cx]
                    src = f
                w = weights[i, e, t]
                # cost w . (dx, dx^2, dy, dy^2), d = l_c - l_p - r: a = w_quadratic, b = -w_linear, r = -rest
                if direct:
                    _gdt_2d_one(src, w[1], -w[0], -rest[e, t, 0], w[3], -w[2], -rest[e, t, 1], msgs[e], args[e],
                               g, argx, col, ocol, acol, v, vf)
                    continue
                _gdt_2d_one(src, w[1], -w[0], -rest[e, t, 0], w[3], -w[2], -rest[e, t, 1], out, arg,
                           g, argx, col, ocol, acol, v, vf)
                if has_parent:
                    for y in range(H):
                        for x in range(W):
                            out[y, x] = out[y, x] + parent_scores[i, e, t, y * py, x * px]
                for y in range(H):
                    for x in range(W):
                        if t == 0 or out[y, x] > msgs[e, y, x]:  # first maximal type, as torch.max
                            msgs[e, y, x] = out[y, x]
                            args[e, y, x] = arg[y, x]
                            if T > 1:
                                targs[e, y, x] = t
        labels[i, root], value[i] = _first_max(bel)
        for j in range(E - 1, -1, -1):
            e = order[j]
            lp = labels[i, edge_parent[e]]
            labels[i, edge_child[e]] = args[e, lp // W, lp % W]
            types[i, e] = targs[e, lp // W, lp % W] if T > 1 else 0


@_jit(parallel=True)
def _cooccurrence_tree(unary, weights, rest, cooc, child_scores, parent_scores, order, edge_child, edge_parent,
                       child_ptr, child_edges, root, labels, types, value):
    """`_spatial_tree` with type co-occurrence ``cooc (B, E, T, T)``: messages ``(T, H, W)`` per edge indexed
    by the type of the edge above the parent, ``m_e(s, l) = max_t cooc[e, s, t] + D_{e,t}(l)`` (first maximal
    t), as `tree_torch.cooccurrence_tree_max_sum_torch`; the root reads row 0. Same argument conventions."""
    B, V, H, W = unary.shape
    E = order.shape[0]
    T = rest.shape[1]
    has_child, has_parent, cy, cx, py, px = _score_layout(child_scores, parent_scores)
    for i in _prange(B):
        msgs = np.empty((max(E, 1), T, H, W), dtype=unary.dtype)
        pos_args = np.empty((max(E, 1), T, H, W), dtype=np.int64)
        type_args = np.empty((max(E, 1), T, H, W), dtype=np.int64)
        bel = np.empty((H, W), dtype=unary.dtype)
        d = np.empty((T, H, W), dtype=unary.dtype)
        g = np.empty((H, W), dtype=unary.dtype)
        argx = np.empty((H, W), dtype=np.int64)
        col, ocol, acol = np.empty(H, dtype=unary.dtype), np.empty(H, dtype=unary.dtype), np.empty(H, np.int64)
        v, vf = np.empty(max(H, W), dtype=np.int64), np.empty(max(H, W), dtype=unary.dtype)
        node_type = np.zeros(V, dtype=np.int64)
        for j in range(E + 1):
            node = root if j == E else edge_child[order[j]]
            for t in range(1 if j == E else T):  # the root: row 0 only
                _node_belief(bel, unary[i, node], msgs[:, t], child_edges, child_ptr[node], child_ptr[node + 1])
                if j == E:
                    break
                e = order[j]
                if has_child:
                    for y in range(H):
                        for x in range(W):
                            bel[y, x] = bel[y, x] + child_scores[i, e, t, y * cy, x * cx]
                w = weights[i, e, t]
                _gdt_2d_one(bel, w[1], -w[0], -rest[e, t, 0], w[3], -w[2], -rest[e, t, 1], d[t], pos_args[e, t],
                           g, argx, col, ocol, acol, v, vf)
                if has_parent:
                    for y in range(H):
                        for x in range(W):
                            d[t, y, x] = d[t, y, x] + parent_scores[i, e, t, y * py, x * px]
            if j == E:
                break
            e = order[j]
            for s in range(T):
                for y in range(H):
                    for x in range(W):
                        best = cooc[i, e, s, 0] + d[0, y, x]
                        arg = 0
                        for t in range(1, T):
                            val = cooc[i, e, s, t] + d[t, y, x]
                            if val > best:  # the first maximal type, as torch.max
                                best, arg = val, t
                        msgs[e, s, y, x] = best
                        type_args[e, s, y, x] = arg
        labels[i, root], value[i] = _first_max(bel)
        node_type[root] = 0
        for j in range(E - 1, -1, -1):
            e = order[j]
            p = edge_parent[e]
            lp = labels[i, p]
            t = type_args[e, node_type[p], lp // W, lp % W]
            labels[i, edge_child[e]] = pos_args[e, t, lp // W, lp % W]
            node_type[edge_child[e]] = t
            types[i, e] = t


def _params(f, *ps):
    return [p.detach().to(f.dtype).contiguous().numpy() for p in ps]


def _check(f):
    if f.device.type != "cpu":
        raise ValueError(f"backend='numba' runs on CPU tensors, got f on {f.device}")
    if f.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"backend='numba' needs float32 or float64, got f of {f.dtype}")


def distance_transform_1d_numba(f: torch.Tensor, a: torch.Tensor, b: torch.Tensor, r: torch.Tensor):
    """Same contract as `distance_transform_torch.distance_transform_1d_torch`: ``f (R, n)``, ``a, b, r (R,)``,
    ``a >= 0`` (not checked here); returns ``out (R, n)`` and ``arg (R, n)`` long. CPU, float32 or float64."""
    _check(f)
    R, n = f.shape
    out = f.new_empty(R, n)
    arg = torch.empty(R, n, dtype=torch.long)
    if R == 0 or n == 0:
        return out, arg
    fn = f.detach().contiguous().numpy()
    _gdt_1d(fn, *_params(f, a, b, r), out.numpy(), arg.numpy())
    return out, arg


def distance_transform_2d_numba(f: torch.Tensor, ax, bx, rx, ay, by, ry):
    """Same contract as `distance_transform_torch.distance_transform_2d`: ``f (R, H, W)``, per-row
    parameters ``(R,)``; returns ``out (R, H, W)`` and the flat argmax ``arg (R, H, W)`` long. The row pass,
    the column pass and the argmax composition run in one compiled call."""
    _check(f)
    R, H, W = f.shape
    out = f.new_empty(R, H, W)
    arg = torch.empty(R, H, W, dtype=torch.long)
    if R == 0 or H == 0 or W == 0:
        return out, arg
    fn = f.detach().contiguous().numpy()
    _gdt_2d(fn, *_params(f, ax, bx, rx, ay, by, ry), out.numpy(), arg.numpy())
    return out, arg


def spatial_tree_max_sum_numba(unary, weights, rest, parents, height: int, width: int):
    """Same contract as `tree_torch.spatial_tree_max_sum_torch`, the whole tree in one compiled call (messages,
    argmaxes and backtracking per image, images in parallel), bitwise equal to it. CPU, float32 or float64."""
    E = unary.shape[1] - 1
    positions, _, value = mixture_tree_max_sum_numba(unary, weights.unsqueeze(-2), rest.reshape(E, 1, 2), parents,
                                                     height, width)
    return positions, value


def mixture_tree_max_sum_numba(unary, weights, rest, parents, height: int, width: int, child_scores=None,
                               parent_scores=None, cooccurrence=None):
    """Same contract as `tree_torch.mixture_tree_max_sum_torch` (T mixture types per edge), and with
    ``cooccurrence`` as `tree_torch.cooccurrence_tree_max_sum_torch`; the whole tree in one compiled call,
    bitwise equal to them. CPU, float32 or float64."""
    from .tree_torch import tree_schedule

    _check(unary)
    sched = tree_schedule(parents)
    B, V, K = unary.shape
    E = V - 1
    T = rest.shape[1]
    dt = unary.dtype
    labels = torch.empty(B, V, dtype=torch.long)
    types = torch.zeros(B, E, dtype=torch.long)
    value = unary.new_empty(B)
    if B == 0:
        return labels, types, value
    order = np.array([e for level in sched.levels for e in level], dtype=np.int64)
    ptr = np.zeros(V + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(c) for c in sched.child_edges])
    kids = np.array([e for c in sched.child_edges for e in c], dtype=np.int64)
    w = weights.detach().to(dt)
    w = (w if w.dim() == 4 else w.unsqueeze(0)).expand(B, E, T, 4).contiguous()

    def scores(s):
        if s is None:
            return np.empty((0, 0, 0, 0, 0), dtype=np.float32 if dt == torch.float32 else np.float64)
        side = (height, width) if s.shape[3] > 1 else (1, 1)
        return s.detach().to(dt).expand(B, E, T, -1).contiguous().view(B, E, T, *side).numpy()

    args = (unary.detach().contiguous().view(B, V, height, width).numpy(), w.numpy(),
            rest.detach().to(dt).contiguous().numpy())
    tail = (scores(child_scores), scores(parent_scores), order, np.array(sched.edge_child, dtype=np.int64),
            np.array(sched.edge_parent, dtype=np.int64), ptr, kids, sched.root, labels.numpy(), types.numpy(),
            value.numpy())
    if cooccurrence is None:
        _spatial_tree(*args, *tail)
    else:
        c = cooccurrence.detach().to(dt)
        c = (c if c.dim() == 4 else c.unsqueeze(0)).expand(B, E, T, T).contiguous()
        _cooccurrence_tree(*args, c.numpy(), *tail)
    return labels, types, value
