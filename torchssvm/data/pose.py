"""Seeded pose-like data for pictorial structures (the LSP model of Osokin et al., 2016, at toy
scale).

A 26-node kinematic tree (the 14 LSP joints plus 12 limb / torso midpoints, as Chen & Yuille, 2014, extend LSP),
positions on an ``H x W`` grid, and per-part score maps from simulated noisy detectors as unary features,
so that `SpatialTree` decoding and `optim.problems.SpatialTreeProblem` (BCFW with positivity on the
quadratic deformation weights) run end to end without the real data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import torch

from .._validation import check_float_dtype, check_positive_int, check_real, check_seed
from .streams import MODEL, SPLIT_STREAM, stream

# Node names and parents (-1: the root). Every parent has a smaller index than its children, so one sweep
# in index order samples a pose root to leaves. Edge e's child is node e + 1 (the root is node 0).
POSE_NODES: Tuple[str, ...] = (
    "neck", "head_mid", "head_top",
    "r_shoulder", "r_upper_arm", "r_elbow", "r_lower_arm", "r_wrist",
    "l_shoulder", "l_upper_arm", "l_elbow", "l_lower_arm", "l_wrist",
    "r_torso", "r_hip", "r_thigh", "r_knee", "r_shin", "r_ankle",
    "l_torso", "l_hip", "l_thigh", "l_knee", "l_shin", "l_ankle",
    "pelvis",
)
POSE_PARENTS: Tuple[int, ...] = (
    -1, 0, 1,
    0, 3, 4, 5, 6,
    0, 8, 9, 10, 11,
    3, 13, 14, 15, 16, 17,
    8, 19, 20, 21, 22, 23,
    0,
)
# The 14 LSP joints, and the two nodes whose distance is the loss scale s (LSP: a shoulder and the
# opposite hip).
LSP_JOINTS: Tuple[str, ...] = ("r_ankle", "r_knee", "r_hip", "l_hip", "l_knee", "l_ankle", "r_wrist", "r_elbow",
                               "r_shoulder", "l_shoulder", "l_elbow", "l_wrist", "neck", "head_top")
SCALE_NODES: Tuple[str, str] = ("l_shoulder", "r_hip")

# Canonical upright pose in body units (x to the image right, y down, body height about 1): the joints;
# the midpoints are the means of their two joints.
_JOINTS = {
    "head_top": (0.0, 0.0), "neck": (0.0, 0.16),
    "r_shoulder": (-0.15, 0.2), "r_elbow": (-0.22, 0.38), "r_wrist": (-0.25, 0.55),
    "l_shoulder": (0.15, 0.2), "l_elbow": (0.22, 0.38), "l_wrist": (0.25, 0.55),
    "r_hip": (-0.1, 0.55), "r_knee": (-0.12, 0.76), "r_ankle": (-0.13, 0.96),
    "l_hip": (0.1, 0.55), "l_knee": (0.12, 0.76), "l_ankle": (0.13, 0.96),
}
_MIDPOINTS = {
    "head_mid": ("neck", "head_top"), "r_upper_arm": ("r_shoulder", "r_elbow"),
    "r_lower_arm": ("r_elbow", "r_wrist"), "l_upper_arm": ("l_shoulder", "l_elbow"),
    "l_lower_arm": ("l_elbow", "l_wrist"), "r_torso": ("r_shoulder", "r_hip"), "r_thigh": ("r_hip", "r_knee"),
    "r_shin": ("r_knee", "r_ankle"), "l_torso": ("l_shoulder", "l_hip"), "l_thigh": ("l_hip", "l_knee"),
    "l_shin": ("l_knee", "l_ankle"), "pelvis": ("r_hip", "l_hip"),
}


def _canonical() -> torch.Tensor:
    """``(V, 2)`` float64 canonical positions (body units)."""
    pts = dict(_JOINTS)
    for name, (a, b) in _MIDPOINTS.items():
        pts[name] = tuple((pa + pb) / 2 for pa, pb in zip(pts[a], pts[b]))
    return torch.tensor([pts[name] for name in POSE_NODES], dtype=torch.float64)


def _mirror() -> Tuple[int, ...]:
    """The left/right counterpart of every node (itself on the midline): a detector's typical confusion."""
    idx = {name: i for i, name in enumerate(POSE_NODES)}
    out = []
    for name in POSE_NODES:
        if name[:2] in ("r_", "l_"):
            out.append(idx[("l_" if name[0] == "r" else "r_") + name[2:]])
        else:
            out.append(idx[name])
    return tuple(out)


@dataclass
class PoseDataset:
    """Pose-like examples on an ``height x width`` grid (`synthetic_pose`); a position is the flat index
    ``y * width + x`` (x the column, y the row), as in `SpatialTree`.

    - ``parents``: ``(V,)`` tuple, the kinematic tree (-1 for the root); ``names``: the node names.
    - ``features``: ``(n, V, F, H*W)`` float, per-part detector score maps.
    - ``positions``: ``(n, V)`` long, the true flat positions.
    - ``rest``: ``(E, 2)`` float64, the mean displacement ``(dx, dy)`` of each edge's child from its parent
      over this split (the paper's ``r_pq``, from training data; edge e's child is node e + 1).
    - ``scale``: ``(n,)`` float64, the LSP loss scale s (distance between ``SCALE_NODES`` in the truth).
    - ``type_maps``: ``(n, E, T, H*W)`` float or None: evidence for each edge's type at its child's position
      (`synthetic_type_maps`; the paper's pairwise CNN scores ``phi^P``), used by `MixtureSpatialTreeProblem`.
    """

    parents: Tuple[int, ...]
    names: Tuple[str, ...]
    features: torch.Tensor
    positions: torch.Tensor
    rest: torch.Tensor
    scale: torch.Tensor
    height: int
    width: int
    name: str = ""
    type_maps: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def num_features(self) -> int:
        return int(self.features.shape[2])

    def xy(self) -> torch.Tensor:
        """``(n, V, 2)`` long ``(x, y)`` of the true positions."""
        return torch.stack([self.positions % self.width, self.positions // self.width], dim=2)

    def __repr__(self) -> str:
        return (f"PoseDataset({self.name!r}, n={len(self)}, nodes={self.num_nodes}, grid={self.height}x{self.width}, "
                f"features={self.num_features})")


def _blob(centers: torch.Tensor, sigma: float, height: int, width: int) -> torch.Tensor:
    """``exp(-||l - c||^2 / (2 sigma^2))`` on the grid for centers ``(..., 2)`` (x, y): ``(..., H*W)``."""
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float64), torch.arange(width, dtype=torch.float64),
                            indexing="ij")
    dx = xs.reshape(-1) - centers[..., 0:1]
    dy = ys.reshape(-1) - centers[..., 1:2]
    return torch.exp(-(dx * dx + dy * dy) / (2 * sigma * sigma))


# The nodes whose edge from their parent bends a limb (the first segment below a shoulder, elbow, hip or
# knee), and the fraction of ``limb_angle`` each uses.
_BENDS = {"r_upper_arm": 1.0, "r_lower_arm": 1.0, "l_upper_arm": 1.0, "l_lower_arm": 1.0,
          "r_thigh": 0.5, "r_shin": 0.5, "l_thigh": 0.5, "l_shin": 0.5}


def _limb_angles(n: int, modes: int, max_angle: float, g: torch.Generator):
    """``(n, V)`` float64 rotation of each node's edge relative to its parent's (radians), or None for upright
    limbs (``modes == 1``)."""
    if modes == 1:
        return None
    angles = torch.zeros(n, len(POSE_NODES), dtype=torch.float64)
    grid = torch.linspace(-max_angle, max_angle, modes, dtype=torch.float64)
    for name, frac in _BENDS.items():
        angles[:, POSE_NODES.index(name)] = frac * grid[torch.randint(0, modes, (n,), generator=g)]
    return angles


def synthetic_pose(split: str = "train", n: int = 100, *, height: int = 32, width: int = 32, num_features: int = 2,
                   jitter: float = 0.04, size_range: Tuple[float, float] = (0.55, 0.85), clutter: int = 3,
                   miss_rate: float = 0.15, swap_rate: float = 0.3, noise: float = 0.15, limb_modes: int = 1,
                   limb_angle: float = 0.8, seed: int = 0, dtype: torch.dtype = torch.float32) -> PoseDataset:
    """Seeded pose-like examples: a 26-node tree (`POSE_PARENTS`), true positions and detector score maps.

    Pose: a body size ``S`` (pixels) uniform in ``size_range`` times ``min(height, width)``; the root (neck)
    placed so the canonical pose fits; then, root to leaves, ``child = parent + S (canonical offset) +
    N(0, (jitter S)^2 I)`` in continuous coordinates, finally rounded and clipped to the grid.

    Features, per part (``num_features`` F = 1 or 2): F=0 a sharp detector, a Gaussian peak (sigma 1 px) at
    the true position whose height is uniform in [0.5, 1] (in [0, 0.3], a missed detection, with probability
    ``miss_rate``), ``clutter`` false peaks of height uniform in [0.3, 0.9] at uniform random positions,
    with probability ``swap_rate`` a peak at the left/right counterpart's true position, plus Gaussian pixel
    noise of standard deviation ``noise``; F=1 (if F = 2) a coarse detector, the same truth and confusion
    peaks with sigma 2.5 px, half the clutter and noise. So the unaries alone are ambiguous and the
    deformation model carries signal.

    Articulation (``limb_modes`` m > 1): each limb bends at the shoulders and elbows by an angle drawn
    uniformly from m modes evenly spaced in ``[-limb_angle, limb_angle]`` (radians), at the hips and knees
    from half of that, each rotation carried down the limb; so an edge's displacements form up to m
    clusters (the case for mixture types per edge, `edge_types` and `MixtureSpatialTree`). The modes are
    drawn from their own generator, so ``limb_modes=1`` (upright limbs) gives the same data as before.

    ``rest`` is the mean true displacement of each edge over the split (what the paper derives from its
    training data); train with the training split's ``rest``. Train and test draw from different streams
    (`torchssvm.data.streams`) with the same distribution. Everything is drawn in float64 and then
    cast to ``dtype`` (features only).
    """
    if split not in SPLIT_STREAM:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    n = check_positive_int("n", n)
    H = check_positive_int("height", height, minimum=8)
    W = check_positive_int("width", width, minimum=8)
    F = check_positive_int("num_features", num_features)
    if F > 2:
        raise ValueError(f"num_features must be 1 or 2, got {F}")
    jitter = check_real("jitter", jitter, maximum=1.0)
    if not (isinstance(size_range, (tuple, list)) and len(size_range) == 2):
        raise ValueError(f"size_range must be a pair (low, high), got {size_range!r}")
    lo = check_real("size_range[0]", size_range[0], minimum=0.1, maximum=1.0)
    hi = check_real("size_range[1]", size_range[1], minimum=lo, maximum=1.0)
    clutter = check_positive_int("clutter", clutter, minimum=0)
    miss_rate = check_real("miss_rate", miss_rate, maximum=1.0)
    swap_rate = check_real("swap_rate", swap_rate, maximum=1.0)
    noise = check_real("noise", noise)
    limb_modes = check_positive_int("limb_modes", limb_modes)
    limb_angle = check_real("limb_angle", limb_angle, maximum=math.pi)
    seed = check_seed(seed)
    check_float_dtype(dtype)

    V = len(POSE_PARENTS)
    canon = _canonical()
    g = stream(seed, SPLIT_STREAM[split])
    kw = {"dtype": torch.float64, "generator": g}
    size = (lo + (hi - lo) * torch.rand(n, **kw)) * min(H, W)  # (n,) body height in pixels
    # Root: the canonical bounding box [-0.25, 0.25] x [0, 0.96] body units fits inside the grid.
    left = 0.25 * size
    span_x = (W - 1 - 2 * left).clamp_min(0)
    span_y = (H - 1 - 0.96 * size).clamp_min(0)
    pos = torch.empty(n, V, 2, dtype=torch.float64)
    pos[:, 0, 0] = left + span_x * torch.rand(n, **kw)
    pos[:, 0, 1] = canon[0, 1] * size + span_y * torch.rand(n, **kw)
    step = torch.randn(n, V, 2, **kw) * (jitter * size).view(n, 1, 1)
    angle = _limb_angles(n, limb_modes, limb_angle, stream(seed, 10 + SPLIT_STREAM[split]))
    for v in range(1, V):
        p = POSE_PARENTS[v]
        offset = canon[v] - canon[p]
        if angle is not None:
            angle[:, v] += angle[:, p]  # a joint's rotation carries down its limb
            c, s_ = angle[:, v].cos(), angle[:, v].sin()
            offset = torch.stack([c * offset[0] - s_ * offset[1], s_ * offset[0] + c * offset[1]], dim=1)
        pos[:, v] = pos[:, p] + size.view(n, 1) * offset + step[:, v]
    xy = pos.round()
    xy[..., 0].clamp_(0, W - 1)
    xy[..., 1].clamp_(0, H - 1)
    positions = (xy[..., 1] * W + xy[..., 0]).long()

    par = torch.tensor(POSE_PARENTS[1:])
    rest = (xy[:, 1:] - xy[:, par]).mean(0)  # (E, 2)
    a, b = (POSE_NODES.index(name) for name in SCALE_NODES)
    scale = (xy[:, a] - xy[:, b]).norm(dim=1).clamp_min(1.0)

    mirror = torch.tensor(_mirror())
    truth_h = torch.where(torch.rand(n, V, **kw) < miss_rate, 0.3 * torch.rand(n, V, **kw),
                          0.5 + 0.5 * torch.rand(n, V, **kw))
    swap_h = (torch.rand(n, V, **kw) < swap_rate).double() * (mirror != torch.arange(V)).double() * \
        (0.5 + 0.5 * torch.rand(n, V, **kw))
    clutter_xy = torch.rand(n, V, max(clutter, 1), 2, **kw) * torch.tensor([W - 1.0, H - 1.0], dtype=torch.float64)
    clutter_h = 0.3 + 0.6 * torch.rand(n, V, max(clutter, 1), **kw)
    maps = []
    for f, (sigma, keep) in enumerate(((1.0, clutter), (2.5, clutter // 2))[:F]):
        m = truth_h.unsqueeze(2) * _blob(xy, sigma, H, W) + swap_h.unsqueeze(2) * _blob(xy[:, mirror], sigma, H, W)
        if keep:
            m = m + (clutter_h[..., :keep, None] * _blob(clutter_xy[:, :, :keep], sigma, H, W)).sum(2)
        m = m + (noise if f == 0 else noise / 2) * torch.randn(n, V, H * W, **kw)
        maps.append(m)
    features = torch.stack(maps, dim=2).to(dtype)
    return PoseDataset(POSE_PARENTS, POSE_NODES, features, positions, rest, scale, H, W, name=f"pose-{split}")


class EdgeTypes(NamedTuple):
    """Mixture types of the edges of a pose tree (`edge_types`).

    - ``rest``: ``(E, T, 2)`` float64, the rest offset ``(dx, dy)`` of each edge's child from its parent per
      type (the K-means centres of the paper's ``r_pq^t``).
    - ``types``: ``(n, E)`` long, the type of each edge in each example's truth (its nearest centre).
    """

    rest: torch.Tensor
    types: torch.Tensor


def edge_types(dataset, num_types: int, *, rest: Optional[torch.Tensor] = None, iters: int = 100,
               seed: int = 0) -> EdgeTypes:
    """Mixture types per edge by K-means on the true displacements (Osokin et al., 2016, after Chen & Yuille,
    2014: the mean displacements of each type are K-means centres of the training displacements). ``dataset``: a
    `PoseDataset`, or any object with ``parents``, ``positions (n, V)`` and ``width``.

    With ``rest`` None: per edge, K-means (k-means++ seeding from ``seed``, Lloyd iterations until no
    assignment changes or ``iters``) on the ``(dx, dy)`` of the child from its parent over ``dataset``; the
    types are sorted by their centre's ``(dx, dy)``, so the result does not depend on the seeding's order.
    With ``rest (E, T, 2)`` given (the training set's centres): each example's types are its nearest centre
    (ties: the smaller type), for a test set. Returns `EdgeTypes`; a ValueError names ``num_types`` when an
    edge has fewer distinct displacements than types.
    """
    T = check_positive_int("num_types", num_types)
    iters = check_positive_int("iters", iters)
    par = torch.tensor(dataset.parents)
    child = (par >= 0).nonzero().squeeze(1)
    pos = dataset.positions.long().cpu()  # K-means on the CPU: the result is small
    xy = torch.stack([pos % dataset.width, torch.div(pos, dataset.width, rounding_mode="floor")], 2).to(torch.float64)
    disp = (xy[:, child] - xy[:, par[child]]).transpose(0, 1)  # (E, n, 2)
    E = disp.shape[0]
    if rest is not None:
        if not isinstance(rest, torch.Tensor) or tuple(rest.shape) != (E, T, 2) or not torch.isfinite(rest).all():
            raise ValueError(f"rest must be a finite ({E}, {T}, 2) tensor (the training set's edge types)")
        rest = rest.detach().to("cpu", torch.float64)
        return EdgeTypes(rest, _nearest(disp, rest).transpose(0, 1))
    g = stream(check_seed(seed), MODEL)
    centres = torch.empty(E, T, 2, dtype=torch.float64)
    for e in range(E):
        points = disp[e]
        distinct = points.unique(dim=0).shape[0]
        if distinct < T:
            names = getattr(dataset, "names", None)
            raise ValueError(f"num_types = {T} exceeds the {distinct} distinct displacements of edge {e}"
                             + (f" ({names[int(child[e])]!r})" if names else ""))
        centres[e] = _kmeans(points, T, iters, g)
    return EdgeTypes(centres, _nearest(disp, centres).transpose(0, 1))


def _nearest(disp: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """``(E, n)`` index of the nearest centre (first on ties) of displacements ``(E, n, 2)``."""
    return torch.cdist(disp, centres).argmin(dim=2)


def _kmeans(points: torch.Tensor, k: int, iters: int, g: torch.Generator) -> torch.Tensor:
    """``(k, 2)`` centres of ``points (n, 2)``, sorted lexicographically by ``(dx, dy)``."""
    n = points.shape[0]
    centres = points[torch.randint(0, n, (1,), generator=g)]
    while centres.shape[0] < k:  # k-means++: the next centre with probability proportional to d^2
        d2 = torch.cdist(points, centres).min(dim=1).values ** 2
        centres = torch.cat([centres, points[torch.multinomial(d2, 1, generator=g)]])
    assign = None
    for _ in range(iters):
        new = torch.cdist(points, centres).argmin(dim=1)
        if assign is not None and torch.equal(new, assign):
            break
        assign = new
        dist = (points - centres[assign]).norm(dim=1)
        for j in range(k):
            members = points[assign == j]
            if members.shape[0]:
                centres[j] = members.mean(0)
            else:  # an empty cluster restarts at the point farthest from its centre, each at a different one
                far = dist.argmax()
                centres[j] = points[far]
                dist[points.eq(points[far]).all(1)] = -1.0
    order = sorted(range(k), key=lambda j: (float(centres[j, 0]), float(centres[j, 1])))
    return centres[order]


def synthetic_type_maps(dataset: PoseDataset, types: EdgeTypes, *, hit_rate: float = 0.8, other: float = 0.3,
                        miss_rate: float = 0.3, clutter: int = 1, noise: float = 0.15, seed: int = 0,
                        dtype: torch.dtype = torch.float32) -> PoseDataset:
    """``dataset`` with ``type_maps (n, E, T, H*W)``: simulated evidence for the type of every edge, as the
    paper's pairwise CNN gives a score per arc type at each position (Osokin et al., 2016, ``phi^P``).

    Per example and edge, a noisy type classifier looks at the edge's child's true position: it names the
    true type (``types.types``) with probability ``hit_rate``, another type uniformly otherwise. Every type's
    map gets a Gaussian peak (sigma 1.5 px) there, of height h uniform in [0.5, 1] for the named type and
    ``other * h`` for the rest, so the maps locate the child whatever the type and the type is in their
    ratios; with probability ``miss_rate`` the classifier misses the part and no map has that peak. Every map
    also gets ``clutter`` false peaks (height uniform in [0.3, 0.9]) at uniform random positions and Gaussian
    pixel noise of standard deviation ``noise``. Drawn in float64 from ``seed`` (offset by the split), cast
    to ``dtype``.
    """
    if not isinstance(types, EdgeTypes):
        raise TypeError(f"types must be an EdgeTypes (edge_types), got {type(types).__name__}")
    n, E = len(dataset), dataset.num_nodes - 1
    T = int(types.rest.shape[1])
    if tuple(types.types.shape) != (n, E):
        raise ValueError(f"types.types must have shape ({n}, {E}) for this dataset, got {tuple(types.types.shape)}")
    hit_rate = check_real("hit_rate", hit_rate, maximum=1.0)
    other = check_real("other", other, maximum=1.0)
    miss_rate = check_real("miss_rate", miss_rate, maximum=1.0)
    clutter = check_positive_int("clutter", clutter, minimum=0)
    noise = check_real("noise", noise)
    seed = check_seed(seed)
    H, W = dataset.height, dataset.width
    offset = 3 if dataset.name.endswith("test") else 4
    g = stream(seed, 20 + offset)
    kw = {"dtype": torch.float64, "generator": g}
    truth = types.types.long()
    wrong = (truth + torch.randint(1, max(T, 2), (n, E), generator=g)) % T  # a uniformly drawn other type
    named = torch.where(torch.rand(n, E, **kw) < hit_rate, truth, wrong if T > 1 else truth)
    height = (0.5 + 0.5 * torch.rand(n, E, **kw)) * (torch.rand(n, E, **kw) >= miss_rate)
    ratio = torch.full((n, E, T), other, dtype=torch.float64).scatter_(2, named.unsqueeze(2), 1.0)
    child = [v for v, p in enumerate(dataset.parents) if p != -1]  # edge e's child, as in `Tree`
    child_xy = dataset.xy()[:, child].to(torch.float64)
    maps = (height.unsqueeze(2) * ratio).unsqueeze(3) * _blob(child_xy, 1.5, H, W).unsqueeze(2)
    if clutter:
        xy = torch.rand(n, E, T, clutter, 2, **kw) * torch.tensor([W - 1.0, H - 1.0], dtype=torch.float64)
        heights = 0.3 + 0.6 * torch.rand(n, E, T, clutter, **kw)
        maps = maps + (heights.unsqueeze(-1) * _blob(xy, 1.5, H, W)).sum(3)
    maps = maps + noise * torch.randn(n, E, T, H * W, **kw)
    return dataclasses.replace(dataset, type_maps=maps.to(dtype))
