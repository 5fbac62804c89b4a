"""Slack rescaling in training: the slack-rescaled table problem under BCFW (exact gap of the slack
objective) and the Pegasos optimizer on the slack-rescaled loss."""

import pytest
import torch

from torchssvm.optim import BCFW, FeatureTableProblem, Pegasos


def _tables(n=30, K=4, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n, K, d, generator=g, dtype=torch.float64)
    truth = torch.randint(0, K, (n,), generator=g)
    losses = torch.rand(n, K, generator=g, dtype=torch.float64) + 0.2
    losses.scatter_(1, truth.unsqueeze(1), 0.0)
    return features, losses, truth


def _slack_primal(features, losses, truth, w, lam):
    s = features @ w  # (n, K)
    gold = s.gather(1, truth.unsqueeze(1))
    hinge = (losses * (1 + s - gold)).max(1).values.clamp_min(0)
    return 0.5 * lam * float(w @ w) + float(hinge.mean())


def test_bcfw_on_the_slack_rescaled_table_certifies_the_slack_objective():
    features, losses, truth = _tables()
    lam = 0.1
    problem = FeatureTableProblem.slack_rescaled(features, losses, truth)
    solver = BCFW(problem, lam=lam, sampling="gap", step="pairwise", seed=0)
    solver.fit(max_passes=100, gap_tol=1e-8)
    cert = solver.duality_gap()
    w = solver.w
    # the primal the solver certifies is the slack-rescaled objective of the original tables
    assert abs(cert["primal"] - _slack_primal(features, losses, truth, w, lam)) < 1e-10
    assert 0 <= cert["gap"] < 1e-3 * cert["primal"]
    assert cert["primal"] - cert["dual"] == pytest.approx(cert["gap"], abs=1e-10)
    # ... and it differs from the margin-rescaled optimum (the two objectives are not the same)
    margin = BCFW(FeatureTableProblem(features, losses, truth), lam=lam, step="pairwise", seed=0)
    margin.fit(max_passes=100, gap_tol=1e-8)
    assert float((margin.w - w).norm()) > 1e-3


def test_pegasos_on_the_slack_loss_approaches_the_bcfw_optimum():
    features, losses, truth = _tables(n=40, seed=1)
    lam = 0.1
    solver = BCFW(FeatureTableProblem.slack_rescaled(features, losses, truth), lam=lam, step="pairwise", seed=0)
    solver.fit(max_passes=300, gap_tol=1e-9)
    best = _slack_primal(features, losses, truth, solver.w, lam)
    w = torch.zeros(features.shape[2], dtype=torch.float64, requires_grad=True)
    opt = Pegasos([w], lam=lam, average=True)
    g = torch.Generator().manual_seed(0)
    for _ in range(3000):
        i = torch.randint(0, 40, (8,), generator=g)
        scores = features[i] @ w
        # the slack-rescaled hinge of the tables' outputs
        loss = (losses[i] * (1 + scores - scores.gather(1, truth[i].unsqueeze(1)))).max(1).values.clamp_min(0).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    opt.averaged()
    gap = _slack_primal(features, losses, truth, w.detach(), lam) - best
    assert 0 <= gap < 0.02 * best + 1e-3
    assert opt.param_groups[0]["t"] == 3000


def test_pegasos_step_and_projection_and_errors():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    opt = Pegasos([w], lam=0.5, project=True)
    w.grad = torch.tensor([1.0, 0.0], dtype=torch.float64)
    opt.step()  # t = 1: w <- 0 * w - grad / (lam * 1) = (-2, 0); norm 2 > 1/sqrt(0.5)
    torch.testing.assert_close(w.detach(), torch.tensor([-2.0, 0.0], dtype=torch.float64) * (2 ** 0.5 / 2))
    w.grad = torch.zeros(2, dtype=torch.float64)
    before = w.detach().clone()
    opt.step()  # t = 2: w <- w / 2
    torch.testing.assert_close(w.detach(), before / 2)
    state = opt.state_dict()
    assert state["param_groups"][0]["t"] == 2
    with pytest.raises(ValueError, match="lam"):
        Pegasos([w], lam=0.0)
    with pytest.raises(ValueError, match="average=True"):
        opt.averaged()
