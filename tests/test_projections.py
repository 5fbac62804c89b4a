"""Block-simplex projections (issue 8, item 1): the sort-based torch twin and the Triton kernel against a
bisection reference in float64, with duplicate kinks, negative entries, single-entry simplices, masks,
radii and infeasible input."""

import pytest
import torch
from conftest import needs_triton
from torchssvm.kernels import project_simplex, project_simplex_torch


def bisection_reference(v, mask=None, radius=None, iters=200):
    """Projection by bisection on tau in exact float64 steps, row by row (slow and obviously right)."""
    out = torch.zeros_like(v)
    for b in range(v.shape[0]):
        keep = torch.ones(v.shape[1], dtype=torch.bool) if mask is None else mask[b]
        x = v[b, keep]
        r = 1.0 if radius is None else float(radius[b])
        lo, hi = float(x.max()) - r, float(x.max())
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            if float((x - mid).clamp_min(0).sum()) >= r:
                lo = mid
            else:
                hi = mid
        out[b, keep] = (x - 0.5 * (lo + hi)).clamp_min(0)
    return out


def _cases():
    g = torch.Generator().manual_seed(0)
    yield torch.randn(20, 7, generator=g, dtype=torch.float64), None, None
    yield torch.randn(5, 1, generator=g, dtype=torch.float64), None, None  # n = 1: x = radius
    dup = torch.tensor([[0.3, 0.3, 0.3, -1.0], [2.0, 2.0, 2.0, 2.0], [-5.0, -5.0, -7.0, -5.0]], dtype=torch.float64)
    yield dup, None, None  # duplicate kinks, all-equal rows, all-negative rows
    v = torch.randn(30, 12, generator=g, dtype=torch.float64) * 10
    mask = torch.rand(30, 12, generator=g) < 0.6
    mask[:, 0] = True
    yield v, mask, torch.rand(30, generator=g, dtype=torch.float64) * 3 + 0.1
    yield torch.randint(-3, 4, (40, 9), generator=g).double(), None, torch.full((40,), 2.0, dtype=torch.float64)


@pytest.mark.parametrize("case", range(5))
def test_torch_projection_matches_bisection(case):
    v, mask, radius = list(_cases())[case]
    x = project_simplex(v, mask, radius, backend="torch")
    torch.testing.assert_close(x, bisection_reference(v, mask, radius), rtol=0, atol=1e-12)
    r = torch.ones(v.shape[0], dtype=torch.float64) if radius is None else radius
    torch.testing.assert_close(x.sum(1), r, rtol=0, atol=1e-12)
    assert (x >= 0).all()
    if mask is not None:
        assert (x[~mask] == 0).all()


def test_projection_is_the_euclidean_minimizer():
    """First-order optimality: <v - x, y - x> <= 0 for every vertex y of the simplex."""
    g = torch.Generator().manual_seed(1)
    v = torch.randn(50, 6, generator=g, dtype=torch.float64)
    x = project_simplex_torch(v)
    for k in range(6):
        y = torch.zeros_like(x)
        y[:, k] = 1.0
        assert (((v - x) * (y - x)).sum(1) <= 1e-12).all()


@needs_triton()
@pytest.mark.parametrize("case", range(5))
def test_triton_projection_matches_torch_twin(case):
    from torchssvm.kernels.projections.simplex_triton import project_simplex_triton

    v, mask, radius = list(_cases())[case]
    torch.testing.assert_close(project_simplex_triton(v, mask, radius), project_simplex_torch(v, mask, radius),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(project_simplex(v, mask, radius, backend="triton"),
                               bisection_reference(v, mask, radius), rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton())])
def test_projection_keeps_a_radius_far_below_the_entries(backend):
    """A radius below the float spacing of max(v) (float32 entries near 100 with radius 1e-6; 1e8 with radius 1)
    still lands on the simplex: the threshold is found relative to the row's maximum."""
    for dtype, v, r, expect in [(torch.float32, [[100.0, 99.0, 3.0]], 1e-6, [1e-6, 0.0, 0.0]),
                                (torch.float32, [[1e8, 0.0, -1e8]], 1.0, [1.0, 0.0, 0.0]),
                                (torch.float64, [[1e17, 0.0]], 1.0, [1.0, 0.0]),
                                (torch.float32, [[5.0, 5.0, 1.0]], 1e-6, [5e-7, 5e-7, 0.0])]:
        x = project_simplex(torch.tensor(v, dtype=dtype), radius=torch.full((1,), r, dtype=dtype), backend=backend)
        torch.testing.assert_close(x, torch.tensor([expect], dtype=dtype), rtol=1e-6, atol=0.0)


def test_projection_rejects_infeasible_and_bad_input():
    v = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="infeasible"):
        project_simplex(v, torch.tensor([[True, False, False], [False, False, False]]))
    with pytest.raises(ValueError, match="radius"):
        project_simplex(v, None, torch.tensor([1.0, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="radius"):
        project_simplex(v, None, torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="mask"):
        project_simplex(v, torch.ones(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        project_simplex(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="v must be"):
        project_simplex(torch.zeros(3))
    from torchssvm.kernels import project_shifted_simplex

    with pytest.raises(ValueError, match=r"radius must be a \(2,\) tensor"):
        project_shifted_simplex(v, torch.zeros(2, dtype=torch.long), radius=1.0)
