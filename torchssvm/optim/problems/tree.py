"""Pictorial structures (the LSP model of Osokin et al., 2016) as a `DualProblem`, blocks in feature space.

Parameters ``w = [w_U (V, F) | w_P (E, 4)]`` (row-major, ``d = V F + 4 E``). For example i with detector
score maps ``x_i (V, F, H*W)`` and positions ``l (V,)`` on the grid, the score is

    <w, phi(x_i, l)> = sum_v sum_f w_U[v, f] x_i[v, f, l_v] - sum_e w_P[e] . Delta(l_c - l_p - r_e),

``Delta(dx, dy) = (dx / u, dx^2 / u^2, dy / u, dy^2 / u^2)`` with displacements measured in a length unit
``u`` (default: the mean LSP scale s of the training set): `SpatialTree` potentials with ``unary[v, l] =
sum_f w_U[v, f] x_i[v, f, l]`` and deformation weights ``w_P * (1/u, 1/u^2, 1/u, 1/u^2)`` (pixel units).
The joint feature map is explicit and small,
``phi(x_i, l) = [x_i[v, f, l_v]]_{v, f} ++ [-Delta(l_c - l_p - r_e)]_e``, so a block vector is
``z_i = phi(x_i, y_i) - sum_y alpha_i(y) phi(x_i, y)`` in ``R^d`` itself (``m = d``, ``Phi_i`` the identity):
inner products and Gram matrices are plain dot products. The paper's model is the same with CNN score
maps, arc types and pairwise CNN terms (d = 2,676); here one type per arc. Why the unit: in pixels the
squared displacements of a loss-augmented labelling reach ``(grid side)^2``, so ``||psi_i||`` and the block
curvature ``||psi_i||^2 / (lam n^2)`` (Osokin et al., 2016) are dominated by them and BCFW's steps shrink;
measured in body-part lengths they are of the order of the unary features.

Convexity: the distance-transform oracle needs ``w_xx, w_yy >= 0`` on every edge. Train with the positivity
box ``box=problem.positivity_box()`` (Osokin et al., 2016, App. H: the oracle runs at ``w = clip(v, lower, upper)``);
an oracle call with a negative quadratic weight raises a ValueError naming the edges.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from ..._validation import shape_or_type
from ...structures.tree import SpatialTree, SpatialTreePotentials
from .base import DualProblem


def _require(dataset, attrs) -> None:
    for attr in attrs:
        if not hasattr(dataset, attr):
            raise TypeError(f"dataset must be a PoseDataset (it has no {attr!r}), got {type(dataset).__name__}")


def _checked_features(dataset, V: int, HW: int) -> torch.Tensor:
    """``dataset.features``, checked: a finite float ``(n, V, F, HW)`` tensor with n, F >= 1."""
    _require(dataset, ("features",))
    feats = dataset.features
    if not isinstance(feats, torch.Tensor) or feats.dim() != 4 or not feats.is_floating_point() \
            or feats.shape[1] != V or feats.shape[3] != HW or feats.shape[0] == 0 or feats.shape[2] == 0:
        raise ValueError(f"dataset.features must be a float (n, {V}, F, {HW}) tensor with n, F >= 1, got "
                         f"{shape_or_type(feats)}")
    if not torch.isfinite(feats).all():
        raise ValueError("dataset.features holds NaN or Inf")
    return feats


def _checked_truth(dataset, n: int, V: int, HW: int, with_scale: bool) -> tuple:
    """``(positions (n, V), scale (n,) or None)`` of a pose data set of ``n`` examples, checked: integer positions in
    ``[0, HW)`` and (``with_scale``) a finite scale > 0 per example. A ValueError names the attribute."""
    _require(dataset, ("positions",) + (("scale",) if with_scale else ()))
    pos = dataset.positions
    if not isinstance(pos, torch.Tensor) or pos.shape != (n, V) or pos.is_floating_point():
        raise ValueError(f"dataset.positions must be a ({n}, {V}) integer tensor")
    if int(pos.min()) < 0 or int(pos.max()) >= HW:
        raise ValueError(f"dataset.positions holds positions outside [0, {HW})")
    scale = getattr(dataset, "scale", None)
    if with_scale and (not isinstance(scale, torch.Tensor) or scale.shape != (n,)
                       or not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all())):
        raise ValueError(f"dataset.scale must be a finite ({n},) tensor > 0 (the LSP loss scale)")
    return pos, scale


class SpatialTreeTheta(NamedTuple):
    """What `SpatialTreeProblem.potentials` returns: ``w (d,)`` (block inner products ``<w, z_i>``) and
    the `SpatialTreePotentials` of the batch (unary ``(B, V, H*W)``, shared weights ``(E, 4)``, rest
    ``(E, 2)``) for the oracles."""

    w: torch.Tensor
    potentials: SpatialTreePotentials


class SpatialTreeProblem(DualProblem):
    """Args:
        dataset: a `PoseDataset` (`torchssvm.data.synthetic_pose`) or any object with ``parents``,
            ``features (n, V, F, H*W)``, ``positions (n, V)`` long, ``rest (E, 2)``, ``scale (n,)``,
            ``height``, ``width``.
        rest: ``(E, 2)`` rest offsets overriding ``dataset.rest``.
        loss: ``"truncated"`` (the LSP loss, per-example scale ``dataset.scale``) or ``"hamming"``.
        unit: the length unit u of the deformation features (pixels, > 0); default ``dataset.scale.mean()``
            (or 1 with ``loss="hamming"``).
        backend: oracle backend (`torchssvm.kernels`).

    ``w`` is written to ``self.weight`` by the solvers; `weights` splits it into ``(w_U, w_P)``.
    """

    _theta = SpatialTreeTheta  # what `potentials` returns

    def __init__(self, dataset, *, rest: Optional[torch.Tensor] = None, loss: str = "truncated",
                 unit: Optional[float] = None, backend: str = "auto"):
        needs = ("parents", "features", "positions", "rest", "height", "width") + (("scale",) if loss == "truncated"
                                                                                  else ())
        for attr in needs:
            if not hasattr(dataset, attr):
                raise TypeError(f"dataset must be a PoseDataset (it has no {attr!r}), got {type(dataset).__name__}")
        self.structure = SpatialTree(dataset.parents, dataset.height, dataset.width, loss=loss)
        self.backend = backend
        V, E, HW = self.structure.num_nodes, self.structure.num_edges, self.structure.num_labels
        feats = _checked_features(dataset, V, HW)
        n, _, F, _ = feats.shape
        pos, scale = _checked_truth(dataset, n, V, HW, with_scale=loss == "truncated")
        rest = dataset.rest if rest is None else rest
        if not isinstance(rest, torch.Tensor) or rest.shape != (E, 2) or not torch.isfinite(rest).all():
            raise ValueError(f"rest must be a finite ({E}, 2) tensor")
        self.device = feats.device
        self.features = feats.to(self.dtype)
        self.truth = pos.long().to(self.device)
        self.rest = rest.to(self.device, self.dtype)
        self.scale = scale.to(self.device, self.dtype) if loss == "truncated" else None
        if unit is None:
            unit = float(self.scale.mean()) if self.scale is not None else 1.0
        if isinstance(unit, bool) or not isinstance(unit, (int, float)) or not (math.isfinite(unit) and unit > 0):
            raise ValueError(f"unit must be a finite number > 0 (pixels), got {unit!r}")
        self.unit = float(unit)
        # pixel-unit structure weights = w_P * per_pixel
        self.per_pixel = torch.tensor([1 / unit, 1 / unit ** 2, 1 / unit, 1 / unit ** 2], dtype=self.dtype,
                                      device=self.device)
        self.n, self.V, self.E, self.F = n, V, E, F
        self.d = self.m = V * F + 4 * E
        self.label_width = V
        self.weight = torch.zeros(self.d, dtype=self.dtype, device=self.device)

    # -- parameters -----------------------------------------------------------------------------
    def parameter_slices(self) -> dict:
        VF = self.V * self.F
        return {"unary": (0, VF, (self.V, self.F)), "deformation": (VF, self.d, (self.E, 4))}

    def positivity_box(self) -> dict:
        """The box (Osokin et al., 2016, App. H) that makes the deformation convex: ``w_xx, w_yy >= 0`` on every
        edge (columns 1 and 3 of ``w_P``), everything else free; pass it as ``BCFW(..., box=...)``. Only the
        quadratic weights need the bound (the authors' code, Osokin et al., 2016, bounds all of ``w_P``, which
        ``box={"deformation": (0.0, None)}`` gives). With mixture types, on every edge and type."""
        lower = torch.full(self.parameter_slices()["deformation"][2], -math.inf, dtype=self.dtype)
        lower[..., 1::2] = 0.0
        return {"deformation": (lower.reshape(-1), None)}

    def weights(self, w: torch.Tensor):
        """``(w_U (V, F), w_P (E, 4))`` views of ``w (d,)``."""
        VF = self.V * self.F
        return w[:VF].view(self.V, self.F), w[VF:].view(self.E, 4)

    def write_model(self, w: torch.Tensor) -> None:
        self.weight.copy_(w)

    # -- the contract ---------------------------------------------------------------------------
    def _pot(self, w: torch.Tensor, features: torch.Tensor) -> SpatialTreePotentials:
        wu, wp = self.weights(w.to(self.dtype))
        return SpatialTreePotentials(torch.einsum("bvfl,vf->bvl", features, wu), wp * self.per_pixel, self.rest)

    def _inputs(self, dataset=None) -> tuple:
        """The per-example tensors `_pot` reads after ``w``: ``(features,)`` of the training set, or of
        ``dataset`` (checked against the training set's shapes)."""
        if dataset is None:
            return (self.features,)
        feats = _checked_features(dataset, self.V, self.structure.num_labels)
        if feats.shape[2] != self.F:
            raise ValueError(f"dataset.features must have {self.F} features per node (the training set's), got "
                             f"{feats.shape[2]}")
        return (feats.to(self.device, self.dtype),)

    def potentials(self, w: torch.Tensor, idx: torch.Tensor) -> SpatialTreeTheta:
        return self._theta(w, self._pot(w, *(t[idx] for t in self._inputs())))

    def _check_convex(self, pot) -> None:
        """A ValueError naming the edges whose quadratic weights (``w_P[..., 1]``, ``w_P[..., 3]`` of shared
        ``(E, 4)`` or ``(E, T, 4)`` weights) are negative or NaN."""
        quad = pot.weights[..., 1::2]
        bad = ((quad < 0) | torch.isnan(quad)).flatten(1).any(1)
        if bool(bad.any()):
            edges = bad.nonzero().squeeze(1).tolist()
            raise ValueError(f"the quadratic deformation weights w_P[..., 1] (w_xx) and w_P[..., 3] (w_yy) must be "
                             f">= 0 for the distance-transform oracle; edges {edges} have min "
                             f"{float(quad.min() * self.unit ** 2):.3g}. Train with box=problem.positivity_box().")

    def oracle(self, theta: SpatialTreeTheta, idx: torch.Tensor):
        pot = theta.potentials
        self._check_convex(pot)
        truth = self.truth[idx]
        scale = None if self.scale is None else self.scale[idx]
        lw = torch.ones(idx.shape[0], dtype=self.dtype, device=self.device)
        fast = self.structure.unchecked  # the data were checked when the problem was built, the weights just now
        labels, value = fast.max_oracle(pot, truth, scale, loss_weight=lw, backend=self.backend)
        loss = fast.task_loss(labels, truth, scale)
        return labels, loss, value.to(self.dtype) - fast.score(pot, truth)

    def decode(self, theta: SpatialTreeTheta, idx: torch.Tensor) -> torch.Tensor:
        self._check_convex(theta.potentials)
        return self.structure.unchecked.decode(theta.potentials, backend=self.backend)

    def labels_score(self, theta: SpatialTreeTheta, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B, C, V = labels.shape
        pot = theta.potentials
        lab = labels.clamp_min(0)  # -1: an unused slot
        s = pot.unary.gather(2, lab.transpose(1, 2)).sum(1)  # (B, C)
        delta = self.structure.deltas(lab.reshape(B * C, V), self.rest, self.dtype)
        return s - (delta * pot.weights).sum((1, 2)).view(B, C)

    def task_loss(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B, C, V = labels.shape
        truth = self.truth[idx].repeat_interleave(C, 0)
        scale = None if self.scale is None else self.scale[idx].repeat_interleave(C)
        return self.structure.unchecked.task_loss(labels.reshape(B * C, V).clamp_min(0), truth, scale).view(B, C)

    def joint_features(self, idx: torch.Tensor, labels: torch.Tensor, features: Optional[torch.Tensor] = None):
        """``phi(x_i, l) (B, d)`` of positions ``labels (B, V)`` (``features``: ``(B, V, F, H*W)``, default the
        training features of ``idx``)."""
        x = self.features[idx] if features is None else features.to(self.dtype)
        B = labels.shape[0]
        unary = x.gather(3, labels.view(B, self.V, 1, 1).expand(B, self.V, self.F, 1)).reshape(B, -1)
        delta = self.structure.deltas(labels, self.rest, self.dtype) * self.per_pixel
        return torch.cat([unary, -delta.reshape(B, -1)], 1)

    def corner(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.joint_features(idx, self.truth[idx]) - self.joint_features(idx, labels)

    def inner(self, theta: SpatialTreeTheta, z: torch.Tensor) -> torch.Tensor:
        return z @ theta.w.to(self.dtype)

    def gram(self, idx_a, z_a, idx_b=None, z_b=None) -> torch.Tensor:
        return z_a @ (z_a if idx_b is None else z_b).T

    def sqnorm(self, idx, z) -> torch.Tensor:
        return (z * z).sum(1)

    def accumulate(self, w: torch.Tensor, idx: torch.Tensor, z: torch.Tensor, coef: torch.Tensor) -> None:
        w.add_(coef.to(self.dtype) @ z)

    def max_loss(self, idx: torch.Tensor) -> torch.Tensor:
        # the truncated loss is separable over nodes: each node's farthest position; Hamming: 1
        scale = None if self.scale is None else self.scale[idx]
        return self.structure.unchecked.max_task_loss(self.truth[idx], scale).to(self.dtype)

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, w: torch.Tensor, dataset=None, *, pck_threshold: float = 0.5, chunk: int = 256) -> dict:
        """MAP positions at ``w`` on ``dataset`` (default: the training set) with this problem's ``rest``:
        ``{"lsp_loss": mean truncated loss, "pck": fraction of nodes within pck_threshold * s of the truth}``
        (both from the scale ``s`` of each example, whatever loss the problem trains with)."""
        inputs = self._inputs(dataset)
        if dataset is None:
            truth, scale = self.truth, self.scale
            if scale is None:
                raise ValueError("evaluate needs the LSP loss scale, which a problem with loss='hamming' does not "
                                 "keep: pass the data set, evaluate(w, dataset)")
        else:
            n = inputs[0].shape[0]
            truth, scale = _checked_truth(dataset, n, self.V, self.structure.num_labels, with_scale=True)
        truth, scale = truth.to(self.device).long(), scale.to(self.device, self.dtype)
        loss, correct = [], []
        st = self.structure
        for s in range(0, truth.shape[0], chunk):
            pot = self._pot(w, *(t[s:s + chunk] for t in inputs))
            self._check_convex(pot)
            y = st.unchecked.decode(pot, backend=self.backend)[:, :self.V]  # positions (without types)
            t, sc = truth[s:s + chunk, :self.V], scale[s:s + chunk]
            (x1, y1), (x0, y0) = st.xy(y), st.xy(t)
            sq = ((x1 - x0) ** 2 + (y1 - y0) ** 2).to(self.dtype)
            loss.append((sq / sc.unsqueeze(1) ** 2).clamp_max(1.0).mean(1))  # the LSP loss, whatever st.loss is
            correct.append((sq.sqrt() <= pck_threshold * sc.unsqueeze(1)).to(self.dtype).mean(1))
        return {"lsp_loss": float(torch.cat(loss).mean()), "pck": float(torch.cat(correct).mean())}
