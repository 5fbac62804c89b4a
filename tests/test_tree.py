"""Trees: max-sum with explicit tables and with generalized distance transforms (pictorial structures)
against enumeration, brute-force transforms and each other; the Triton twins; the Tree / SpatialTree
structures (losses, scores, marginals, hinge gradients, errors)."""

import itertools

import pytest
import torch
from conftest import needs_numba, needs_triton
from hypothesis import given, settings
from hypothesis import strategies as st
from torchssvm.kernels import (
    distance_transform_1d,
    distance_transform_1d_torch,
    distance_transform_2d,
    spatial_tree_max_sum,
    spatial_tree_max_sum_torch,
    tree_max_sum,
    tree_max_sum_torch,
    tree_schedule,
)

import torchssvm as ts
from torchssvm.structures.tree import SpatialTreePotentials, TreePotentials

SHAPES = {
    "single": [-1],
    "chain": [-1, 0, 1, 2, 3],
    "star": [1, -1, 1, 1, 1],
    "random": [3, 3, 0, -1, 2],
    "binary": [-1, 0, 0, 1, 1],
}


def draw(g, *shape, integer=True, dtype=torch.float64):
    if integer:  # small integers: many exact ties
        return torch.randint(-2, 3, shape, generator=g).to(dtype)
    return torch.randn(*shape, generator=g, dtype=dtype)


def bfs_order(parents):
    depth = tree_schedule(parents).depth
    return sorted(range(len(parents)), key=lambda v: (depth[v], v))


def brute_force_tree(unary, pairwise, parents, loss=None):
    """Best labelling of one tree by enumerating all K^V labellings (float64). ``pairwise (E, K, K)``;
    ``loss(Y) -> (N,)`` is added. Ties: the lexicographically smallest labelling in BFS order (the documented
    rule). Returns (labels list, value)."""
    V, K = unary.shape
    sched = tree_schedule(parents)
    Y = torch.tensor(list(itertools.product(range(K), repeat=V)), dtype=torch.long).view(-1, V)
    s = unary.double()[torch.arange(V), Y].sum(1)
    for e, (p, c) in enumerate(zip(sched.edge_parent, sched.edge_child)):
        s = s + pairwise[e].double()[Y[:, p], Y[:, c]]
    if loss is not None:
        s = s + loss(Y)
    best = s.max()
    ties = Y[s == best][:, bfs_order(parents)]
    key = (ties * (K ** torch.arange(V - 1, -1, -1))).sum(1)
    return Y[s == best][key.argmin()].tolist(), float(best)


def spatial_tables(weights, rest, parents, H, W, dtype=torch.float64):
    """Explicit ``(E, HW, HW)`` tables ``[l_p, l_c] = -w . Delta(l_c - l_p - r)`` of one example."""
    sched = tree_schedule(parents)
    pos = torch.arange(H * W)
    x, y = (pos % W).to(dtype), (pos // W).to(dtype)
    tabs = []
    for e in range(len(sched.edge_child)):
        dx = x.view(1, -1) - x.view(-1, 1) - rest[e, 0]
        dy = y.view(1, -1) - y.view(-1, 1) - rest[e, 1]
        w = weights[e]
        tabs.append(-(w[0] * dx + w[1] * dx * dx + w[2] * dy + w[3] * dy * dy))
    return torch.stack(tabs) if tabs else torch.zeros(0, H * W, H * W, dtype=dtype)


def random_spatial(g, B, parents, H, W, *, shared=False, dtype=torch.float64):
    E = len(parents) - 1
    unary = torch.randint(-4, 5, (B, len(parents), H * W), generator=g).to(dtype)
    shape = (E, 4) if shared else (B, E, 4)
    weights = torch.randint(-1, 2, shape, generator=g).to(dtype)
    weights[..., 1::2] = torch.randint(0, 2, weights[..., 1::2].shape, generator=g).to(dtype)
    rest = torch.randint(-2, 3, (E, 2), generator=g).to(dtype) / 2  # half-integers: exact
    return unary, weights, rest


def brute_force_gdt(f, a, b, r):
    R, n = f.shape
    d = (torch.arange(n).view(1, n, 1) - torch.arange(n).view(1, 1, n)).to(f.dtype) - r.view(R, 1, 1)
    return (f.unsqueeze(1) - a.view(R, 1, 1) * d * d - b.view(R, 1, 1) * d).max(-1)


# -- kernels: explicit tables ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("shared", [False, True])
def test_tree_max_sum_matches_enumeration(shape, K, shared):
    parents = SHAPES[shape]
    V, E, B = len(parents), len(parents) - 1, 6
    for integer in (True, False):
        g = torch.Generator().manual_seed(K + 7 * V + shared)
        unary = draw(g, B, V, K, integer=integer)
        pairwise = draw(g, E, K, K, integer=integer) if shared else draw(g, B, E, K, K, integer=integer)
        labels, value = tree_max_sum_torch(unary, pairwise, parents)
        for b in range(B):
            y, v = brute_force_tree(unary[b], pairwise if shared else pairwise[b], parents)
            assert labels[b].tolist() == y
            assert float(value[b]) == pytest.approx(v, abs=1e-12)


def test_schedule_levels_and_edges():
    s = tree_schedule([3, 3, 0, -1, 2])
    assert s.root == 3 and s.edge_child == (0, 1, 2, 4) and s.edge_parent == (3, 3, 0, 2)
    assert s.levels == ((3,), (2,), (0, 1))  # children at depth 3, 2, 1
    assert s.child_edges[3] == (0, 1) and s.depth == (1, 1, 2, 0, 3)


def test_tree_max_sum_chunks_consistently(monkeypatch):
    import torchssvm.kernels.tree.tree_torch as tt

    g = torch.Generator().manual_seed(3)
    unary, pairwise = draw(g, 9, 5, 3), draw(g, 9, 4, 3, 3)
    for pw in (pairwise, pairwise[0]):
        ref = tree_max_sum_torch(unary, pw, SHAPES["random"])
        monkeypatch.setattr(tt, "_MAX_LEVEL_ELEMENTS", 20)  # chunks of 1 or 2 examples
        out = tree_max_sum_torch(unary, pw, SHAPES["random"])
        monkeypatch.undo()
        assert torch.equal(ref[0], out[0]) and torch.equal(ref[1], out[1])


# -- kernels: distance transforms ----------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 6, 11])
def test_gdt_1d_matches_brute_force_with_ties(n):
    g = torch.Generator().manual_seed(n)
    R = 40
    f = torch.randint(-4, 5, (R, n), generator=g).double()
    a = torch.randint(0, 3, (R,), generator=g).double()  # a = 0 on about a third of the rows
    b = torch.randint(-3, 4, (R,), generator=g).double()  # negative b too
    r = torch.randint(-5, 6, (R,), generator=g).double() / 2  # non-integer rest offsets
    out, arg = distance_transform_1d(f, a, b, r, backend="torch")
    ref, ref_arg = brute_force_gdt(f, a, b, r)
    assert torch.equal(out, ref) and torch.equal(arg, ref_arg)  # exact, ties to the smallest q


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton()),
                                     pytest.param("numba", marks=needs_numba())])
def test_gdt_1d_with_excluded_positions_matches_brute_force(backend):
    """-inf entries of f (positions no output may take), up to whole rows of them, with a = 0 rows too: the
    envelope drops -inf parabolas (their breakpoints are NaN) and the result is the brute force's, ties included."""
    g = torch.Generator().manual_seed(5)
    R, n = 60, 7
    f = torch.randint(-4, 5, (R, n), generator=g).double()
    f[torch.rand(R, n, generator=g) < 0.4] = -torch.inf
    f[0] = -torch.inf
    f[1, 1:3] = -torch.inf  # the case that broke the envelope: two -inf parabolas on top of the stack
    a = torch.randint(0, 3, (R,), generator=g).double()
    a[1] = 1.0
    b = torch.randint(-3, 4, (R,), generator=g).double()
    r = torch.randint(-5, 6, (R,), generator=g).double() / 2
    out, arg = distance_transform_1d(f, a, b, r, backend=backend)
    ref, ref_arg = brute_force_gdt(f, a, b, r)
    assert torch.equal(out, ref)
    finite = torch.isfinite(ref)
    assert torch.equal(arg[finite], ref_arg[finite]) and bool((~finite[0]).all())


def test_gdt_rejects_bad_parameters():
    f = torch.zeros(3, 4)
    one = torch.zeros(3)
    with pytest.raises(ValueError, match=r"a must be a \(3,\) tensor"):
        distance_transform_1d(f, torch.zeros(1), one, one)
    with pytest.raises(ValueError, match="r must be on f's device"):
        distance_transform_1d(f, one, one, one.double())
    with pytest.raises(ValueError, match="b must be finite"):
        distance_transform_1d(f, one, torch.full((3,), float("nan")), one)
    with pytest.raises(ValueError, match="f must hold finite values or -inf"):
        distance_transform_1d(torch.full((3, 4), float("inf")), one, one, one)
    with pytest.raises(ValueError, match=r"f must be a floating \(R, n\) tensor"):
        distance_transform_1d(torch.zeros(4), one, one, one)
    with pytest.raises(ValueError, match=r"ry must be a \(2,\) tensor"):
        distance_transform_2d(torch.zeros(2, 3, 3), *([torch.zeros(2)] * 5), torch.zeros(3))


def test_gdt_1d_real_valued_and_float32():
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float64, torch.float32):
        f = torch.randn(30, 9, generator=g).to(dtype) * 3
        a = torch.rand(30, generator=g).to(dtype)
        a[:3] = 0
        b, r = torch.randn(30, generator=g).to(dtype), (torch.randn(30, generator=g) * 2).to(dtype)
        out, arg = distance_transform_1d_torch(f, a, b, r)
        ref, _ = brute_force_gdt(f, a, b, r)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-12)
        d = (torch.arange(9).view(1, 9) - arg).to(dtype) - r.view(-1, 1)  # the argmax attains the value
        torch.testing.assert_close(f.gather(1, arg) - a.view(-1, 1) * d * d - b.view(-1, 1) * d, out)


def test_gdt_2d_matches_brute_force():
    g = torch.Generator().manual_seed(2)
    R, H, W = 12, 4, 5
    f = torch.randint(-4, 5, (R, H, W), generator=g).double()
    p = [torch.randint(lo, 3, (R,), generator=g).double() for lo in (0, -2, 0, -2)]
    rx, ry = torch.randint(-3, 4, (R,), generator=g).double() / 2, torch.randint(-3, 4, (R,), generator=g).double() / 2
    ax, bx, ay, by = p
    out, arg = distance_transform_2d(f, ax, bx, rx, ay, by, ry, backend="torch")
    pos = torch.arange(H * W)
    x, y = (pos % W).double(), (pos // W).double()
    dx = x.view(1, -1, 1) - x.view(1, 1, -1) - rx.view(R, 1, 1)  # [r, output, source]
    dy = y.view(1, -1, 1) - y.view(1, 1, -1) - ry.view(R, 1, 1)
    cost = ax.view(R, 1, 1) * dx * dx + bx.view(R, 1, 1) * dx + ay.view(R, 1, 1) * dy * dy + by.view(R, 1, 1) * dy
    ref, ref_arg = (f.view(R, 1, H * W) - cost).max(-1)
    assert torch.equal(out.view(R, -1), ref) and torch.equal(arg.view(R, -1), ref_arg)


# -- kernels: spatial trees ---------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["chain", "star", "random", "single"])
@pytest.mark.parametrize("shared", [False, True])
def test_spatial_tree_matches_explicit_tables(shape, shared):
    parents, H, W = SHAPES[shape], 4, 5
    g = torch.Generator().manual_seed(len(shape) + shared)
    unary, weights, rest = random_spatial(g, 3, parents, H, W, shared=shared)
    labels, value = spatial_tree_max_sum_torch(unary, weights, rest, parents, H, W)
    for b in range(3):
        tables = spatial_tables(weights if shared else weights[b], rest, parents, H, W)
        ref_labels, ref_value = tree_max_sum_torch(unary[b : b + 1], tables, parents)
        assert torch.equal(labels[b], ref_labels[0]) and float(value[b]) == float(ref_value[0])


@pytest.mark.parametrize("backend", ["torch", pytest.param("numba", marks=needs_numba())])
@pytest.mark.parametrize("parents", [[-1, 0, 0], [-1, 0, 0, 1]])
def test_spatial_tree_matches_enumeration_tiny(backend, parents):
    H, W = 2, 3
    g = torch.Generator().manual_seed(5 + len(parents))
    unary, weights, rest = random_spatial(g, 4, parents, H, W)
    labels, value = spatial_tree_max_sum(unary, weights, rest, parents, H, W, backend=backend)
    for b in range(4):
        y, v = brute_force_tree(unary[b], spatial_tables(weights[b], rest, parents, H, W), parents)
        assert labels[b].tolist() == y and float(value[b]) == v


# -- Triton twins -----------------------------------------------------------------------------------
@needs_triton()
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("integer", [True, False])
def test_triton_gdt_1d_equals_torch(dtype, integer):
    g = torch.Generator().manual_seed(int(integer))
    for n in (1, 4, 9):
        f = draw(g, 7, n, integer=integer, dtype=dtype)
        a = torch.randint(0, 3, (7,), generator=g).to(dtype) if integer else torch.rand(7, generator=g).to(dtype)
        a[0] = 0
        b, r = draw(g, 7, integer=integer, dtype=dtype), draw(g, 7, integer=integer, dtype=dtype) / 2
        ref = distance_transform_1d(f, a, b, r, backend="torch")
        out = distance_transform_1d(f, a, b, r, backend="triton")
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@needs_triton()
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("K", [3, 70])  # one tile, and tiled over parent and child labels
@pytest.mark.parametrize("shared", [False, True])
def test_triton_tree_equals_torch(dtype, K, shared):
    parents = SHAPES["random"]
    g = torch.Generator().manual_seed(K)
    for integer in (True, False):
        unary = draw(g, 3, 5, K, integer=integer, dtype=dtype)
        pairwise = draw(g, 4, K, K, integer=integer, dtype=dtype)
        if not shared:
            pairwise = torch.stack([pairwise, draw(g, 4, K, K, integer=integer, dtype=dtype), pairwise])
        ref = tree_max_sum(unary, pairwise, parents, backend="torch")
        out = tree_max_sum(unary, pairwise, parents, backend="triton")
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@needs_triton()
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_triton_spatial_tree_equals_torch(dtype):
    parents, H, W = SHAPES["binary"], 3, 4
    g = torch.Generator().manual_seed(11)
    unary, weights, rest = random_spatial(g, 2, parents, H, W, dtype=dtype)
    unary = unary + torch.rand(unary.shape, generator=g).to(dtype)  # real-valued
    ref = spatial_tree_max_sum(unary, weights, rest, parents, H, W, backend="torch")
    out = spatial_tree_max_sum(unary, weights, rest, parents, H, W, backend="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


# -- structures ---------------------------------------------------------------------------------
def test_tree_loss_augmented_matches_enumeration():
    parents, K, B = SHAPES["random"], 3, 5
    tree = ts.Tree(parents, num_labels=K)
    g = torch.Generator().manual_seed(8)
    unary, pairwise = draw(g, B, 5, K), draw(g, B, 4, K, K)
    target = torch.randint(0, K, (B, 5), generator=g)
    lw = torch.tensor([0.0, 1.0, 2.5, 5.0, 1.0], dtype=torch.float64)
    y_hat, value = tree.max_oracle(TreePotentials(unary, pairwise), target, loss_weight=lw)
    for b in range(B):
        y, v = brute_force_tree(unary[b], pairwise[b], parents,
                                loss=lambda Y, b=b: lw[b] * (Y != target[b]).double().sum(1) / 5)
        assert float(value[b]) == pytest.approx(v, abs=1e-12)
        assert float(tree.score((unary[b:b + 1], pairwise[b:b + 1]), y_hat[b:b + 1])
                     + lw[b] * tree.task_loss(y_hat[b:b + 1], target[b:b + 1])) == pytest.approx(v, abs=1e-12)
    # dyadic loss weights on integer potentials: exact, so the tie-breaking must match too
    y_hat, _ = tree.max_oracle(TreePotentials(unary[:2], pairwise[:2]), target[:2], loss_weight=4.0)
    for b in range(2):
        y, _ = brute_force_tree(unary[b], pairwise[b], parents, loss=lambda Y, b=b: 4.0 * (Y != target[b]).sum(1) / 5)
        assert y_hat[b].tolist() == y


@pytest.mark.parametrize("loss", ["truncated", "hamming"])
def test_spatial_loss_augmented_matches_enumeration(loss):
    parents, H, W, B = [-1, 0, 1, 0], 2, 3, 3  # V = 4 and s in {1, 2}: every loss value is dyadic
    spt = ts.SpatialTree(parents, H, W, loss=loss)
    g = torch.Generator().manual_seed(4)
    unary, weights, rest = random_spatial(g, B, parents, H, W, shared=True)
    target = torch.randint(0, H * W, (B, 4), generator=g)
    scale = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64) if loss == "truncated" else None
    y_hat, value = spt.max_oracle(SpatialTreePotentials(unary, weights, rest), target, scale, loss_weight=2.0)
    pos = torch.arange(H * W)
    for b in range(B):
        tx, ty = target[b] % W, target[b] // W

        def lossf(Y, b=b, tx=tx, ty=ty):
            if loss == "hamming":
                return 2.0 * (Y != target[b]).double().sum(1) / 4
            d2 = ((pos[Y] % W - tx) ** 2 + (pos[Y] // W - ty) ** 2).double()
            return 2.0 * (d2 / float(scale[b]) ** 2).clamp_max(1).sum(1) / 4

        y, v = brute_force_tree(unary[b], spatial_tables(weights, rest, parents, H, W), parents, loss=lossf)
        assert y_hat[b].tolist() == y and float(value[b]) == v
        assert float(spt.task_loss(y_hat[b:b + 1], target[b:b + 1], None if scale is None else scale[b:b + 1])) \
            == float(lossf(y_hat[b:b + 1])) / 2


def test_task_loss_and_score_by_hand():
    # root 1, children 0 and 2 of 1, 3 child of 2; edges (by child): 0: 1->0, 1: 1->2, 2: 2->3
    parents, K = [1, -1, 1, 2], 2
    tree = ts.Tree(parents, num_labels=K)
    unary = torch.arange(8, dtype=torch.float64).view(1, 4, 2)  # unary[v, k] = 2 v + k
    pairwise = torch.arange(12, dtype=torch.float64).view(3, 2, 2)  # [e, kp, kc] = 4 e + 2 kp + kc
    y = torch.tensor([[1, 0, 1, 1]])
    # unary: 1 + 2 + 5 + 7 = 15; pairwise: e0 (y1=0, y0=1) = 1, e1 (y1=0, y2=1) = 5, e2 (y2=1, y3=1) = 11
    assert float(tree.score(TreePotentials(unary, pairwise), y)) == 15 + 1 + 5 + 11
    assert float(tree.task_loss(torch.tensor([[1, 1, 0, 1]]), y)) == 2 / 4
    assert float(ts.Tree(parents, num_labels=K, normalize=False).task_loss(torch.tensor([[0, 1, 0, 1]]), y)) == 3

    spt = ts.SpatialTree([-1, 0], 3, 4)  # W = 4: flat l = 4 y + x
    un = torch.zeros(1, 2, 12, dtype=torch.float64)
    un[0, 0, 5], un[0, 1, 11] = 2.0, 3.0
    w = torch.tensor([[1.0, 2.0, -1.0, 0.5]], dtype=torch.float64)
    rest = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
    # parent at (x, y) = (1, 1), child at (3, 2): d = (3 - 1 - 1, 2 - 1 - 0.5) = (1, 0.5)
    # cost = 1 * 1 + 2 * 1 + (-1) * 0.5 + 0.5 * 0.25 = 2.625
    lab = torch.tensor([[5, 11]])
    assert float(spt.score(SpatialTreePotentials(un, w, rest), lab)) == 2 + 3 - 2.625
    # truncated loss, s = 2: node 0 off by (1, 1): 2/4; node 1 off by (0, 2): min(1, 4/4) = 1 -> (0.5 + 1) / 2
    truth = torch.tensor([[0, 3]])  # (0, 0) and (3, 0)
    assert float(spt.task_loss(lab, truth, torch.tensor([2.0], dtype=torch.float64))) == 0.75
    assert float(ts.SpatialTree([-1, 0], 3, 4, loss="hamming").task_loss(lab, torch.tensor([[5, 3]]))) == 0.5


@pytest.mark.parametrize("spatial", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_marginals_give_the_score(spatial, shared):
    g = torch.Generator().manual_seed(6)
    parents = SHAPES["random"]
    if spatial:
        spt = ts.SpatialTree(parents, 3, 3)
        unary, weights, rest = random_spatial(g, 4, parents, 3, 3, shared=shared)
        pot = SpatialTreePotentials(unary, weights, rest)
        y = torch.randint(0, 9, (4, 5), generator=g)
        mu = spt.marginals(y, rest=rest, dtype=torch.float64)
        inner = (mu.unary * unary).sum((1, 2)) + (mu.weights * weights).sum((-1, -2))
    else:
        spt = ts.Tree(parents, num_labels=3)
        unary, pairwise = draw(g, 4, 5, 3), draw(g, 4, 3, 3) if shared else draw(g, 4, 4, 3, 3)
        pot = TreePotentials(unary, pairwise)
        y = torch.randint(0, 3, (4, 5), generator=g)
        mu = spt.marginals(y, dtype=torch.float64)
        inner = (mu.unary * unary).sum((1, 2)) + (mu.pairwise * pairwise).sum((1, 2, 3))
    torch.testing.assert_close(spt.score(pot, y), inner)


@pytest.mark.parametrize("spatial", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_hinge_gradient_is_score_difference(spatial, shared):
    """The hinge is piecewise linear: at a generic point its gradient is exact, so a small step changes it
    by exactly <grad, step> (checked with finite differences in float64)."""
    g = torch.Generator().manual_seed(9)
    parents, B = SHAPES["star"], 3
    if spatial:
        spt, K = ts.SpatialTree(parents, 3, 3), 9
        unary, weights, rest = random_spatial(g, B, parents, 3, 3, shared=shared)
        unary = unary + 0.1 * torch.rand(unary.shape, generator=g, dtype=torch.float64)
        weights = weights + 0.1 * torch.rand(weights.shape, generator=g, dtype=torch.float64)
        tensors = [unary, weights]
        make = lambda u, w: SpatialTreePotentials(u, w, rest)  # noqa: E731
        scale = torch.tensor([1.0, 1.5, 2.0], dtype=torch.float64)
    else:
        spt, K = ts.Tree(parents, num_labels=3), 3
        unary = torch.randn(B, 5, 3, generator=g, dtype=torch.float64)
        pairwise = torch.randn(*((4, 3, 3) if shared else (B, 4, 3, 3)), generator=g, dtype=torch.float64)
        tensors, make, scale = [unary, pairwise], TreePotentials, None
    target = torch.randint(0, K, (B, 5), generator=g)
    crit = ts.StructuredHingeLoss(spt, reduction="sum")
    params = [t.clone().requires_grad_() for t in tensors]
    loss = crit(make(*params), target, scale)
    loss.backward()
    loss = loss.detach()
    assert float(loss) > 0  # some example violates: the gradient is not trivially zero
    for i, t in enumerate(tensors):
        step = 1e-6 * torch.randn(t.shape, generator=g, dtype=torch.float64)
        moved = [u + step if j == i else u for j, u in enumerate(tensors)]
        lo = crit(make(*moved), target, scale)
        expect = float(loss) + float((params[i].grad * step).sum())
        assert float(lo) == pytest.approx(expect, abs=1e-12)
        assert params[i].grad.abs().sum() > 0


def test_hinge_is_zero_for_a_margin_satisfying_truth():
    tree = ts.Tree(SHAPES["chain"], num_labels=3)
    target = torch.tensor([[0, 1, 2, 1, 0]])
    mu = tree.marginals(target, dtype=torch.float64)
    pot = TreePotentials((10 * mu.unary).requires_grad_(), torch.zeros(4, 3, 3, dtype=torch.float64))
    loss = ts.StructuredHingeLoss(tree)(pot, target)
    assert float(loss.detach()) == 0
    assert torch.equal(tree.decode(pot), target)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="parents must have exactly one root"):
        ts.Tree([-1, -1, 0], num_labels=2)
    with pytest.raises(ValueError, match="parents must have exactly one root"):
        ts.Tree([1, 2, 0], num_labels=2)  # a cycle leaves no root
    with pytest.raises(ValueError, match="parents has a cycle"):
        ts.Tree([-1, 2, 1], num_labels=2)
    with pytest.raises(ValueError, match=r"parents\[1\] = 5"):
        ts.Tree([-1, 5], num_labels=2)
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        ts.Tree([-1, 1], num_labels=2)
    tree = ts.Tree([-1, 0, 0], num_labels=2)
    u = torch.zeros(2, 3, 2)
    with pytest.raises(ValueError, match="pairwise must have shape"):
        tree.decode(TreePotentials(u, torch.zeros(3, 2, 2)))
    with pytest.raises(ValueError, match="unary has 4 nodes"):
        tree.decode(TreePotentials(torch.zeros(2, 4, 2), torch.zeros(2, 2, 2)))
    with pytest.raises(ValueError, match="target holds label 2"):
        tree.decode(TreePotentials(u, torch.zeros(2, 2, 2)), target=torch.full((2, 3), 2))
    with pytest.raises(ValueError, match="lengths must be None"):
        tree.decode(TreePotentials(u, torch.zeros(2, 2, 2)), torch.ones(2, dtype=torch.long))
    with pytest.raises(ValueError, match="pairwise contains NaN"):
        tree.decode(TreePotentials(u, torch.full((2, 2, 2), float("nan"))))

    spt = ts.SpatialTree([-1, 0], 2, 2)
    u = torch.zeros(1, 2, 4)
    w = torch.tensor([[0.0, -1.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match=r"weights\[..., 1\] and weights\[..., 3\] must be >= 0"):
        spt.decode(SpatialTreePotentials(u, w))
    with pytest.raises(ValueError, match=r"weights\[..., 1\] and weights\[..., 3\] must be >= 0"):
        spatial_tree_max_sum(u, w, torch.zeros(1, 2), [-1, 0], 2, 2, backend="torch")
    with pytest.raises(ValueError, match="a must be >= 0"):
        distance_transform_1d(torch.zeros(1, 3), torch.tensor([-1.0]), torch.zeros(1), torch.zeros(1))
    with pytest.raises(ValueError, match="weights must have shape"):
        spt.decode(SpatialTreePotentials(u, torch.zeros(2, 4)))
    with pytest.raises(ValueError, match="rest must have shape"):
        spt.decode(SpatialTreePotentials(u, torch.zeros(1, 4), torch.zeros(2, 2)))
    with pytest.raises(ValueError, match="loss scale s"):
        spt.decode(SpatialTreePotentials(u, torch.zeros(1, 4)), target=torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="loss scale s"):
        spt.task_loss(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long),
                     torch.tensor([0.0]))
    with pytest.raises(ValueError, match="height must be >= 1"):
        ts.SpatialTree([-1], 0, 2)
    with pytest.raises(ValueError, match="parents must have exactly one root"):
        tree_max_sum(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2), [-1, -1], backend="torch")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.booleans(), st.integers(0, 10**6))
def test_property_random_trees_match_enumeration(V, K, shared, seed):
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(V, generator=g).tolist()  # a random tree: each node hangs below an earlier one
    parents = [-1] * V
    for i in range(1, V):
        parents[order[i]] = order[int(torch.randint(0, i, (1,), generator=g))]
    unary = draw(g, 2, V, K)
    pairwise = draw(g, V - 1, K, K) if shared else draw(g, 2, V - 1, K, K)
    labels, value = tree_max_sum_torch(unary, pairwise, parents)
    for b in range(2):
        y, v = brute_force_tree(unary[b], pairwise if shared else pairwise[b], parents)
        assert labels[b].tolist() == y and float(value[b]) == v


def test_tree_kernels_check_the_nodes_against_parents():
    """A unary with more nodes than ``parents`` left the extra nodes' labels uninitialised (80 on a 2 x 2 grid)."""
    from torchssvm.kernels import spatial_tree_max_sum, tree_max_sum

    f64 = torch.float64
    u = torch.randn(1, 3, 4, dtype=f64)
    with pytest.raises(ValueError, match=r"unary must have shape \(B, 2, K\) for the 2 nodes of parents"):
        spatial_tree_max_sum(u, torch.rand(2, 4, dtype=f64), torch.zeros(2, 2, dtype=f64), [-1, 0], 2, 2,
                             backend="torch")
    with pytest.raises(ValueError, match=r"unary must have shape \(B, 4, K\)"):
        tree_max_sum(u, torch.randn(3, 4, 4, dtype=f64), [-1, 0, 0, 1], backend="torch")
    with pytest.raises(ValueError, match="pairwise must have shape"):
        tree_max_sum(u, torch.randn(3, 4, 4, dtype=f64), [-1, 0, 1], backend="torch")
    with pytest.raises(ValueError, match="weights must have shape"):
        spatial_tree_max_sum(u, torch.rand(3, 4, dtype=f64), torch.zeros(2, 2, dtype=f64), [-1, 0, 0], 2, 2)
    with pytest.raises(ValueError, match="rest must have shape"):
        spatial_tree_max_sum(u, torch.rand(2, 4, dtype=f64), torch.zeros(3, 2, dtype=f64), [-1, 0, 0], 2, 2)
    with pytest.raises(ValueError, match="height \\* width"):
        spatial_tree_max_sum(u, torch.rand(2, 4, dtype=f64), torch.zeros(2, 2, dtype=f64), [-1, 0, 0], 1, 2)
    labels, _ = tree_max_sum(u, torch.randn(2, 4, 4, dtype=f64), [-1, 0, 1], backend="torch")
    assert bool(((labels >= 0) & (labels < 4)).all())
