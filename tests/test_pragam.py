"""Pragam and Pragam-b (seed 003; note 003 sections 2.1-2.3 and 6.1, 6.4): the gap certificate and the
O(1/k^2) bound at every iterate, mu_k, feasibility, the maps and the dual against explicit formulas, the exact
bias minimization against brute force, the optimum against liblinear / libsvm, resume, sparse input, logging
and argument errors."""

import math

import numpy as np
import pytest
import torch
from conftest import ScalarRecorder, needs_triton

from torchssvm.optim.primal.pragam import Pragam, best_bias


def make_data(n=200, d=30, seed=0, shift=0.5):
    g = torch.Generator().manual_seed(seed)
    y = torch.where(torch.rand(n, generator=g) < 0.45, -1.0, 1.0).double()
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    X = X + shift * y[:, None] * torch.randn(d, generator=g, dtype=torch.float64)
    return X, y


def brute_bias(scores, y):
    """min over every breakpoint of the mean hinge, O(n^2)."""
    r = 1.0 - y * scores
    c = y * r
    F = (r[None, :] - y[None, :] * c[:, None]).clamp_min(0).mean(1)
    return float(F.min())


def explicit_dual(X, y, lam, alpha):
    """The standard SVM dual with the Gram matrix: sum alpha - 1/(2 lam) alpha^T Y K Y alpha."""
    ya = y * alpha
    return float(alpha.sum() - ya @ (X @ X.T) @ ya / (2 * lam))


def explicit_primal(X, y, lam, w, bias):
    s = X @ w
    risk = brute_bias(s, y) if bias else float((1 - y * s).clamp_min(0).mean())
    return float(lam / 2 * (w @ w)) + risk


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lam", [1e-2, 1e-1, 1.0])
def test_every_iterate_is_certified_within_the_rate_bound(bias, lam):
    X, y = make_data(seed=int(lam * 100) + bias)
    n = X.shape[0]
    s = Pragam(X, y, lam, bias=bias)
    true_L = float(torch.linalg.matrix_norm(X, 2)) ** 2 / lam
    assert true_L <= s.L <= 1.011 * true_L
    passes = s.passes
    r = s.report()
    for k in range(301):
        if k:
            r = s.step()
            assert r["passes"] == passes + 4 * k
        assert r["iteration"] == s.iteration == k
        assert r["gap_exact"]
        bound = 4 * s.L * (1 / (2 * n)) / ((k + 1) * (k + 2))
        assert r["mu"] == pytest.approx(4 * s.L / ((k + 1) * (k + 2)), rel=1e-15)
        assert r["bound"] == pytest.approx(bound, rel=1e-15)
        assert -1e-13 <= r["gap"] <= bound * (1 + 1e-9)
        assert r["gap"] == r["primal"] - r["dual"]
        assert (s.alpha >= 0).all() and (s.alpha <= 1 / n).all()
        if bias:
            assert abs(float(y @ s.alpha)) <= 1e-15
        if k % 25 == 0:
            torch.testing.assert_close(s.w_hat, X.T @ (y * s.alpha) / lam, rtol=0, atol=1e-12)
            assert r["dual"] == pytest.approx(explicit_dual(X, y, lam, s.alpha), rel=0, abs=1e-12)
            assert r["primal"] == pytest.approx(explicit_primal(X, y, lam, s.w, bias), rel=0, abs=1e-12)
            torch.testing.assert_close(s.Xw, X @ s.w, rtol=0, atol=1e-12)


def test_mu_schedule_is_the_recursion():
    """mu_0 = 2L and mu_{k+1} = (1 - tau_k) mu_k, tau_k = 2/(k+3), equal the closed form used."""
    X, y = make_data(n=20, d=4)
    s = Pragam(X, y, 0.1)
    mu = 2 * s.L
    assert s.mu == mu
    for k in range(50):
        mu *= 1 - 2 / (k + 3)
        s.step()
        assert s.mu == pytest.approx(mu, rel=1e-13)


@pytest.mark.parametrize("bias", [False, True])
def test_maps_and_weak_duality_on_random_points(bias):
    X, y = make_data(n=60, d=8, seed=3)
    lam = 0.05
    s = Pragam(X, y, lam, bias=bias)
    g = torch.Generator().manual_seed(7)
    for _ in range(20):
        alpha = s._project(torch.rand(60, generator=g, dtype=torch.float64) / 30)
        w = torch.randn(8, generator=g, dtype=torch.float64)
        torch.testing.assert_close(s.w_of_alpha(alpha), X.T @ (y * alpha) / lam, rtol=0, atol=1e-13)
        assert s.dual_value(alpha) == pytest.approx(explicit_dual(X, y, lam, alpha), rel=0, abs=1e-12)
        assert s.primal_value(w) == pytest.approx(explicit_primal(X, y, lam, w, bias), rel=0, abs=1e-12)
        assert s.primal_value(w) >= s.dual_value(alpha)
        assert s.primal_value(s.w_of_alpha(alpha)) >= s.dual_value(alpha) - 1e-15


@pytest.mark.parametrize("seed", range(6))
def test_best_bias_is_the_exact_minimizer(seed):
    g = torch.Generator().manual_seed(seed)
    n = 1 + 17 * seed
    y = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    s = torch.randn(n, generator=g, dtype=torch.float64)
    if seed % 2:
        s = torch.randint(-2, 3, (n,), generator=g).double()  # many tied breakpoints
    if seed == 4:
        y[:] = 1.0  # one class: the largest breakpoint zeroes every term
    b, value = best_bias(s, y)
    assert value == pytest.approx(brute_bias(s, y), rel=0, abs=1e-14)
    assert value == pytest.approx(float((1 - y * (s + b)).clamp_min(0).mean()), rel=0, abs=1e-15)
    grid = torch.linspace(b - 3, b + 3, 601, dtype=torch.float64)
    F = (1 - y[None, :] * (s[None, :] + grid[:, None])).clamp_min(0).mean(1)
    assert float(F.min()) >= value - 1e-14


def test_optimum_matches_liblinear_without_bias():
    from sklearn.svm import LinearSVC

    X, y = make_data(n=100, d=10, seed=5)
    lam = 1.0
    s = Pragam(X, y, lam)
    hist = s.fit(gap_tol=1e-7, max_iter=5000)
    assert hist[-1]["gap"] <= 1e-7
    clf = LinearSVC(loss="hinge", fit_intercept=False, C=1 / (lam * 100), tol=1e-10, max_iter=10**6, dual=True)
    clf.fit(X.numpy(), y.numpy())
    J_ref = s.primal_value(torch.tensor(clf.coef_[0]))
    assert J_ref >= hist[-1]["dual"] - 1e-12
    assert abs(hist[-1]["primal"] - J_ref) <= 1e-6


def test_optimum_matches_libsvm_with_bias():
    """Pragam-b against libsvm's SVC (linear kernel, unregularized intercept): the primal value, the bias and the
    dual (libsvm's dual variables a in [0, C] are alpha / lam)."""
    from sklearn.svm import SVC

    X, y = make_data(n=100, d=10, seed=6)
    lam = 1.0
    s = Pragam(X, y, lam, bias=True)
    hist = s.fit(gap_tol=1e-7, max_iter=5000)
    assert hist[-1]["gap"] <= 1e-7
    clf = SVC(kernel="linear", C=1 / (lam * 100), tol=1e-12).fit(X.numpy(), y.numpy())
    J_ref = s.primal_value(torch.tensor(clf.coef_[0]))
    assert abs(hist[-1]["primal"] - J_ref) <= 1e-6
    a = np.zeros(100)
    a[clf.support_] = np.abs(clf.dual_coef_[0])
    assert abs(s.dual_value(torch.tensor(a * lam)) - hist[-1]["dual"]) <= 1e-6
    assert abs(float(y @ torch.tensor(a))) <= 1e-10
    assert s.b == pytest.approx(float(clf.intercept_[0]), abs=1e-3)


@pytest.mark.parametrize("bias", [False, True])
def test_state_dict_resumes_the_same_trajectory(bias):
    X, y = make_data(n=50, d=6, seed=8)
    a = Pragam(X, y, 0.1, bias=bias)
    for _ in range(10):
        a.step()
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.state_dict().items()}
    # another start and another L: everything comes from the state (the report after the load too, whose mu and
    # bound once took the new solver's own L)
    b = Pragam(X, y, 0.1, bias=bias, seed=123, L=2 * a.L)
    b.load_state_dict(state)
    assert b.report() == a.report() and b.L == a.L
    for _ in range(15):
        ra, rb = a.step(), b.step()
        assert {k: v for k, v in ra.items() if k != "time"} == {k: v for k, v in rb.items() if k != "time"}
    for k in ("alpha", "w", "w_hat", "Xw"):
        assert torch.equal(getattr(a, k), getattr(b, k))
    with pytest.raises(ValueError, match="lam"):
        Pragam(X, y, 0.2, bias=bias).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict({"alpha": state["alpha"]})


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_X_gives_the_dense_trajectory(layout):
    X, y = make_data(n=40, d=12, seed=9)
    X[torch.rand(X.shape, generator=torch.Generator().manual_seed(1)) < 0.6] = 0
    Xs = X.to_sparse_coo() if layout == "coo" else X.to_sparse_csr()
    dense, sparse = Pragam(X, y, 0.1, bias=True), Pragam(Xs, y, 0.1, bias=True)
    assert sparse.L == pytest.approx(dense.L, rel=1e-10)
    for _ in range(20):
        rd, rs = dense.step(), sparse.step()
        assert rs["gap"] == pytest.approx(rd["gap"], rel=1e-8, abs=1e-13)
    torch.testing.assert_close(sparse.w, dense.w, rtol=0, atol=1e-12)
    torch.testing.assert_close(sparse.decision_function(Xs), dense.decision_function(X), rtol=0, atol=1e-12)


def test_fit_predict_and_stopping_rules():
    X, y = make_data(n=80, d=5, seed=10, shift=2.0)
    s = Pragam(X, y, 0.01, bias=True)
    hist = s.fit(max_iter=40)
    assert len(hist) == 40 and s.iteration == 40
    assert s.fit(max_iter=40) == []  # max_iter counts iterations from the start
    hist = s.fit(gap_tol=1e-3)
    assert hist[-1]["gap"] <= 1e-3 and all(r["gap"] > 1e-3 for r in hist[:-1])
    seen = []
    s.fit(max_iter=s.iteration + 3, callback=seen.append)
    assert [r["iteration"] for r in seen] == [s.iteration - 2, s.iteration - 1, s.iteration]
    s.fit(time_budget=0.0)
    f = s.decision_function(X)
    torch.testing.assert_close(f, X @ s.w + s.b, rtol=0, atol=1e-13)
    pred = s.predict(X)
    assert pred.dtype == torch.int64 and set(pred.tolist()) <= {-1, 1}
    assert (pred == torch.where(f >= 0, 1, -1)).all()
    assert float((pred.double() == y).double().mean()) > 0.9
    with pytest.raises(ValueError, match="at least one"):
        s.fit()


def test_writer_gets_scalars():
    X, y = make_data(n=30, d=4, seed=11)
    for bias, tag in ((False, "pragam"), (True, "pragam_b")):
        w = ScalarRecorder()
        s = Pragam(X, y, 0.1, bias=bias, writer=w)
        s.step()
        s.step()
        for key in ("primal", "dual", "gap", "exact_gap", "bound", "mu", "passes", "time"):
            assert [step for step, _ in w.scalars[f"{tag}/{key}"]] == [0, 1, 2]
        assert w.scalars[f"{tag}/gap"][-1][1] == s.report()["gap"]
        # a solver built to resume the run logs only the iterates it computes (iterate 0 was logged already)
        resumed = Pragam(X, y, 0.1, bias=bias, writer=w)
        resumed.load_state_dict(s.state_dict())
        resumed.step()
        assert [step for step, _ in w.scalars[f"{tag}/primal"]] == [0, 1, 2, 3]


@needs_triton()
def test_triton_projection_backend_matches_torch():
    X, y = make_data(n=24, d=4, seed=12)
    a = Pragam(X, y, 0.1, bias=True, backend="torch")
    b = Pragam(X, y, 0.1, bias=True, backend="triton")
    for _ in range(2):
        ra, rb = a.step(), b.step()
        assert rb["gap"] == pytest.approx(ra["gap"], rel=1e-9, abs=1e-13)
    torch.testing.assert_close(b.alpha, a.alpha, rtol=0, atol=1e-13)


def test_rejects_bad_arguments():
    X, y = make_data(n=10, d=3)
    with pytest.raises(TypeError, match="X must be"):
        Pragam(X.numpy(), y, 0.1)
    with pytest.raises(ValueError, match="X must have shape"):
        Pragam(X[:, 0], y, 0.1)
    with pytest.raises(TypeError, match="X must be a floating"):
        Pragam(X.long(), y, 0.1)
    bad = X.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        Pragam(bad, y, 0.1)
    with pytest.raises(ValueError, match="y must have shape"):
        Pragam(X, y[:5], 0.1)
    with pytest.raises(ValueError, match="labels -1 and \\+1"):
        Pragam(X, (y > 0).long(), 0.1)
    with pytest.raises(TypeError, match="y must be"):
        Pragam(X, y.tolist(), 0.1)
    for lam in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="lam"):
            Pragam(X, y, lam)
    with pytest.raises(TypeError, match="lam"):
        Pragam(X, y, "big")
    with pytest.raises(TypeError, match="bias"):
        Pragam(X, y, 0.1, bias=1)
    for L in (0.0, -2.0, math.inf, "x"):
        with pytest.raises(ValueError, match="L must be"):
            Pragam(X, y, 0.1, L=L)
    with pytest.raises(ValueError, match="power_iters"):
        Pragam(X, y, 0.1, power_iters=0)
    with pytest.raises(TypeError, match="writer"):
        Pragam(X, y, 0.1, writer=object())
    with pytest.raises(ValueError, match="backend"):
        Pragam(X, y, 0.1, backend="cuda")
    L = float(torch.linalg.matrix_norm(X, 2)) ** 2 / 0.1
    s = Pragam(X, y, 0.1, L=L)
    assert s.L == L and s.report()["passes"] == 3  # no estimate: only the initialization
    # an L below the Lipschitz constant ||A||^2 / lam of grad D is refused at once (by the Rayleigh quotient of w_0),
    # not by the solver's own checkpoint later (it ran, and its state was refused at the resume)
    for frac in (0.01, 0.9):
        with pytest.raises(ValueError, match=r"^L = .* is below \|\|A w\|\|\^2"):
            Pragam(X, y, 0.1, L=frac * L)
    with pytest.raises(ValueError, match="X must be a tensor of shape"):
        s.decision_function(torch.zeros(4, 2, dtype=torch.float64))
