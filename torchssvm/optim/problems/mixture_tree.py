"""Pictorial structures with mixture types per edge (the LSP model of Osokin et al., 2016) as a `DualProblem`.

Each edge e has T types with their own rest offsets ``r_{e,t}`` (K-means centres of the training
displacements, `torchssvm.data.edge_types`), their own deformation weights and a type bias. Parameters
``w = [w_U (V, F) | w_T (E, T) | w_P (E, T, 4)]`` (row-major, ``d = V F + E T + 4 E T``); for positions ``l``
and edge types ``t``

    <w, phi(x_i, (l, t))> = sum_v sum_f w_U[v, f] x_i[v, f, l_v] + c sum_e w_T[e, t_e]
                            - sum_e w_P[e, t_e] . Delta(l_c - l_p - r_{e, t_e}),

with ``Delta`` in the length unit u (`SpatialTreeProblem`) and ``c`` the type feature's scale
(``type_scale``). The paper's d = 2,676 is this layout for 26 nodes, 50 arcs (both orientations of 25
edges) and 13 types, with CNN score maps for the unaries and the type scores; here the type score is a
learned bias per edge and type (`MixtureSpatialTree` potentials with ``child_scores = c w_T`` as a
``(B, E, T, 1)`` bias), one type per edge. Labels are ``(V + E)`` wide: the positions, then the edge types;
the truth's types are the nearest centres (types are supervised, as in the paper). The loss depends on the
positions only.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from ..._validation import check_positive_int, shape_or_type
from ...data.pose import EdgeTypes, edge_types
from ...structures.mixture_tree import MixtureSpatialTree, MixtureTreePotentials
from .tree import SpatialTreeProblem


class MixtureTreeTheta(NamedTuple):
    """What `MixtureSpatialTreeProblem.potentials` returns: ``w (d,)`` and the `MixtureTreePotentials` of the
    batch (unary ``(B, V, H*W)``, shared weights ``(E, T, 4)``, rest ``(E, T, 2)``, type bias
    ``(B, E, T, 1)``)."""

    w: torch.Tensor
    potentials: MixtureTreePotentials


class MixtureSpatialTreeProblem(SpatialTreeProblem):
    """Args:
        dataset: a `PoseDataset` (as `SpatialTreeProblem`).
        num_types: T >= 1 types per edge.
        types: an `EdgeTypes` (``rest (E, T, 2)``, ``types (n, E)``) for ``dataset``; default
            ``edge_types(dataset, num_types, seed=seed)`` (K-means on its displacements).
        loss, unit, backend: as `SpatialTreeProblem`.
        type_scale: the value c of the type feature (``phi`` holds ``c`` at ``(e, t_e)``, so the bias is
            ``c w_T[e, t]``); default ``1 / sqrt(E)``, which bounds the type block of a corner's squared norm
            by 2, the size of one or two nodes' unary features. Why: a corner whose types differ from the
            truth's on every edge gains ``2 E c^2`` in ``||psi_i||^2``, the block curvature of BCFW (Osokin et al.,
            2016); with c = 1 that is 50 on the pose tree, twice the unary block, and BCFW's steps shrink
            (the runs: docs/benchmarks/pose_mixture.md).
        cooccurrence: learn a co-occurrence score ``c w_C[e, s, t]`` of type t on edge e and type s on the
            edge above e's parent (row 0 for edges out of the root; `MixtureSpatialTree`), so that the types
            of consecutive edges, e.g. the two halves of a bent limb, are chosen together; ``w_C (E, T, T)``
            comes after ``w_T`` and ``w_M``, with the type feature's scale c.
        seed: the K-means seeding when ``types`` is None.

    Type evidence: when ``dataset.type_maps (n, E, T, H*W)`` is set (`torchssvm.data.synthetic_type_maps`,
    or a network's type scores), each edge also gets one weight ``w_M[e]`` on it, the paper's
    ``w_{T,pq} phi^P_{pq}(I, l, t)``: the type score is ``c w_T[e, t] + w_M[e] type_maps[e, t, l_c]`` at the
    child's position, and ``w = [w_U | w_T | w_M (E,) | w_P]`` (``d`` grows by E).

    ``evaluate(w, test_set)`` decodes the test set with these types' rest offsets (the paper's protocol: the
    clustering comes from the training set) and the test set's ``type_maps`` when the problem has them.
    """

    _theta = MixtureTreeTheta

    def __init__(self, dataset, num_types: int, *, types: Optional[EdgeTypes] = None, cooccurrence: bool = False,
                 loss: str = "truncated", unit: Optional[float] = None, type_scale: Optional[float] = None,
                 backend: str = "auto", seed: int = 0):
        super().__init__(dataset, loss=loss, unit=unit, backend=backend)
        n, V, E, F = self.n, self.V, self.E, self.F
        T = check_positive_int("num_types", num_types)
        if types is None:
            types = edge_types(dataset, T, seed=seed)
        if not isinstance(types, EdgeTypes) or tuple(types.rest.shape) != (E, T, 2) \
                or tuple(types.types.shape) != (n, E):
            raise ValueError(f"types must be an EdgeTypes with rest ({E}, {T}, 2) and types ({n}, {E}) "
                             f"(torchssvm.data.edge_types)")
        if not torch.isfinite(types.rest).all():
            raise ValueError("types.rest holds NaN or Inf")
        if types.types.is_floating_point() or (types.types.numel() and (int(types.types.min()) < 0
                                                                         or int(types.types.max()) >= T)):
            raise ValueError(f"types.types must be integers in [0, {T})")
        self.structure = MixtureSpatialTree(dataset.parents, dataset.height, dataset.width, T, loss=loss)
        self.T = T
        if type_scale is None:
            type_scale = 1 / math.sqrt(max(E, 1))
        if isinstance(type_scale, bool) or not isinstance(type_scale, (int, float)) \
                or not (math.isfinite(type_scale) and type_scale > 0):
            raise ValueError(f"type_scale must be a finite number > 0, got {type_scale!r}")
        self.type_scale = float(type_scale)
        self.rest = types.rest.to(self.device, self.dtype)
        self.truth = torch.cat([self.truth, types.types.long().to(self.device)], 1)
        self.label_width = V + E
        maps = getattr(dataset, "type_maps", None)
        self.type_maps = None if maps is None else self._check_maps(maps, n)
        self.M = 0 if self.type_maps is None else E
        if not isinstance(cooccurrence, bool):
            raise TypeError(f"cooccurrence must be a bool, got {type(cooccurrence).__name__}")
        self.C = E * T * T if cooccurrence else 0
        self.d = self.m = V * F + E * T + self.M + self.C + 4 * E * T
        self.weight = torch.zeros(self.d, dtype=self.dtype, device=self.device)

    def _check_maps(self, maps, n: int) -> torch.Tensor:
        shape = (n, self.E, self.T, self.structure.num_labels)
        if not isinstance(maps, torch.Tensor) or tuple(maps.shape) != shape or not maps.is_floating_point():
            got = shape_or_type(maps)
            raise ValueError(f"dataset.type_maps must be a float {shape} tensor (or None), got {got}")
        if not torch.isfinite(maps).all():
            raise ValueError("dataset.type_maps holds NaN or Inf")
        return maps.to(self.device, self.dtype)

    def _inputs(self, dataset=None) -> tuple:
        """``(features,)``, or ``(features, type_maps)`` when the problem has type maps."""
        base = super()._inputs(dataset)
        if self.type_maps is None:
            return base
        if dataset is None:
            return base + (self.type_maps,)
        maps = getattr(dataset, "type_maps", None)
        if maps is None:
            raise ValueError("dataset has no type_maps, but this problem was trained with them "
                             "(torchssvm.data.synthetic_type_maps)")
        return base + (self._check_maps(maps, base[0].shape[0]),)

    # -- parameters -----------------------------------------------------------------------------
    def parameter_slices(self) -> dict:
        VF, ET, M, C = self.V * self.F, self.E * self.T, self.M, self.C
        out = {"unary": (0, VF, (self.V, self.F)), "type": (VF, VF + ET, (self.E, self.T))}
        if M:
            out["type_map"] = (VF + ET, VF + ET + M, (M,))
        if C:
            out["cooccurrence"] = (VF + ET + M, VF + ET + M + C, (self.E, self.T, self.T))
        out["deformation"] = (VF + ET + M + C, self.d, (self.E, self.T, 4))
        return out

    def weights(self, w: torch.Tensor):
        """``(w_U (V, F), w_T (E, T), w_M (E,), w_C (E, T, T), w_P (E, T, 4))`` views of ``w (d,)``; ``w_M`` and
        ``w_C`` are empty without type maps (resp. co-occurrence)."""
        E, T = self.E, self.T
        VF, ET, M, C = self.V * self.F, E * T, self.M, self.C
        a = VF + ET + M
        return (w[:VF].view(self.V, self.F), w[VF:VF + ET].view(E, T), w[VF + ET:a],
                w[a:a + C].view(E, T, T) if C else w[a:a], w[a + C:].view(E, T, 4))

    # -- the contract ---------------------------------------------------------------------------
    def _pot(self, w: torch.Tensor, features: torch.Tensor, maps: Optional[torch.Tensor] = None):
        wu, wt, wm, wc, wp = self.weights(w.to(self.dtype))
        child = (wt * self.type_scale).unsqueeze(0).unsqueeze(3).expand(features.shape[0], self.E, self.T, 1)
        if maps is not None:  # (B, E, T, H*W): position-dependent type scores
            child = child + wm.view(1, -1, 1, 1) * maps
        return MixtureTreePotentials(torch.einsum("bvfl,vf->bvl", features, wu), wp * self.per_pixel, self.rest,
                                     child, None, wc * self.type_scale if self.C else None)

    def labels_score(self, theta: MixtureTreeTheta, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B, C, L = labels.shape
        V, E = self.V, self.E
        pot = theta.potentials
        lab = labels.clamp_min(0).reshape(B * C, L)  # -1: an unused slot
        s = pot.unary.gather(2, labels[..., :V].clamp_min(0).transpose(1, 2)).sum(1)  # (B, C)
        types = lab[:, V:]
        e = torch.arange(E, device=lab.device)
        delta = self.structure.typed_deltas(lab, self.rest, self.dtype)
        edge = -(pot.weights[e, types] * delta).sum(2)  # (B C, E)
        cs = pot.child_scores  # (B, E, T, 1) a bias, or (B, E, T, H*W) with type maps
        at = lab[:, self.structure.edge_nodes(lab.device)[1]]
        flat = self.structure.typed_positions(types, at, cs.shape[3]).view(B, C, E).transpose(1, 2)  # (B, E, C)
        typed = cs.reshape(B, E, -1).gather(2, flat).sum(1)  # (B, C)
        if self.C:  # shared (E, T, T) scores of (type above, own type)
            typed = typed + pot.cooccurrence.reshape(E, -1)[e, self.structure.type_pairs(types)].sum(1).view(B, C)
        return s + edge.sum(1).view(B, C) + typed

    def joint_features(self, idx: torch.Tensor, labels: torch.Tensor, features: Optional[torch.Tensor] = None,
                       type_maps: Optional[torch.Tensor] = None):
        """``phi(x_i, (l, t)) (B, d)`` of labels ``(B, V + E)`` (``features``: ``(B, V, F, H*W)`` and
        ``type_maps``: ``(B, E, T, H*W)``, default the training set's of ``idx``)."""
        x = self.features[idx] if features is None else features.to(self.dtype)
        B, V, E, T = labels.shape[0], self.V, self.E, self.T
        unary = x.gather(3, labels[:, :V].reshape(B, V, 1, 1).expand(B, V, self.F, 1)).reshape(B, -1)
        types = labels[:, V:]
        onehot = torch.zeros(B, E, T, dtype=self.dtype, device=x.device).scatter_(2, types.unsqueeze(2),
                                                                                  self.type_scale)
        delta = self.structure.typed_deltas(labels, self.rest, self.dtype) * self.per_pixel
        deform = torch.zeros(B, E, T, 4, dtype=self.dtype, device=x.device)
        deform.scatter_(2, types.view(B, E, 1, 1).expand(B, E, 1, 4), -delta.unsqueeze(2))
        parts = [unary, onehot.reshape(B, -1)]
        if self.M:
            maps = self.type_maps[idx] if type_maps is None else type_maps.to(self.dtype)
            at = self.structure.typed_positions(types, labels[:, self.structure.edge_nodes(labels.device)[1]],
                                                 maps.shape[3])
            parts.append(maps.reshape(B, E, -1).gather(2, at.unsqueeze(2)).squeeze(2))  # maps[e, t_e, l_c]
        if self.C:
            cooc = torch.zeros(B, E, T * T, dtype=self.dtype, device=x.device)
            parts.append(cooc.scatter_(2, self.structure.type_pairs(types).unsqueeze(2), self.type_scale)
                         .reshape(B, -1))
        return torch.cat(parts + [deform.reshape(B, -1)], 1)
