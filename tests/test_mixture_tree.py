"""Pictorial structures with mixture types per edge: the oracle against enumeration over positions and
types, the compiled and Triton twins against the torch twin, T = 1 against `SpatialTree`, and the
`MixtureSpatialTree` structure (loss-augmented decoding, scores, marginals, hinge gradients, errors)."""

import itertools

import pytest
import torch
from conftest import needs_numba, needs_triton
from torchssvm.kernels import mixture_tree_max_sum, numba_available, spatial_tree_max_sum, tree_schedule

import torchssvm as ts
from torchssvm.structures.mixture_tree import MixtureTreePotentials

BACKENDS = ["torch", pytest.param("numba", marks=needs_numba()), pytest.param("triton", marks=needs_triton())]
TREES = {"path": [-1, 0, 1], "fork": [-1, 0, 0, 1], "star": [1, -1, 1, 1]}


def random_mixture(g, B, parents, H, W, T, *, shared, scores, integer=True, dtype=torch.float64):
    V, E, K = len(parents), len(parents) - 1, H * W

    def draw(*shape, lo=-3, hi=4):
        t = torch.randint(lo, hi, shape, generator=g).to(dtype)
        return t if integer else t + torch.rand(shape, generator=g, dtype=torch.float64).to(dtype)

    unary = draw(B, V, K)
    weights = draw(*((E, T, 4) if shared else (B, E, T, 4)), lo=-1, hi=2)
    weights[..., 1::2] = weights[..., 1::2].abs()
    rest = torch.randint(-2, 3, (E, T, 2), generator=g).to(dtype) / 2  # half-integers: exact
    child = draw(B, E, T, K) if scores in ("child", "both") else None
    parent = draw(B, E, T, K) if scores in ("parent", "both") else None
    if scores == "bias":  # a type bias on one end, by position on the other
        child, parent = draw(B, E, T, 1), draw(B, E, T, K)
    return unary, weights, rest, child, parent


def enumerate_scores(unary, weights, rest, child, parent, parents, H, W, b, cooc=None):
    """Every (positions, types) labelling of example b and its score: ``(Y (N, V), types (N, E), s (N,))``;
    ``cooc (E, T, T)`` adds ``cooc[e, type above e's parent (0 at the root), t_e]``."""
    V, K = unary.shape[1], H * W
    sched = tree_schedule(parents)
    E, T = rest.shape[0], rest.shape[1]
    Y = torch.tensor(list(itertools.product(range(K), repeat=V)), dtype=torch.long).view(-1, V)
    Ty = torch.tensor(list(itertools.product(range(T), repeat=E)), dtype=torch.long).view(-1, E)
    Y, Ty = Y.repeat_interleave(Ty.shape[0], 0), Ty.repeat(Y.shape[0], 1)
    w = weights if weights.dim() == 3 else weights[b]
    s = unary[b].double()[torch.arange(V), Y].sum(1)
    for e, (p, c) in enumerate(zip(sched.edge_parent, sched.edge_child)):
        t = Ty[:, e]
        dx = (Y[:, c] % W - Y[:, p] % W).double() - rest[e, t, 0].double()
        dy = (Y[:, c] // W - Y[:, p] // W).double() - rest[e, t, 1].double()
        we = w[e, t].double()
        s = s - (we[:, 0] * dx + we[:, 1] * dx * dx + we[:, 2] * dy + we[:, 3] * dy * dy)
        for scores, at in ((child, Y[:, c]), (parent, Y[:, p])):
            if scores is not None:
                s = s + scores[b, e].double()[t, at if scores.shape[-1] > 1 else 0]
        if cooc is not None:
            above = sched.edge_child.index(p) if p != sched.root else None
            s = s + cooc[e].double()[Ty[:, above] if above is not None else 0, t]
    return Y, Ty, s


# -- the oracle -------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("scores", ["none", "child", "both", "bias"])
def test_mixture_oracle_matches_enumeration(backend, tree, scores):
    parents, H, W, T, B = TREES[tree], 2, 3, 2, 3
    g = torch.Generator().manual_seed(len(parents) * 10 + len(scores))
    for shared, integer in ((True, True), (False, False)):
        args = random_mixture(g, B, parents, H, W, T, shared=shared, scores=scores, integer=integer)
        pos, types, value = mixture_tree_max_sum(args[0], args[1], args[2], parents, H, W, args[3], args[4],
                                                 backend=backend)
        assert pos.shape == (B, len(parents)) and types.shape == (B, len(parents) - 1)
        for b in range(B):
            Y, Ty, s = enumerate_scores(*args, parents, H, W, b)
            best = float(s.max())
            assert float(value[b]) == pytest.approx(best, abs=1e-9)
            found = ((Y == pos[b]).all(1) & (Ty == types[b]).all(1)).nonzero().item()
            assert float(s[found]) == pytest.approx(best, abs=1e-9)  # the returned labelling attains it
            if not integer:  # real-valued scores: a unique maximizer
                assert int(s.argmax()) == found


TWIN_CASES = [pytest.param("numba", dtype, shared, marks=needs_numba())
              for dtype in (torch.float32, torch.float64) for shared in (True, False)]
TWIN_CASES.append(pytest.param("triton", torch.float32, False, marks=needs_triton()))  # interpreted on CPU: one


@pytest.mark.parametrize(("backend", "dtype", "shared"), TWIN_CASES)
def test_twins_equal_torch_bitwise(backend, dtype, shared):
    """Same decisions and arithmetic in the same order: equal values, positions and types, ties included
    (small integers on a 5x6 grid, T = 3, both score kinds)."""
    parents, H, W = [-1, 0, 0, 1, 1, 2, 5], 5, 6
    g = torch.Generator().manual_seed(3)
    cases = (("both", True), ("parent", False), ("none", True), ("bias", False), ("child", False))
    for scores, integer in cases[:1] if backend == "triton" else cases:
        for T in (3, 1):  # T = 1 takes the single-type path (the transform writes the message)
            args = random_mixture(g, 4, parents, H, W, T, shared=shared, scores=scores, integer=integer,
                                  dtype=dtype)
            ref = mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], backend="torch")
            out = mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], backend=backend)
            for a, b in zip(out, ref):
                assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["torch", pytest.param("numba", marks=needs_numba())])
@pytest.mark.parametrize("shared", [True, False])
def test_one_type_is_the_spatial_tree(backend, shared):
    data = ts.data.synthetic_pose(n=3, height=16, width=16, seed=2)
    g = torch.Generator().manual_seed(0)
    unary = data.features[:, :, 0]
    w = torch.rand(*((25, 4) if shared else (3, 25, 4)), generator=g) - 0.5
    w[..., 1::2] = w[..., 1::2].abs() / 4
    rest = data.rest.float()
    labels, value = spatial_tree_max_sum(unary, w, rest, data.parents, 16, 16, backend=backend)
    pos, types, v1 = mixture_tree_max_sum(unary, w.unsqueeze(-2), rest.unsqueeze(1), data.parents, 16, 16,
                                          backend=backend)
    assert torch.equal(pos, labels) and torch.equal(v1, value) and not types.any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tree", ["path", "star"])
def test_cooccurrence_oracle_matches_enumeration(backend, tree):
    parents, H, W, T, B = TREES[tree], 2, 2, 3, 3
    g = torch.Generator().manual_seed(40 + len(parents))
    for integer in (True, False):
        args = random_mixture(g, B, parents, H, W, T, shared=True, scores="both", integer=integer)
        cooc = torch.randint(-3, 4, (len(parents) - 1, T, T), generator=g).double()
        if not integer:
            cooc = cooc + torch.rand(cooc.shape, generator=g, dtype=torch.float64)
        pos, types, value = mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], cooc, backend=backend)
        for b in range(B):
            Y, Ty, s = enumerate_scores(*args, parents, H, W, b, cooc)
            assert float(value[b]) == pytest.approx(float(s.max()), abs=1e-9)
            found = ((Y == pos[b]).all(1) & (Ty == types[b]).all(1)).nonzero().item()
            assert float(s[found]) == pytest.approx(float(s.max()), abs=1e-9)
            if not integer:
                assert int(s.argmax()) == found


@pytest.mark.parametrize("backend", ["torch", pytest.param("numba", marks=needs_numba())])
def test_zero_cooccurrence_is_the_mixture_and_twins_agree(backend):
    parents, H, W, T = [-1, 0, 0, 1, 1, 2, 5], 5, 6, 3
    g = torch.Generator().manual_seed(9)
    for dtype, shared in ((torch.float32, True), (torch.float64, False)):
        args = random_mixture(g, 4, parents, H, W, T, shared=shared, scores="both", dtype=dtype)
        zero = torch.zeros(6, T, T, dtype=dtype)
        plain = mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], backend=backend)
        for a, b in zip(mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], zero, backend=backend), plain):
            assert torch.equal(a, b)
        cooc = torch.randint(-2, 3, (4, 6, T, T), generator=g).to(dtype)  # per example, integers: ties
        ref = mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], cooc, backend="torch")
        for a, b in zip(mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], cooc, backend=backend), ref):
            assert torch.equal(a, b)


def test_cooccurrence_chains_the_types_of_a_limb():
    """A path whose two edges prefer the same type: with a co-occurrence bonus for equal types the second
    edge follows the first even where its own evidence slightly prefers the other type."""
    parents, H, W = [-1, 0, 1], 1, 9
    unary = torch.zeros(1, 3, W, dtype=torch.float64)
    weights = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=torch.float64).expand(2, 2, 4)
    rest = torch.zeros(2, 2, 2, dtype=torch.float64)
    child = torch.tensor([[2.0, 0.0], [0.0, 0.5]], dtype=torch.float64).view(1, 2, 2, 1)  # edge 1 prefers type 1
    _, types, _ = mixture_tree_max_sum(unary, weights, rest, parents, H, W, child, backend="torch")
    assert types[0].tolist() == [0, 1]
    cooc = torch.zeros(2, 2, 2, dtype=torch.float64)
    cooc[1] = torch.eye(2)  # edge 1: +1 when its type equals edge 0's
    for backend in ("torch",) + (("numba",) if numba_available() else ()):
        _, types, value = mixture_tree_max_sum(unary, weights, rest, parents, H, W, child, None, cooc,
                                               backend=backend)
        assert types[0].tolist() == [0, 0] and float(value) == 3.0


@pytest.mark.parametrize("backend", ["torch", pytest.param("numba", marks=needs_numba())])
def test_one_row_grid_reads_every_column_of_the_maps(backend):
    """A 1 x W grid: per-position type scores are (B, E, T, W) maps, not biases (numba once read column 0)."""
    parents, H, W, T, B = [-1, 0, 0], 1, 4, 2, 3
    g = torch.Generator().manual_seed(13)
    args = random_mixture(g, B, parents, H, W, T, shared=False, scores="both", integer=False)
    cooc = torch.randn(2, T, T, generator=g, dtype=torch.float64)
    for extra in ((), (cooc,)):
        pos, types, value = mixture_tree_max_sum(*args[:3], parents, H, W, *args[3:], *extra, backend=backend)
        for b in range(B):
            Y, Ty, s = enumerate_scores(*args, parents, H, W, b, *extra)
            assert int(s.argmax()) == ((Y == pos[b]).all(1) & (Ty == types[b]).all(1)).nonzero().item()
            assert float(value[b]) == pytest.approx(float(s.max()), abs=1e-9)


def test_kernel_arguments_are_checked_by_name():
    parents, H, W = [-1, 0, 0], 3, 3
    u, w = torch.zeros(1, 3, 9), torch.zeros(2, 2, 4)
    with pytest.raises(ValueError, match=r"rest must have shape \(2, 2, 2\)"):
        mixture_tree_max_sum(u, w, torch.zeros(1, 2, 2), parents, H, W, backend="torch")
    with pytest.raises(ValueError, match="weights must have shape"):
        mixture_tree_max_sum(u, torch.zeros(3, 2, 4), torch.zeros(2, 2, 2), parents, H, W, backend="torch")
    with pytest.raises(ValueError, match="unary must have shape"):
        mixture_tree_max_sum(torch.zeros(1, 3, 8), w, torch.zeros(2, 2, 2), parents, H, W, backend="torch")
    with pytest.raises(ValueError, match="child_scores must have shape"):
        mixture_tree_max_sum(u, w, torch.zeros(2, 2, 2), parents, H, W, torch.zeros(1, 2, 2, 3), backend="torch")
    with pytest.raises(ValueError, match="cooccurrence must have shape"):
        mixture_tree_max_sum(u, w, torch.zeros(2, 2, 2), parents, H, W, None, None, torch.zeros(2, 2, 3),
                             backend="torch")


def test_types_pick_the_matching_rest_offset():
    """Two types per edge, rest offsets (+3, 0) and (-3, 0): a chain whose true displacements alternate
    is decoded with the alternating types, which one shared offset cannot express."""
    parents, H, W = [-1, 0, 1, 2], 1, 13
    xs = [6, 9, 6, 9]
    unary = torch.full((1, 4, W), -1.0, dtype=torch.float64)
    unary[0, torch.arange(4), torch.tensor(xs)] = 1.0
    weights = torch.tensor([[0.0, 1.0, 0.0, 0.0]] * 2, dtype=torch.float64).expand(3, 2, 4)
    rest = torch.tensor([[3.0, 0.0], [-3.0, 0.0]], dtype=torch.float64).expand(3, 2, 2)
    pos, types, value = mixture_tree_max_sum(unary, weights, rest, parents, H, W, backend="torch")
    assert pos[0].tolist() == xs and types[0].tolist() == [0, 1, 0] and float(value) == 4.0


# -- the structure ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", pytest.param("numba", marks=needs_numba())])
@pytest.mark.parametrize(("loss", "cooccur"), [("truncated", False), ("hamming", False), ("truncated", True)])
def test_loss_augmented_oracle_matches_enumeration(backend, loss, cooccur):
    parents, H, W, T, B = [-1, 0, 1, 0], 2, 3, 2, 3  # V = 4, s in {1, 2}: dyadic losses
    mst = ts.MixtureSpatialTree(parents, H, W, T, loss=loss)
    g = torch.Generator().manual_seed(12)
    args = random_mixture(g, B, parents, H, W, T, shared=True, scores="both", integer=False)
    if cooccur:
        args = (*args, torch.randn(3, T, T, generator=g, dtype=torch.float64))
    target = torch.cat([torch.randint(0, H * W, (B, 4), generator=g), torch.randint(0, T, (B, 3), generator=g)], 1)
    scale = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64) if loss == "truncated" else None
    y_hat, value = mst.max_oracle(MixtureTreePotentials(*args), target, scale, loss_weight=2.0, backend=backend)
    assert y_hat.shape == (B, 7)
    for b in range(B):
        Y, Ty, s = enumerate_scores(*args[:5], parents, H, W, b, *args[5:])
        lab = torch.cat([Y, Ty], 1)
        delta = mst.task_loss(lab, target[b:b + 1].expand(lab.shape[0], 7),
                              None if scale is None else scale[b:b + 1].expand(lab.shape[0]))
        aug = s + 2.0 * delta
        assert int(aug.argmax()) == ((Y == y_hat[b, :4]).all(1) & (Ty == y_hat[b, 4:]).all(1)).nonzero().item()
        assert float(value[b]) == pytest.approx(float(aug.max()), abs=1e-9)
        pot_b = MixtureTreePotentials(args[0][b:b + 1], args[1], args[2], args[3][b:b + 1], args[4][b:b + 1],
                                      *args[5:])
        assert float(mst.score(pot_b, y_hat[b:b + 1])) == pytest.approx(float(s[aug.argmax()]), abs=1e-9)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("scores", ["both", "bias"])
def test_marginals_give_the_score(shared, scores):
    parents, H, W, T = [1, -1, 1, 2, 2], 3, 3, 3
    mst = ts.MixtureSpatialTree(parents, H, W, T)
    g = torch.Generator().manual_seed(7)
    args = random_mixture(g, 4, parents, H, W, T, shared=shared, scores=scores, integer=False)
    cooc = torch.randn(*((4, T, T) if shared else (4, 4, T, T)), generator=g, dtype=torch.float64)
    args = (*args, cooc)
    y = torch.cat([torch.randint(0, 9, (4, 5), generator=g), torch.randint(0, T, (4, 4), generator=g)], 1)
    mu = mst.marginals(y, rest=args[2], dtype=torch.float64)
    w = args[1] if not shared else args[1].expand(4, *args[1].shape)
    c = cooc if not shared else cooc.expand(4, *cooc.shape)
    # a type bias (B, E, T, 1) pairs with the marginals summed over positions
    child_mu = mu.child_scores.sum(3, keepdim=True) if args[3].shape[3] == 1 else mu.child_scores
    inner = ((mu.unary * args[0]).sum((1, 2)) + (mu.weights * w).sum((1, 2, 3))
             + (child_mu * args[3]).sum((1, 2, 3)) + (mu.parent_scores * args[4]).sum((1, 2, 3))
             + (mu.cooccurrence * c).sum((1, 2, 3)))
    torch.testing.assert_close(mst.score(MixtureTreePotentials(*args), y), inner)
    assert (mu.weights.ne(0).any(-1).sum(2) <= 1).all()  # only the chosen type carries the deformation


@pytest.mark.parametrize(("shared", "scores"), [(True, "both"), (False, "both"), (False, "bias")])
def test_hinge_gradient_is_score_difference(shared, scores):
    """Piecewise linear: at a generic point a small step changes the hinge by exactly <grad, step>, for
    every potential tensor (finite differences in float64)."""
    parents, H, W, T, B = [1, -1, 1, 1], 3, 3, 2, 3
    mst = ts.MixtureSpatialTree(parents, H, W, T)
    g = torch.Generator().manual_seed(21)
    unary, weights, rest, child, parent = random_mixture(g, B, parents, H, W, T, shared=shared, scores=scores,
                                                         integer=False)
    cooc = torch.randn(*((3, T, T) if shared else (B, 3, T, T)), generator=g, dtype=torch.float64)
    target = torch.cat([torch.randint(0, 9, (B, 4), generator=g), torch.randint(0, T, (B, 3), generator=g)], 1)
    scale = torch.tensor([1.0, 1.5, 2.0], dtype=torch.float64)
    crit = ts.StructuredHingeLoss(mst, reduction="sum")
    tensors = [unary, weights, child, parent, cooc]

    def make(u, w, c, p, b):
        return MixtureTreePotentials(u, w, rest, c, p, b)

    params = [t.clone().requires_grad_() for t in tensors]
    loss = crit(make(*params), target, scale)
    loss.backward()
    loss = loss.detach()
    assert float(loss) > 0
    for i, t in enumerate(tensors):
        assert params[i].grad.abs().sum() > 0
        step = 1e-6 * torch.randn(t.shape, generator=g, dtype=torch.float64)
        moved = [u + step if j == i else u for j, u in enumerate(tensors)]
        expect = float(loss) + float((params[i].grad * step).sum())
        assert float(crit(make(*moved), target, scale)) == pytest.approx(expect, abs=1e-12)


def test_one_type_structure_matches_spatial_tree():
    data = ts.data.synthetic_pose(n=4, height=12, width=12, seed=5)
    spt = ts.SpatialTree(data.parents, 12, 12)
    mst = ts.MixtureSpatialTree(data.parents, 12, 12, 1)
    w = torch.tensor([0.1, 0.05, -0.1, 0.05]).expand(25, 4)
    unary, rest, scale = data.features[:, :, 0], data.rest.float(), data.scale.float()
    y, v = spt.max_oracle(ts.SpatialTreePotentials(unary, w, rest), data.positions, scale)
    target = torch.cat([data.positions, torch.zeros(4, 25, dtype=torch.long)], 1)
    ym, vm = mst.max_oracle(MixtureTreePotentials(unary, w.unsqueeze(1), rest.unsqueeze(1)), target, scale)
    assert torch.equal(ym[:, :26], y) and torch.equal(vm, v) and not ym[:, 26:].any()


def test_errors_name_the_argument():
    mst = ts.MixtureSpatialTree([-1, 0], 2, 2, 2)
    u, w = torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    with pytest.raises(ValueError, match="num_types must be >= 1"):
        ts.MixtureSpatialTree([-1, 0], 2, 2, 0)
    with pytest.raises(ValueError, match="weights must have shape"):
        mst.decode(MixtureTreePotentials(u, torch.zeros(1, 4)))
    with pytest.raises(ValueError, match="weights must have shape"):
        mst.decode(MixtureTreePotentials(u, torch.zeros(1, 3, 4)))
    bad = w.clone()
    bad[0, 1, 3] = -1
    with pytest.raises(ValueError, match=r"weights\[..., 1\] and weights\[..., 3\] must be >= 0"):
        mst.decode(MixtureTreePotentials(u, bad))
    with pytest.raises(ValueError, match="rest must have shape"):
        mst.decode(MixtureTreePotentials(u, w, torch.zeros(1, 2)))
    with pytest.raises(ValueError, match="child_scores must have shape"):
        mst.decode(MixtureTreePotentials(u, w, None, torch.zeros(1, 1, 2, 3)))
    with pytest.raises(ValueError, match=r"child_scores must have shape \(1, 1, 2, 1\)"):
        mst.decode(MixtureTreePotentials(u, w, None, torch.zeros(1, 1, 3, 1)))
    with pytest.raises(ValueError, match="parent_scores contains NaN"):
        mst.decode(MixtureTreePotentials(u, w, None, None, torch.full((1, 1, 2, 4), float("nan"))))
    scale = torch.ones(1)
    with pytest.raises(ValueError, match=r"target must have shape \(1, 3\)"):
        mst.decode(MixtureTreePotentials(u, w), target=torch.zeros(1, 2, dtype=torch.long), lengths=scale)
    with pytest.raises(ValueError, match=r"target\[:, 2:\] \(edge types\) holds label 2"):
        mst.decode(MixtureTreePotentials(u, w), target=torch.tensor([[0, 1, 2]]), lengths=scale)
    with pytest.raises(ValueError, match=r"target\[:, :2\] \(positions\) holds label 4"):
        mst.decode(MixtureTreePotentials(u, w), target=torch.tensor([[4, 1, 0]]), lengths=scale)
    with pytest.raises(ValueError, match="loss scale s"):
        mst.decode(MixtureTreePotentials(u, w), target=torch.tensor([[0, 1, 0]]))
    with pytest.raises(ValueError, match=r"cooccurrence must have shape \(1, 2, 2\) \(shared\)"):
        mst.decode(MixtureTreePotentials(u, w, None, None, None, torch.zeros(1, 2, 3)))
    with pytest.raises(ValueError, match=r"cooccurrence must have shape \(1, 1, 2, 2\)"):
        mst.decode(MixtureTreePotentials(u, w, None, None, None, torch.zeros(2, 1, 2, 2)))
    with pytest.raises(TypeError, match="MixtureTreePotentials"):
        mst.decode(u)
    with pytest.raises(ValueError, match=r"y must have shape"):
        mst.task_loss(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), scale)
