"""BCFW with slack-rescaled corners (seed 000 with the BCFW issue): `SlackRescaledProblem` over chains and
tables, checked against enumeration of the slack objective and against the same problem written as
explicit feature tables."""

import itertools

import pytest
import torch
from test_optim_problems import _dense_problem

import torchssvm as ts
from torchssvm.optim import BCFW, ChainProblem, FeatureTableProblem, FrankWolfe, SlackRescaledProblem, make_problem


def _chain_data(seed=0, n=6, K=3, D=3, T=4):
    return _dense_problem(seed=seed, n=n, K=K, D=D, T=T)


def _enumerate(problem: ChainProblem):
    """Every labelling of every example: ``(n, C, T)`` padded candidates (short examples repeat their
    truth, which changes no maximum), their losses ``(n, C)`` and psi vectors ``(n, C, d)``."""
    n, K, T = problem.n, problem.K, problem.T
    C = K ** T
    cands = problem.truth.unsqueeze(1).repeat(1, C, 1)
    for i in range(n):
        L = int(problem.lengths[i])
        ys = torch.tensor(list(itertools.product(range(K), repeat=L)))
        cands[i, : ys.shape[0], :L] = ys
    psi = torch.zeros(n, C, problem.d, dtype=torch.float64)
    for i in range(n):
        idx = torch.full((C,), i)
        z = problem.corner(idx, cands[i])
        for c in range(C):
            problem.accumulate(psi[i, c], idx[c : c + 1], z[c : c + 1], torch.ones(1, dtype=torch.float64))
    losses = torch.stack([problem.task_loss(torch.tensor([i]), cands[i : i + 1])[0] for i in range(n)])
    return cands, losses, psi


def _slack_primal(losses, psi, w, lam):
    return 0.5 * lam * float(w @ w) + float((losses * (1 - psi @ w)).max(1).values.clamp_min(0).mean())


@pytest.fixture(scope="module")
def enumerated_optimum():
    """The slack optimum of the enumerated tables of `_chain_data` (features ``phi(y) = -psi(y)``)."""
    model, ds = _chain_data()
    base = make_problem(model, ds)
    _, losses, psi = _enumerate(base)
    table = BCFW(FeatureTableProblem.slack_rescaled(-psi, losses, _truth_index(base, psi)), lam=LAM,
                 step="pairwise", seed=0)
    table.fit(max_passes=1000, gap_tol=1e-11)
    cert = table.duality_gap()
    assert cert["gap"] <= 1e-11
    return cert["primal"], losses, psi


LAM = 0.5


@pytest.mark.parametrize("step,cache,B", [("fw", 0, 1), ("pairwise", 10, 1), ("away", 10, 3), ("fw", 0, 4),
                                          ("pairwise", 0, 4)])
def test_chain_slack_bcfw_reaches_the_slack_optimum_of_the_enumerated_tables(step, cache, B, enumerated_optimum):
    optimum, losses, psi = enumerated_optimum
    model, ds = _chain_data()
    solver = BCFW(model, ds, lam=LAM, rescaling="slack", step=step, cache_size=cache, batch_size=B,
                  sampling="gap", gap_check_every=5, seed=1)
    solver.fit(max_passes=300, gap_tol=1e-9)
    cert = solver.duality_gap()
    # the certified primal is the slack objective, evaluated here by enumeration
    assert cert["primal"] == pytest.approx(_slack_primal(losses, psi, solver.w, LAM), abs=1e-10)
    assert cert["primal"] - cert["dual"] == pytest.approx(cert["gap"], abs=1e-10)
    # the certificate brackets the optimum of the same problem written as explicit tables
    assert cert["dual"] - 1e-10 <= optimum <= cert["primal"] + 1e-10
    assert cert["gap"] <= (1e-6 if step != "fw" else 1e-2)
    # and the model holds w
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), solver.w)


def _truth_index(problem, psi):
    """The candidate index of the truth: the first labelling with psi = 0 and loss 0."""
    n = problem.n
    out = torch.empty(n, dtype=torch.long)
    for i in range(n):
        zero = (psi[i].abs().sum(1) == 0).nonzero().squeeze(1)
        out[i] = zero[-1]  # the padded repeats of the truth come last
    return out


def test_slack_and_margin_optima_differ_and_slack_corners_are_loss_scaled():
    model, ds = _chain_data(seed=2)
    margin = make_problem(model, ds)
    slack = make_problem(model, ds, rescaling="slack")
    assert isinstance(slack, SlackRescaledProblem) and slack.structure is slack.base.structure
    idx = torch.arange(ds.y.shape[0])
    w = torch.randn(slack.d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    theta = slack.potentials(w, idx)
    labels, loss, H = slack.oracle(theta, idx)
    torch.testing.assert_close(slack.corner(idx, labels), loss.unsqueeze(1) * margin.corner(idx, labels))
    # the solvers' H = L - s(truth) + labels_score reproduces L (1 + s(y) - s(truth)) from the scores
    s_truth = slack.labels_score(theta, idx, slack.truth[idx].unsqueeze(1)).squeeze(1)
    s_y = slack.labels_score(theta, idx, labels.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(loss - s_truth + s_y, H)
    base_y = margin.labels_score(theta, idx, labels.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(H, loss * (1 + base_y - s_truth))
    assert bool((H > 0).any())
    a = BCFW(model, ds, lam=LAM, step="pairwise", seed=0)
    a.fit(max_passes=200, gap_tol=1e-9)
    b = BCFW(model, ds, lam=LAM, step="pairwise", seed=0, rescaling="slack")
    b.fit(max_passes=200, gap_tol=1e-9)
    assert float((a.w - b.w).norm()) > 1e-3


def test_frank_wolfe_and_ssg_accept_slack_rescaling():
    """Weak duality across solvers on the slack objective: every certified dual is below every primal."""
    model, ds = _chain_data(seed=3)
    bc = BCFW(model, ds, lam=LAM, rescaling="slack", step="pairwise", seed=0)
    bc.fit(max_passes=300, gap_tol=1e-9)
    best = bc.duality_gap()
    fw = FrankWolfe(model, ds, lam=LAM, rescaling="slack")
    hist = fw.fit(max_passes=40)
    for r in hist:
        assert r["dual"] <= best["primal"] + 1e-10 and r["primal"] >= best["dual"] - 1e-10
    assert hist[-1]["gap"] < 0.1 * hist[0]["gap"]
    ssg = ts.optim.SSG(model, ds, lam=LAM, rescaling="slack", seed=0)
    for _ in range(30):
        r = ssg.step()
        assert r["primal"] >= best["dual"] - 1e-10
    assert r["primal"] - best["primal"] < 0.1 * best["primal"]  # the averaged iterate closes in


def test_slack_rescaling_errors():
    model, ds = _chain_data()
    with pytest.raises(ValueError, match="rescaling"):
        BCFW(model, ds, lam=0.1, rescaling="slak")
    weighted = ts.Chain(3, class_weights=torch.tensor([1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="class_weights"):
        BCFW(model, ds, lam=0.1, rescaling="slack", structure=weighted)
    with pytest.raises(ValueError, match="already slack"):
        SlackRescaledProblem(make_problem(model, ds, rescaling="slack"))
    with pytest.raises(TypeError, match="base"):
        SlackRescaledProblem(model)
    with pytest.raises(NotImplementedError, match="regularization path"):
        ts.optim.regularization_path(make_problem(model, ds, rescaling="slack"))
