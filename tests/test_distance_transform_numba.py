"""The compiled CPU twin (numba) of the distance transforms and of max-sum on spatial trees: bitwise equal to
the torch twin (values and argmaxes, float32 and float64, ties, a = 0 rows), against brute force, on the
26-part pose tree through `SpatialTree.max_oracle`, and the backend rules (auto picks it on CPU, errors).
Enumeration over whole tiny trees: `test_tree.test_spatial_tree_matches_enumeration_tiny` (both backends)."""

import pytest
import torch
from conftest import needs_numba
from test_tree import SHAPES, brute_force_gdt, draw, random_spatial
from torchssvm.kernels import (
    _numba,
    distance_transform_1d,
    distance_transform_2d,
    resolve_backend,
    spatial_tree_max_sum,
)
from torchssvm.kernels.tree import distance_transform_numba as dtn

import torchssvm as ts
from torchssvm.data.pose import POSE_PARENTS
from torchssvm.structures.chain import ChainPotentials
from torchssvm.structures.tree import SpatialTreePotentials

pytestmark = needs_numba()
DTYPES = [torch.float64, torch.float32]


def same(x, y):
    return torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3, 9, 64])
def test_gdt_1d_equals_torch(dtype, integer, n):
    g = torch.Generator().manual_seed(n + 100 * integer)
    R = 30
    f = draw(g, R, n, integer=integer, dtype=dtype) * (1 if integer else 5)
    a = torch.randint(0, 3, (R,), generator=g).to(dtype) if integer else torch.rand(R, generator=g).to(dtype)
    a[::4] = 0  # the linear case
    b, r = draw(g, R, integer=integer, dtype=dtype), draw(g, R, integer=integer, dtype=dtype) / 2
    ref = distance_transform_1d(f, a, b, r, backend="torch")
    out = distance_transform_1d(f, a, b, r, backend="numba")
    assert same(out, ref)
    if integer:  # exact: the brute-force maximum and its smallest argmax
        assert same(out, brute_force_gdt(f, a, b, r))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdt_2d_equals_torch_and_brute_force(dtype):
    g = torch.Generator().manual_seed(3)
    R, H, W = 9, 5, 7
    for integer in (True, False):
        f = draw(g, R, H, W, integer=integer, dtype=dtype)
        p = [torch.randint(lo, 3, (R,), generator=g).to(dtype) for lo in (0, -2, 0, -2)]
        if not integer:
            p = [x + torch.rand(R, generator=g).to(dtype) for x in p]
        rx, ry = draw(g, R, dtype=dtype) / 2, draw(g, R, dtype=dtype) / 2
        ax, bx, ay, by = p
        out = distance_transform_2d(f, ax, bx, rx, ay, by, ry, backend="numba")
        assert same(out, distance_transform_2d(f, ax, bx, rx, ay, by, ry, backend="torch"))
        if integer and dtype == torch.float64:
            pos = torch.arange(H * W)
            x, y = (pos % W).double(), (pos // W).double()
            dx = x.view(1, -1, 1) - x.view(1, 1, -1) - rx.view(R, 1, 1)
            dy = y.view(1, -1, 1) - y.view(1, 1, -1) - ry.view(R, 1, 1)
            cost = (ax.view(R, 1, 1) * dx * dx + bx.view(R, 1, 1) * dx
                    + ay.view(R, 1, 1) * dy * dy + by.view(R, 1, 1) * dy)
            ref, ref_arg = (f.view(R, 1, H * W) - cost).max(-1)
            assert torch.equal(out[0].view(R, -1), ref) and torch.equal(out[1].view(R, -1), ref_arg)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("shared", [False, True])
def test_spatial_tree_equals_torch(dtype, shape, shared):
    parents, H, W = SHAPES[shape], 4, 6
    g = torch.Generator().manual_seed(len(shape) + 10 * shared)
    unary, weights, rest = random_spatial(g, 5, parents, H, W, shared=shared, dtype=dtype)
    for real in (False, True):
        u = unary + torch.rand(unary.shape, generator=g).to(dtype) if real else unary
        ref = spatial_tree_max_sum(u, weights, rest, parents, H, W, backend="torch")
        out = spatial_tree_max_sum(u, weights, rest, parents, H, W, backend="numba")
        assert same(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pose_oracle_equals_torch(dtype):
    """The BCFW oracle of the 26-part pose model (unary + truncated loss, then max-sum), as benchmarked."""
    d = ts.data.synthetic_pose("train", 6, height=16, width=12, num_features=1, seed=4)
    tree = ts.SpatialTree(POSE_PARENTS, 16, 12)
    E = tree.num_edges
    g = torch.Generator().manual_seed(0)
    weights = (torch.rand(6, E, 4, generator=g) * 0.2).to(dtype)
    weights[..., 0::2] -= 0.1
    pot = SpatialTreePotentials(d.features[:, :, 0].to(dtype), weights, d.rest.to(dtype))
    ref = tree.max_oracle(pot, d.positions, d.scale, backend="torch")
    out = tree.max_oracle(pot, d.positions, d.scale, backend="numba")
    assert same(out, ref)
    assert same(tree.max_oracle(pot, d.positions, d.scale), out)  # "auto" on CPU: numba


def test_backend_rules(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_backend("auto", cpu, has_numba=True) == "numba"
    assert resolve_backend("auto", cpu) == "torch"  # operations without a numba twin
    with pytest.raises(ValueError, match="backend='numba'"):
        resolve_backend("numba", cpu)
    chain = ts.Chain(3)
    with pytest.raises(ValueError, match="backend='numba'"):  # the slack oracle has no numba twin
        chain.slack_max_oracle(ChainPotentials(torch.zeros(1, 2, 3), torch.zeros(3, 3)), torch.zeros(1, 2).long(),
                               backend="numba")
    with pytest.raises(ValueError, match="float32 or float64"):
        dtn.distance_transform_1d_numba(torch.zeros(2, 3, dtype=torch.bfloat16), *torch.zeros(3, 2))
    # "auto" keeps torch for half types, which the numba twins do not take
    for dtype in (torch.float16, torch.bfloat16):
        f = torch.tensor([[0.0, 3.0, -1.0, 2.0]], dtype=dtype)
        p = [torch.full((1,), v, dtype=dtype) for v in (0.5, 0.0, 0.0)]
        for got, want in zip(distance_transform_1d(f, *p), distance_transform_1d(f, *p, backend="torch")):
            assert torch.equal(got, want)
        assert torch.equal(distance_transform_2d(f.view(1, 2, 2), *p, *p)[1],
                           distance_transform_2d(f.view(1, 2, 2), *p, *p, backend="torch")[1])
        unary, weights, rest = torch.randn(1, 2, 6).to(dtype), torch.tensor([[0.0, 1.0, 0.0, 1.0]], dtype=dtype), \
            torch.zeros(1, 2, dtype=dtype)
        assert torch.equal(spatial_tree_max_sum(unary, weights, rest, torch.tensor([-1, 0]), 2, 3)[0],
                           spatial_tree_max_sum(unary, weights, rest, torch.tensor([-1, 0]), 2, 3,
                                                        backend="torch")[0])
    monkeypatch.setattr(_numba, "numba", None)  # as without numba installed
    assert resolve_backend("auto", cpu, has_numba=True) == "torch"
    with pytest.raises(RuntimeError, match="numba"):
        resolve_backend("numba", cpu, has_numba=True)
