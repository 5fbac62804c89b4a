"""Pictorial structures with mixture types per edge: each edge picks one of T deformation models.

The LSP model of the BCFW gap-sampling paper (Osokin et al., 2016, after Chen & Yuille, 2014) gives every arc a
type ``t in {1..T}`` with its own rest offset (a K-means centre of the training displacements), its own
deformation weights and an image-dependent type score; Yang & Ramanan's (2011) "flexible mixtures of parts" give
every part an appearance type. `MixtureSpatialTree` covers both with one type per edge (in a tree an edge
and its child node are the same thing) scored at either end:

``s(l, t) = sum_v unary[v, l_v] + sum_e (child_scores[e, t_e, l_c] + parent_scores[e, t_e, l_p]
            - w_{e, t_e} . Delta(l_c - l_p - r_{e, t_e}) + cooccurrence[e, t_{a(e)}, t_e])``,
``Delta(dx, dy) = (dx, dx^2, dy, dy^2)``, with ``a(e)`` the edge above e's parent (type 0 at the root): the
optional co-occurrence term couples the types of consecutive edges, as Yang & Ramanan's co-occurrence
biases couple the types of neighbouring parts.

Decoding maximizes jointly over positions and types: per edge, T distance transforms of the child's belief
and a first-maximum over types per parent position (`kernels.mixture_tree_max_sum`), O(V T H W) per example;
with co-occurrence the messages also depend on the parent's own type, O(V T^2 H W).
The paper's model with a type on both orientations of an edge is this one with the ``T^2`` type pairs as
types (two quadratics in the same displacement add up to one, and each orientation's type score sits at
one end).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from .._validation import (
    POTENTIAL_INF_HINT,
    check_constant,
    check_finite,
    check_float_dtype,
    check_labels,
    check_positive_int,
    check_shape,
    check_tensor,
)
from ..kernels import check_quadratic_weights, mixture_tree_max_sum
from .base import compute_dtype
from .tree import SpatialTree


class MixtureTreePotentials(NamedTuple):
    """Scores of a batch of pictorial-structure trees with T types per edge (`MixtureSpatialTree`).

    - ``unary``: ``(B, V, H*W)`` score of node v at flat position ``y * W + x``.
    - ``weights``: ``(B, E, T, 4)`` or ``(E, T, 4)`` deformation weights ``(w_x, w_xx, w_y, w_yy)`` of each
      edge and type; ``w_xx, w_yy >= 0``.
    - ``rest``: ``(E, T, 2)`` rest offsets ``(r_x, r_y)`` of each edge's child from its parent per type, or
      None (zero). A constant: it receives no gradient (one that requires grad is refused).
    - ``child_scores``, ``parent_scores``: ``(B, E, T, H*W)`` or None: the score of type t on edge e at the
      position of the edge's child (resp. parent), e.g. a type's appearance or a network's type logits;
      ``(B, E, T, 1)`` for a score that does not depend on the position (a type bias).
    - ``cooccurrence``: ``(B, E, T, T)``, ``(E, T, T)`` or None: ``[e, s, t]`` scores type t on edge e when
      the edge above e's parent has type s (edges out of the root read row s = 0).

    As marginals (`MixtureSpatialTree.marginals`): unary one-hot ``(B, V, H*W)``, weights ``(B, E, T, 4)``
    holding ``-Delta(l_c - l_p - r_{e, t_e})`` at the chosen type and 0 elsewhere, rest None, the type
    scores one-hot ``(B, E, T, H*W)`` at ``(t_e, l_c)`` (resp. ``(t_e, l_p)``) and the co-occurrence one-hot
    ``(B, E, T, T)`` at ``(t_{a(e)}, t_e)``.
    """

    unary: torch.Tensor
    weights: torch.Tensor
    rest: Optional[torch.Tensor] = None
    child_scores: Optional[torch.Tensor] = None
    parent_scores: Optional[torch.Tensor] = None
    cooccurrence: Optional[torch.Tensor] = None


class MixtureSpatialTree(SpatialTree):
    """`SpatialTree` with ``num_types`` T deformation types per edge, chosen jointly with the positions.

    Labels are ``(B, V + E)`` long: the V flat positions (as in `SpatialTree`), then the type in ``[0, T)`` of
    each edge (edge e's child is the e-th non-root node in increasing order). The task loss depends on the
    positions only (``loss="truncated"``: the LSP loss with the per-example scale passed as ``lengths``; or
    ``"hamming"``), as in the paper, where types are part of the output but not of the loss.

    Args:
        parents: ``(V,)`` parent of each node, -1 for the root.
        height, width: the grid.
        num_types: T >= 1 (T = 1 without type scores is `SpatialTree`, bitwise).
        loss: ``"truncated"`` or ``"hamming"`` (`SpatialTree`).
    """

    potential_names = ("unary", "weights", "rest", "child_scores", "parent_scores", "cooccurrence")

    def __init__(self, parents: Sequence[int], height: int, width: int, num_types: int, *, loss: str = "truncated"):
        self.num_types = check_positive_int("num_types", num_types)
        super().__init__(parents, height, width, loss=loss)
        self.label_width = self.num_nodes + self.num_edges
        # the edge above each edge's parent (-1 at the root), for the co-occurrence term
        edge_of = {c: e for e, c in enumerate(self.schedule.edge_child)}
        self._above = torch.tensor([edge_of.get(p, -1) for p in self.schedule.edge_parent], dtype=torch.long)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        pot = self._as_potentials(potentials)
        B, _ = self._check_unary(pot.unary)
        E, T, K = self.num_edges, self.num_types, self.num_labels
        check_tensor("weights", pot.weights, floating=True)
        scores = {"child_scores": pot.child_scores, "parent_scores": pot.parent_scores}
        self._check_common({"weights": pot.weights, "rest": pot.rest, "cooccurrence": pot.cooccurrence, **scores},
                           pot.unary)
        if pot.weights.dim() == 3:
            check_shape("weights", pot.weights, (E, T, 4), "shared")
        elif pot.weights.dim() == 4:
            check_shape("weights", pot.weights, (B, E, T, 4), "per example")
        else:
            raise ValueError(f"weights must have shape ({E}, {T}, 4) or ({B}, {E}, {T}, 4), "
                             f"got {tuple(pot.weights.shape)}")
        if pot.rest is not None:
            check_shape("rest", pot.rest, (E, T, 2))
            check_constant("rest", pot.rest, "rest offsets are constants of the deformation cost")
        for name, s in scores.items():
            if s is not None:
                bias = s.dim() == 4 and s.shape[-1] == 1
                check_shape(name, s, (B, E, T, 1 if bias else K), f"or ({B}, {E}, {T}, 1) for a type bias")
        if pot.cooccurrence is not None:
            shared = pot.cooccurrence.dim() == 3
            check_shape("cooccurrence", pot.cooccurrence, (E, T, T) if shared else (B, E, T, T),
                        "shared" if shared else f"per example, or ({E}, {T}, {T}) shared")
        check_finite({"unary": pot.unary, "weights": pot.weights, "rest": pot.rest, "cooccurrence": pot.cooccurrence,
                      **scores}, POTENTIAL_INF_HINT)
        check_quadratic_weights("weights[..., 1] and weights[..., 3]", pot.weights[..., 1::2])
        lengths = self._check_scale(lengths, B, pot.unary.device)
        if target is not None:
            target = self._check_labels(target_name, target, B, pot.unary.device)
        return pot, lengths, target

    def _check_labels(self, name, y, B, device):
        check_tensor(name, y, ndim=2)
        V, E = self.num_nodes, self.num_edges
        if B is None:
            B = y.shape[0]
        if tuple(y.shape) != (B, V + E):
            raise ValueError(f"{name} must have shape ({B}, {V + E}) (V = {V} positions, then E = {E} edge types), "
                             f"got {tuple(y.shape)}")
        pos = check_labels(f"{name}[:, :{V}] (positions)", y[:, :V], (B, V), self.num_labels, device)
        types = check_labels(f"{name}[:, {V}:] (edge types)", y[:, V:], (B, E), self.num_types, device)
        return torch.cat([pos, types], 1)

    def _check_y(self, y, y_hat):
        check_tensor("y", y)
        y = self._check_labels("y", y, None, y.device)
        y_hat = self._check_labels("y_hat", y_hat, y.shape[0], y.device) if y_hat is not None else None
        return y, y_hat

    def _as_potentials(self, potentials) -> MixtureTreePotentials:
        if isinstance(potentials, MixtureTreePotentials):
            return potentials
        if isinstance(potentials, (tuple, list)) and 2 <= len(potentials) <= 6:
            return MixtureTreePotentials(*potentials)
        raise TypeError("potentials must be a MixtureTreePotentials(unary, weights, rest=None, child_scores=None, "
                        f"parent_scores=None, cooccurrence=None), got {type(potentials).__name__}")

    def _rest(self, pot, dtype, device):
        if pot.rest is None:
            return torch.zeros(self.num_edges, self.num_types, 2, dtype=dtype, device=device)
        return pot.rest.detach().to(dtype)

    def _type_score_magnitude(self, mags) -> float:
        return sum(mags.get(k, 0.0) for k in ("child_scores", "parent_scores", "cooccurrence"))

    def _split(self, y):
        return y[:, :self.num_nodes], y[:, self.num_nodes:]

    def type_pairs(self, types: torch.Tensor) -> torch.Tensor:
        """``(B, E)`` flat index ``t_{a(e)} T + t_e`` of each edge into a ``(T, T)`` co-occurrence table, with
        ``t_{a(e)}`` the type of the edge above e's parent (0 for edges out of the root)."""
        above = self._above.to(types.device)
        t_above = torch.where(above >= 0, types[:, above.clamp_min(0)], torch.zeros_like(types))
        return t_above * self.num_types + types

    @staticmethod
    def typed_positions(types: torch.Tensor, at: torch.Tensor, Ks: int) -> torch.Tensor:
        """``(B, E)`` flat index ``t_e Ks + l`` of each edge into a ``(T, Ks)`` type score table at positions
        ``at (B, E)``; ``Ks = 1`` (a type bias) ignores the position."""
        return types * Ks + (at if Ks > 1 else torch.zeros_like(at))

    def typed_deltas(self, y, rest, dtype) -> torch.Tensor:
        """``(B, E, 4)`` ``Delta(l_c - l_p - r_{e, t_e})`` of labels ``y (B, V + E)``."""
        pos, types = self._split(y)
        E = self.num_edges
        r = rest[torch.arange(E, device=y.device), types]  # (B, E, 2)
        par, ch = self.edge_nodes(y.device)
        x, yy = self.xy(pos)
        dx = (x[:, ch] - x[:, par]).to(dtype) - r[..., 0]
        dy = (yy[:, ch] - yy[:, par]).to(dtype) - r[..., 1]
        return torch.stack([dx, dx * dx, dy, dy * dy], dim=2)

    # -- the protocol -------------------------------------------------------------------------
    def _max_oracle(self, pot, lengths, target, loss_weight, backend):
        dt = compute_dtype(pot)
        dev = pot.unary.device
        target_pos = None if target is None else target[:, :self.num_nodes]
        unary = self._augmented_unary(pot.unary.detach().to(dt), lengths, target_pos, loss_weight)

        def scores(s):
            return None if s is None else s.detach().to(dt)

        pos, types, value = mixture_tree_max_sum(unary, pot.weights.detach().to(dt), self._rest(pot, dt, dev),
                                                 self.parents, self.height, self.width, scores(pot.child_scores),
                                                 scores(pot.parent_scores), scores(pot.cooccurrence), backend=backend)
        return torch.cat([pos, types], 1), value

    def _score(self, pot, y, lengths) -> torch.Tensor:
        dt = compute_dtype(pot)  # a half unary with float32 weights (a network under autocast): float32, as the oracles
        pos, types = self._split(y)
        s = pot.unary.to(dt).gather(2, pos.unsqueeze(2)).squeeze(2).sum(1)
        if not self.num_edges:
            return s
        delta = self.typed_deltas(y, self._rest(pot, dt, y.device), dt)
        B, E = types.shape
        weights = pot.weights.to(dt)
        if weights.dim() == 3:
            w = weights[torch.arange(E, device=y.device), types]  # (B, E, 4)
        else:
            w = weights.gather(2, types.view(B, E, 1, 1).expand(B, E, 1, 4)).squeeze(2)
        s = s - (w * delta).sum((1, 2))
        par, ch = self.edge_nodes(y.device)
        for scores, at in ((pot.child_scores, pos[:, ch]), (pot.parent_scores, pos[:, par])):
            if scores is not None:
                idx = self.typed_positions(types, at, scores.shape[3])
                flat = scores.reshape(B, E, -1).gather(2, idx.unsqueeze(2))
                s = s + flat.squeeze(2).sum(1).to(dt)
        if pot.cooccurrence is not None:
            c = pot.cooccurrence.reshape(-1, E, self.num_types ** 2).expand(B, E, -1)
            s = s + c.gather(2, self.type_pairs(types).unsqueeze(2)).squeeze(2).sum(1).to(dt)
        return s

    def _task_loss(self, y_hat, y, lengths) -> torch.Tensor:
        V = self.num_nodes
        return super()._task_loss(y_hat[:, :V], y[:, :V], lengths)

    def marginals(self, y, lengths=None, *, dtype=torch.float32, rest=None) -> MixtureTreePotentials:
        """Marginals of labels ``y (B, V + E)`` (`MixtureTreePotentials`), with ``rest (E, T, 2)`` (default
        zero), so that ``score == <pot, marginals>`` per example (shared weights broadcast)."""
        check_float_dtype(dtype)
        y, _ = self._check_y(y, None)
        if rest is not None:
            check_shape("rest", rest, (self.num_edges, self.num_types, 2))
        B = y.shape[0]
        E, T, K = self.num_edges, self.num_types, self.num_labels
        like = torch.zeros(0, dtype=dtype, device=y.device)
        pot = MixtureTreePotentials(like.new_empty(B, self.num_nodes, K), like.new_empty(B, E, T, 4),
                                    rest, like.new_empty(B, E, T, K), like.new_empty(B, E, T, K),
                                    like.new_empty(B, E, T, T))
        ones = torch.ones(B, dtype=dtype, device=y.device)
        out = self.marginal_vjp(y, ones, pot, lengths, (True, True, False, True, True, True), dtype)
        return MixtureTreePotentials(out[0], out[1], None, out[3], out[4], out[5])

    # -- autograd plumbing -----------------------------------------------------------------------
    def from_tensors(self, tensors: Sequence[Optional[torch.Tensor]]) -> MixtureTreePotentials:
        return MixtureTreePotentials(*tensors)

    def marginal_vjp(self, y, weight, potentials, lengths, needs, dtype=None):
        pot = self._as_potentials(potentials)
        dtype = dtype or pot.unary.dtype
        weight = weight.to(dtype)
        pos, types = self._split(y)
        B, E, T = y.shape[0], self.num_edges, self.num_types
        out = [None] * 6
        if needs[0]:
            out[0] = self._unary_vjp(pos, weight, pot.unary, dtype)
        if needs[1] and pot.weights is not None:
            g = -self.typed_deltas(y, self._rest(pot, dtype, y.device), dtype) * weight.view(-1, 1, 1)
            full = torch.zeros(B, E, T, 4, dtype=dtype, device=y.device)
            full.scatter_(2, types.view(B, E, 1, 1).expand(B, E, 1, 4), g.unsqueeze(2))
            out[1] = full.sum(0) if pot.weights.dim() == 3 else full
        par, ch = self.edge_nodes(y.device)
        for slot, at in ((3, pos[:, ch]), (4, pos[:, par])):
            if needs[slot] and pot[slot] is not None:
                Ks = pot[slot].shape[3]  # K, or 1 for a type bias
                g = torch.zeros(B, E, T * Ks, dtype=dtype, device=y.device)
                g.scatter_(2, self.typed_positions(types, at, Ks).unsqueeze(2), weight.view(B, 1, 1).expand(B, E, 1))
                out[slot] = g.view(B, E, T, Ks)
        if len(needs) > 5 and needs[5] and pot.cooccurrence is not None:
            g = torch.zeros(B, E, T * T, dtype=dtype, device=y.device)
            g.scatter_(2, self.type_pairs(types).unsqueeze(2), weight.view(B, 1, 1).expand(B, E, 1))
            out[5] = g.view(B, E, T, T).sum(0) if pot.cooccurrence.dim() == 3 else g.view(B, E, T, T)
        return tuple(out)

    def __repr__(self) -> str:
        return (f"MixtureSpatialTree(V={self.num_nodes}, height={self.height}, width={self.width}, "
                f"num_types={self.num_types}, loss={self.loss!r})")
