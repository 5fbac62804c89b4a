"""GDMM for chains (note 002): the BCFW optimum, the linear rate, Soft-BCFW, sampled FMO, invariants."""

import math

import pytest
import torch
from torchssvm.kernels import project_shifted_simplex

import torchssvm as ts
from torchssvm.optim import BCFW, GDMM
from torchssvm.optim.gdmm.factor_oracles import bigram_fmo
from torchssvm.structures import Chain

K, D = 3, 3


def _data(n=5, max_length=5, seed=3):
    return ts.data.synthetic_chain("train", n=n, num_labels=K, num_features=D, max_length=max_length, seed=seed)


def _model(k=K, d=D, **kw):
    return ts.models.LinearChainModel(d, k, dtype=torch.float64, **kw)


@pytest.fixture(scope="module")
def small():
    """5 sequences, K = 3, per-token Hamming (the paper's loss), C = 1: the BCFW optimum to gap 1e-9."""
    data = _data()
    st = Chain(K, normalize=False)
    b = BCFW(_model(), data, lam=1.0 / len(data), step="pairwise", structure=st)
    b.fit(max_passes=5000, gap_tol=1e-9)
    ref = b.duality_gap()
    assert ref["gap"] <= 1e-8
    return data, st, ref["primal"]


def _run(data, st, iters, **kw):
    g = GDMM(_model(), data, C=1.0, structure=st, primal_every=0, **kw)
    for _ in range(iters):
        r = g.step()
    return g, r


@pytest.mark.parametrize("update", ["step", "exact"])
def test_sequential_reaches_the_bcfw_optimum_at_a_linear_rate(small, update):
    data, st, P = small
    g = GDMM(_model(), data, C=1.0, rho=1.0, structure=st, batch_size=1, primal_every=0, bigram_update=update)
    infeas = []
    for _ in range(400):
        infeas.append(g.step()["infeasibility"])
    primal, dual = g.primal_objective(), -g.lam * g.dual_objective()
    assert abs(primal - P) <= 1e-3 * P  # note 002 section 6, item 1
    assert abs(dual - P) <= 1e-3 * P
    assert infeas[-1] <= 1e-5
    # linear convergence: the residual shrinks by a constant factor per window (O(1/t) would give 1/2, 2/3, 3/4)
    assert infeas[199] <= 0.2 * infeas[99] and infeas[299] <= 0.2 * infeas[199] and infeas[399] <= 0.2 * infeas[299]


@pytest.mark.parametrize("update", ["step", "exact"])
def test_block_jacobi_reaches_the_same_optimum(small, update):
    data, st, P = small
    g, r = _run(data, st, 500, rho=1.0, batch_size=8, bigram_update=update)
    assert r["infeasibility"] <= 1e-5
    assert abs(g.primal_objective() - P) <= 1e-3 * P
    assert abs(r["dual"] - P) <= 1e-3 * P


def test_sampled_fmo_reaches_the_same_optimum(small):
    data, st, P = small
    g, r = _run(data, st, 400, rho=1.0, batch_size=8, fmo="sampled", nu=2)
    assert abs(g.primal_objective() - P) <= 1e-3 * P
    assert r["visits_unigram"] < K  # one of two label blocks per call


def test_soft_bcfw_plateaus_above_the_optimum_and_closer_with_larger_rho(small):
    data, st, P = small
    plateau = {}
    for rho in (1.0, 10.0):
        g, _ = _run(data, st, 200, rho=rho, eta=0.0, batch_size=8)
        a = g.primal_objective()
        for _ in range(100):
            g.step()
        b = g.primal_objective()
        plateau[rho] = b
        assert b > P * 1.02  # eta = 0 never restores consistency: a suboptimal primal (rho = 10: P * 1.028)
        if rho == 1.0:
            assert abs(b - a) <= 1e-3 * P  # converged (to the wrong point)
    assert plateau[10.0] < plateau[1.0]


def _recompute(g):
    W = g.x.t() @ g._dense(g.uidx, g.uval, g.K) if g.x is not None else None
    bd = g._dense(g.bidx, g.bval, g.K * g.K).view(-1, g.K, g.K)
    return W, bd.sum(0)


def _check_simplex(idx, val, top_label, C):
    ok = idx >= 0
    assert torch.allclose((val * ok).sum(1), torch.zeros(val.shape[0], dtype=val.dtype), atol=1e-12)
    truth = idx == top_label.unsqueeze(1)
    assert bool((truth.sum(1) == 1).all())
    assert bool((val[truth] >= -1e-12).all() and (val[truth] <= C + 1e-12).all())
    assert bool((val[ok & ~truth] <= 1e-12).all())


@pytest.mark.parametrize("batch_size, update", [(1, "step"), (4, "step"), (1, "exact"), (4, "exact")])
def test_invariants_and_monotone_lagrangian(batch_size, update):
    data = _data(n=6, seed=1)
    g = GDMM(_model(), data, C=0.5, rho=0.7, batch_size=batch_size, primal_every=0, bigram_update=update)
    for _ in range(3):
        L0 = g.lagrangian()
        for chunk in torch.randperm(g.N).split(batch_size):
            g._update_tokens(chunk)
            L1 = g.lagrangian()
            assert L1 <= L0 + 1e-12  # exact block minimization / joint step: never up
            L0 = L1
        for chunk in torch.randperm(g.E).split(batch_size):
            g._update_edges(chunk)
            L1 = g.lagrangian()
            assert L1 <= L0 + 1e-12
            L0 = L1
        g._multiplier_step()
    _check_simplex(g.uidx, g.uval, g.y, g.C)
    _check_simplex(g.bidx, g.bval, g.ybig, g.C)
    W, v = _recompute(g)
    assert torch.allclose(g.W, W, atol=1e-12) and torch.allclose(g.v, v, atol=1e-12)
    g._write_model()
    w = torch.cat([p.detach().reshape(-1) for p in g.problem.model.parameters()])
    assert torch.allclose(w, g.flat_w(), atol=1e-12)
    # at a consistent point -G is the SSVM dual: here just that the reports are coherent
    r = g.step()
    assert math.isclose(r["dual"], -g.lam * g.dual_objective(), rel_tol=1e-12)


def test_sparse_features_match_dense_one_hot():
    n, T, Dv, K2 = 6, 5, 7, 4
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, T + 1, (n,), generator=gen)
    ids = torch.randint(0, Dv, (n, T, 2), generator=gen)
    ids[:, :, 1] = torch.where(ids[:, :, 1] == ids[:, :, 0], -1, ids[:, :, 1])
    y = torch.randint(0, K2, (n, T), generator=gen)
    pad = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)
    y[pad] = -1
    ids[pad] = -1
    dense = torch.zeros(n, T, Dv, dtype=torch.float64)
    for a in range(2):
        ok = ids[:, :, a] >= 0
        dense[ok.nonzero(as_tuple=True) + (ids[:, :, a][ok],)] = 1.0
    ds_sparse = ts.data.SequenceDataset(ts.models.TokenFeatures(ids), y, lengths, num_labels=K2, num_features=Dv)
    ds_dense = ts.data.SequenceDataset(dense, y, lengths, num_labels=K2, num_features=Dv)
    a = GDMM(_model(K2, Dv, sparse=True), ds_sparse, C=1.0, rho=0.5, batch_size=4, primal_every=0)
    b = GDMM(_model(K2, Dv), ds_dense, C=1.0, rho=0.5, batch_size=4, primal_every=0)
    for _ in range(4):
        ra, rb = a.step(), b.step()
    assert torch.allclose(a.W, b.W, atol=1e-12) and torch.allclose(a.v, b.v, atol=1e-12)
    assert math.isclose(ra["dual"], rb["dual"], rel_tol=1e-10)
    assert math.isclose(a.primal_objective(), b.primal_objective(), rel_tol=1e-10)


def test_index_search_returns_the_brute_force_value_at_every_call(monkeypatch):
    import torchssvm.optim.gdmm.gdmm as gdmm_module

    calls = []

    def checked(v, mL, mR, rho, exclude=None, *, index=None, method="index"):
        out = bigram_fmo(v, mL, mR, rho, exclude, index=index, method=method)
        ref = bigram_fmo(v, mL, mR, rho, exclude, method="brute")
        assert torch.equal(out[2], ref[2])  # ties may pick another pair, never another value
        calls.append(int(mL.shape[0]))
        return out

    monkeypatch.setattr(gdmm_module, "bigram_fmo", checked)
    data = ts.data.synthetic_chain("train", n=6, num_labels=5, num_features=3, max_length=6, seed=2)
    g = GDMM(_model(5), data, C=1.0, rho=0.5, batch_size=4, bigram_search="index", primal_every=0)
    for _ in range(5):
        g.step()
    assert sum(calls) == 5 * g.E


def test_active_sets_stay_small_on_a_large_domain():
    data = ts.data.synthetic_large_chain("train", n=40, num_labels=200, num_features=16, seed=0)
    g = GDMM(ts.models.LinearChainModel(16, 200, dtype=torch.float64), data, C=1.0, rho=1.0, batch_size=64,
             primal_every=0)
    for _ in range(5):
        r = g.step()
    assert r["active_unigram"] <= 20 and r["active_bigram"] <= 20
    assert r["visits_bigram"] < 200 * 200 / 4  # the index reads a fraction of K^2 per call
    assert r["visits_unigram"] == 200


def test_state_dict_resumes_the_same_trajectory():
    data = _data(n=6, seed=4)
    a = GDMM(_model(), data, C=1.0, rho=0.5, batch_size=3, primal_every=0, fmo="sampled", nu=2)
    for _ in range(3):
        a.step()
    state = a.state_dict()
    for _ in range(3):
        a.step()
    b = GDMM(_model(), data, C=1.0, rho=0.5, batch_size=3, primal_every=0, fmo="sampled", nu=2, seed=99)
    b.load_state_dict(state)
    for _ in range(3):
        b.step()
    assert torch.equal(a.uidx, b.uidx) and torch.allclose(a.W, b.W, atol=0) and torch.allclose(a.v, b.v, atol=0)
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict({"W": a.W})
    W = b.W.clone()
    with pytest.raises(ValueError, match="state_dict\\['v'\\] holds NaN"):
        b.load_state_dict(dict(state, v=torch.full_like(state["v"], math.nan)))
    assert torch.equal(b.W, W)  # refused before anything was set


def test_a_state_resumes_with_the_solvers_own_rho_and_eta():
    """rho and eta steer the run and certify nothing: a loaded state keeps the solver's (one built with eta = 1 runs
    eta = 1 from a Soft-BCFW state, and its multipliers move), and the multipliers' bound follows the etas they were
    stepped with (``eta_total``), so either way round the state loads; a state of before ``eta_total`` derives it."""
    data = _data(n=6, seed=4)
    soft = GDMM(_model(), data, C=1.0, rho=0.5, eta=0.0, primal_every=0)
    for _ in range(3):
        soft.step()
    full = GDMM(_model(), data, C=1.0, rho=2.0, eta=1.0, primal_every=0)
    full.load_state_dict(soft.state_dict())
    assert (full.rho, full.eta, full.eta_total) == (2.0, 1.0, 0.0) and not full.lam_L.any()
    full.step()
    assert full.lam_L.any() and full.eta_total == 1.0
    back = GDMM(_model(), data, C=1.0, rho=0.5, eta=0.0, primal_every=0)
    back.load_state_dict(full.state_dict())  # non-zero multipliers into an eta = 0 solver: they stay as they are
    lam_L = back.lam_L.clone()
    back.step()
    assert back.eta == 0.0 and torch.equal(back.lam_L, lam_L)
    state = full.state_dict()
    with pytest.raises(ValueError, match="lam_L"):  # multipliers no eta could have made
        back.load_state_dict(dict(state, eta_total=0.0))
    older = {k: v for k, v in state.items() if k != "eta_total"}
    back.load_state_dict(dict(older, eta=1.0))  # a state that recorded its eta instead
    assert back.eta_total == full.iterations


def test_reports_fit_and_writer():
    class Writer:
        def __init__(self):
            self.tags = set()

        def add_scalar(self, tag, value, step):
            self.tags.add(tag)

    data = _data(n=4, seed=5)
    w = Writer()
    g = GDMM(_model(), data, C=1.0, rho=1.0, batch_size=4, primal_every=2, writer=w)
    hist = g.fit(max_iter=4)
    assert [r["iteration"] for r in hist] == [1, 2, 3, 4]
    assert hist[0]["primal"] is None and hist[1]["primal"] is not None
    # before feasibility primal - dual is an estimate, not a certificate: no "gap", nor its tag
    assert math.isclose(hist[1]["gap_estimate"], hist[1]["primal"] - hist[1]["dual"])
    assert hist[1]["gap"] is None and not hist[1]["gap_exact"] and hist[1]["infeasibility"] > 0
    assert {"gdmm/primal", "gdmm/dual_estimate", "gdmm/gap_estimate", "gdmm/infeasibility",
            "gdmm/active_bigram"} <= w.tags
    # the dual of an infeasible iterate bounds nothing: never under the certified names
    assert all(r["infeasibility"] > g.feasibility_tol * g.C for r in hist)
    assert "gdmm/gap" not in w.tags and "gdmm/dual" not in w.tags
    hist = g.fit(time_budget=0.0)
    assert len(hist) == 1
    with pytest.raises(ValueError, match="fit needs"):
        g.fit()


@pytest.mark.parametrize("kwargs, match", [
    ({"C": 0}, "C must be"), ({"C": "a"}, "C must be"), ({"rho": -1}, "rho must be"),
    ({"eta": -0.5}, "eta must be"), ({"fmo": "heap"}, "fmo must be"), ({"nu": 3}, "nu=3 needs"),
    ({"batch_size": 0}, "batch_size must be"), ({"bigram_search": "x"}, "bigram_search must be"),
    ({"drop_tol": -1.0}, "drop_tol must be"), ({"drop_tol": 1e-3}, r"drop_tol must be in \[0, 1e-09\]"),
    ({"fmo": "sampled", "nu": K + 1}, f"nu must be <= K = {K}"), ({"primal_every": -1}, "primal_every must be"),
    ({"bigram_update": "newton"}, "bigram_update must be"),
    ({"structure": Chain(K, class_weights=torch.ones(K))}, "class weights"),
])
def test_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GDMM(_model(), _data(n=3), **kwargs)


def test_errors_non_chain():
    feats = torch.randn(4, 3, 2, dtype=torch.float64)
    losses = torch.ones(4, 3, dtype=torch.float64)
    losses[:, 0] = 0
    problem = ts.optim.FeatureTableProblem(feats, losses, torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="chains"):
        GDMM(problem)


def _shifted_reference(u, top, C):
    """Bisection on tau: a_j = min(cap_j, u_j - tau) with sum a = 0."""
    cap = torch.zeros_like(u)
    cap[top] = C
    lo, hi = float(u.min()) - C - 1, float(u.max()) + C + 1
    for _ in range(200):
        tau = 0.5 * (lo + hi)
        s = float(torch.minimum(cap, u - tau).sum())
        lo, hi = (tau, hi) if s > 0 else (lo, tau)
    return torch.minimum(cap, u - 0.5 * (lo + hi))


def test_project_shifted_simplex_against_bisection():
    gen = torch.Generator().manual_seed(0)
    for M in (1, 2, 5, 9):
        u = torch.randn(6, M, generator=gen, dtype=torch.float64) * 3
        u[0] = 1.0  # duplicate kinks
        top = torch.randint(0, M, (6,), generator=gen)
        radius = torch.rand(6, generator=gen, dtype=torch.float64) + 0.1
        mask = torch.rand(6, M, generator=gen) > 0.3
        mask[torch.arange(6), top] = True
        a = project_shifted_simplex(u, top, mask, radius, backend="torch")
        for b in range(6):
            sel = mask[b].nonzero(as_tuple=True)[0]
            t = int((sel == top[b]).nonzero()[0])
            ref = _shifted_reference(u[b, sel], t, float(radius[b]))
            assert torch.allclose(a[b, sel], ref, atol=1e-12)
            assert bool((a[b, ~mask[b]] == 0).all())


def test_project_shifted_simplex_errors():
    u = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="top must index a column"):
        project_shifted_simplex(u, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="top must be"):
        project_shifted_simplex(u, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="top must index a valid"):
        project_shifted_simplex(u, torch.tensor([0, 1]), torch.tensor([[True, True, True], [True, False, True]]))
    with pytest.raises(ValueError, match="u must be"):
        project_shifted_simplex(torch.zeros(3, dtype=torch.float64), torch.tensor([0]))
