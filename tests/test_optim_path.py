"""Regularization path (note 001 section 2.8) and the batch baselines (FW, SSG)."""

import math

import pytest
import torch
from test_optim_bcfw import brute_primal, check_invariants, random_table

import torchssvm as ts
from torchssvm.optim import BCFW, SSG, FeatureTableProblem, FrankWolfe, grid_search, regularization_path
from torchssvm.optim.regularization_path import _initialize


def test_prop1_rescaling_identity_is_exact():
    F, L, y = random_table(n=14, seed=2)
    for cfg in (dict(), dict(step="pairwise", cache_size=4)):
        s = BCFW(FeatureTableProblem(F, L, y), lam=0.3, seed=0, **cfg)
        for _ in range(3):
            s.step()
        before = s.duality_gap()
        w_before = s.w.clone()
        rho = 0.37
        delta = s.rescale_lambda(0.3 * rho)
        after = s.duality_gap()
        torch.testing.assert_close(s.w, w_before, rtol=0, atol=1e-15)  # the primal is unchanged
        assert after["gap"] == pytest.approx(before["gap"] + (1 - rho) * float(delta.sum()), abs=1e-12)
        torch.testing.assert_close(after["block_gaps"], before["block_gaps"] + (1 - rho) * delta, rtol=0,
                                   atol=1e-12)
        check_invariants(s, F, L, y)
    with pytest.raises(ValueError, match="lam_new"):
        s.rescale_lambda(1.0)


def test_initialization_is_certified_at_lambda_inf():
    F, L, y = random_table(n=10, seed=3)
    s = BCFW(FeatureTableProblem(F, L, y), lam=1.0, step="pairwise", cache_size=4)
    _initialize(s, kappa=0.9, epsilon=0.05)
    g = s.duality_gap()
    assert g["gap"] <= 0.9 * 0.05 + 1e-12
    assert (g["block_gaps"] <= s.block_gaps + 1e-12).all()  # eq. (11) bounds each block gap
    check_invariants(s, F, L, y)


@pytest.mark.parametrize("cfg", [dict(), dict(step="pairwise", cache_size=5)])
def test_path_is_epsilon_approximate_everywhere(cfg):
    F, L, y = random_table(n=15, K=4, d=3, seed=0)
    eps = 0.05
    path = regularization_path(FeatureTableProblem(F, L, y), epsilon=eps, kappa=0.9, lam_min=1e-2, **cfg)
    lams = path.lams
    assert all(b < a for a, b in zip(lams, lams[1:]))
    assert all(b["gap"] <= 0.9 * eps + 1e-12 for b in path.breakpoints)
    lo = max(path.covers_to, 1e-2)
    for lam in torch.logspace(math.log10(lams[0] * 4), math.log10(lo * 1.001), 8).tolist():
        gap = path.certify(lam)
        assert -1e-12 <= gap <= eps + 1e-9
        # the certificate bounds the true suboptimality: P(w(lam)) - P* <= gap
        w = path.weights_at(lam)
        s = BCFW(FeatureTableProblem(F, L, y), lam=lam, step="pairwise", sampling="gap")
        s.fit(gap_tol=1e-4, max_passes=3000)
        assert brute_primal(F, L, y, w, lam) - s.dual_value() <= eps + 1e-4
    with pytest.raises(ValueError, match="below"):
        path.certify(lo / 10) if path.covers_to > 0 else (_ for _ in ()).throw(ValueError("below"))


def test_heuristic_path_and_grid_search():
    F, L, y = random_table(n=15, K=4, d=3, seed=1)
    heur = regularization_path(FeatureTableProblem(F, L, y), epsilon=0.05, kappa=0.7, lam_min=1e-2, heuristic=True,
                               keep_duals=True)
    exact = regularization_path(FeatureTableProblem(F, L, y), epsilon=0.05, kappa=0.9, lam_min=1e-2)
    assert not all(b["gap_exact"] for b in heur.breakpoints[1:])
    gaps = sorted(heur.certify(b["lam"]) for b in heur.breakpoints)
    assert gaps[0] >= -1e-12 and gaps[len(gaps) // 2] <= 0.05  # mostly accurate, without the guarantee
    assert heur.breakpoints[-1]["passes"] < exact.breakpoints[-1]["passes"]  # and cheaper
    grid = grid_search(FeatureTableProblem(F, L, y), lams=[2.0 ** k for k in range(4, -7, -1)], epsilon=0.05)
    assert [g["lam"] for g in grid] == [2.0 ** k for k in range(4, -7, -1)]
    assert all(g["gap"] <= 0.05 for g in grid)
    assert all(b["oracle_calls"] >= a["oracle_calls"] for a, b in zip(grid, grid[1:]))
    cold = grid_search(FeatureTableProblem(F, L, y), lams=[2.0 ** k for k in range(4, -7, -1)], epsilon=0.05,
                       warm_start=False)
    assert all(g["gap"] <= 0.05 for g in cold)
    with pytest.raises(ValueError, match="decreasing"):
        grid_search(FeatureTableProblem(F, L, y), lams=[1.0, 2.0])
    with pytest.raises(ValueError, match="kappa"):
        regularization_path(FeatureTableProblem(F, L, y), kappa=1.0)


def test_batch_frank_wolfe_certifies_and_converges():
    F, L, y = random_table(n=12, seed=4)
    s = FrankWolfe(FeatureTableProblem(F, L, y), lam=0.2)
    gaps = []
    for _ in range(40):
        w_before = s.w.clone()
        r = s.step()
        assert r["gap_exact"]
        assert r["primal"] == pytest.approx(brute_primal(F, L, y, w_before, 0.2), abs=1e-12)
        gaps.append(r["gap"])
        check_invariants(s, F, L, y)
    assert gaps[-1] < gaps[0] / 5
    assert r["oracle_calls"] == 40 * s.n
    box = FrankWolfe(FeatureTableProblem(F, L, y), lam=0.2, box=(-0.05, 0.05))
    for _ in range(5):
        box.step()
        assert box.w.abs().max() <= 0.05
        check_invariants(box, F, L, y)


def test_ssg_decreases_the_primal_and_resumes():
    F, L, y = random_table(n=20, seed=5)
    s = SSG(FeatureTableProblem(F, L, y), lam=0.1, seed=0)
    first = s.step()["primal"]
    for _ in range(30):
        r = s.step()
    assert r["primal"] < first and r["dual"] is None and r["gap"] is None
    ref = BCFW(FeatureTableProblem(F, L, y), lam=0.1, step="pairwise", sampling="gap")
    ref.fit(max_passes=20)
    assert r["primal"] >= ref.dual_value() - 1e-12  # weak duality
    assert r["primal"] == pytest.approx(brute_primal(F, L, y, s.output, 0.1), abs=1e-12)
    a = SSG(FeatureTableProblem(F, L, y), lam=0.1, seed=1)
    b = SSG(FeatureTableProblem(F, L, y), lam=0.1, seed=1)
    for _ in range(4):
        a.step()
    b.step()
    c = SSG(FeatureTableProblem(F, L, y), lam=0.1, seed=9)
    c.load_state_dict(b.state_dict())
    for _ in range(3):
        c.step()
    assert torch.equal(a.output, c.output)


def test_solvers_write_the_chain_model():
    ds = ts.data.synthetic_chain("train", 12, num_labels=3, num_features=4, seed=2)
    for cls in (FrankWolfe, SSG):
        model = ts.LinearChainModel(4, 3, dtype=torch.float64)
        s = cls(model, ds, lam=0.1)
        s.step()
        w = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.testing.assert_close(w, s.output if cls is SSG else s.w)
        assert w.abs().sum() > 0


def _multilabel_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(8, 3, generator=g) > 0.5).long()
    return ts.optim.MultiLabelProblem(x, y, ts.MultiLabel(3))


@pytest.mark.parametrize("max_passes", [1, 2, 3])
def test_a_path_that_runs_out_of_passes_covers_only_what_it_certifies(max_passes):
    """An inner solve that stops above epsilon was kept as the last breakpoint and covers_to its lambda: there the
    path's weights had gaps of 0.080, 0.054, 0.093 at epsilon 0.05."""
    eps = 0.05
    path = regularization_path(_multilabel_problem(), epsilon=eps, lam_min=1e-2, max_passes=max_passes)
    assert path.unfinished is not None and path.unfinished["gap"] > eps
    assert path.covers_to == path.unfinished["lam"] < path.lams[-1]
    assert all(b["gap"] <= eps for b in path.breakpoints)
    assert path.certify(path.covers_to) <= eps * (1 + 1e-9)


def test_path_arguments_are_checked():
    p = _multilabel_problem()
    for kwargs, err in (({"epsilon": "a"}, TypeError), ({"epsilon": -1.0}, ValueError), ({"kappa": "a"}, TypeError),
                        ({"time_budget": -1.0}, ValueError), ({"time_budget": "a"}, TypeError)):
        with pytest.raises(err, match=next(iter(kwargs))):
            regularization_path(p, **kwargs)
    path = regularization_path(p, epsilon=0.1, lam_min=0.5)
    with pytest.raises(TypeError, match="lam"):
        path.weights_at("a")
