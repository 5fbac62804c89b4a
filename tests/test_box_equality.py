"""Projection onto a box with one linear equality (seed 003 App. B; note 003 sections 2.4 and 6.3): the
sort-based torch twin, the median-search reference (Algorithm 2) and the Triton kernel against a float64
bisection reference in the original variables, with mixed-sign sigma, random weights, duplicate kinks, flat
segments, n = 1, infinite bounds, the simplex and SVM special cases, and infeasible input."""

import math

import numpy as np
import pytest
import torch
from conftest import needs_triton
from torchssvm.kernels import box_equality_median, project_box_equality, project_box_equality_torch, project_simplex

INF = math.inf


def bisection_reference(m, lower, upper, sigma, z, d2=None):
    """Row by row in numpy float64: ``x(t) = clip(m + t sigma / d2, l, u)`` (stationarity of the Lagrangian)
    and ``g(t) = sum sigma x(t)`` nondecreasing; bracket ``g(lo) <= z <= g(hi)`` by doubling, then halve until
    the bracket is two adjacent floats."""
    B, n = m.shape

    def row(t, b):
        a = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)
        return np.broadcast_to(a[b] if a.ndim == 2 else a, (n,))

    out = np.zeros((B, n))
    for b in range(B):
        mb, lb, ub, sb = m[b].numpy(), row(lower, b), row(upper, b), row(sigma, b)
        db = np.ones(n) if d2 is None else row(d2, b)
        zb = float(z[b]) if isinstance(z, torch.Tensor) else float(z)

        def x_of(t, mb=mb, lb=lb, ub=ub, sb=sb, db=db):
            return np.clip(mb + t * sb / db, lb, ub)

        lo, hi = -1.0, 1.0
        while (sb * x_of(lo)).sum() > zb and lo > -1e300:  # z at an end point: g(-inf) = z up to rounding
            lo *= 2
        while (sb * x_of(hi)).sum() < zb and hi < 1e300:
            hi *= 2
        for _ in range(3000):
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:
                break
            if (sb * x_of(mid)).sum() >= zb:
                hi = mid
            else:
                lo = mid
        out[b] = x_of(0.5 * (lo + hi))
    return torch.from_numpy(out)


def feasible_z(lower, upper, sigma, g, B, frac=None):
    lo, hi, s = (torch.as_tensor(t, dtype=torch.float64).expand(B, -1) if isinstance(t, torch.Tensor) and t.dim() == 1
                 else t for t in (lower, upper, sigma))
    zmin = torch.where(s > 0, s * lo, s * hi).sum(1)
    zmax = torch.where(s > 0, s * hi, s * lo).sum(1)
    r = torch.rand(B, generator=g, dtype=torch.float64) if frac is None else torch.full((B,), frac, dtype=torch.float64)
    return zmin + r * (zmax - zmin)


def random_sigma(g, B, n):
    s = torch.rand(B, n, generator=g, dtype=torch.float64) * 2.9 + 0.1
    return s * torch.where(torch.rand(B, n, generator=g) < 0.5, -1.0, 1.0).double()


def _cases():
    """(name, m, lower, upper, sigma, z, d2)."""
    g = torch.Generator().manual_seed(0)
    B, n = 40, 9
    m = torch.randn(B, n, generator=g, dtype=torch.float64) * 3
    lo = -torch.rand(B, n, generator=g, dtype=torch.float64) * 2
    hi = lo + torch.rand(B, n, generator=g, dtype=torch.float64) * 2 + 1e-3
    s = random_sigma(g, B, n)
    d2 = torch.rand(B, n, generator=g, dtype=torch.float64) * 5 + 0.05
    yield "mixed", m, lo, hi, s, feasible_z(lo, hi, s, g, B), d2

    # integer data, sigma = +-1, unit weights: many coordinates share kinks
    B, n = 30, 8
    m = torch.randint(-3, 4, (B, n), generator=g).double()
    lo = torch.randint(-2, 1, (B, n), generator=g).double()
    hi = lo + torch.randint(1, 3, (B, n), generator=g).double()
    s = torch.where(torch.rand(B, n, generator=g) < 0.5, -1.0, 1.0).double()
    z = torch.round(feasible_z(lo, hi, s, g, B))
    yield "duplicates", m, lo, hi, s, z, None

    # the root on a flat segment (x_1 = 0, x_2 = 1 for every multiplier in [-4, 0]) and z at both ends
    m = torch.tensor([[0.0, 5.0], [0.0, 5.0], [0.3, -2.0], [1.0, 1.0]], dtype=torch.float64)
    lo = torch.zeros(4, 2, dtype=torch.float64)
    hi = torch.ones(4, 2, dtype=torch.float64)
    yield "flat", m, lo, hi, torch.ones(4, 2, dtype=torch.float64), torch.tensor([1.0, 2.0, 0.0, 1.0]).double(), None

    B = 12
    m = torch.randn(B, 1, generator=g, dtype=torch.float64)
    lo = -torch.rand(B, 1, generator=g, dtype=torch.float64)
    hi = torch.rand(B, 1, generator=g, dtype=torch.float64)
    lo[:3], hi[3:6] = -INF, INF
    s = random_sigma(g, B, 1)
    z = s[:, 0] * (lo[:, 0].clamp_min(-5) + torch.rand(B, generator=g, dtype=torch.float64)
                   * (hi[:, 0].clamp_max(5) - lo[:, 0].clamp_min(-5)))
    yield "n=1", m, lo, hi, s, z, torch.rand(B, 1, generator=g, dtype=torch.float64) + 0.5

    # infinite bounds: half the coordinates unbounded on one side, some on both
    B, n = 30, 10
    m = torch.randn(B, n, generator=g, dtype=torch.float64) * 2
    lo = -torch.rand(B, n, generator=g, dtype=torch.float64)
    hi = torch.rand(B, n, generator=g, dtype=torch.float64)
    pick = torch.rand(B, n, generator=g)
    lo[pick < 0.25] = -INF
    hi[(pick >= 0.25) & (pick < 0.5)] = INF
    lo[pick > 0.9], hi[pick > 0.9] = -INF, INF
    lo[:4], hi[4:8] = -INF, INF  # rows 0-3: no lower bound at all, rows 4-7: no upper bound
    s = random_sigma(g, B, n)
    z = torch.randn(B, generator=g, dtype=torch.float64) * 3
    zmin = torch.where(s > 0, s * lo, s * hi).sum(1)
    zmax = torch.where(s > 0, s * hi, s * lo).sum(1)
    z = torch.where(torch.isfinite(zmin), zmin.clamp_min(-1e300) + z.abs(), z)
    z = torch.where(torch.isfinite(zmax), torch.minimum(z, zmax), z)
    yield "infinite", m, lo, hi, s, z, torch.rand(B, n, generator=g, dtype=torch.float64) + 0.1

    # shared (n,) bounds and weights, numbers for sigma, some coordinates fixed (l = u), large scale
    B, n = 20, 7
    m = torch.randn(B, n, generator=g, dtype=torch.float64) * 1e3
    lo = torch.linspace(-500, 0, n, dtype=torch.float64)
    hi = lo + torch.tensor([0, 300, 600, 0, 900, 10, 400], dtype=torch.float64)
    z = feasible_z(lo.expand(B, n), hi.expand(B, n), torch.full((B, n), 2.0, dtype=torch.float64), g, B)
    yield "shared", m, lo, hi, 2.0, z, torch.rand(n, generator=g, dtype=torch.float64) + 0.5

    # the SVM dual of Pragam-b: l = 0, u = 1/n, sigma = y, z = 0
    B, n = 20, 15
    m = torch.randn(B, n, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(B, n, generator=g) < 0.4, -1.0, 1.0).double()
    y[:, 0], y[:, 1] = 1.0, -1.0
    yield "svm", m, 0.0, 1.0 / n, y, 0.0, None


CASES = list(_cases())
NAMES = [c[0] for c in CASES]


def _scale(m):
    return max(1.0, float(m.abs().max()))


@pytest.mark.parametrize("name", NAMES)
def test_torch_projection_matches_bisection_and_is_feasible(name):
    _, m, lo, hi, s, z, d2 = CASES[NAMES.index(name)]
    x = project_box_equality(m, lo, hi, s, z, d2, backend="torch")
    tol = 1e-12 * _scale(m)
    torch.testing.assert_close(x, bisection_reference(m, lo, hi, s, z, d2), rtol=0, atol=tol)
    B, n = m.shape
    lo_, hi_, s_ = (torch.as_tensor(t, dtype=torch.float64).expand(B, n) for t in (lo, hi, s))
    assert (x >= lo_).all() and (x <= hi_).all()
    zt = torch.as_tensor(z, dtype=torch.float64).expand(B)
    torch.testing.assert_close((s_ * x).sum(1), zt, rtol=0, atol=tol * max(1.0, float(s_.abs().max())) * n)


@pytest.mark.parametrize("name", NAMES)
def test_median_search_matches_torch_twin(name):
    _, m, lo, hi, s, z, d2 = CASES[NAMES.index(name)]
    x = project_box_equality_torch(m, lo, hi, s, z, d2)
    B, n = m.shape

    def row(t, b):
        return t[b] if isinstance(t, torch.Tensor) and t.dim() == 2 else t

    xm = np.stack([box_equality_median(m[b], row(lo, b), row(hi, b), row(s, b),
                                       float(z[b]) if isinstance(z, torch.Tensor) else z,
                                       None if d2 is None else row(d2, b)) for b in range(B)])
    torch.testing.assert_close(torch.from_numpy(xm), x, rtol=0, atol=1e-12 * _scale(m))


def test_flat_segment_and_end_points():
    _, m, lo, hi, s, z, _ = CASES[NAMES.index("flat")]
    x = project_box_equality(m, lo, hi, s, z)
    expected = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    assert torch.equal(x, expected)


def test_simplex_special_case_equals_project_simplex():
    g = torch.Generator().manual_seed(3)
    v = torch.randn(25, 11, generator=g, dtype=torch.float64) * 2
    v[0] = 0.5  # all equal
    x = project_box_equality(v, 0.0, INF, 1.0, 1.0)
    torch.testing.assert_close(x, project_simplex(v), rtol=0, atol=1e-14)
    assert (x >= 0).all()
    torch.testing.assert_close(box_equality_median(v[3], 0.0, INF, 1.0, 1.0), x[3].numpy(), rtol=0, atol=1e-14)


def test_svm_case_is_exactly_feasible_and_optimal():
    """Box and equality hold to rounding and the output satisfies the KKT conditions with the multiplier
    recovered from the free coordinates."""
    g = torch.Generator().manual_seed(4)
    n = 200
    m = torch.randn(3, n, generator=g, dtype=torch.float64) * 0.02
    y = torch.where(torch.rand(n, generator=g) < 0.3, -1.0, 1.0).double()
    x = project_box_equality(m, 0.0, 1.0 / n, y, 0.0)
    assert (x >= 0).all() and (x <= 1.0 / n).all()
    assert float((x @ y).abs().max()) <= 1e-15
    for b in range(3):
        free = (x[b] > 0) & (x[b] < 1.0 / n)
        lam = float(((x[b] - m[b]) * y)[free].mean())
        r = (x[b] - m[b]) - lam * y  # 0 on free coordinates, the sign of the active bound's multiplier elsewhere
        assert r[free].abs().max() <= 1e-15
        assert (r[x[b] == 0] >= -1e-15).all() and (r[x[b] == 1.0 / n] <= 1e-15).all()


def test_float32_and_empty_batch():
    _, m, lo, hi, s, z, d2 = CASES[0]
    x32 = project_box_equality(m.float(), lo.float(), hi.float(), s.float(), z.float(), d2.float())
    assert x32.dtype == torch.float32
    torch.testing.assert_close(x32.double(), project_box_equality_torch(m, lo, hi, s, z, d2), rtol=0, atol=1e-4)
    e = torch.zeros(0, 4, dtype=torch.float64)
    assert project_box_equality(e, 0.0, 1.0, 1.0, torch.zeros(0, dtype=torch.float64)).shape == (0, 4)


@needs_triton()
@pytest.mark.parametrize("name", NAMES)
def test_triton_matches_torch_twin(name):
    from torchssvm.kernels.projections.box_equality_triton import project_box_equality_triton

    _, m, lo, hi, s, z, d2 = CASES[NAMES.index(name)]
    rows = slice(0, 6)  # the interpreter runs one program at a time: a few rows per case

    def cut(t):  # (n,) and number arguments are shared by every row
        return t[rows] if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == m.shape[0] else t

    m, lo, hi, s, z, d2 = (cut(t) for t in (m, lo, hi, s, z, d2))
    tol = 1e-12 * _scale(m)
    x = project_box_equality_triton(m, lo, hi, s, z, d2)
    torch.testing.assert_close(x, project_box_equality_torch(m, lo, hi, s, z, d2), rtol=0, atol=tol)
    torch.testing.assert_close(project_box_equality(m, lo, hi, s, z, d2, backend="triton"),
                               bisection_reference(m, lo, hi, s, z, d2), rtol=0, atol=tol)


@needs_triton()
def test_triton_simplex_case_and_row_limit():
    from torchssvm.kernels.projections.box_equality_triton import MAX_BLOCK, project_box_equality_triton

    v = torch.randn(4, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.testing.assert_close(project_box_equality_triton(v, 0.0, INF, 1.0, 1.0), project_simplex(v),
                               rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="at most"):
        project_box_equality_triton(torch.zeros(1, MAX_BLOCK + 1, dtype=torch.float64), 0.0, 1.0, 1.0, 0.0)


def test_rejects_infeasible_and_bad_input():
    m = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="z is infeasible"):
        project_box_equality(m, 0.0, 1.0, 1.0, 3.5)
    with pytest.raises(ValueError, match="z is infeasible"):
        project_box_equality(m, 0.0, 1.0, torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64), -1.5)
    with pytest.raises(ValueError, match="z is infeasible"):
        project_box_equality(m, 0.0, INF, 1.0, torch.tensor([1.0, -0.5], dtype=torch.float64))
    project_box_equality(m, 0.0, 1.0, 1.0, 3.0)  # the end point is feasible
    with pytest.raises(ValueError, match="sigma"):
        project_box_equality(m, 0.0, 1.0, torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), 0.5)
    with pytest.raises(ValueError, match="d2"):
        project_box_equality(m, 0.0, 1.0, 1.0, 0.5, d2=torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="lower must be <= upper"):
        project_box_equality(m, 1.0, 0.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="lower must be < inf"):
        project_box_equality(m, INF, INF, 1.0, 0.5)
    with pytest.raises(ValueError, match="m holds NaN"):
        project_box_equality(torch.tensor([[0.0, math.nan]], dtype=torch.float64), 0.0, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="lower holds NaN"):
        project_box_equality(m, torch.tensor([0.0, math.nan, 0.0], dtype=torch.float64), 1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="upper must have shape"):
        project_box_equality(m, 0.0, torch.ones(4, dtype=torch.float64), 1.0, 0.5)
    with pytest.raises(ValueError, match="z must have shape"):
        project_box_equality(m, 0.0, 1.0, 1.0, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="sigma must have m's dtype"):
        project_box_equality(m, 0.0, 1.0, torch.ones(3, dtype=torch.float32), 0.5)
    with pytest.raises(ValueError, match="m must be"):
        project_box_equality(torch.zeros(3), 0.0, 1.0, 1.0, 0.5)
