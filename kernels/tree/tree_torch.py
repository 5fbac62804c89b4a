"""Batched max-sum (max-product in log space) on a tree in plain torch: the reference twin of `tree_triton`.

The tree is ``parents (V,)``: ``parents[v]`` is the parent of node v, -1 for the single root. Edges are
numbered by their child: edge e joins ``parents[c_e]`` and ``c_e``, where ``c_0 < c_1 < ...`` are the
non-root nodes in increasing order (so ``E = V - 1``). A pairwise table entry ``[k_parent, k_child]``
scores the parent's label and the child's label.

`tree_schedule` groups the edges by the depth of their child; messages flow leaves to root one level at
a time (every edge of a level in one batched op), then labels are backtracked root to leaves.
Tie-breaking (identical in the Triton kernel): every argmax takes the smallest label index, so among all
maximizing labellings the result is the lexicographically smallest with the nodes ordered parents before
children (for instance by depth). A node's belief is its unary plus its children's messages added in
increasing edge order, the same sum on every backend.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch

from torchssvm._device import host_to_device
from torchssvm._validation import check_int_sequence

from .distance_transform_torch import distance_transform_2d

# Above this many elements per level ((B, n, K, K) scores) the level is processed in chunks of examples.
_MAX_LEVEL_ELEMENTS = 1 << 25


class TreeSchedule(NamedTuple):
    """Message-passing order of a tree (plain Python tuples; cached per ``parents``).

    - ``root``: the root node; ``edge_child[e]`` / ``edge_parent[e]``: the nodes of edge e.
    - ``levels``: edge indices grouped by the depth of their child, deepest first (leaves to root).
    - ``child_edges[v]``: the edges whose parent is v, increasing.
    - ``depth[v]``: the number of edges from v to the root.
    """

    parents: Tuple[int, ...]
    root: int
    edge_child: Tuple[int, ...]
    edge_parent: Tuple[int, ...]
    levels: Tuple[Tuple[int, ...], ...]
    child_edges: Tuple[Tuple[int, ...], ...]
    depth: Tuple[int, ...]


def check_parents(parents, name: str = "parents") -> Tuple[int, ...]:
    """``parents`` as a tuple of ints, or a ValueError naming ``name``: one root (-1), every other entry a
    node in ``[0, V)`` other than itself, and no cycle."""
    par = check_int_sequence(name, parents)
    V = len(par)
    if V == 0:
        raise ValueError(f"{name} must hold at least one node")
    for v, p in enumerate(par):
        if not (p == -1 or 0 <= p < V) or p == v:
            raise ValueError(f"{name}[{v}] = {p}: must be -1 (the root) or another node in [0, {V})")
    roots = [v for v in range(V) if par[v] == -1]
    if len(roots) != 1:
        raise ValueError(f"{name} must have exactly one root (-1), got {len(roots)}: {roots}")
    for v in range(V):
        m, steps = v, 0
        while par[m] != -1:
            m, steps = par[m], steps + 1
            if steps > V:
                raise ValueError(f"{name} has a cycle through node {v}")
    return par


@functools.lru_cache(maxsize=256)
def _schedule(par: Tuple[int, ...]) -> TreeSchedule:
    V = len(par)
    depth = [0] * V
    for v in range(V):
        m = v
        while par[m] != -1:
            m, depth[v] = par[m], depth[v] + 1
    edge_child = tuple(v for v in range(V) if par[v] != -1)
    edge_parent = tuple(par[c] for c in edge_child)
    child_edges = [[] for _ in range(V)]
    for e, p in enumerate(edge_parent):
        child_edges[p].append(e)
    max_depth = max(depth)
    levels = tuple(
        tuple(e for e, c in enumerate(edge_child) if depth[c] == d) for d in range(max_depth, 0, -1)
    )
    return TreeSchedule(par, par.index(-1), edge_child, edge_parent, levels,
                        tuple(tuple(c) for c in child_edges), tuple(depth))


def tree_schedule(parents: Sequence[int]) -> TreeSchedule:
    """The (cached) `TreeSchedule` of ``parents``; raises a ValueError naming ``parents`` if it is not a tree."""
    return _schedule(check_parents(parents))


# A level op maps the beliefs of a level's child nodes ``(B, n, K)`` and the level's edge indices ``(n,)``
# to the messages to their parents ``(B, n, K)`` (indexed by the parent's label) and the maximizing child
# label for each parent label ``(B, n, K)`` long.
LevelOp = Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


class LevelIndex(NamedTuple):
    """A level's index tensors on a device: its ``edges``, their ``children`` and ``parents`` ``(n,)``, and
    ``slots (n, width)``, each child's own child edges padded with E (the zero message row), or None for leaves."""

    edges: torch.Tensor
    children: torch.Tensor
    parents: torch.Tensor
    slots: Optional[torch.Tensor]


class DevicePlan(NamedTuple):
    """`LevelIndex` of every level of a schedule (``levels``, deepest first), of the ``root`` (a level of one
    node, no edge) and ``edge_parent (E,)``, on one device."""

    levels: Tuple[LevelIndex, ...]
    root: LevelIndex
    edge_parent: torch.Tensor


@functools.lru_cache(maxsize=64)
def device_plan(sched: TreeSchedule, device: torch.device) -> DevicePlan:
    """The (cached) `DevicePlan` of ``sched`` on ``device``: made once, as each index tensor built per call would
    be a blocking copy from the host on a GPU (docs/benchmarks/host_syncs.md)."""
    E = len(sched.edge_child)

    def index(values) -> torch.Tensor:
        return host_to_device(torch.tensor(values, dtype=torch.long), device)

    def level(edges, nodes) -> LevelIndex:
        width = max(len(sched.child_edges[v]) for v in nodes)
        slots = [list(sched.child_edges[v]) + [E] * (width - len(sched.child_edges[v])) for v in nodes]
        return LevelIndex(index(list(edges)), index(list(nodes)), index([sched.edge_parent[e] for e in edges]),
                          index(slots) if width else None)

    levels = tuple(level(lv, [sched.edge_child[e] for e in lv]) for lv in sched.levels)
    return DevicePlan(levels, level((), [sched.root]), index(list(sched.edge_parent)))


def _beliefs(unary: torch.Tensor, msgs: torch.Tensor, ix: LevelIndex) -> torch.Tensor:
    """Beliefs of a level's children (``unary`` gathered on dim 1) plus their children's messages (``msgs``
    rows on dim 1), added in a fixed order: unary + m_0 + m_1 + ..."""
    bel = unary[:, ix.children]
    if ix.slots is not None:
        for j in range(ix.slots.shape[1]):
            bel = bel + msgs[:, ix.slots[:, j]]
    return bel


def tree_max_sum_generic(unary: torch.Tensor, sched: TreeSchedule, level_op: LevelOp):
    """Max-sum on the tree of ``sched`` with node scores ``unary (B, V, K)`` and edge messages from
    ``level_op``; returns ``(labels (B, V) long, value (B,))``. Shared by every form and backend."""
    B, V, K = unary.shape
    E = V - 1
    dev = unary.device
    plan = device_plan(sched, dev)
    msgs = unary.new_empty(B, E + 1, K)  # every edge's row is written before it is read
    msgs[:, E] = 0  # row E: a zero message for padded child slots
    args = torch.empty(B, max(E, 1), K, dtype=torch.long, device=dev)
    for ix in plan.levels:
        m, a = level_op(_beliefs(unary, msgs, ix), ix.edges)
        msgs[:, ix.edges] = m
        args[:, ix.edges] = a
    value, root_label = _beliefs(unary, msgs, plan.root)[:, 0].max(dim=1)
    labels = torch.empty(B, V, dtype=torch.long, device=dev)
    labels[:, sched.root] = root_label
    for ix in reversed(plan.levels):
        labels[:, ix.children] = args[:, ix.edges].gather(2, labels[:, ix.parents].unsqueeze(2)).squeeze(2)
    return labels, value


def explicit_level_op_torch(pairwise: torch.Tensor) -> LevelOp:
    """The level op of explicit tables ``pairwise (B, E, K, K)`` or shared ``(E, K, K)``:
    ``m[k_p] = max_{k_c} pairwise[e, k_p, k_c] + belief[k_c]`` (first maximal ``k_c``)."""

    def op(belief, eidx):
        B, n, K = belief.shape
        tables = pairwise[:, eidx] if pairwise.dim() == 4 else pairwise[eidx].unsqueeze(0)
        step = max(1, _MAX_LEVEL_ELEMENTS // max(1, n * K * K))
        if B <= step:
            return (tables + belief.unsqueeze(2)).max(dim=3)
        parts = [
            (tables[s : s + step] if tables.shape[0] > 1 else tables) + belief[s : s + step].unsqueeze(2)
            for s in range(0, B, step)
        ]
        outs = [p.max(dim=3) for p in parts]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

    return op


def tree_max_sum_torch(unary: torch.Tensor, pairwise: torch.Tensor, parents: Sequence[int]):
    """MAP labelling of a batch of trees with explicit pairwise tables.

    Args:
        unary: ``(B, V, K)`` scores of label k at node v.
        pairwise: ``(B, E, K, K)`` per example or ``(E, K, K)`` shared, ``E = V - 1``; entry
            ``[.., e, i, j]`` scores label i at ``parents[c_e]`` and label j at the child ``c_e`` (module doc).
        parents: ``(V,)`` parent of each node, -1 for the root.

    Returns:
        labels ``(B, V)`` long and the best scores ``(B,)``.
    """
    return tree_max_sum_generic(unary, tree_schedule(parents), explicit_level_op_torch(pairwise))


def spatial_level_op(weights: torch.Tensor, rest: torch.Tensor, height: int, width: int, gdt_2d) -> LevelOp:
    """The level op of spatial nodes (module `distance_transform_torch`, "Spatial trees"), with ``gdt_2d``
    the 2-D distance transform of the backend (contract of `distance_transform_torch.distance_transform_2d`)."""

    def op(belief, eidx):
        B, n, _ = belief.shape
        w = weights[:, eidx] if weights.dim() == 3 else weights[eidx].unsqueeze(0)
        w = w.expand(B, n, 4).reshape(B * n, 4)
        r = rest[eidx].unsqueeze(0).expand(B, n, 2).reshape(B * n, 2)
        # cost w . (dx, dx^2, dy, dy^2) with d = l_c - l_p - r is a GDT with p = parent, q = child,
        # d_gdt = p - q - r_gdt = -d: a = w_quadratic, b = -w_linear, r_gdt = -r.
        out, arg = gdt_2d(
            belief.reshape(B * n, height, width),
            w[:, 1], -w[:, 0], -r[:, 0], w[:, 3], -w[:, 2], -r[:, 1],
        )
        return out.reshape(B, n, height * width), arg.reshape(B, n, height * width)

    return op


def spatial_tree_max_sum_torch(unary, weights, rest, parents, height: int, width: int, gdt_2d=None):
    """MAP positions of a batch of pictorial-structure trees by generalized distance transforms.

    Args:
        unary: ``(B, V, H*W)`` score of node v at position ``l = y * W + x`` (row y, column x).
        weights: ``(B, E, 4)`` or ``(E, 4)`` deformation weights ``w = (w_x, w_xx, w_y, w_yy)`` of each
            edge, with ``w_xx, w_yy >= 0`` (not checked here).
        rest: ``(E, 2)`` rest offsets ``r = (r_x, r_y)`` of each child relative to its parent.
        parents: ``(V,)`` parent of each node, -1 for the root.

    The score is ``sum_v unary[v, l_v] - sum_e w_e . Delta(l_c - l_p - r_e)`` with
    ``Delta(dx, dy) = (dx, dx^2, dy, dy^2)``, ``c``/``p`` the child/parent of edge e. O(V H W) work per
    example. Returns labels ``(B, V)`` long (flat positions) and the best scores ``(B,)``. ``gdt_2d``: the
    2-D transform to use (default: the torch twin `distance_transform_2d`).
    """
    op = spatial_level_op(weights, rest, height, width, gdt_2d or distance_transform_2d)
    return tree_max_sum_generic(unary, tree_schedule(parents), op)


class _MixtureLevelOp:
    """The level op of spatial nodes with T mixture types per edge (`mixture_tree_max_sum_torch`): per edge
    and type one 2-D transform of the child's belief (plus the type's score at the child's position), the
    type's score at the parent's position added, then the first maximal type per parent position. It
    returns the maximizing child position for the level's messages and keeps the maximizing type per
    parent position in ``self.types (B, E, H*W)`` for the read-out after backtracking."""

    def __init__(self, weights, rest, child_scores, parent_scores, height: int, width: int, gdt_2d, B: int):
        self.weights, self.rest = weights, rest
        self.child_scores, self.parent_scores = child_scores, parent_scores
        self.height, self.width, self.gdt_2d = height, width, gdt_2d
        E = rest.shape[0]
        self.types = torch.empty(B, max(E, 1), height * width, dtype=torch.long, device=rest.device)

    def __call__(self, belief, eidx):
        B, n, K = belief.shape
        T = self.rest.shape[1]
        w = self.weights[:, eidx] if self.weights.dim() == 4 else self.weights[eidx].unsqueeze(0)
        w = w.expand(B, n, T, 4).reshape(B * n * T, 4)
        r = self.rest[eidx].unsqueeze(0).expand(B, n, T, 2).reshape(B * n * T, 2)
        f = belief.unsqueeze(2).expand(B, n, T, K)
        if self.child_scores is not None:
            f = f + self.child_scores[:, eidx]
        # as `spatial_level_op`: a = w_quadratic, b = -w_linear, r_gdt = -r per axis
        out, arg = self.gdt_2d(f.reshape(B * n * T, self.height, self.width),
                               w[:, 1], -w[:, 0], -r[:, 0], w[:, 3], -w[:, 2], -r[:, 1])
        out, arg = out.view(B, n, T, K), arg.view(B, n, T, K)
        if self.parent_scores is not None:
            out = out + self.parent_scores[:, eidx]
        msg, best = out.max(dim=2)  # first maximal type
        self.types[:, eidx] = best
        return msg, arg.gather(2, best.unsqueeze(2)).squeeze(2)

    def edge_types(self, positions: torch.Tensor, edge_parent: torch.Tensor) -> torch.Tensor:
        """``(B, E)`` the type chosen on each edge given the backtracked ``positions (B, V)``; ``edge_parent (E,)``
        on their device."""
        E = edge_parent.shape[0]
        return self.types[:, :E].gather(2, positions[:, edge_parent].unsqueeze(2)).squeeze(2)


def mixture_tree_max_sum_torch(unary, weights, rest, parents, height: int, width: int, child_scores=None,
                               parent_scores=None, gdt_2d=None):
    """MAP positions and edge types of a batch of pictorial-structure trees with T mixture types per edge.

    Args:
        unary: ``(B, V, H*W)`` score of node v at position ``l = y * W + x``.
        weights: ``(B, E, T, 4)`` or ``(E, T, 4)`` deformation weights of each edge and type,
            ``w_xx, w_yy >= 0`` (not checked here).
        rest: ``(E, T, 2)`` rest offsets of each edge and type.
        child_scores, parent_scores: ``(B, E, T, H*W)`` or None: the score of type t on edge e at the position
            of the edge's child (resp. parent); ``(B, E, T, 1)`` for a score that does not depend on the
            position (a type bias).
        parents: ``(V,)`` parent of each node, -1 for the root.

    The score of positions ``l`` and types ``t (E,)`` is ``sum_v unary[v, l_v] + sum_e (child_scores[e, t_e,
    l_c] + parent_scores[e, t_e, l_p] - w_{e, t_e} . Delta(l_c - l_p - r_{e, t_e}))``. O(V T H W) work per
    example: T distance transforms per edge. Ties: the first maximal type, then the distance transform's
    smallest child position (so T = 1 without scores equals `spatial_tree_max_sum_torch` bitwise). Returns
    positions ``(B, V)`` long, types ``(B, E)`` long and the best scores ``(B,)``.
    """
    sched = tree_schedule(parents)
    op = _MixtureLevelOp(weights, rest, child_scores, parent_scores, height, width,
                         gdt_2d or distance_transform_2d, unary.shape[0])
    positions, value = tree_max_sum_generic(unary, sched, op)
    return positions, op.edge_types(positions, device_plan(sched, unary.device).edge_parent), value


def cooccurrence_tree_max_sum_torch(unary, weights, rest, cooccurrence, parents, height: int, width: int,
                                    child_scores=None, parent_scores=None, gdt_2d=None):
    """`mixture_tree_max_sum_torch` with type co-occurrence scores: ``cooccurrence (B, E, T, T)`` or shared
    ``(E, T, T)``, entry ``[e, s, t]`` scoring type t on edge e when the edge above e's parent has type s
    (the root has no edge above it: edges out of the root read row 0). Yang & Ramanan's "flexible mixtures
    of parts" with a part's type on the edge above it.

    A node's state is its position and the type of the edge above it, so messages are ``(T, H*W)`` per edge:
    ``m_e(s, l_p) = max_t cooccurrence[e, s, t] + D_{e,t}(l_p)``, with ``D_{e,t}`` the transform of the child's
    belief under type t (its type scores included), as in `mixture_tree_max_sum_torch`. O(V T (T + transform)
    H W) per example. Ties: the first maximal type, the transform's smallest child position, the root's first
    maximum; with zero co-occurrence the result equals `mixture_tree_max_sum_torch` bitwise. Returns positions
    ``(B, V)``, types ``(B, E)`` and the best scores ``(B,)``.
    """
    gdt_2d = gdt_2d or distance_transform_2d
    sched = tree_schedule(parents)
    B, V, K = unary.shape
    E, T = rest.shape[0], rest.shape[1]
    dev = unary.device
    plan = device_plan(sched, dev)
    msgs = unary.new_zeros(B, E + 1, T, K)  # m_e(s, l_p); row E: a zero message for padded child slots
    pos_args = torch.empty(B, max(E, 1), T, K, dtype=torch.long, device=dev)  # best l_c given (t, l_p)
    type_args = torch.empty(B, max(E, 1), T, K, dtype=torch.long, device=dev)  # best t given (s, l_p)
    unary_t = unary.unsqueeze(2).expand(B, V, T, K)  # (B, n, T, K) beliefs: unary + messages in edge order

    for ix in plan.levels:
        n = ix.edges.shape[0]
        eidx = ix.edges
        f = _beliefs(unary_t, msgs, ix)
        if child_scores is not None:
            f = f + child_scores[:, eidx]
        w = weights[:, eidx] if weights.dim() == 4 else weights[eidx].unsqueeze(0)
        w = w.expand(B, n, T, 4).reshape(B * n * T, 4)
        r = rest[eidx].unsqueeze(0).expand(B, n, T, 2).reshape(B * n * T, 2)
        out, arg = gdt_2d(f.reshape(B * n * T, height, width), w[:, 1], -w[:, 0], -r[:, 0], w[:, 3], -w[:, 2],
                          -r[:, 1])
        out = out.view(B, n, T, K)
        if parent_scores is not None:
            out = out + parent_scores[:, eidx]
        b = cooccurrence[:, eidx] if cooccurrence.dim() == 4 else cooccurrence[eidx].unsqueeze(0)
        m, best = (b.unsqueeze(-1) + out.unsqueeze(2)).max(dim=3)  # (B, n, s, K): the first maximal t
        msgs[:, eidx] = m
        type_args[:, eidx] = best
        pos_args[:, eidx] = arg.view(B, n, T, K)
    value, root_label = _beliefs(unary_t, msgs, plan.root)[:, 0, 0].max(dim=1)
    positions = torch.empty(B, V, dtype=torch.long, device=dev)
    node_type = torch.zeros(B, V, dtype=torch.long, device=dev)  # the type of the edge above each node
    types = torch.zeros(B, E, dtype=torch.long, device=dev)
    positions[:, sched.root] = root_label
    for ix in reversed(plan.levels):
        eidx, child, parent = ix.edges, ix.children, ix.parents
        lp = positions[:, parent]
        t = type_args[:, eidx].flatten(2).gather(2, (node_type[:, parent] * K + lp).unsqueeze(2)).squeeze(2)
        positions[:, child] = pos_args[:, eidx].flatten(2).gather(2, (t * K + lp).unsqueeze(2)).squeeze(2)
        node_type[:, child] = t
        types[:, eidx] = t
    return positions, types, value
