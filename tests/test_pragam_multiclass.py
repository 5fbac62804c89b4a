"""Multiclass Pragam (Crammer-Singer hinge, Q2 a product of simplices): the gap certificate and the O(1/k^2)
bound at every iterate, L against the exact operator norm, the maps against explicit formulas, the optimum
against BCFW on the equivalent feature table, the binary case against the binary solver's objective, sparse
input, resume and errors."""

import pytest
import torch
from conftest import linear_classes

from torchssvm.optim import BCFW, MulticlassPragam, Pragam
from torchssvm.optim.problems import FeatureTableProblem


def make_data(n=90, d=6, K=4, seed=0):
    return linear_classes(n, d, K, 0.8, seed)


def explicit_A(X, y, K):
    """``A (n K, d K)``: row (i, k) is ``phi(x_i, y_i) - phi(x_i, k)`` with one-hot class blocks (W flattened
    row-major as (d, K))."""
    n, d = X.shape
    A = torch.zeros(n, K, d, K, dtype=torch.float64)
    for i in range(n):
        for k in range(K):
            A[i, k, :, int(y[i])] += X[i]
            A[i, k, :, k] -= X[i]
    return A.reshape(n * K, d * K)


def table(X, y, K):
    n, d = X.shape
    F = torch.zeros(n, K, d, K, dtype=torch.float64)
    for k in range(K):
        F[:, k, :, k] = X
    F = F.reshape(n, K, d * K)  # W (d, K) flattened row-major, as explicit_A
    L = torch.ones(n, K, dtype=torch.float64)
    L[torch.arange(n), y] = 0
    return FeatureTableProblem(F, L, y)


@pytest.mark.parametrize("lam", [1e-2, 0.3])
def test_every_iterate_is_certified_within_the_rate_bound(lam):
    X, y = make_data(seed=int(lam * 10))
    n, K = X.shape[0], 4
    s = MulticlassPragam(X, y, lam)
    A = explicit_A(X, y, K)
    true_L = float(torch.linalg.matrix_norm(A, 2)) ** 2 / lam
    assert true_L <= s.L <= 1.011 * true_L
    delta = 1.0 - torch.nn.functional.one_hot(y, K).double()
    r = s.report()
    for k in range(201):
        if k:
            r = s.step()
        bound = 4 * s.L * (1 / (2 * n)) / ((k + 1) * (k + 2))
        assert r["bound"] == pytest.approx(bound, rel=1e-15)
        assert -1e-13 <= r["gap"] <= bound * (1 + 1e-9)
        assert bool((s.alpha >= 0).all())
        torch.testing.assert_close(s.alpha.sum(1), torch.full((n,), 1 / n, dtype=torch.float64), rtol=0, atol=1e-15)
        if k % 40 == 0:
            a = s.alpha.reshape(-1)
            w_hat = (A.T @ a / lam).view(-1, K)
            torch.testing.assert_close(s.w_hat, w_hat, rtol=0, atol=1e-12)
            dual = float(delta.reshape(-1) @ a) - float(w_hat.reshape(-1) @ w_hat.reshape(-1)) * lam / 2
            assert r["dual"] == pytest.approx(dual, abs=1e-12)
            scores = X @ s.w
            risk = (delta + scores - scores.gather(1, y[:, None])).amax(1).mean()
            assert r["primal"] == pytest.approx(lam / 2 * float((s.w * s.w).sum()) + float(risk), abs=1e-12)


def test_optimum_matches_bcfw_on_the_feature_table():
    X, y = make_data(n=60, seed=3)
    lam = 0.05
    ref = BCFW(table(X, y, 4), lam=lam, step="pairwise")
    ref.fit(max_passes=3000, gap_tol=1e-9)
    P = ref.duality_gap()["primal"]
    s = MulticlassPragam(X, y, lam)
    s.fit(gap_tol=1e-6, max_iter=20000)
    assert s.report()["gap"] <= 1e-6
    assert s.report()["primal"] == pytest.approx(P, abs=2e-6)
    assert s.report()["dual"] <= P + 1e-9  # weak duality against the certified optimum


def test_two_classes_reach_the_binary_svm_optimum_scaled():
    """With K = 2 and ``w_1 = -w_0 = v / 2`` the Crammer-Singer hinge is the binary hinge of ``v``:
    ``J_mc(W) = lam/4 ||v||^2 + mean [1 - y v^T x]_+``, the binary objective at ``lam / 2``."""
    X, y = make_data(n=80, K=2, seed=5)
    lam = 0.1
    mc = MulticlassPragam(X, y, lam)
    mc.fit(gap_tol=1e-7, max_iter=20000)
    b = Pragam(X, (2 * y - 1).double(), lam / 2)
    b.fit(gap_tol=1e-7, max_iter=20000)
    assert mc.report()["primal"] == pytest.approx(b.report()["primal"], abs=3e-7)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_X_gives_the_dense_trajectory(layout):
    X, y = make_data(n=40, seed=1)
    X[X.abs() < 0.7] = 0
    dense = MulticlassPragam(X, y, 0.1)
    sp = MulticlassPragam(X.to_sparse() if layout == "coo" else X.to_sparse_csr(), y, 0.1)
    assert sp.L == pytest.approx(dense.L, rel=1e-12)
    for _ in range(20):
        rd, rs = dense.step(), sp.step()
    assert rs["gap"] == pytest.approx(rd["gap"], rel=1e-9, abs=1e-13)
    torch.testing.assert_close(sp.w, dense.w, rtol=1e-10, atol=1e-12)
    assert torch.equal(sp.predict(X), dense.predict(X))


def test_state_dict_resumes_and_predict():
    X, y = make_data(n=50, seed=2)
    a = MulticlassPragam(X, y, 0.1)
    for _ in range(10):
        a.step()
    state = a.state_dict()
    b = MulticlassPragam(X, y, 0.1)
    b.load_state_dict(state)
    ra, rb = a.step(), b.step()
    assert ra["gap"] == rb["gap"] and torch.equal(a.w, b.w)
    assert a.tag == "pragam_multiclass"
    pred = a.predict(X)
    assert pred.dtype == torch.int64 and torch.equal(pred, (X @ a.w).argmax(1))


def test_rejects_bad_arguments():
    X, y = make_data(n=10)
    with pytest.raises(TypeError, match="integer class labels"):
        MulticlassPragam(X, y.double(), 0.1)
    y3 = y.clone()
    y3[0] = 3
    with pytest.raises(ValueError, match=r"labels in \[0, 3\)"):
        MulticlassPragam(X, y3, 0.1, num_classes=3)
    y3[0] = -1
    with pytest.raises(ValueError, match="labels in"):
        MulticlassPragam(X, y3, 0.1)
    with pytest.raises(ValueError, match="num_classes must be"):
        MulticlassPragam(X, y, 0.1, num_classes=1)
    with pytest.raises(ValueError, match="single class"):
        MulticlassPragam(X, torch.zeros(10, dtype=torch.long), 0.1)
    with pytest.raises(ValueError, match="y must have shape"):
        MulticlassPragam(X, y[:5], 0.1)
    with pytest.raises(ValueError, match="X must be a tensor of shape"):
        MulticlassPragam(X, y, 0.1).predict(X[:, :2])
