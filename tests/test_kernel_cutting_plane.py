"""Kernel SSVM with exact and sampled cuts (issue 8, item 4; seed 004): the exact kernel 1-slack optimum
against an independent solve of the SVM dual (RBF) and against linear BMRM / 1-slack (linear kernel,
binary and multiclass); sampled cuts near the optimum; the paper's stopping rules and kernel-evaluation
counts; state and errors."""

import math

import pytest
import torch
from conftest import linear_classes

from torchssvm.optim import BMRM, FeatureTableProblem, HingeRisk, OneSlackCuttingPlane
from torchssvm.optim.frank_wolfe.box_qp import box_qp
from torchssvm.optim.kernel_svm.kernel_cutting_plane import KernelCuttingPlane
from torchssvm.optim.kernel_svm.mercer import MercerKernel


def binary_data(n=80, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.where(x[:, 0] * x[:, 1] + 0.3 * torch.randn(n, generator=g, dtype=torch.float64) > 0, 1, -1)
    return x, y


def multiclass_data(n=60, d=3, K=4, seed=0):
    return linear_classes(n, d, K, 0.7, seed)


def test_rbf_kernel_matches_the_definition_and_floors_the_exponent_before_subnormals():
    """The exponent is floored at -80 in float32 and at -700 in float64, where exp's results would be subnormal."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(7, 3, generator=g, dtype=torch.float64) * 3
    b = torch.randn(5, 3, generator=g, dtype=torch.float64) * 3
    kernel = MercerKernel("rbf", 2.0)
    K = kernel(a, b)
    arg = 2.0 * ((a.unsqueeze(1) - b.unsqueeze(0)) ** 2).sum(-1)
    assert bool((arg > 80).any()) and bool((arg < 80).any())
    torch.testing.assert_close(K, torch.exp(-arg), rtol=1e-12, atol=0)  # float64: exact past exp(-80)
    torch.testing.assert_close(kernel(a, b, torch.float32), torch.exp(-arg.clamp_max(80.0)).float(), rtol=1e-4,
                               atol=0)
    assert kernel.evaluations == 70
    far = MercerKernel("rbf", 1.0)(torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[30.0]], dtype=torch.float64))
    assert float(far) == math.exp(-700.0)  # 900 > 700: floored
    torch.testing.assert_close(MercerKernel("linear")(a, b), a @ b.T)


def test_rbf_kernel_is_exact_far_from_the_origin_and_in_the_requested_dtype():
    """The augmented-GEMM exponent is centred on b's mean: inputs near 1000 (||x||^2 ~ 3e6, where the expanded
    ``||a||^2 + ||b||^2 - 2ab`` loses every digit in float32) still give the kernel to rounding."""
    g = torch.Generator().manual_seed(1)
    a = (1000 + torch.randn(9, 3, generator=g, dtype=torch.float64)).float()
    b = (1000 + torch.randn(6, 3, generator=g, dtype=torch.float64)).float()
    exact = torch.exp(-0.5 * ((a.double().unsqueeze(1) - b.double().unsqueeze(0)) ** 2).sum(-1))
    assert float(exact.min()) > 1e-6
    kernel = MercerKernel("rbf", 0.5)
    K64 = kernel(a, b, torch.float64)
    assert K64.dtype == torch.float64
    torch.testing.assert_close(K64, exact, rtol=1e-12, atol=1e-14)
    K32 = kernel(a, b)
    assert K32.dtype == torch.float32
    torch.testing.assert_close(K32.double(), exact, rtol=0, atol=1e-5)
    assert kernel.evaluations == 2 * 54
    assert MercerKernel("linear")(a, b, torch.float64).dtype == torch.float64


def test_constant_time_block_by_block_scoring_matches_one_block(monkeypatch):
    """Scoring the draws in blocks of a few rows (kernel, product, oracle, violators' rows) takes the same
    path as one (r, U) block."""
    from torchssvm.optim.kernel_svm import kernel_cutting_plane

    x, y = binary_data(n=200, seed=7)

    def run():
        solver = KernelCuttingPlane(x, y, 50.0, gamma=0.5, sampling="constant", r=60, eps=1e-3, seed=2)
        return solver, solver.fit(max_iter=80)

    one, h_one = run()
    monkeypatch.setattr(kernel_cutting_plane, "BLOCK_ENTRIES", 37)
    assert one._block_rows(10) == 3
    many, h_many = run()
    assert [r["added"] for r in h_one] == [r["added"] for r in h_many] and sum(r["added"] for r in h_one) >= 10
    assert h_one[-1]["kernel_evaluations"] == h_many[-1]["kernel_evaluations"]
    torch.testing.assert_close(many.alpha, one.alpha, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(many.G, one.G, rtol=1e-10, atol=1e-12)


def test_cut_cache_slots_match_a_plain_list_of_rows():
    """Adding, dropping (slots freed, never moved) and re-adding rows: the rows in cut order, the weighted sum
    and the gathered entries equal those of a plain list."""
    from torchssvm.optim.kernel_svm.kernel_cutting_plane import CutCache

    g = torch.Generator().manual_seed(3)
    cache, plain = CutCache(11, 2, "cpu"), []
    for step in range(40):
        row = torch.randn(11, 2, generator=g, dtype=torch.float64)
        cache.add(row)
        plain.append(row)
        if step % 3 == 2:
            mask = torch.rand(len(plain), generator=g) > 0.4
            cache.keep(mask)
            plain = [r for r, k in zip(plain, mask.tolist()) if k]
        rows = torch.stack(plain) if plain else torch.zeros(0, 11, 2, dtype=torch.float64)
        assert torch.equal(cache.rows(), rows)
        alpha = torch.rand(len(plain), generator=g, dtype=torch.float64)
        torch.testing.assert_close(cache.scores(alpha), (alpha.view(-1, 1, 1) * rows).sum(0), rtol=1e-14, atol=1e-14)
        idx = torch.tensor([4, 0, 4, 10])
        assert torch.equal(cache.at(idx), rows[:, idx, :])
    assert cache.buf.shape[0] <= 2 * max(8, len(plain) + 40)


def svm_dual_optimum(x, y, C, gamma):
    """The SVM without bias, ``min 1/2 ||u||^2 + (C/N) sum hinge``, by its box-constrained dual solved with
    projected Newton: ``(optimum, beta)``."""
    N = x.shape[0]
    K = MercerKernel("rbf", gamma)(x, x)
    yf = y.double()
    Q = yf.unsqueeze(1) * K * yf.unsqueeze(0)
    beta = box_qp(torch.ones(N, dtype=torch.float64), Q, torch.full((N,), C / N, dtype=torch.float64),
                  max_iter=200, tol=1e-14)
    return float(beta.sum() - 0.5 * beta @ Q @ beta), beta


def test_exact_rbf_matches_the_svm_dual():
    x, y = binary_data()
    C, gamma = 80.0, 0.5  # C = N: the SVM's C_svm = 1
    opt, beta = svm_dual_optimum(x, y, C, gamma)
    solver = KernelCuttingPlane(x, y, C, kernel="rbf", gamma=gamma, sampling="exact", eps=1e-6)
    history = solver.fit(max_iter=2000)
    assert history[-1]["converged"]
    obj = solver.objective()
    # certified: the QP value is below the optimum, the primal above, and they meet within C eps
    assert solver.dual_value() <= opt + 1e-9 <= obj["primal"] + 2e-9
    assert obj["primal"] - opt <= C * 1e-6 + 1e-9
    assert all(r["gap"] >= -1e-9 for r in history)
    # the decision function is the SVM's (unique optimum w)
    f_svm = MercerKernel("rbf", gamma)(x, x) @ (beta * y.double())
    torch.testing.assert_close(solver.decision_function(x), f_svm, rtol=0, atol=5e-3)


def test_exact_linear_kernel_matches_linear_bmrm():
    x, y = binary_data(seed=1)
    C = 10.0
    ref = BMRM(HingeRisk(x, y), lam=1 / C, variant="qp", eps=1e-10)
    ref.fit(max_passes=500)
    solver = KernelCuttingPlane(x, y, C, kernel="linear", sampling="exact", eps=1e-8)
    solver.fit(max_iter=2000)
    # (1/2 ||w||^2 + C R) = C (lam/2 ||w||^2 + R) with lam = 1 / C
    assert solver.objective()["primal"] == pytest.approx(C * ref.best_primal, abs=C * 1e-7)


def test_exact_linear_kernel_multiclass_matches_one_slack():
    x, y = multiclass_data()
    N, K = x.shape[0], 4
    C = 5.0
    F = torch.zeros(N, K, x.shape[1] * K, dtype=torch.float64)
    for k in range(K):
        F[:, k, k * x.shape[1] : (k + 1) * x.shape[1]] = x
    L = torch.ones(N, K, dtype=torch.float64)
    L[torch.arange(N), y] = 0
    ref = OneSlackCuttingPlane(FeatureTableProblem(F, L, y), lam=1 / C, eps=1e-10)
    ref.fit(max_passes=1000)
    solver = KernelCuttingPlane(x, y, C, kernel="linear", sampling="exact", eps=1e-8)
    history = solver.fit(max_iter=2000)
    assert history[-1]["converged"]
    assert solver.objective()["primal"] == pytest.approx(C * ref.best_primal, abs=C * 1e-7)
    assert solver.predict(x).shape == (N,)


@pytest.mark.parametrize("sampling,r,tol", [("linear", 200, 0.06), ("constant", 200, 0.1), ("hybrid", 200, 0.1)])
def test_sampled_cuts_reach_near_the_optimum(sampling, r, tol):
    x, y = binary_data(n=150, seed=2)
    C, gamma = 150.0, 0.5
    opt, _ = svm_dual_optimum(x, y, C, gamma)
    solver = KernelCuttingPlane(x, y, C, kernel="rbf", gamma=gamma, sampling=sampling, r=r, eps=1e-3, seed=0)
    history = solver.fit(max_iter=3000)
    assert history[-1]["converged"] and sum(r["added"] for r in history) >= 10
    primal = solver.objective()["primal"]
    assert opt - 1e-9 <= primal <= opt * (1 + tol)


def test_linear_time_costs_and_exit_rule():
    x, y = binary_data(n=120, seed=3)
    solver = KernelCuttingPlane(x, y, 10.0, gamma=0.5, sampling="linear", r=30, eps=1e-3, inactive_after=0)
    history = solver.fit(max_iter=500)
    # each added cut costs N r kernel evaluations (the A cache makes scoring and Gram rows free)
    added = sum(r["added"] for r in history)
    assert history[-1]["kernel_evaluations"] == added * 120 * 30
    # the exit test is the exact violation: at the end the full-pass risk is within eps of xi
    last = history[-1]
    assert last["converged"] and last["violation"] <= 1e-3
    obj = solver.objective()
    assert obj["risk"] - solver._xi() <= 1e-3 + 1e-12
    # the linear-time offsets are exact: each cut's c is the mean 0/1 loss of its pass
    assert (solver.offsets >= 0).all() and (solver.offsets <= 1).all()


def test_linear_time_sampled_cut_is_unbiased():
    """E[<w, g>] of Alg. 3's sampled cut equals <w, g'> of the exact cut (note 004, section 2.3)."""
    x, y = binary_data(n=100, seed=6)
    solver = KernelCuttingPlane(x, y, 100.0, gamma=0.5, sampling="linear", r=10, eps=1e-3, seed=1)
    for _ in range(4):
        solver.step()
    fS = solver.training_scores()
    yhat, delta, _ = solver._oracle(fS, torch.arange(100))
    E = solver.F[solver.truth] - solver.F[yhat]
    I = (delta > 0).nonzero().squeeze(1)
    assert 0 < I.numel() < 100
    exact = float((fS * E).sum()) / 100
    values = []
    for _ in range(4000):
        draw, a = solver._linear_time_draw(I)
        values.append(a * float((fS[draw] * E[draw]).sum()))
    values = torch.tensor(values, dtype=torch.float64)
    assert abs(float(values.mean()) - exact) <= 4 * float(values.std()) / 4000 ** 0.5


def test_constant_time_cost_is_independent_of_n_and_stops_after_patience():
    for n in (100, 1000):
        x, y = binary_data(n=n, seed=4)
        solver = KernelCuttingPlane(x, y, 5.0, gamma=0.5, sampling="constant", r=20, eps=1e-3, patience=4,
                                    inactive_after=0)
        history = solver.fit(max_iter=300)
        assert history[-1]["converged"]
        assert [r["added"] for r in history[-4:]] == [0, 0, 0, 0]
        # r draws scored against every basis so far, plus r^2 for a new cut's own Gram entry: no term in n
        bound = sum(20 * 20 * (i + 1) for i in range(len(history)))
        assert history[-1]["kernel_evaluations"] <= bound


def test_hybrid_switches_to_linear_time_with_the_cache_of_the_constant_time_cuts():
    """At Alg. 2's stop, "hybrid" builds the cache of every cut so far in one pass (N U evaluations) and goes on
    with linear-time cuts (r_linear draws) to Alg. 3's exact exit test."""
    x, y = binary_data(n=500, seed=8)
    solver = KernelCuttingPlane(x, y, 50.0, gamma=0.5, sampling="hybrid", r=20, r_linear=25, eps=1e-3, seed=2)
    history = []
    while not history or history[-1]["mode"] == "constant":
        history.append(solver.step())
        assert len(history) < 2000
    assert not history[-1]["converged"] and [r["added"] for r in history[-4:]] == [0, 0, 0, 0]
    T, U = len(solver.basis), solver._concat()[3].numel()
    before = history[-2]["kernel_evaluations"]
    # the last constant-time step scores its r = 20 draws, then the switch makes its one pass
    assert history[-1]["kernel_evaluations"] == before + 20 * U + 500 * U
    assert solver.cache.shape == (T, 500, 1)
    count = solver.kernel.evaluations
    torch.testing.assert_close(solver.training_scores(), solver._expansion_scores(x), rtol=1e-10, atol=1e-12)
    solver.kernel.evaluations = count
    state = solver.state_dict()
    assert state["mode"] == "linear"
    rest = solver.fit(max_iter=2000)
    assert rest[-1]["converged"] and all(r["mode"] == "linear" for r in rest)
    # linear-time cuts: r_linear draws each, and the exact exit test (the full-pass risk within eps of xi)
    added = sum(r["added"] for r in rest)
    assert added >= 1 and solver.kernel.evaluations == count + added * 500 * 25
    assert solver.objective()["risk"] - solver._xi() <= 1e-3 + 1e-12
    torch.testing.assert_close(solver.training_scores(), solver._expansion_scores(x), rtol=1e-10, atol=1e-12)
    resumed = KernelCuttingPlane(x, y, 50.0, gamma=0.5, sampling="hybrid", r=20, r_linear=25, eps=1e-3)
    resumed.load_state_dict(state)
    assert resumed.mode == "linear" and resumed.fit(max_iter=2000)[-1]["converged"]


@pytest.mark.parametrize("seed", [0, 3])
def test_hybrid_linear_phase_adds_linear_time_cuts(seed):
    """The linear-time phase's exit test uses its own cuts' slack: the constant-time cuts' sampled offsets
    overestimate the risk, and over all cuts the test passed at once, without a single linear-time cut (these
    seeds did so)."""
    x, y = binary_data(n=500, seed=8)
    solver = KernelCuttingPlane(x, y, 50.0, gamma=0.5, sampling="hybrid", r=20, r_linear=25, eps=1e-3, seed=seed)
    history = solver.fit(max_iter=2000)
    linear = [r for r in history if r["mode"] == "linear"]
    assert history[-1]["converged"] and sum(r["added"] for r in linear[1:]) >= 1
    assert 0 < solver.sampled_cuts < len(solver.basis)
    assert solver.state_dict()["sampled_cuts"] == solver.sampled_cuts


def test_state_dict_resumes_the_same_trajectory():
    x, y = binary_data(n=60, seed=5)
    a = KernelCuttingPlane(x, y, 5.0, gamma=0.5, sampling="linear", r=20, eps=1e-4, seed=3)
    for _ in range(5):
        a.step()
    b = KernelCuttingPlane(x, y, 5.0, gamma=0.5, sampling="linear", r=20, eps=1e-4, seed=3)
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        ra, rb = a.step(), b.step()
        assert ra["dual"] == rb["dual"] and ra["violation"] == rb["violation"]
    torch.testing.assert_close(a.decision_function(x), b.decision_function(x), rtol=0, atol=0)


def test_state_dict_resumes_bitwise_after_cuts_were_removed():
    """The cut cache's slots (freed by removed cuts, reused by new ones) are saved: a resumed run sums the same rows
    in the same order (a compacted cache differed from step 12 on, by 5e-17 in the violation)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 3, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    kw = dict(C=50.0, gamma=0.7, sampling="linear", r=15, eps=1e-6, seed=4, inactive_after=3)
    a = KernelCuttingPlane(x, y, **kw)
    removed = sum(a.step()["removed"] for _ in range(20))
    slot = a._cache.slot
    assert removed > 0 and not torch.equal(slot, torch.arange(slot.numel()))  # freed slots reused out of order
    b = KernelCuttingPlane(x, y, **kw)
    b.load_state_dict(a.state_dict())
    for _ in range(40):
        ra, rb = a.step(), b.step()
        assert (ra["violation"], ra["dual"], ra["cuts"]) == (rb["violation"], rb["dual"], rb["cuts"])
    bad = a.state_dict()
    bad["cache_layout"] = bad["cache_layout"].clone().fill_(0)
    with pytest.raises(ValueError, match="cache_layout"):
        b.load_state_dict(bad)


def test_duality_gap_is_the_returned_models_after_fit_stops_on_max_iter():
    """A step certifies the iterate it started from, then adds a cut and re-solves: after fit(max_iter) the last
    report is not the model's (its gap was 33.2 while the model's was 50.8); duality_gap is, by an independent
    primal."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, generator=g, dtype=torch.float64)
    y = torch.where(x[:, 0] * x[:, 1] + 0.2 * torch.randn(200, generator=g, dtype=torch.float64) > 0, 1, -1)
    s = KernelCuttingPlane(x, y, 100.0, gamma=1.0, sampling="exact", eps=1e-6)
    history = s.fit(max_iter=4)
    assert len(history) == 4 and not history[-1]["converged"]
    cert = s.duality_gap()
    f = s.decision_function(x)
    primal = 0.5 * float(s.alpha @ (s.G @ s.alpha)) + 100.0 * float((1 - y * f).clamp_min(0).mean())
    assert cert["gap_exact"] and math.isclose(cert["primal"], primal, rel_tol=1e-10)
    assert cert["gap"] != history[-1]["gap"] and cert["gap"] >= 0
    assert cert["train_error"] == float((s.predict(x) != y).double().mean())
    assert s.fit(max_iter=4) == [] and s.steps_done == 4  # max_iter counts every step, as Pragam's


def test_train_errors_are_predicts_errors():
    """``train_error`` breaks f = 0 as `predict` does (+1; at w = 0 it reported 0.675 for predict's 0.325), and the
    constant-time ``train_error_sampled`` is predict's error on the draws (it was the rate of margin violators)."""
    x, y = binary_data(n=40, seed=2)
    s = KernelCuttingPlane(x, y, 1.0, gamma=0.5, sampling="exact")
    assert s.objective()["train_error"] == float((y != 1).double().mean())
    c = KernelCuttingPlane(x, y, 1.0, gamma=0.5, sampling="constant", r=40, seed=1)
    for _ in range(6):
        r = c.step()
    state = c.generator.get_state()
    draw = torch.randint(40, (40,), generator=c.generator)
    c.generator.set_state(state)
    expect = float((c.predict(x[draw]) != y[draw]).double().mean())
    assert c.step()["train_error_sampled"] == expect
    assert r["train_error_sampled"] <= 1.0


def test_prediction_checks_its_input():
    x, y = binary_data(n=10)
    s = KernelCuttingPlane(x, y, 1.0, gamma=0.5)
    s.fit(max_iter=3)
    for bad, match in ((x[:, :1], "x must be"), (x[0], "x must be"), (x.long(), "x must be"),
                       (x.clone().fill_(float("nan")), "NaN")):
        with pytest.raises(ValueError, match=match):
            s.predict(bad)


def test_fit_limits_are_checked():
    x, y = binary_data(n=10)
    s = KernelCuttingPlane(x, y, 1.0, gamma=0.5)
    for kwargs, err in (({"max_iter": -3}, ValueError), ({"max_iter": 2.5}, TypeError), ({"max_iter": "5"}, TypeError),
                        ({"time_budget": -1.0}, ValueError), ({"time_budget": float("nan")}, ValueError)):
        with pytest.raises(err, match=next(iter(kwargs))):
            s.fit(**kwargs)
    assert s.steps_done == 0 and s.fit(max_iter=0) == []


def test_errors():
    x, y = binary_data(n=10)
    for kwargs, err in (({"num_classes": 3.9}, TypeError), ({"num_classes": "4"}, TypeError),
                        ({"num_classes": 1}, ValueError), ({"seed": 2.5}, TypeError), ({"gamma": True}, ValueError)):
        with pytest.raises(err, match=next(iter(kwargs))):
            KernelCuttingPlane(x, y.clamp_min(0), **kwargs)
    with pytest.raises(ValueError, match="sampling"):
        KernelCuttingPlane(x, y, sampling="rand")
    with pytest.raises(ValueError, match="C must be"):
        KernelCuttingPlane(x, y, C=0.0)
    with pytest.raises(ValueError, match="kernel must be"):
        KernelCuttingPlane(x, y, kernel="poly")
    with pytest.raises(ValueError, match="gamma"):
        KernelCuttingPlane(x, y, gamma=-1.0)
    with pytest.raises(ValueError, match="r must be"):
        KernelCuttingPlane(x, y, r=0)
    with pytest.raises(ValueError, match="y must be"):
        KernelCuttingPlane(x, y[:5])
    with pytest.raises(ValueError, match="multiclass y"):
        KernelCuttingPlane(x, torch.full((10,), 3), num_classes=3)
    with pytest.raises(ValueError, match="NaN"):
        KernelCuttingPlane(x.clone().fill_(float("nan")), y)


def test_binary_labels_with_one_class_stay_binary():
    """-1/+1 labels are binary also when a subset holds only +1 (it was read as a 2-class multiclass problem, with
    another objective and predictions in {0, 1})."""
    x, y = binary_data(n=40, seed=1)
    pos = y == 1
    solver = KernelCuttingPlane(x[pos], y[pos], 1.0, gamma=0.5, eps=1e-3)
    assert solver.binary
    solver.fit(max_iter=200)
    assert set(solver.predict(x).tolist()) <= {-1, 1}


@pytest.mark.parametrize("sampling", ["exact", "constant"])
def test_dual_is_logged_as_an_estimate_with_sampled_cuts(sampling):
    """With sampled cuts the QP's value bounds nothing: ``kernel_cp/dual_estimate``, never ``kernel_cp/dual``."""

    class Writer:
        def __init__(self):
            self.tags = set()

        def add_scalar(self, tag, value, step):
            self.tags.add(tag)

    x, y = binary_data(n=60, seed=3)
    w = Writer()
    svm = KernelCuttingPlane(x, y, lam=1 / 60, gamma=0.5, sampling=sampling, r=20, writer=w)
    svm.fit(max_iter=3)
    certified = "kernel_cp/dual" in w.tags
    assert certified == (sampling == "exact")
    assert ("kernel_cp/dual_estimate" in w.tags) == (sampling != "exact")
