"""Bundle methods and the 1-slack cutting plane (issue 8, item 2): the simplex QP against its optimality
conditions and SLSQP, qp-bmrm / ls-bmrm / 1-slack reaching the BCFW optimum with certified gaps, the
corrected Hadamard lower bound of seed 003 (eps_t = 1/(2 lam t)) and the printed instance's collapse,
inactive-cut removal, state and errors."""

import math

import numpy as np
import pytest
import torch
from conftest import ScalarRecorder
from test_cutting_plane import random_table
from torchssvm.kernels import numba_available

from torchssvm.optim import BCFW, BMRM, FeatureTableProblem, OneSlackCuttingPlane
from torchssvm.optim.cutting_planes.risks import HingeRisk, MaxOfLinearRisk, StructuredRisk
from torchssvm.optim.cutting_planes.simplex_qp import frank_wolfe_gap, qp_value, simplex_qp


def hadamard(d):
    H = torch.ones(1, 1, dtype=torch.float64)
    while H.shape[0] < d:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    return H


# -- the simplex QP ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["active_set", "fista"])
@pytest.mark.parametrize("t,rank,radius,inequality", [(6, 6, 1.0, False), (12, 3, 2.5, False), (8, 8, 1.0, True),
                                                       (30, 5, 0.7, True), (1, 1, 1.0, False)])
def test_simplex_qp_is_optimal(t, rank, radius, inequality, method):
    scipy_opt = pytest.importorskip("scipy.optimize")
    g = torch.Generator().manual_seed(t * 7 + rank)
    A = torch.randn(t, rank, generator=g, dtype=torch.float64)
    Q = A @ A.T
    c = torch.randn(t, generator=g, dtype=torch.float64) + 0.5
    x, info = simplex_qp(Q, c, radius, inequality=inequality, tol=1e-12, method=method)
    assert (x >= 0).all()
    if inequality:
        assert float(x.sum()) <= radius + 1e-12
    else:
        assert float(x.sum()) == pytest.approx(radius, abs=1e-12)
    # KKT: every coordinate's gradient >= the multiplier, with equality on the support
    grad = Q @ x - c
    nu = float(grad.min()) if not inequality else min(float(grad.min()), 0.0)
    assert (grad >= nu - 1e-9).all()
    assert (grad[x > 1e-9] - nu).abs().max() <= 1e-7
    assert info["fw_gap"] <= 1e-12 or info["iterations"] < 5000
    # an independent solver does no better
    cons = [{"type": "ineq" if inequality else "eq", "fun": lambda z: radius - z.sum()}]
    start = torch.full((t,), radius / (t + 1)).numpy()
    ref = scipy_opt.minimize(lambda z: 0.5 * z @ Q.numpy() @ z - c.numpy() @ z, start,
                             jac=lambda z: Q.numpy() @ z - c.numpy(), bounds=[(0, None)] * t, constraints=cons,
                             method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000})
    assert info["value"] <= ref.fun + 1e-9
    assert qp_value(Q, c, x) == pytest.approx(info["value"], abs=1e-12)


@pytest.mark.parametrize("rank", [1, 2])
def test_simplex_qp_solves_singular_faces(rank):
    """Rank-deficient Q at a large scale (nearly parallel cuts at small lam): on a singular face the objective is
    linear along the face's flat directions, and the step goes along one to the boundary (the ridge-regularized
    face solve gave ascent directions, then the projected gradient zigzagged until the iterations ran out: a
    Frank-Wolfe gap of 3e-3 to 0.1 on a quarter of these). Certified by the independent Frank-Wolfe gap."""
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        A = torch.randn(6, rank, generator=g, dtype=torch.float64)
        Q = A @ A.T * 1e6
        c = torch.rand(6, generator=g, dtype=torch.float64)
        for inequality in (False, True):
            x, info = simplex_qp(Q, c, 0.8, inequality=inequality, tol=1e-10)
            assert info["solved"] and (rank == 2 or info["iterations"] <= 10)
            assert bool((x >= 0).all())
            if inequality:
                assert float(x.sum()) <= 0.8 + 1e-12
                x = torch.cat([x, x.new_tensor([0.8 - float(x.sum())])])
                Qi, ci = torch.nn.functional.pad(Q, (0, 1, 0, 1)), torch.nn.functional.pad(c, (0, 1))
            else:
                assert abs(float(x.sum()) - 0.8) <= 1e-12
                Qi, ci = Q, c
            assert frank_wolfe_gap(Qi, ci, x, 0.8) <= 1e-8


def test_simplex_qp_at_the_scale_of_tiny_lam():
    """Cut Gram matrices of 1e14 to 1e18 (features of scale 1e4 at lam 1e-8). A single cut, inequality form: the
    optimum x = 1/q (the rounding threshold sized by max|Q| r took the real descent from the slack for rounding
    and returned x = 0 as solved, with a Frank-Wolfe gap of 1: OneSlack then reported convergence at a gap of 1).
    A nonsingular face has no flat direction (the unscaled border of the KKT matrix made the constraint's own
    direction look like one; the step took all the mass and the next rescaling divided by 0)."""
    from torchssvm.optim.cutting_planes.simplex_qp import _null_direction

    for q in (1e10, 1e14, 1e16, 1e18):
        x, info = simplex_qp(torch.tensor([[q]], dtype=torch.float64), torch.ones(1, dtype=torch.float64), 1.0,
                             inequality=True, tol=1e-6)
        assert info["solved"] and info["fw_gap"] <= 1e-6 and float(x[0]) == pytest.approx(1 / q, rel=1e-9)
    rng = np.random.default_rng(0)
    for _ in range(3):
        A = rng.standard_normal((7, 7))
        Q = A @ A.T * 1e18 + 1e14 * np.eye(7)
        assert _null_direction(Q, rng.standard_normal(7) * 1e18, np.arange(7), 1e3) is None
        c = rng.random(7) * 1e9
        x, info = simplex_qp(torch.from_numpy(Q), torch.from_numpy(c), 1.0, tol=1e-6)
        assert bool(torch.isfinite(x).all()) and abs(float(x.sum()) - 1) < 1e-12
        ref = simplex_qp(torch.from_numpy(Q), torch.from_numpy(c), 1.0, method="fista", max_iter=3000, tol=0)[1]
        assert info["value"] <= ref["value"] + 1e-11 * abs(ref["value"])


def test_simplex_qp_warm_started_along_a_growing_bundle_at_tiny_lam():
    """Cuts added one at a time with warm starts, as a cutting-plane run makes them, at lam 1e-8 to 1e-6. Near the
    optimum a real face step falls under the rounding test, which is sized for steps of length r: the iteration
    crept by pairwise steps of 1e-22 until its cap, then FISTA ended unsolved (106 of 488 calls). The face's
    minimizer is now taken when it lowers the Frank-Wolfe gap."""
    rng = np.random.default_rng(1)
    calls = iterations = 0
    for kind in ("parallel", "lowrank", "rand") * 2:
        d, T, lam = int(rng.integers(3, 40)), int(rng.integers(5, 40)), 10.0 ** rng.uniform(-8, -6)
        if kind == "parallel":
            A = rng.standard_normal(d) + 10 ** rng.uniform(-6, -1) * rng.standard_normal((T, d))
        elif kind == "lowrank":
            A = rng.standard_normal((T, 3)) @ rng.standard_normal((3, d))
        else:
            A = rng.standard_normal((T, d))
        b = rng.uniform(0, 1, T)
        for inequality in (False, True):
            x = None
            for t in range(1, T + 1):
                Q, c = torch.tensor(A[:t] @ A[:t].T / lam), torch.tensor(b[:t])
                x0 = None if x is None else torch.cat([x, x.new_zeros(1)])
                x, info = simplex_qp(Q, c, 1.0, x0=x0, inequality=inequality, tol=1e-10)
                assert info["solved"], (kind, t)
                calls, iterations = calls + 1, iterations + info["iterations"]
    assert iterations <= 5 * calls


def test_simplex_qp_active_set_on_an_ill_conditioned_rank_deficient_bundle():
    """The regime of qp-bmrm at small lam: Q = A A^T / lam with t = 120 cuts in d = 20 dimensions, nearly
    parallel cuts, lam = 2^-18. The active-set solution is certified (Frank-Wolfe gap <= tol) and no worse
    than FISTA's, and a warm start from the optimum plus one new cut takes about one
    iteration per support change."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(20, generator=g, dtype=torch.float64)
    A = base + 0.05 * torch.randn(120, 20, generator=g, dtype=torch.float64)
    Q = A @ A.T * 2.0 ** 18
    c = torch.rand(120, generator=g, dtype=torch.float64)
    x, info = simplex_qp(Q, c, 1.0, inequality=True, tol=1e-9)
    assert info["iterations"] < 10 * 121 + 50  # did not fall back to FISTA
    assert info["fw_gap"] <= 1e-9  # f(x) - f* <= 1e-9 (certified), in units where Q is ~1e6
    assert frank_wolfe_gap(torch.nn.functional.pad(Q, (0, 1, 0, 1)), torch.nn.functional.pad(c, (0, 1)),
                           torch.cat([x, x.new_tensor([1.0 - float(x.sum())])]), 1.0) <= 1e-9
    _, fista = simplex_qp(Q, c, 1.0, inequality=True, tol=1e-9, method="fista", max_iter=300)
    assert info["value"] <= fista["value"] + 1e-9
    Q2 = torch.nn.functional.pad(Q, (0, 1, 0, 1))
    a_new = base + 0.05 * torch.randn(20, generator=g, dtype=torch.float64)
    Q2[-1, :-1] = Q2[:-1, -1] = (A @ a_new) * 2.0 ** 18
    Q2[-1, -1] = float(a_new @ a_new) * 2.0 ** 18
    c2 = torch.cat([c, c.new_tensor([1.5])])
    x2, info2 = simplex_qp(Q2, c2, 1.0, torch.cat([x, x.new_zeros(1)]), inequality=True, tol=1e-9)
    # each iteration adds or drops one coordinate or ends: bounded by the supports' symmetric difference
    changed = int(((torch.cat([x, x.new_zeros(1)]) > 0) != (x2 > 0)).sum())
    assert info2["iterations"] <= 2 * changed + 5
    assert info2["value"] <= info["value"]
    with pytest.raises(ValueError, match="method"):
        simplex_qp(Q, c, 1.0, method="newton")


def test_simplex_qp_warm_start_and_linear_objective():
    c = torch.tensor([0.1, 0.7, 0.3], dtype=torch.float64)
    x, _ = simplex_qp(torch.zeros(3, 3, dtype=torch.float64), c, 2.0)
    assert x.tolist() == [0.0, 2.0, 0.0]
    Q = torch.eye(3, dtype=torch.float64)
    x, info = simplex_qp(Q, c, 1.0, x0=torch.tensor([5.0, -1.0, 0.0], dtype=torch.float64))
    assert frank_wolfe_gap(Q, c, x, 1.0) <= 1e-10
    with pytest.raises(ValueError, match="radius"):
        simplex_qp(Q, c, 0.0)
    with pytest.raises(ValueError, match="Q must be"):
        simplex_qp(Q, c[:2])


# -- bundle methods and 1-slack on SSVMs ------------------------------------------------------------


@pytest.fixture(scope="module")
def table_optimum():
    F, L, y = random_table()
    lam = 0.1
    ref = BCFW(FeatureTableProblem(F, L, y), lam=lam, step="pairwise", seed=0, batch_size=4)
    ref.fit(max_passes=100, gap_tol=1e-9)
    cert = ref.duality_gap()
    assert cert["gap"] <= 1e-3
    return (F, L, y), lam, cert


@pytest.mark.parametrize("make", [
    lambda p, lam: BMRM(p, lam=lam, variant="qp", eps=1e-7),
    lambda p, lam: BMRM(p, lam=lam, variant="ls", eps=1e-3),
    lambda p, lam: OneSlackCuttingPlane(p, lam=lam, eps=1e-7, inactive_after=5),
], ids=["qp-bmrm", "ls-bmrm", "1-slack"])
def test_cut_solvers_reach_the_bcfw_optimum(table_optimum, make):
    (F, L, y), lam, best = table_optimum
    solver = make(FeatureTableProblem(F, L, y), lam)
    history = solver.fit(max_passes=3000)
    assert history[-1]["converged"]
    for r in history:  # every report certifies its iterate: dual <= optimum <= primal
        assert r["dual"] <= best["primal"] + 1e-9
        assert r["primal"] >= best["dual"] - 1e-9
    # the certified optimum lies inside BCFW's certificate
    assert best["dual"] - 1e-9 <= history[-1]["best_primal"] <= best["primal"] + 1e-9
    # the written model is w(alpha): its SSVM objective through an independent exact pass
    p = FeatureTableProblem(F, L, y)
    H = (L + F @ solver.w).max(1).values - (F @ solver.w).gather(1, y.unsqueeze(1)).squeeze(1)
    primal = 0.5 * lam * float(solver.w @ solver.w) + float(H.mean())
    assert primal >= best["dual"] - 1e-9
    assert p.n == 20


def test_bmrm_gaps_are_monotone_and_qp_needs_fewer_iterations(table_optimum):
    """Both forms keep the model's value non-decreasing (qp: a superset of cuts; ls: the segment contains
    the old aggregate), so eps_t never grows; the full QP converges in fewer iterations."""
    (F, L, y), lam, _ = table_optimum
    runs = {}
    for variant in ("qp", "ls"):
        solver = BMRM(FeatureTableProblem(F, L, y), lam=lam, variant=variant, eps=1e-3)
        history = solver.fit(max_passes=3000)
        eps = [r["eps"] for r in history]
        assert all(b <= a + 1e-10 for a, b in zip(eps, eps[1:]))
        runs[variant] = len(history)
    assert runs["qp"] < runs["ls"]


def test_one_slack_cuts_are_the_averaged_structured_cuts():
    """The cut of `StructuredRisk` is tight at w and a global under-estimator of R (checked by
    enumeration on random points); the 1-slack exit test matches the violation identity."""
    F, L, y = random_table(n=8, K=4, d=3, seed=3)
    risk = StructuredRisk(FeatureTableProblem(F, L, y))
    g = torch.Generator().manual_seed(0)

    def R(w):
        s = F @ w
        return float(((L + s).max(1).values - s.gather(1, y.unsqueeze(1)).squeeze(1)).mean())

    for _ in range(5):
        w = torch.randn(3, generator=g, dtype=torch.float64)
        value, c, cut = risk.cut(w)
        assert value == pytest.approx(R(w), abs=1e-12)
        assert c - float(w @ cut) == pytest.approx(value, abs=1e-12)
        for _ in range(10):
            v = torch.randn(3, generator=g, dtype=torch.float64) * 3
            assert c - float(v @ cut) <= R(v) + 1e-12


def test_one_slack_removes_inactive_cuts_and_resumes():
    F, L, y = random_table(n=30, K=6, d=5, seed=1)
    cp = OneSlackCuttingPlane(FeatureTableProblem(F, L, y), lam=0.01, eps=1e-6, inactive_after=2)
    history = cp.fit(max_passes=200)
    assert sum(r["removed"] for r in history) > 0
    assert history[-1]["converged"] and history[-1]["gap"] <= 1e-6 + 1e-9
    assert (cp.alpha >= 0).all() and float(cp.alpha.sum()) <= 1 + 1e-12
    # resume: a fresh solver loaded from a mid-run state follows the same trajectory
    a = OneSlackCuttingPlane(FeatureTableProblem(F, L, y), lam=0.01, eps=1e-6, inactive_after=2)
    for _ in range(4):
        a.step()
    b = OneSlackCuttingPlane(FeatureTableProblem(F, L, y), lam=0.01, eps=1e-6, inactive_after=2)
    b.load_state_dict(a.state_dict())
    ra, rb = a.step(), b.step()
    assert ra["primal"] == rb["primal"] and ra["dual"] == rb["dual"]
    torch.testing.assert_close(a.w, b.w, rtol=0, atol=0)


def test_one_slack_and_bmrm_on_a_chain_match_bcfw():
    from test_optim_problems import _dense_problem

    lam = 0.5
    model, ds = _dense_problem(n=8)
    ref = BCFW(model, ds, lam=lam, step="pairwise", seed=0)
    ref.fit(max_passes=60)
    best = ref.duality_gap()
    assert best["gap"] <= 2e-2
    for solver in (OneSlackCuttingPlane(_dense_problem(n=8)[0], ds, lam=lam, eps=1e-9),
                   BMRM(_dense_problem(n=8)[0], ds, lam=lam, variant="qp", eps=1e-9)):
        history = solver.fit(max_passes=500)
        assert history[-1]["converged"]
        # the certified optimum lies inside BCFW's certificate, and every dual value below BCFW's primal
        assert best["dual"] - 1e-9 <= history[-1]["best_primal"] <= best["primal"] + 1e-9
        assert history[-1]["best_primal"] - history[-1]["dual"] <= 1e-8
        assert all(r["dual"] <= best["primal"] + 1e-9 for r in history)


# -- the lower bound of seed 003 ------------------------------------------------------------------


@pytest.mark.parametrize("lam", [1.0, 0.1])
def test_hadamard_instance_needs_one_over_two_lam_t_iterations(lam):
    """Corrected instance A = H_d / sqrt(d) (note 003, section 1.3): exact BMRM's gap is exactly
    1 / (2 lam t) after t < d iterations, i.e. 1 / (2 lam eps) iterations to reach eps."""
    d = 16
    A = hadamard(d) / math.sqrt(d)
    solver = BMRM(MaxOfLinearRisk(A), lam=lam, variant="qp", eps=1e-12, qp_tol=1e-6)
    for t in range(1, d):
        r = solver.step()
        assert r["eps"] == pytest.approx(1 / (2 * lam * t), rel=1e-8)
        assert r["best_primal"] == pytest.approx(0.0, abs=1e-12)


def test_printed_hadamard_instance_collapses_in_two_steps():
    """As printed, A = (1/sqrt d) [[H, -H], [-H, H]] has column i + d/2 = -column i: BMRM's second cut is
    the negation of the first and the gap is 0 after two iterations (the paper's theorem fails)."""
    d = 16
    H = hadamard(d // 2)
    A = torch.cat([torch.cat([H, -H], 1), torch.cat([-H, H], 1)], 0) / math.sqrt(d)
    solver = BMRM(MaxOfLinearRisk(A.T), lam=1.0, variant="qp", eps=1e-12)
    solver.step()
    r = solver.step()
    assert r["eps"] == pytest.approx(0.0, abs=1e-10)


def test_hinge_risk_bmrm_matches_bcfw_on_a_binary_svm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 5, generator=g, dtype=torch.float64)
    y = torch.where(x[:, 0] + 0.5 * torch.randn(60, generator=g, dtype=torch.float64) > 0, 1, -1)
    lam = 0.05
    # the binary SVM as a 2-output feature table: phi(x, +-1) = +-x / 2, 0/1 loss
    F = torch.stack([-x / 2, x / 2], 1)
    truth = (y > 0).long()
    Lt = torch.ones(60, 2, dtype=torch.float64)
    Lt[torch.arange(60), truth] = 0
    ref = BCFW(FeatureTableProblem(F, Lt, truth), lam=lam, step="pairwise", seed=0)
    ref.fit(max_passes=2000, gap_tol=1e-10)
    best = ref.duality_gap()
    solver = BMRM(HingeRisk(x, y), lam=lam, variant="qp", eps=1e-9)
    history = solver.fit(max_passes=500)
    assert history[-1]["best_primal"] == pytest.approx(best["primal"], abs=1e-7)


def test_errors():
    F, L, y = random_table(n=4)
    with pytest.raises(ValueError, match="variant"):
        BMRM(FeatureTableProblem(F, L, y), lam=0.1, variant="cg")
    with pytest.raises(ValueError, match="eps"):
        BMRM(FeatureTableProblem(F, L, y), lam=0.1, eps=0)
    with pytest.raises(ValueError, match="lam"):
        OneSlackCuttingPlane(FeatureTableProblem(F, L, y), lam=-1)
    with pytest.raises(ValueError, match="inactive_after"):
        OneSlackCuttingPlane(FeatureTableProblem(F, L, y), lam=0.1, inactive_after=-1)
    with pytest.raises(ValueError, match="y must hold"):
        HingeRisk(torch.randn(3, 2), torch.tensor([1, 0, -1]))
    solver = BMRM(FeatureTableProblem(F, L, y), lam=0.1)
    with pytest.raises(ValueError, match="state_dict"):
        solver.load_state_dict({"w": torch.zeros(2)})



@pytest.mark.skipif(not numba_available(), reason="needs numba")
def test_chain_solvers_take_backend_numba():
    """``backend="numba"`` runs the chain oracles' compiled twins and leaves the solvers' own QP and projection kernels
    (torch and Triton only) to "auto": the same iterates as with "torch", up to the rounding of the scores."""
    from test_optim_problems import _dense_problem

    from torchssvm.optim import NSlackCuttingPlane

    def make(kind, backend):
        model, ds = _dense_problem(n=8)
        if kind == "bmrm":
            return BMRM(model, ds, lam=0.5, variant="qp", backend=backend)
        return NSlackCuttingPlane(model, ds, lam=0.5, qp_step="projected", backend=backend)

    for kind in ("bmrm", "n-slack"):
        runs = {}
        for backend in ("torch", "numba"):
            solver = make(kind, backend)
            runs[backend] = [solver.step() for _ in range(3)]
        for a, b in zip(runs["torch"], runs["numba"]):
            assert a["primal"] == pytest.approx(b["primal"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("solver", ["qp", "ls", "oneslack"])
def test_fit_leaves_the_certified_iterate_in_the_model(solver):
    """fit stops on BMRM's eps_t (the gap of w_best) or on gap_tol (the gap of the evaluated iterate); the model
    then holds w_best, whose gap both bound. The last QP's w_{t+1} (in the model before) was never evaluated:
    its gap was up to 10x eps. ls-bmrm's state_dict loads back (its age vector kept the length of every cut)."""
    for seed in range(12):
        F, L, y = random_table(8, 4, 3, seed=seed)
        for kw in ({"eps": 0.05}, {"eps": 1e-9, "gap_tol": 0.05}):
            p = FeatureTableProblem(F, L, y)
            if solver == "oneslack":
                s = OneSlackCuttingPlane(p, lam=0.01, eps=kw["eps"])
            else:
                s = BMRM(p, lam=0.01, eps=kw["eps"], variant=solver)
            history = s.fit(max_passes=2000, gap_tol=kw.get("gap_tol"))
            certified = history[-1]["converged"] or history[-1]["gap"] <= 0.05
            assert certified
            torch.testing.assert_close(p.weight, s.w_best)
            w = p.weight.to(torch.float64)
            scores = F @ w  # (n, K): the primal of the model's weights, by hand
            hinge = (L + scores - scores.gather(1, y.unsqueeze(1))).amax(1).clamp_min(0)
            primal = 0.005 * float(w @ w) + float(hinge.mean())
            lower = max(s.model_value, history[-1]["dual"])  # lower bounds of the optimum (QP values)
            assert primal - lower <= 0.05 + 1e-9
    if solver == "ls":
        s2 = BMRM(FeatureTableProblem(F, L, y), lam=0.01, variant="ls")
        s2.load_state_dict(s.state_dict())
        assert s2.age.shape == s2.alpha.shape == (1,)


def test_bundle_solvers_and_ssg_log_their_oracle_calls():
    """DESIGN's scalars include the oracle calls: BMRM, OneSlack and SSG wrote the passes only."""
    from torchssvm.optim import SSG

    F, L, y = random_table(n=10)
    for make, tag in ((lambda w: BMRM(FeatureTableProblem(F, L, y), lam=0.1, writer=w), "bmrm"),
                      (lambda w: OneSlackCuttingPlane(FeatureTableProblem(F, L, y), lam=0.1, writer=w), "oneslack"),
                      (lambda w: SSG(FeatureTableProblem(F, L, y), lam=0.1, writer=w), "ssg")):
        w = ScalarRecorder()
        solver = make(w)
        reports = [solver.step() for _ in range(3)]
        assert w.scalars[f"{solver.tag}/oracle_calls"] == [(k + 1, r["oracle_calls"]) for k, r in enumerate(reports)]
        assert solver.tag == tag
