"""BCFW and its variants: the invariants and identities of note 001 section 7, on enumerable problems."""

import itertools
import math
import os

import numpy as np
import pytest
import torch
from conftest import ScalarRecorder, needs_numba, needs_triton

import torchssvm as ts
from torchssvm.optim import BCFW, FeatureTableProblem
from torchssvm.optim.frank_wolfe.box_qp import box_qp, qp_objective

VARIANTS = list(itertools.product(["uniform", "gap"], ["fw", "pairwise", "away"], [0, 3], [1, 4]))


def random_table(n=12, K=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    F = torch.randn(n, K, d, generator=g, dtype=torch.float64)
    y = torch.randint(K, (n,), generator=g)
    L = torch.rand(n, K, generator=g, dtype=torch.float64)
    L[torch.arange(n), y] = 0
    return F, L, y


def brute_primal(F, L, y, w, lam):
    n = F.shape[0]
    psi = F[torch.arange(n), y].unsqueeze(1) - F
    return float(lam / 2 * (w @ w) + (L - psi @ w).max(1).values.mean())


def check_invariants(s: BCFW, F=None, L=None, y=None):
    """w = sum_i w_i, l = sum_i l_i, explicit duals on the simplex and reproducing the blocks, and the
    exact gap = P(w) - D(alpha) with P by enumeration."""
    p, n = s.problem, s.n
    v = torch.zeros(p.d, dtype=torch.float64)
    p.accumulate(v, torch.arange(n), s.z, torch.full((n,), 1 / (s.lam * n), dtype=torch.float64))
    torch.testing.assert_close(s.v, v, rtol=0, atol=1e-12)
    if getattr(s, "atoms", None) is not None:
        st = s.atoms
        for i in range(n):
            if not bool(st.alpha_valid[i]):
                continue
            c = int(st.count[i])
            a = st.alpha[i, :c]
            assert (a >= 0).all()
            assert abs(float(a.sum()) - 1) < 1e-12
            idx = torch.full((c,), i)
            torch.testing.assert_close((a.unsqueeze(1) * p.corner(idx, st.labels[i, :c])).sum(0), s.z[i],
                                       rtol=0, atol=1e-12)
            assert abs(float((a * st.loss[i, :c]).sum()) / n - float(s.ell[i])) < 1e-12
    g = s.duality_gap()
    assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9
    assert g["gap"] >= -1e-12
    if F is not None:
        assert abs(brute_primal(F, L, y, s.w, s.lam) - g["primal"]) < 1e-9
    return g


@pytest.mark.parametrize("sampling,step,cache,B", VARIANTS)
def test_every_variant_keeps_invariants_and_never_increases_the_dual(sampling, step, cache, B):
    F, L, y = random_table(seed=len(sampling) + len(step) + cache + B)
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.1, sampling=sampling, step=step, cache_size=cache,
             batch_size=B, gap_check_every=2, seed=3)
    f_prev = -s.dual_value()
    first = check_invariants(s, F, L, y)["gap"]
    for _ in range(6):
        done = 0
        while done < s.n:  # single updates, so the dual is checked after every block step
            s._update(s._sample(B))
            f = -s.dual_value()
            assert f <= f_prev + 1e-13
            f_prev = f
            done += B
        check_invariants(s, F, L, y)
    assert s.duality_gap()["gap"] < first


def test_reported_exact_gap_is_the_certificate():
    F, L, y = random_table(seed=1)
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.05, sampling="gap", step="pairwise", cache_size=3,
             gap_check_every=2)
    reports = [s.step() for _ in range(4)]
    assert [r["gap_exact"] for r in reports] == [False, True, False, True]
    g = s.duality_gap()
    assert abs(reports[-1]["gap"] - g["gap"]) < 1e-12
    assert abs(reports[-1]["primal"] - brute_primal(F, L, y, s.w, s.lam)) < 1e-12
    assert reports[-1]["passes"] == pytest.approx(reports[-1]["oracle_calls"] / s.n)
    # refresh passes are counted: 4 passes of n visits, 2 exact passes, minus the cache hits
    assert reports[-1]["oracle_calls"] == 6 * s.n - reports[-1]["cache_hits"]


def _line_search_brute(s, idx, direction, d_ell, upper):
    """Minimize the dual f(gamma) = lam/2 ||w + gamma Phi d / (lam n)||^2 - (l + gamma d_l) on a grid
    refined around the best point."""
    p, n, lam = s.problem, s.n, s.lam
    dv = torch.zeros(p.d, dtype=torch.float64)
    p.accumulate(dv, idx, direction, torch.full((1,), 1 / (lam * n), dtype=torch.float64))

    def f(g):
        w = s.w + g * dv
        return 0.5 * lam * float(w @ w) - (float(s.ell.sum()) + g * float(d_ell))

    lo, hi = 0.0, float(upper)
    for _ in range(60):  # ternary search: f is a convex quadratic in gamma
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if f(a) <= f(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


@pytest.mark.parametrize("step", ["fw", "pairwise", "away"])
def test_closed_form_steps_equal_brute_force_line_search(step, monkeypatch):
    F, L, y = random_table(seed=4)
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.2, step=step, seed=0)
    for _ in range(2):
        s.step()
    captured = []
    original = box_qp

    def spy(c, H, upper, **kw):
        gamma = original(c, H, upper, **kw)
        captured.append((c.clone(), H.clone(), upper.clone(), gamma.clone()))
        return gamma

    monkeypatch.setattr("torchssvm.optim.frank_wolfe.bcfw.box_qp", spy)
    checked = 0
    for _ in range(30):
        idx = s._sample(1)
        state = {k: v.clone() for k, v in (("z", s.z), ("ell", s.ell), ("v", s.v))}
        s._update(idx)
        c, H, upper, gamma = captured[-1]
        if float(gamma) < 1e-6:  # the direction is recovered as (z_new - z_old) / gamma below
            continue
        # recover the direction from the block change: z_new - z_old = gamma d
        direction = (s.z[idx] - state["z"][idx]) / float(gamma)
        d_ell = (s.ell[idx] - state["ell"][idx]) / float(gamma)
        s.z, s.ell, s.v = state["z"], state["ell"], state["v"]
        s._sync_w()
        best = _line_search_brute(s, idx, direction, d_ell, upper[0])
        assert abs(best - float(gamma)) < 1e-6 * max(1.0, float(upper[0]))
        checked += 1
        s._update(idx)  # (re-applies the same step: same w, same oracle answer)
    assert checked >= 5


@pytest.fixture(params=["numba", "no numba"])
def qp_host(request, monkeypatch):
    """`box_qp`'s CPU path: the compiled host loop (numba) or, as without numba, numpy up to ``_NUMPY_MAX_B``
    blocks and torch above."""
    from torchssvm.optim.frank_wolfe import box_qp_numba

    if request.param == "numba":
        if not box_qp_numba.available():  # CI has it (the dev extra)
            pytest.fail("numba is not installed") if os.environ.get("CI") else pytest.skip("needs numba")
    else:
        monkeypatch.setattr(box_qp_numba, "available", lambda: False)
    return request.param


@pytest.mark.parametrize("method", ["newton", "sweeps"])
def test_box_qp_matches_projected_brute_force(method, qp_host):
    g = torch.Generator().manual_seed(0)
    for B in (1, 2, 5):
        M = torch.randn(B, B + 1, generator=g, dtype=torch.float64)
        H = M @ M.T
        c = torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        gamma = box_qp(c, H, u, method=method, max_iter=500, tol=0)
        assert ((gamma >= 0) & (gamma <= u)).all()
        obj = lambda x, c=c, H=H: float(-c @ x + 0.5 * x @ H @ x)  # noqa: E731
        for _ in range(200):  # no feasible random point is better
            x = torch.rand(B, generator=g, dtype=torch.float64) * u
            assert obj(gamma) <= obj(x) + 1e-9
    # zero curvature: go to the bound when the gain is positive
    one = torch.ones(1, dtype=torch.float64)
    assert float(box_qp(one, torch.zeros(1, 1, dtype=torch.float64), 0.3 * one, method=method)) == 0.3


def _kkt_violation(c, H, u, gamma):
    """max |gamma - clip(gamma - grad)|: zero exactly at the box QP's optimum."""
    grad = H @ gamma - c
    return float((gamma - torch.minimum(torch.maximum(gamma - grad, torch.zeros_like(u)), u)).abs().max())


def test_box_qp_newton_reaches_the_optimum_of_full_rank_problems(qp_host):
    g = torch.Generator().manual_seed(1)
    for trial in range(60):
        B = int(torch.randint(2, 48, (1,), generator=g))
        M = torch.randn(B, B + 8, generator=g, dtype=torch.float64)
        if trial % 2:  # strongly correlated directions, as the blocks of one mini-batch are
            M = M + 4 * torch.randn(1, B + 8, generator=g, dtype=torch.float64)
        H = M @ M.T
        c = torch.randn(B, generator=g, dtype=torch.float64) * 3
        u = torch.rand(B, generator=g, dtype=torch.float64)
        gamma = box_qp(c, H, u)
        ref = box_qp(c, H, u, method="sweeps", max_iter=20000, tol=1e-15)
        f, f_ref = float(qp_objective(c, H, gamma)), float(qp_objective(c, H, ref))
        assert f <= f_ref + 1e-10 * (1 + abs(f_ref))
        assert _kkt_violation(c, H, u, gamma) <= 1e-9 * (1 + float(c.abs().max()))


def test_box_qp_newton_is_monotone_and_feasible_on_singular_problems(qp_host):
    g = torch.Generator().manual_seed(2)
    for _ in range(40):
        B = int(torch.randint(2, 30, (1,), generator=g))
        M = torch.randn(B, max(1, B // 3), generator=g, dtype=torch.float64)
        H = M @ M.T
        H[0], H[:, 0] = 0.0, 0.0  # a zero direction (a block already at its FW corner)
        c = torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        u[-1] = 0.0  # pairwise step whose FW atom is its away atom
        gamma = box_qp(c, H, u, max_iter=400)
        assert ((gamma >= 0) & (gamma <= u)).all() and float(gamma[-1]) == 0.0
        assert float(gamma[0]) == (float(u[0]) if float(c[0]) > 0 else 0.0)
        f = float(qp_objective(c, H, gamma))
        one_sweep = float(qp_objective(c, H, box_qp(c, H, u, method="sweeps", max_iter=1)))
        assert f <= min(0.0, one_sweep) + 1e-12
        assert _kkt_violation(c, H, u, gamma) <= 1e-8 * (1 + float(c.abs().max()))


def test_box_qp_newton_is_free_of_the_problem_scale(qp_host):
    """The step sizes of ``(s c, s H)`` are those of ``(c, H)`` at any scale ``s`` (the stop test is relative to
    max|c|: an absolute one stopped at gamma = 0 for tiny problems, and one in gamma units for huge gains), also
    where a zero-curvature direction sends the Newton step past float64's range."""
    from torchssvm.optim.frank_wolfe.box_qp import _projected_newton

    g = torch.Generator().manual_seed(7)
    for B in (3, 40, 80):  # 80: above the numpy cutoff, the torch iteration without numba
        M = torch.randn(B, B // 2, generator=g, dtype=torch.float64)
        H, c = M @ M.T, torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        ref = box_qp(c, H, u)
        assert float(ref.abs().max()) > 0
        for scale in (1e-13, 1e-6, 1e6, 1e13):
            for gamma in (box_qp(c * scale, H * scale, u), _projected_newton(c * scale, H * scale, u, 50, 1e-12)):
                torch.testing.assert_close(gamma, ref, rtol=0, atol=1e-7)
    c = torch.tensor([1e12, -1.0, 2.0, 0.0], dtype=torch.float64)  # zero curvature, one huge gain
    want = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(box_qp(c, torch.zeros(4, 4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)),
                               want, rtol=0, atol=1e-9)


def test_box_qp_newton_stops_where_its_ridge_stops_resolving_the_gradient():
    """A mini-batch QP recorded late in a BCFW run (OCR-small, lam 1e-4, B = 16; tests/fixtures): H singular, the
    gaps 1e-3 of H's scale. Tested against tol max|c| alone, the compiled loop went on to max_iter gaining less than
    1e-13 of f per iteration; with the ridge's floor it stops within a few iterations, at the optimum."""
    import json
    from pathlib import Path

    nb = _needs_box_qp_numba()
    qp = json.loads((Path(__file__).parent / "fixtures" / "box_qp_late_bcfw.json").read_text())
    c, H, u = (np.asarray(qp[k], dtype=np.float64) for k in ("c", "H", "upper"))
    gamma = nb.projected_newton(c, H, u, 50, 1e-12)
    assert np.array_equal(nb.projected_newton(c, H, u, 5, 1e-12), gamma)  # stopped by the test, not max_iter
    ref = box_qp(*(torch.from_numpy(t) for t in (c, H, u)), method="sweeps", max_iter=100000, tol=1e-16).numpy()
    f = lambda x: -(x @ c) + 0.5 * x @ H @ x  # noqa: E731
    assert f(gamma) <= f(ref) + 1e-10 * abs(f(ref))


def test_box_qp_newton_torch_and_numpy_paths_agree():
    """CPU inputs take the numpy iteration, device tensors the torch one: the same steps."""
    from torchssvm.optim.frank_wolfe.box_qp import _projected_newton, _projected_newton_numpy

    g = torch.Generator().manual_seed(3)
    for trial in range(30):
        B = int(torch.randint(2, 70, (1,), generator=g))
        M = torch.randn(B, B // 2 + 1 + 8 * (trial % 2), generator=g, dtype=torch.float64)
        M = M + 3 * torch.randn(1, M.shape[1], generator=g, dtype=torch.float64)
        H, c = M @ M.T, torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        a = _projected_newton(c, H, u, 50, 1e-12)
        b = torch.from_numpy(_projected_newton_numpy(c.numpy(), H.numpy(), u.numpy(), 50, 1e-12))
        fa, fb = float(qp_objective(c, H, a)), float(qp_objective(c, H, b))
        assert abs(fa - fb) <= 1e-10 * (1 + abs(fa))
        assert _kkt_violation(c, H, u, a) <= 1e-8 * (1 + float(c.abs().max()))


def _needs_box_qp_numba():
    from torchssvm.optim.frank_wolfe import box_qp_numba

    if not box_qp_numba.available():
        pytest.fail("numba is not installed") if os.environ.get("CI") else pytest.skip("needs numba")
    return box_qp_numba


def test_box_qp_numba_and_torch_iterations_reach_the_same_optimum():
    """The compiled host loop (exact arc minima) and the torch iteration (a grid of trial lengths) take other
    steps to the same optimum: the same objective to rounding, a KKT point, on full-rank, correlated and singular
    problems, with zero directions and zero upper bounds."""
    from torchssvm.optim.frank_wolfe.box_qp import _projected_newton

    nb = _needs_box_qp_numba()
    g = torch.Generator().manual_seed(5)
    for trial in range(40):
        B = int(torch.randint(2, 150, (1,), generator=g))
        M = torch.randn(B, B // (1 + 3 * (trial % 3 == 2)) + 1, generator=g, dtype=torch.float64)
        M = M + (trial % 2) * 3 * torch.randn(1, M.shape[1], generator=g, dtype=torch.float64)
        H, c = M @ M.T, torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        if trial % 4 == 3:
            H[0], H[:, 0], u[-1] = 0.0, 0.0, 0.0
        a = _projected_newton(c, H, u, 50, 1e-12)
        b = torch.from_numpy(nb.projected_newton(c.numpy(), H.numpy(), u.numpy(), 50, 1e-12))
        assert ((b >= 0) & (b <= u)).all()
        fa, fb = float(qp_objective(c, H, a)), float(qp_objective(c, H, b))
        assert fb <= fa + 1e-10 * (1 + abs(fa))
        assert _kkt_violation(c, H, u, b) <= 1e-9 * (1 + float(c.abs().max()))


def test_box_qp_numba_arc_minimum_is_the_minimum_along_the_projection_arc():
    """`_arc_minimum`'s walk over the breakpoints against ``f(P(gamma + t d))`` evaluated on a dense grid of ``t``
    (every breakpoint, 300 points in each piece and past the last)."""
    import numpy as np

    nb = _needs_box_qp_numba()
    rng = np.random.default_rng(0)
    f = lambda c, H, x: -c @ x + 0.5 * x @ H @ x  # noqa: E731
    for _ in range(60):
        B = int(rng.integers(1, 12))
        M = rng.standard_normal((B, int(rng.integers(1, B + 3))))
        H, c, u = M @ M.T, 2 * rng.standard_normal(B), rng.random(B)
        gamma = np.clip(rng.random(B) * 1.4 - 0.2, 0.0, 1.0) * u  # some coordinates at a bound
        d = rng.standard_normal(B) * (rng.random(B) < 0.8)
        grad = H @ gamma - c
        t = nb._arc_minimum(H, grad, gamma, u, d, np.empty(B), np.empty(B), np.empty(B), np.empty(B, np.int64))
        assert t >= 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            tau = np.where(d > 0, (u - gamma) / d, np.where(d < 0, -gamma / d, np.nan))
        knots = np.unique(np.concatenate([[0.0], tau[np.isfinite(tau) & (tau >= 0)]]))
        grid = np.concatenate([np.linspace(a, b, 300) for a, b in zip(knots, np.append(knots[1:], knots[-1] + 10))])
        arc = np.clip(gamma + np.append(grid, t)[:, None] * d, 0.0, u)  # the grid's points, then t's
        values = [f(c, H, x) for x in arc]
        assert values[-1] <= min(values[:-1]) + 1e-12 * (1 + abs(min(values[:-1])))
        assert values[-1] <= f(c, H, gamma) + 1e-15


def test_box_qp_newton_solves_both_sides_of_the_numpy_cutoff(qp_host):
    """Without numba, CPU problems up to `_NUMPY_MAX_B` take the numpy iteration, larger ones the torch one; with
    it, all take the compiled loop: each reaches a KKT point of the box QP (the optimum: the objective is
    convex)."""
    from torchssvm.optim.frank_wolfe.box_qp import _NUMPY_MAX_B

    g = torch.Generator().manual_seed(4)
    for B in (_NUMPY_MAX_B - 1, _NUMPY_MAX_B, _NUMPY_MAX_B + 1, 2 * _NUMPY_MAX_B):
        M = torch.randn(B, B + 8, generator=g, dtype=torch.float64)
        M = M + 3 * torch.randn(1, B + 8, generator=g, dtype=torch.float64)
        H, c = M @ M.T, 3 * torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        gamma = box_qp(c, H, u)
        assert ((gamma >= 0) & (gamma <= u)).all()
        assert _kkt_violation(c, H, u, gamma) <= 1e-9 * (1 + float(c.abs().max()))


def test_box_qp_rejects_an_unknown_method():
    one = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="method"):
        box_qp(one, torch.eye(2, dtype=torch.float64), one, method="cg")


def test_minibatch_step_is_at_least_as_good_as_one_block():
    F, L, y = random_table(n=30, seed=5)
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.05, batch_size=8, seed=0)
    f0 = -s.dual_value()
    s._update(torch.arange(8))
    f_joint = -s.dual_value()
    assert f_joint < f0
    # B independent line searches can increase the dual; the coordinated step cannot
    t = BCFW(FeatureTableProblem(F, L, y), lam=0.05, batch_size=1, seed=0)
    t._update(torch.arange(1))
    assert f_joint <= -t.dual_value() + 1e-15


# -- the toy example of App. C (note 001 section 4) -----------------------------------------------
def toy_problem(n, K):
    """1 hard object (phi(x_1, k) = -e_k / sqrt 2) and n - 1 easy ones (phi(x_i, k) = -e_{K+1}), 0-1 loss,
    truth 0 with phi = 0; used with lam = 1/n."""
    F = torch.zeros(n, K + 1, K + 1, dtype=torch.float64)
    for k in range(1, K + 1):
        F[0, k, k - 1] = -1 / math.sqrt(2)
        F[1:, k, K] = -1.0
    L = torch.ones(n, K + 1, dtype=torch.float64)
    L[:, 0] = 0
    return FeatureTableProblem(F, L, torch.zeros(n, dtype=torch.long))


def _oracle_calls_to(n, K, eps, sampling, max_passes=2000):
    s = BCFW(toy_problem(n, K), lam=1.0 / n, sampling=sampling, seed=0, gap_check_every=10)
    while s.oracle_calls / n < max_passes:
        s.step()
        if s.duality_gap()["gap"] <= eps:
            return s.oracle_calls
    return math.inf


def test_toy_first_easy_visit_zeroes_every_easy_gap():
    n, K = 6, 4
    s = BCFW(toy_problem(n, K), lam=1.0 / n)
    s._update(torch.tensor([3]))
    gaps = s.duality_gap()["block_gaps"]
    assert float(s.block_gaps[3]) == pytest.approx(1.0 / n)  # g_i = 1/n at the first easy visit, gamma = 1
    assert torch.equal(gaps[1:], torch.zeros(n - 1, dtype=torch.float64))
    assert float(s.w[K]) == pytest.approx(1.0)


def test_toy_gap_sampling_speedup_grows_like_min_n_K():
    r_small = _oracle_calls_to(10, 200, 1e-4, "uniform") / _oracle_calls_to(10, 200, 1e-4, "gap")
    r_large = _oracle_calls_to(40, 200, 1e-4, "uniform") / _oracle_calls_to(40, 200, 1e-4, "gap")
    r_capped = _oracle_calls_to(40, 10, 1e-4, "uniform") / _oracle_calls_to(40, 10, 1e-4, "gap")
    assert r_small > 4  # min(n, K, 1/(n eps)) = 10
    assert r_large > 2 * r_small  # min(...) = 40
    assert r_capped < r_large / 2  # K = 10 caps it


def test_toy_converges_to_the_known_optimum():
    n, K = 5, 3
    s = BCFW(toy_problem(n, K), lam=1.0 / n, sampling="gap", step="pairwise", seed=0)
    s.fit(gap_tol=1e-10, max_passes=5000)
    hard = s.w[:K]
    assert float(s.w[K]) == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(hard, torch.full((K,), float(hard.mean()), dtype=torch.float64), atol=1e-6, rtol=0)


def test_gap_sampling_without_refresh_stalls_and_refresh_converges():
    F, L, y = random_table(n=60, K=8, d=6, seed=0)
    gaps = {}
    for every in (10, 0):
        s = BCFW(FeatureTableProblem(F, L, y), lam=0.01, sampling="gap", gap_check_every=every, seed=0)
        for _ in range(150):
            r = s.step()
        gaps[every] = (s.duality_gap()["gap"], r["gap"])
    true_inf, estimate_inf = gaps[0]
    assert gaps[10][0] < true_inf / 3  # refresh every 10 passes converges further
    assert estimate_inf < true_inf / 5  # Gap Inf: the stale estimates underestimate the gap badly


def test_box_constraints_stay_feasible_and_keep_the_gap_identity():
    F, L, y = random_table(n=15, K=5, d=4, seed=6)
    lower = torch.tensor([0.0, -0.1, -math.inf, -math.inf], dtype=torch.float64)
    upper = torch.tensor([math.inf, 0.1, 0.05, math.inf], dtype=torch.float64)
    for step in ("fw", "pairwise"):
        s = BCFW(FeatureTableProblem(F, L, y), lam=0.05, step=step, box=(lower, upper), seed=1)
        for _ in range(6):
            s.step()
            assert ((s.w >= lower) & (s.w <= upper)).all()
            g = check_invariants(s, F, L, y)
        assert (s.v != s.w).any()  # the box is active
        # weak duality across the two problems: the unconstrained optimum (>= its dual value) is no
        # worse than any box-feasible point
        u = BCFW(FeatureTableProblem(F, L, y), lam=0.05, step=step, seed=1)
        u.fit(max_passes=10)
        assert u.dual_value() <= g["primal"] + 1e-12


def test_chain_box_positivity_on_transition():
    ds = ts.data.synthetic_chain("train", 20, num_labels=3, num_features=4, seed=0)
    model = ts.LinearChainModel(4, 3, dtype=torch.float64)
    s = BCFW(model, ds, lam=0.1, step="pairwise", box={"transition": (0.0, None)})
    for _ in range(3):
        s.step()
        assert (model.transition >= 0).all()
    g = s.duality_gap()
    assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9
    with pytest.raises(ValueError, match="transition"):
        BCFW(model, ds, lam=0.1, box={"transitions": (0.0, None)})


@pytest.mark.parametrize("cfg", [dict(), dict(sampling="gap", step="pairwise", cache_size=3),
                                 dict(step="away", batch_size=3, sampling="gap")])
def test_state_dict_resumes_bitwise(cfg):
    F, L, y = random_table(n=10, seed=7)
    a = BCFW(FeatureTableProblem(F, L, y), lam=0.1, gap_check_every=2, seed=5, **cfg)
    for _ in range(5):
        a.step()
    b = BCFW(FeatureTableProblem(F, L, y), lam=0.1, gap_check_every=2, seed=5, **cfg)
    for _ in range(2):
        b.step()
    state = b.state_dict()
    c = BCFW(FeatureTableProblem(F, L, y), lam=0.1, gap_check_every=2, seed=123, **cfg)
    c.load_state_dict(state)
    for _ in range(3):
        c.step()
    assert torch.equal(a.v, c.v) and torch.equal(a.z, c.z) and torch.equal(a.ell, c.ell)
    assert a.oracle_calls == c.oracle_calls


def test_chain_state_dict_round_trip_through_torch_save(tmp_path):
    ds = ts.data.synthetic_chain("train", 15, num_labels=3, num_features=4, seed=1)
    runs = []
    for interrupt in (False, True):
        model = ts.LinearChainModel(4, 3, dtype=torch.float64)
        s = BCFW(model, ds, lam=0.05, sampling="gap", step="pairwise", cache_size=4, gap_check_every=2, seed=0)
        for k in range(4):
            if interrupt and k == 2:
                torch.save(s.state_dict(), tmp_path / "bcfw.pt")
                model = ts.LinearChainModel(4, 3, dtype=torch.float64)
                s = BCFW(model, ds, lam=0.05, sampling="gap", step="pairwise", cache_size=4, gap_check_every=2)
                s.load_state_dict(torch.load(tmp_path / "bcfw.pt", weights_only=False))
            s.step()
        runs.append(torch.nn.utils.parameters_to_vector(model.parameters()).clone())
    assert torch.equal(runs[0], runs[1])


def test_writer_gets_scalars_and_block_gap_histogram():
    F, L, y = random_table(seed=8)
    w = ScalarRecorder()
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.1, writer=w, cache_size=3, gap_check_every=1)
    s.step()
    for key in ("primal", "dual", "gap", "exact_gap", "oracle_calls", "cache_hit_rate", "time"):
        assert f"bcfw/{key}" in w.scalars
    assert w.hists == [("bcfw/block_gaps", 1, s.n)]
    s.gap_check_every = 3
    s.step()  # pass 2: no exact pass: the block gaps last seen are estimates
    assert w.hists[-1] == ("bcfw/block_gaps_estimate", 2, s.n)


def test_fit_stops_on_a_certified_gap():
    F, L, y = random_table(seed=9)
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.2, sampling="gap", step="pairwise")
    hist = s.fit(gap_tol=1e-4, max_passes=2000)
    assert hist[-1]["gap_exact"] and hist[-1]["gap"] <= 1e-4
    assert s.duality_gap()["gap"] == pytest.approx(hist[-1]["gap"], abs=1e-12)


@pytest.mark.parametrize("kwargs,match", [
    (dict(sampling="random"), "sampling"), (dict(step="fast"), "step"), (dict(cache_size=-1), "cache_size"),
    (dict(cache_size=1), "cache_size"), (dict(batch_size=0), "batch_size"), (dict(batch_size=99), "batch_size"),
    (dict(lam=0.0), "lam"), (dict(lam=float("nan")), "lam"), (dict(cache_factor=-1.0), "cache_factor"),
    (dict(gap_check_every=1.5), "gap_check_every"), (dict(box=(1.0, 0.0)), "box"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    F, L, y = random_table()
    kwargs = {"lam": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        BCFW(FeatureTableProblem(F, L, y), **kwargs)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton())])
@pytest.mark.parametrize("cap,keep_active", [(0, True), (0, False), (3, True), (3, False), (6, False)])
def test_batched_atom_insertion_equals_block_by_block(cap, keep_active, backend):
    """`AtomStore.insert_batch` (mini-batches, on the device; torch ops or the Triton kernel) makes the same
    slots and store as `insert`: hits, appends, replacement of the lowest inactive atom, eviction of active
    atoms, growth."""
    from torchssvm.optim.frank_wolfe.atoms import AtomStore

    g = torch.Generator().manual_seed(cap + 10 * keep_active)
    n, W, K = 9, 3, 3
    truth = torch.randint(K, (n, W), generator=g)
    a, b = AtomStore(truth, 2), AtomStore(truth, 2, backend)
    grew = 0
    for _ in range(25):
        idx = torch.randperm(n, generator=g)[:5]
        labels = torch.randint(K, (5, W), generator=g)
        loss = torch.rand(5, generator=g, dtype=torch.float64)
        C = int(a.count[idx].max())
        scores = torch.randn(5, C, generator=g, dtype=torch.float64)
        slots = [a.insert(int(i), labels[r], float(loss[r]), scores[r], cap=cap, keep_active=keep_active)
                 for r, i in enumerate(idx.tolist())]
        before = b.labels.shape[1]
        assert b.insert_batch(idx, labels, loss, scores, cap=cap, keep_active=keep_active).tolist() == slots
        grew += b.labels.shape[1] > before
        for r, i in enumerate(idx.tolist()):  # random activity: some atoms gain mass, some lose it
            mass = float(torch.rand(1, generator=g)) if r % 2 else 0.0
            for st in (a, b):
                st.alpha[i, slots[r]] = mass
        for name in ("labels", "loss", "alpha", "count", "alpha_valid"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert grew or (cap == 0 and not keep_active)  # the store grew (FW steps without a cap only evict)


@needs_triton()
@pytest.mark.parametrize("cached,away", [(True, True), (True, False), (False, True)])
def test_atom_selection_kernel_equals_its_torch_twin(cached, away):
    """`select_atoms` (the cache test and the away atoms of a device step): the Triton kernel and the torch twin
    agree bitwise, ties included (small-integer scores), and update the gaps and the miss counter alike."""
    from torchssvm.kernels import select_atoms

    g = torch.Generator().manual_seed(3 + cached + 2 * away)
    n, B, C, W = 20, 12, 5, 4
    idx = torch.randperm(n, generator=g)[:B]
    count = torch.randint(1, C + 1, (n,), generator=g)
    a_H = torch.randint(-2, 3, (B, C), generator=g).double() / 8
    a_labels = torch.randint(0, 3, (B, C, W), generator=g)
    a_loss = torch.rand(B, C, generator=g, dtype=torch.float64)
    a_alpha = torch.rand(B, C, generator=g, dtype=torch.float64) * (torch.rand(B, C, generator=g) < 0.6)
    base, ell = torch.randn(B, generator=g, dtype=torch.float64), torch.randn(B, generator=g, dtype=torch.float64)
    gaps = torch.rand(n, generator=g, dtype=torch.float64) / 4
    labels = torch.randint(0, 3, (B, W), generator=g)
    loss, H = torch.rand(B, generator=g, dtype=torch.float64), torch.randn(B, generator=g, dtype=torch.float64)
    out, state = {}, {}
    for backend in ("torch", "triton"):
        gp, misses = gaps.clone(), torch.zeros((), dtype=torch.long)
        out[backend] = select_atoms(a_H, count, a_labels, a_loss, a_alpha, idx, base, ell, gp, labels, loss,
                                    H, n, 0.25 if cached else None, 0.01, misses if cached else None, away,
                                    backend=backend)
        state[backend] = gp, misses
    (a, b), (ga, gb) = (out["torch"], out["triton"]), (state["torch"], state["triton"])
    for x, y in zip(a[:3], b[:3]):
        assert torch.equal(x, y)
    assert torch.equal(ga[0], gb[0]) and int(ga[1]) == int(gb[1])
    assert (a[3] is None) == (b[3] is None) == (not away)
    if away:
        for x, y in zip(a[3], b[3]):
            assert torch.equal(x, y)
    if cached:  # both kinds of blocks occur
        assert 0 < int(ga[1]) < B and not torch.equal(ga[0], gaps)
        # factor = floor = 0: a block never visited (gap inf, 0 * inf = NaN) misses in both twins
        gaps[idx[::2]] = torch.inf
        hits = {}
        for backend in ("torch", "triton"):
            gp, misses = gaps.clone(), torch.zeros((), dtype=torch.long)
            select_atoms(a_H, count, a_labels, a_loss, a_alpha, idx, base, ell, gp, labels, loss, H, n, 0.0, 0.0,
                         misses, away, backend=backend)
            hits[backend] = gp[idx] == gaps[idx]  # a hit keeps the block's gap
        assert torch.equal(hits["torch"], hits["triton"]) and not hits["torch"][::2].any()


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton()),
                                     pytest.param("numba", marks=needs_numba()),
                                     pytest.param("numba-threads", marks=needs_numba())])
@pytest.mark.parametrize("step", ["fw", "pairwise", "away"])
def test_batched_block_step_equals_block_by_block(step, backend, monkeypatch):
    """`apply_block_step` (the end of a mini-batch step: z, l and the atoms' weights; on CUDA one Triton kernel, on
    the CPU one numba loop, its blocks on threads for a large batch) against the sequential solver's host loop,
    block by block, bitwise: FW steps past 1, drop steps at the bound, zero steps, the FW atom equal to the away
    atom, and a block whose weights are no longer valid."""
    from torchssvm.kernels import apply_block_step

    if backend == "numba-threads":  # this small batch on threads
        from torchssvm.kernels.step import block_step_numba

        monkeypatch.setattr(block_step_numba, "_PARALLEL_MIN_WORK", 0)
        backend = "numba"

    F, L, y = random_table(n=16, seed=4)
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.1, step=step, cache_size=4, batch_size=1, seed=0)
    s.fit(max_passes=3)
    st = s.atoms
    g = torch.Generator().manual_seed(1)
    idx = torch.arange(0, 16, 2)
    B = idx.shape[0]
    count = st.count[idx]
    s_slot = (torch.rand(B, generator=g) * count).long()
    away = (torch.rand(B, generator=g) * count).long()
    away[5] = s_slot[5]
    bad = 6  # a block whose weights are no longer valid: a step with two distinct atoms must leave them alone
    assert count[bad] >= 2
    s_slot[bad], away[bad] = 0, 1
    st.alpha_valid[idx[bad]] = False
    upper = torch.rand(B, generator=g, dtype=torch.float64)
    gamma = upper * torch.tensor([0.0, 0.3, 1.0, 0.7, 1.0, 0.2, 0.5, 1.0], dtype=torch.float64)
    gamma[2] = 1.5 if step == "fw" else gamma[2]  # FW: gamma >= 1 puts all mass on the FW atom
    # an away step's blocks each take a FW (0) or an away (2) step; pairwise steps pass no kinds
    kind = (torch.arange(B) % 2) * 2 if step == "away" else None
    aw = None if step == "fw" else away
    direction = torch.randn(B, s.z.shape[1], generator=g, dtype=torch.float64)
    d_ell = torch.randn(B, generator=g, dtype=torch.float64)
    before, z0, ell0 = st.alpha.clone(), s.z.clone(), s.ell.clone()
    apply_block_step(s.z, s.ell, idx, z0[idx], ell0[idx], gamma, direction, d_ell, st.alpha, st.alpha_valid, step,
                     s_slot, aw, upper, kind, backend=backend)
    batched = st.alpha.clone()
    st.alpha.copy_(before)
    for b in range(B):
        s._update_alpha(idx[b : b + 1], gamma[b : b + 1], upper[b : b + 1], s_slot[b : b + 1],
                        None if aw is None else aw[b : b + 1], None if kind is None else kind[b : b + 1])
    assert torch.equal(batched, st.alpha)
    assert not torch.equal(batched, before) and torch.equal(batched[idx[bad]], before[idx[bad]])
    rest = torch.ones(16, dtype=torch.bool)
    rest[idx] = False
    assert torch.equal(s.z[idx], z0[idx] + gamma.unsqueeze(1) * direction) and torch.equal(s.z[rest], z0[rest])
    assert torch.equal(s.ell[idx], ell0[idx] + gamma * d_ell) and torch.equal(s.ell[rest], ell0[rest])
    z1, ell1 = s.z.clone(), s.ell.clone()  # without explicit duals (FW steps without atoms): z and l only
    apply_block_step(s.z, s.ell, idx, z0[idx], ell0[idx], gamma, direction, d_ell, backend=backend)
    assert torch.equal(s.z, z1) and torch.equal(s.ell, ell1)


def test_block_step_rejects_an_unknown_step_type_and_missing_duals():
    from torchssvm.kernels import apply_block_step

    z = torch.zeros(3, 2, dtype=torch.float64)
    args = (z, z[:, 0].clone(), torch.arange(2), z[:2], z[:2, 0], z[:2, 0], z[:2], z[:2, 0])
    with pytest.raises(ValueError, match="step must be one of"):
        apply_block_step(*args, step="frank-wolfe")
    alpha, valid, slot = torch.zeros(3, 4, dtype=torch.float64), torch.ones(3, dtype=torch.bool), torch.zeros(2).long()
    with pytest.raises(ValueError, match="away, upper must be given"):
        apply_block_step(*args, alpha, valid, "pairwise", slot)
    with pytest.raises(ValueError, match="kind must be given"):
        apply_block_step(*args, alpha, valid, "away", slot, slot, z[:2, 0])


def test_bcfw_leaves_numba_to_the_oracles():
    """``backend="numba"`` is for tree problems' distance transforms; the step's own kernels run as "auto"."""
    F, L, y = random_table(n=8, seed=2)
    s = BCFW(FeatureTableProblem(F, L, y), lam=0.1, step="pairwise", cache_size=3, batch_size=4, seed=0,
             backend="numba")
    assert s.backend == "auto" and s.atoms.backend == "auto"
    assert s.step()["dual"] > 0


@needs_numba()
def test_numba_block_step_checks_blocks_and_slots_before_writing():
    from torchssvm.kernels import apply_block_step
    from torchssvm.kernels.step.block_step_numba import apply_block_step_numba

    g = torch.Generator().manual_seed(0)
    z, ell = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    alpha, valid = torch.rand(5, 4, generator=g, dtype=torch.float64), torch.ones(5, dtype=torch.bool)
    idx, gamma = torch.tensor([1, 4]), torch.tensor([0.5, 0.25], dtype=torch.float64)
    d = torch.randn(2, 3, generator=g, dtype=torch.float64)
    args = (z, ell, idx, z[idx], ell[idx], gamma, d, d[:, 0])
    before = (z.clone(), ell.clone(), alpha.clone())
    with pytest.raises(ValueError, match="idx must lie in"):
        apply_block_step_numba(z, ell, torch.tensor([1, 5]), *args[3:])
    with pytest.raises(ValueError, match="atom slots"):
        apply_block_step_numba(*args, alpha, valid, "pairwise", torch.tensor([0, 1]), torch.tensor([2, 4]),
                               torch.ones(2, dtype=torch.float64))
    twice = torch.tensor([4, 4])  # two loops would write one row (on threads: in either order)
    with pytest.raises(ValueError, match="distinct"):
        apply_block_step_numba(z, ell, twice, z[twice], ell[twice], *args[5:])
    assert all(torch.equal(a, b) for a, b in zip((z, ell, alpha), before))  # nothing was written
    with pytest.raises(ValueError, match="contiguous float64"):
        apply_block_step_numba(z.float(), *args[1:])
    zt = z.t().contiguous().t()  # not contiguous: "auto" leaves it to torch, which writes it the same way
    apply_block_step(zt, ell.clone(), *args[2:])
    apply_block_step(z, ell, *args[2:])
    assert torch.equal(zt, z) and not torch.equal(z, before[0])


@pytest.mark.parametrize("batch_size", [1, 3])
def test_away_steps_keep_the_blocks_on_the_simplex(batch_size):
    """An away atom whose weight rounds to 1 - 1 ulp must not take an away step: its bound alpha_a / (1 - alpha_a)
    (about 9e15) times a direction of pure rounding noise moved a block off the simplex, after which the dual
    exceeded the optimum and the exact gap went negative (this table did so at pass 13)."""
    g = torch.Generator().manual_seed(4)
    n, K = 6, 4
    f = torch.randn(n, K, 2, generator=g, dtype=torch.float64)
    truth = torch.randint(K, (n,), generator=g)
    loss = torch.rand(n, K, generator=g, dtype=torch.float64) + 0.2
    loss[torch.arange(n), truth] = 0
    s = BCFW(FeatureTableProblem(f, loss, truth), lam=0.1, step="away", batch_size=batch_size)
    for _ in range(60):
        s.step()
        mu = -s.z.clone()  # block i's weights over the labels: e_truth - z_i
        mu[torch.arange(n), truth] += 1
        assert float(mu.min()) >= -1e-12
        assert s.duality_gap()["gap"] >= -1e-12


def test_frank_wolfe_fit_leaves_the_certified_iterate():
    """Batch FW certifies the iterate its pass was made at, then moves: fit(gap_tol) would stop with the model one
    move past the certified iterate (its gap up to 9x gap_tol on these tables). The certifying pass now holds."""
    from torchssvm.optim import FrankWolfe

    certified = 0
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        f = torch.randn(8, 4, 3, generator=g, dtype=torch.float64)
        truth = torch.randint(4, (8,), generator=g)
        loss = torch.rand(8, 4, generator=g, dtype=torch.float64) + 0.2
        loss[torch.arange(8), truth] = 0
        s = FrankWolfe(FeatureTableProblem(f, loss, truth), lam=0.01)
        history = s.fit(max_passes=500, gap_tol=0.05)
        if history[-1]["gap"] > 0.05:  # the pass budget ran out (FW's O(1/k) on a few tables): nothing certified
            continue
        certified += 1
        assert history[-1]["step_size"] == 0.0
        assert s.duality_gap()["gap"] == pytest.approx(history[-1]["gap"], rel=1e-9, abs=1e-12)
    assert certified >= 15


def _ml_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(8, 3, generator=g) > 0.5).long()
    return ts.optim.MultiLabelProblem(x, y, ts.MultiLabel(3))


def test_box_refuses_infinite_bounds_on_the_wrong_side():
    """w >= +inf was taken as no box at all; mixed with a finite bound it gave NaN steps."""
    with pytest.raises(ValueError, match=r"box lower bound holds \+inf"):
        ts.optim.FrankWolfe(_ml_problem(), lam=0.1, box=(float("inf"), None))
    with pytest.raises(ValueError, match=r"box\['bias'\] upper bound holds -inf"):
        ts.optim.BCFW(_ml_problem(), lam=0.1, box={"bias": (None, float("-inf")), "weight": (0.0, None)})


@pytest.mark.parametrize("make", [
    lambda p: ts.optim.FrankWolfe(p, lam=0.1),
    lambda p: ts.optim.BCFW(p, lam=0.1),
    lambda p: ts.optim.NSlackCuttingPlane(p, lam=0.1),
    lambda p: ts.optim.BMRM(ts.optim.StructuredRisk(p), lam=0.1),
], ids=["fw", "bcfw", "nslack", "bmrm"])
def test_fit_limits_already_met_take_no_step(make):
    """fit(max_passes=0) ran a pass, and a second fit(max_passes=3) after one to 3 passes ran a fourth."""
    s = make(_ml_problem())
    assert s.fit(max_passes=0) == [] and s.oracle_calls == 0
    s.fit(max_passes=3)
    calls = s.oracle_calls
    assert s.fit(max_passes=3) == [] and s.oracle_calls == calls


def test_the_certifying_pass_of_fit_is_logged():
    """fit confirms a low gap estimate with an exact pass; that certificate (and its oracle calls) never reached
    the writer."""
    rec = ScalarRecorder()
    s = ts.optim.BCFW(_ml_problem(), lam=1.0, gap_check_every=0, writer=rec)
    history = s.fit(max_passes=200, gap_tol=1e-3)
    last = history[-1]
    assert last["gap_exact"] and last["gap"] <= 1e-3
    assert rec.scalars["bcfw/exact_gap"][-1] == (s.steps_done, last["gap"])
    assert rec.scalars["bcfw/oracle_calls"][-1] == (s.steps_done, last["oracle_calls"])


def test_nslack_seed_is_checked():
    """seed=1.5 was truncated to 1, seed='a' raised int()'s error."""
    for seed in (1.5, "a"):
        with pytest.raises(TypeError, match="seed"):
            ts.optim.NSlackCuttingPlane(_ml_problem(), lam=0.1, seed=seed)


def test_a_state_with_a_fractional_count_is_refused():
    s = ts.optim.FrankWolfe(_ml_problem(), lam=0.1)
    s.fit(max_passes=2)
    state = s.state_dict()
    state["oracle_calls"] = 2.7  # int() loaded it as 2
    fresh = ts.optim.FrankWolfe(_ml_problem(), lam=0.1)
    with pytest.raises(ValueError, match="oracle_calls"):
        fresh.load_state_dict(state)
    state["oracle_calls"] = 16.0  # an integral float is the count
    fresh.load_state_dict(state)
    assert fresh.oracle_calls == 16
