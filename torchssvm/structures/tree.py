"""Tree-structured outputs: one discrete label per node of a fixed tree, unary and pairwise (edge) scores.

Two forms share the tree handling (`kernels.tree_torch`: edges numbered by their child, schedule by depth):

- `Tree`: explicit pairwise tables ``(B, E, K, K)`` or ``(E, K, K)`` on any tree (e.g. a Chow-Liu tree
  over labels). Exact max-sum, O(V K^2) per example.
- `SpatialTree`: pictorial structures (the LSP model of the BCFW gap-sampling paper): a node's label is a
  position on an ``H x W`` grid and each edge has a quadratic deformation cost, decoded by generalized
  distance transforms in O(V H W) per example instead of O(V (HW)^2). A separate class rather than a
  ``grid=`` option because its potentials, losses and marginals differ from the explicit form.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from .._validation import (
    POTENTIAL_INF_HINT,
    check_bool,
    check_constant,
    check_finite,
    check_float_dtype,
    check_labels,
    check_positive_int,
    check_shape,
    check_tensor,
)
from ..kernels import check_quadratic_weights, spatial_tree_max_sum, tree_max_sum, tree_schedule
from .base import Structure, compute_dtype


class TreePotentials(NamedTuple):
    """Scores of a batch of trees with V nodes, E = V - 1 edges and K labels.

    - ``unary``: ``(B, V, K)`` score of label k at node v.
    - ``pairwise``: ``(B, E, K, K)`` per example or ``(E, K, K)`` shared; ``[.., e, i, j]`` scores label i at
      the parent and label j at the child of edge e (edge e's child is the e-th non-root node in
      increasing order).

    As marginals (`Tree.marginals`) the same container holds one-hot indicators: unary ``(B, V, K)``,
    pairwise ``(B, E, K, K)``.
    """

    unary: torch.Tensor
    pairwise: torch.Tensor


class SpatialTreePotentials(NamedTuple):
    """Scores of a batch of pictorial-structure trees on an ``H x W`` grid (`SpatialTree`).

    - ``unary``: ``(B, V, H*W)`` score of node v at flat position ``y * W + x``.
    - ``weights``: ``(B, E, 4)`` or ``(E, 4)`` deformation weights ``(w_x, w_xx, w_y, w_yy)`` of each edge;
      ``w_xx, w_yy >= 0``.
    - ``rest``: ``(E, 2)`` rest offsets ``(r_x, r_y)`` of each child from its parent, or None (zero). A
      constant: it receives no gradient (one that requires grad is refused).

    As marginals (`SpatialTree.marginals`): unary one-hot ``(B, V, H*W)``, weights ``(B, E, 4)`` holding
    ``-Delta(l_c - l_p - r)`` (the gradient of the score in the weights), rest None.
    """

    unary: torch.Tensor
    weights: torch.Tensor
    rest: Optional[torch.Tensor] = None


class Tree(Structure):
    """Output space of labellings ``y in {0..K-1}^V`` of the nodes of a tree, scored

    ``s(y) = sum_v unary[v, y_v] + sum_e pairwise[e, y_{parent(c_e)}, y_{c_e}]``.

    Args:
        parents: ``(V,)`` parent of each node, -1 for the single root (a ValueError names ``parents`` for two
            roots, a cycle or an out-of-range entry).
        num_labels: K.
        normalize: divide the Hamming loss by V.
        class_weights: optional ``(K,)`` cost of a mistake on a node whose true label is k.

    Labels are ``(B, V)`` long; ``lengths`` must be None. Task loss: Hamming over nodes
    ``sum_v c[y_v] [y_hat_v != y_v]`` (normalized by V by default). MAP and loss-augmented decoding are exact
    (max-sum, leaves to root; ties: smallest label at every argmax, `kernels.tree_torch`).
    """

    potential_names = ("unary", "pairwise")
    has_max_task_loss = True

    def __init__(self, parents: Sequence[int], num_labels: int, *, normalize: bool = True, class_weights=None):
        self.schedule = tree_schedule(parents)
        super().__init__(num_labels, class_weights)
        self.parents = self.schedule.parents
        self.num_nodes = len(self.parents)
        self.num_edges = self.num_nodes - 1
        self.normalize = check_bool("normalize", normalize)
        self._edge_child = torch.tensor(self.schedule.edge_child, dtype=torch.long)
        self._edge_parent = torch.tensor(self.schedule.edge_parent, dtype=torch.long)

    def edge_nodes(self, device):
        """``(parent nodes (E,), child nodes (E,))`` on ``device``."""
        return self._edge_parent.to(device), self._edge_child.to(device)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        if lengths is not None:
            raise ValueError("lengths must be None for Tree (every example has all V nodes)")
        pot = self._as_potentials(potentials)
        B, K = self._check_unary(pot.unary)
        E = self.num_edges
        check_tensor("pairwise", pot.pairwise, floating=True)
        self._check_common({"pairwise": pot.pairwise}, pot.unary)
        if pot.pairwise.dim() == 3:
            check_shape("pairwise", pot.pairwise, (E, K, K), "shared")
        elif pot.pairwise.dim() == 4:
            check_shape("pairwise", pot.pairwise, (B, E, K, K), "per example")
        else:
            raise ValueError(f"pairwise must have shape ({E}, {K}, {K}) or ({B}, {E}, {K}, {K}), "
                             f"got {tuple(pot.pairwise.shape)}")
        check_finite({"unary": pot.unary, "pairwise": pot.pairwise}, POTENTIAL_INF_HINT)
        if target is not None:
            target = check_labels(target_name, target, (B, self.num_nodes), K, pot.unary.device)
        return pot, None, target

    def _check_unary(self, unary):
        check_tensor("unary", unary, ndim=3, floating=True)
        B, V, K = unary.shape
        if V != self.num_nodes:
            raise ValueError(f"unary has {V} nodes in dimension 1, but parents has {self.num_nodes}")
        if K != self.num_labels:
            raise ValueError(f"unary has {K} labels in its last dimension, expected {self.num_labels}")
        return B, K

    def _as_potentials(self, potentials) -> TreePotentials:
        if isinstance(potentials, TreePotentials):
            return potentials
        if isinstance(potentials, (tuple, list)) and len(potentials) == 2:
            return TreePotentials(*potentials)
        raise TypeError(f"potentials must be a TreePotentials(unary, pairwise), got {type(potentials).__name__}")

    def _check_y(self, y, y_hat):
        check_tensor("y", y, ndim=2)
        shape = (y.shape[0], self.num_nodes)
        y = check_labels("y", y, shape, self.num_labels, y.device)
        y_hat = check_labels("y_hat", y_hat, shape, self.num_labels, y.device) if y_hat is not None else None
        return y, y_hat

    # -- the protocol -------------------------------------------------------------------------
    def _max_oracle(self, pot, lengths, target, loss_weight, backend):
        """Unchecked `max_oracle`. ``loss_weight``: ``(B,)`` tensor or None."""
        dt = compute_dtype(pot)
        unary = self._augmented_unary(pot.unary.detach().to(dt), lengths, target, loss_weight)
        return tree_max_sum(unary, pot.pairwise.detach().to(dt), self.parents, backend=backend)

    def _augmented_unary(self, unary, lengths, target, loss_weight):
        """``unary + loss_weight * Delta_v(l)``: the loss is decomposable over nodes."""
        if target is None:
            return unary
        # in place on the fresh float64 table: no extra (B, V, K) buffers; t + unary == unary + t bitwise
        table = self._node_loss_table(target, lengths).mul_(loss_weight.view(-1, 1, 1))
        return table.to(unary.dtype).add_(unary)

    def _node_loss_table(self, target, lengths) -> torch.Tensor:
        """``(B, V, K)`` float64: the loss of each label at each node given the truth (Hamming). A fresh tensor:
        `_augmented_unary` modifies it in place, so overrides must return a fresh tensor too."""
        w = self._node_weights(target)
        wrong = torch.ones(*target.shape, self.num_labels, dtype=torch.float64, device=target.device)
        return wrong.scatter_(2, target.unsqueeze(2), 0.0) * w.unsqueeze(2)

    def _max_task_loss(self, target, lengths) -> torch.Tensor:
        w = self._node_weights(target).sum(1)
        return w if self.num_labels > 1 else torch.zeros_like(w)

    def _node_weights(self, y) -> torch.Tensor:
        w = self._class_weight(y, torch.float64)
        return w / self.num_nodes if self.normalize else w

    def _score_bound(self, tensors, mags, aug):
        return self.num_nodes * (mags.get("unary", 0.0) + aug) + self.num_edges * mags.get("pairwise", 0.0)

    def _loss_sites(self, tensors) -> int:
        return self.num_nodes

    def _score(self, pot, y, lengths) -> torch.Tensor:
        s = pot.unary.gather(2, y.unsqueeze(2)).squeeze(2).sum(1)
        if self.num_edges:
            par, ch = self.edge_nodes(y.device)
            yp, yc = y[:, par], y[:, ch]
            K = self.num_labels
            if pot.pairwise.dim() == 3:
                pw = pot.pairwise.reshape(-1)[(torch.arange(self.num_edges, device=y.device) * K + yp) * K + yc]
            else:
                pw = pot.pairwise.reshape(y.shape[0], -1, K * K).gather(2, (yp * K + yc).unsqueeze(2)).squeeze(2)
            s = s + pw.sum(1)
        return s

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        if lengths is not None:
            raise ValueError("lengths must be None for Tree")
        y, y_hat = self._check_y(y, y_hat)
        return self._task_loss(y_hat, y, None)

    def _task_loss(self, y_hat, y, lengths) -> torch.Tensor:
        return (self._node_weights(y) * (y_hat != y)).sum(1)

    def marginals(self, y, lengths=None, *, dtype=torch.float32) -> TreePotentials:
        """One-hot marginals of ``y (B, V)``: unary ``(B, V, K)`` and pairwise ``(B, E, K, K)``, so that
        ``score(pot, y) == <pot, marginals(y)>`` per example (shared tables broadcast)."""
        check_float_dtype(dtype)
        if lengths is not None:
            raise ValueError("lengths must be None for Tree")
        y, _ = self._check_y(y, None)
        B, K, E = y.shape[0], self.num_labels, self.num_edges
        unary = torch.zeros(B, self.num_nodes, K, dtype=dtype, device=y.device).scatter_(2, y.unsqueeze(2), 1.0)
        par, ch = self.edge_nodes(y.device)
        pair = torch.zeros(B, E, K * K, dtype=dtype, device=y.device)
        pair.scatter_(2, (y[:, par] * K + y[:, ch]).unsqueeze(2), 1.0)
        return TreePotentials(unary, pair.view(B, E, K, K))

    # -- autograd plumbing -----------------------------------------------------------------------
    def tensors(self, potentials):
        return tuple(self._as_potentials(potentials))

    def from_tensors(self, tensors: Sequence[Optional[torch.Tensor]]) -> TreePotentials:
        return TreePotentials(*tensors)

    def _unary_vjp(self, y, weight, unary, dtype):
        src = weight.view(-1, 1, 1).expand(*y.shape, 1)
        return torch.zeros(unary.shape, dtype=dtype, device=unary.device).scatter_(2, y.unsqueeze(2), src)

    def marginal_vjp(self, y, weight, potentials, lengths, needs, dtype=None):
        pot = self._as_potentials(potentials)
        dtype = dtype or pot.unary.dtype
        weight = weight.to(dtype)
        out = [None, None]
        if needs[0]:
            out[0] = self._unary_vjp(y, weight, pot.unary, dtype)
        if needs[1]:
            K, E, B = self.num_labels, self.num_edges, y.shape[0]
            par, ch = self.edge_nodes(y.device)
            idx = y[:, par] * K + y[:, ch]  # (B, E)
            if pot.pairwise.dim() == 3:
                flat = (torch.arange(E, device=y.device) * (K * K) + idx).reshape(-1)
                g = torch.zeros(E * K * K, dtype=dtype, device=y.device)
                out[1] = g.index_add_(0, flat, weight.unsqueeze(1).expand(B, E).reshape(-1)).view(E, K, K)
            else:
                g = torch.zeros(B, E, K * K, dtype=dtype, device=y.device)
                out[1] = g.scatter_(2, idx.unsqueeze(2), weight.view(B, 1, 1).expand(B, E, 1)).view(B, E, K, K)
        return tuple(out)

    def __repr__(self) -> str:
        return f"Tree(V={self.num_nodes}, num_labels={self.num_labels}, normalize={self.normalize})"


LOSSES = ("truncated", "hamming")


class SpatialTree(Tree):
    """Pictorial structures: node v's label is a position ``l_v = (x, y)`` on an ``H x W`` grid (x the column
    in ``[0, W)``, y the row in ``[0, H)``), given as the flat index ``y * W + x``; the score is

    ``s(l) = sum_v unary[v, l_v] - sum_e w_e . Delta(l_c - l_p - r_e)``,  ``Delta(dx, dy) = (dx, dx^2, dy, dy^2)``

    with ``c``/``p`` the child/parent of edge e, ``w_e = (w_x, w_xx, w_y, w_yy)`` (``w_xx, w_yy >= 0``: a
    convex deformation cost) and ``r_e`` the child's rest offset from its parent (`SpatialTreePotentials`).
    Decoding runs max-sum with 2-D generalized distance transforms (`kernels.distance_transform_torch`; on CPU
    the compiled twin `kernels.distance_transform_numba` when numba is installed).

    Args:
        parents: ``(V,)`` parent of each node, -1 for the root.
        height, width: the grid (``num_labels = H * W``).
        loss: ``"truncated"``: the LSP loss ``(1/V) sum_v min(1, ||l_v - l_v*||^2 / s^2)`` with a per-example
            scale ``s (B,)`` (LSP: the distance between left shoulder and right hip in the truth), passed in
            the protocol's ``lengths`` slot (``lengths=s``) wherever a loss is computed; or ``"hamming"``:
            ``(1/V) sum_v [l_v != l_v*]`` (``lengths`` then must be None).
    """

    potential_names = ("unary", "weights", "rest")
    offset_names = ("rest",)
    oracle_op = "spatial_tree_max_sum"

    def __init__(self, parents: Sequence[int], height: int, width: int, *, loss: str = "truncated"):
        self.height = check_positive_int("height", height)
        self.width = check_positive_int("width", width)
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        self.loss = loss
        super().__init__(parents, self.height * self.width, normalize=True)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        pot = self._as_potentials(potentials)
        B, K = self._check_unary(pot.unary)
        E = self.num_edges
        check_tensor("weights", pot.weights, floating=True)
        self._check_common({"weights": pot.weights, "rest": pot.rest}, pot.unary)
        if pot.weights.dim() == 2:
            check_shape("weights", pot.weights, (E, 4), "shared")
        elif pot.weights.dim() == 3:
            check_shape("weights", pot.weights, (B, E, 4), "per example")
        else:
            raise ValueError(f"weights must have shape ({E}, 4) or ({B}, {E}, 4), got {tuple(pot.weights.shape)}")
        if pot.rest is not None:
            check_shape("rest", pot.rest, (E, 2))
            check_constant("rest", pot.rest, "rest offsets are constants of the deformation cost")
        check_finite({"unary": pot.unary, "weights": pot.weights, "rest": pot.rest}, POTENTIAL_INF_HINT)
        check_quadratic_weights("weights[..., 1] and weights[..., 3]", pot.weights[..., 1::2])
        lengths = self._check_scale(lengths, B, pot.unary.device)
        if target is not None:
            target = check_labels(target_name, target, (B, self.num_nodes), K, pot.unary.device)
        return pot, lengths, target

    def _check_scale(self, scale, B, device):
        if scale is None:
            return None
        if self.loss == "hamming":
            raise ValueError("lengths must be None for SpatialTree(loss='hamming')")
        check_tensor("lengths (the loss scale s)", scale, ndim=1, floating=True, device=device)
        if scale.shape[0] != B:
            raise ValueError(f"lengths (the loss scale s) must have shape ({B},), got {tuple(scale.shape)}")
        if B and not (bool(torch.isfinite(scale).all()) and bool((scale > 0).all())):
            raise ValueError("lengths (the loss scale s) must be finite and > 0")
        return scale

    def _need_scale(self, scale):
        if self.loss == "truncated" and scale is None:
            raise ValueError("SpatialTree(loss='truncated') needs the per-example loss scale s (B,) "
                             "passed as lengths")

    def _as_potentials(self, potentials) -> SpatialTreePotentials:
        if isinstance(potentials, SpatialTreePotentials):
            return potentials
        if isinstance(potentials, (tuple, list)) and len(potentials) in (2, 3):
            return SpatialTreePotentials(*potentials)
        raise TypeError("potentials must be a SpatialTreePotentials(unary, weights, rest=None), "
                        f"got {type(potentials).__name__}")

    def _rest(self, pot, dtype, device):
        if pot.rest is None:
            return torch.zeros(self.num_edges, 2, dtype=dtype, device=device)
        return pot.rest.detach().to(dtype)

    def _score_bound(self, tensors, mags, aug):
        """The score ``sum_v unary - sum_e w . Delta`` with ``|dx|, |dy| <= D = max(H, W) + |rest|``, and the
        distance transform's envelope test, which multiplies beliefs by position differences (``4 n`` of them, n
        the longer side) and the quadratic weight by ``n^3``."""
        n = max(self.height, self.width)
        D = n + mags.get("rest", 0.0)
        w = mags.get("weights", 0.0)
        edge = w * 2.0 * (D + D * D) + self._type_score_magnitude(mags)
        score = self.num_nodes * (mags.get("unary", 0.0) + aug) + self.num_edges * edge
        return 4.0 * n * score + w * float(n) ** 3

    def _type_score_magnitude(self, mags) -> float:
        return 0.0

    def xy(self, labels):
        """``(x, y)``: the column and the row of flat positions ``labels`` (any shape)."""
        return labels % self.width, torch.div(labels, self.width, rounding_mode="floor")

    def deltas(self, y, rest, dtype) -> torch.Tensor:
        """``(B, E, 4)`` ``Delta(l_c - l_p - r)`` of labellings ``y (B, V)`` (positions in range) with rest offsets
        ``rest (E, 2)`` of ``dtype``: the deformation part of the joint feature map (the score is
        ``sum_v unary[v, l_v] - sum_e w_e . Delta_e``)."""
        par, ch = self.edge_nodes(y.device)
        x, yy = self.xy(y)
        dx = (x[:, ch] - x[:, par]).to(dtype) - rest[:, 0]
        dy = (yy[:, ch] - yy[:, par]).to(dtype) - rest[:, 1]
        return torch.stack([dx, dx * dx, dy, dy * dy], dim=2)

    # -- the protocol -------------------------------------------------------------------------
    def max_oracle(self, potentials, target=None, lengths=None, *, loss_weight=1.0, backend="auto"):
        if target is not None:
            self._need_scale(lengths)
        return super().max_oracle(potentials, target, lengths, loss_weight=loss_weight, backend=backend)

    def _max_oracle(self, pot, lengths, target, loss_weight, backend):
        dt = compute_dtype(pot)
        dev = pot.unary.device
        unary = self._augmented_unary(pot.unary.detach().to(dt), lengths, target, loss_weight)
        return spatial_tree_max_sum(unary, pot.weights.detach().to(dt), self._rest(pot, dt, dev), self.parents,
                                    self.height, self.width, backend=backend)

    def _max_task_loss(self, target, lengths) -> torch.Tensor:
        """Every node at its farthest position (the truncated loss is separable over nodes); Hamming: 1 (0 on a
        one-position grid). The positions are ``target[:, :V]`` (a mixture's types follow them)."""
        if self.loss == "hamming":
            return torch.full((target.shape[0],), 1.0 if self.num_labels > 1 else 0.0, dtype=torch.float64,
                              device=target.device)
        return self._node_loss_table(target[:, :self.num_nodes], lengths).max(2).values.sum(1)

    def _node_loss_table(self, target, lengths) -> torch.Tensor:
        if self.loss == "hamming":
            return super()._node_loss_table(target, lengths)
        self._need_scale(lengths)
        f64 = torch.float64
        tx, ty = self.xy(target)
        # separable: dx^2 (B, V, 1, W) + dy^2 (B, V, H, 1), exact integers in float64, one (B, V, H*W) pass
        dx = torch.arange(self.width, device=target.device, dtype=f64) - tx.unsqueeze(2).to(f64)
        dy = torch.arange(self.height, device=target.device, dtype=f64) - ty.unsqueeze(2).to(f64)
        d2 = (dx * dx).unsqueeze(2) + (dy * dy).unsqueeze(3)
        s2 = lengths.to(f64).view(-1, 1, 1) ** 2
        return d2.view(*target.shape, self.num_labels).div_(s2).clamp_max_(1.0).div_(self.num_nodes)

    def _score(self, pot, y, lengths) -> torch.Tensor:
        dt = compute_dtype(pot)  # a half unary with float32 weights (a network under autocast): float32, as the oracles
        s = pot.unary.to(dt).gather(2, y.unsqueeze(2)).squeeze(2).sum(1)
        if self.num_edges:
            delta = self.deltas(y, self._rest(pot, dt, y.device), dt)
            s = s - (pot.weights.to(dt) * delta).sum((1, 2))
        return s

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        y, y_hat = self._check_y(y, y_hat)
        if lengths is not None:
            lengths = self._check_scale(lengths, y.shape[0], y.device)
        return self._task_loss(y_hat, y, lengths)

    def _task_loss(self, y_hat, y, lengths) -> torch.Tensor:
        if self.loss == "hamming":
            return (y_hat != y).to(torch.float64).sum(1) / self.num_nodes
        return self._node_loss_table(y, lengths).gather(2, y_hat.unsqueeze(2)).squeeze(2).sum(1)

    def marginals(self, y, lengths=None, *, dtype=torch.float32, rest=None) -> SpatialTreePotentials:
        """Marginals of positions ``y (B, V)``: unary one-hot ``(B, V, H*W)`` and weights ``(B, E, 4)`` =
        ``-Delta(l_c - l_p - r)`` (``rest (E, 2)``, default zero), so that ``score == <pot, marginals>``."""
        check_float_dtype(dtype)
        y, _ = self._check_y(y, None)
        B = y.shape[0]
        unary = torch.zeros(B, self.num_nodes, self.num_labels, dtype=dtype, device=y.device)
        unary.scatter_(2, y.unsqueeze(2), 1.0)
        if rest is None:
            rest = torch.zeros(self.num_edges, 2, dtype=dtype, device=y.device)
        else:
            check_shape("rest", rest, (self.num_edges, 2))
        return SpatialTreePotentials(unary, -self.deltas(y, rest.to(dtype), dtype), None)

    # -- autograd plumbing -----------------------------------------------------------------------
    def from_tensors(self, tensors: Sequence[Optional[torch.Tensor]]) -> SpatialTreePotentials:
        return SpatialTreePotentials(*tensors)

    def marginal_vjp(self, y, weight, potentials, lengths, needs, dtype=None):
        pot = self._as_potentials(potentials)
        dtype = dtype or pot.unary.dtype
        weight = weight.to(dtype)
        out = [None, None, None]
        if needs[0]:
            out[0] = self._unary_vjp(y, weight, pot.unary, dtype)
        if needs[1]:
            g = -self.deltas(y, self._rest(pot, dtype, y.device), dtype) * weight.view(-1, 1, 1)
            out[1] = g.sum(0) if pot.weights.dim() == 2 else g
        return tuple(out)

    def __repr__(self) -> str:
        return f"SpatialTree(V={self.num_nodes}, height={self.height}, width={self.width}, loss={self.loss!r})"
