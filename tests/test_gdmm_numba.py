"""The compiled sequential passes of chain GDMM (`optim/gdmm/gdmm_numba.py`): the same iterates as the tensor code
(up to rounding; same permutations), an exact block minimization at every factor (the Lagrangian never goes
up), widening of full active sets, and the engine rules."""

import math

import numpy as np
import pytest
import torch
from conftest import needs_numba
from torchssvm.kernels import _numba

import torchssvm as ts
from torchssvm.optim import GDMM
from torchssvm.optim.gdmm import gdmm_numba as gn
from torchssvm.structures import Chain

pytestmark = needs_numba()


def _model(K, D, **kw):
    return ts.models.LinearChainModel(D, K, dtype=torch.float64, **kw)


def _dense_state(g):
    K = g.K
    return {
        "alpha": g._dense(g.uidx, g.uval, K),
        "beta": g._dense(g.bidx, g.bval, K * K),
        "W": g.W, "v": g.v, "lam_L": g.lam_L, "lam_R": g.lam_R,
    }


def _sparse_data(n=8, T=6, Dv=9, K=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=gen)
    ids = torch.randint(0, Dv, (n, T, 3), generator=gen)
    ids[:, :, 2] = torch.where(ids[:, :, 2] == ids[:, :, 0], -1, ids[:, :, 2])
    ids[:, :, 1] = torch.where(ids[:, :, 1] == ids[:, :, 0], -1, ids[:, :, 1])
    vals = torch.rand(n, T, 3, generator=gen, dtype=torch.float64) + 0.5
    y = torch.randint(0, K, (n, T), generator=gen)
    pad = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)
    y[pad] = -1
    ids[pad] = -1
    x = ts.models.TokenFeatures(ids, vals)
    return ts.data.SequenceDataset(x, y, lengths, num_labels=K, num_features=Dv), Dv, K


@pytest.mark.parametrize("kind, update", [("dense", "exact"), ("sparse", "exact"), ("dense", "step"),
                                          ("sparse", "step")])
@pytest.mark.parametrize("C, rho", [(1.0, 1.0), (0.3, 0.2)])
def test_same_iterates_as_the_tensor_code(kind, update, C, rho):
    if kind == "dense":
        K, D = 6, 4
        data = ts.data.synthetic_chain("train", n=7, num_labels=K, num_features=D, max_length=6, seed=2)
        make = lambda: _model(K, D)  # noqa: E731
    else:
        data, D, K = _sparse_data()
        make = lambda: _model(K, D, sparse=True)  # noqa: E731
    st = Chain(K, normalize=False)
    runs = {}
    for engine in ("torch", "numba"):
        g = GDMM(make(), data, C=C, rho=rho, structure=st, batch_size=1, primal_every=0, engine=engine,
                 bigram_update=update)
        assert g.engine == engine
        reports = [g.step() for _ in range(6)]
        runs[engine] = (g, reports)
    (a, ra), (b, rb) = runs["torch"], runs["numba"]
    sa, sb = _dense_state(a), _dense_state(b)
    for key in sa:
        torch.testing.assert_close(sb[key], sa[key], rtol=0, atol=1e-10, msg=key)
    for x, y in zip(ra, rb):
        assert math.isclose(x["dual"], y["dual"], rel_tol=1e-10, abs_tol=1e-12)
        assert math.isclose(x["infeasibility"], y["infeasibility"], rel_tol=1e-8, abs_tol=1e-12)
        assert x["visits_unigram"] == y["visits_unigram"] and x["visits_bigram"] == y["visits_bigram"]
        assert x["inner_bigram"] == y["inner_bigram"]  # the same face changes
        assert (x["inner_bigram"] > 1) == (update == "exact")
    assert torch.equal(a.generator.get_state(), b.generator.get_state())  # the same permutations were drawn
    assert a.uidx.shape[1] > 1 and a.bidx.shape[1] > 1  # the active sets grew (and were widened)
    b._write_model()
    w = torch.cat([p.detach().reshape(-1) for p in b.problem.model.parameters()])
    torch.testing.assert_close(w, a.flat_w(), rtol=0, atol=1e-10)


def _call_token(g, t):
    ids, vals = g._x_numba
    return gn.token_pass(torch.tensor([t]).numpy(), 0, g.uidx.numpy(), g.uval.numpy(), g.bidx.numpy(),
                         g.bval.numpy(), g.W.numpy(), g.v.numpy(), g.lam_L.numpy(), g.lam_R.numpy(), ids, vals,
                         g.x_sqnorm.numpy(), g.deg.numpy(), g.y.numpy(), g.delta.numpy(), g.tok_left_edge.numpy(),
                         g.tok_right_edge.numpy(), g.C, g.rho, g.drop_tol)


def _call_edge(g, e):
    return gn.edge_pass(torch.tensor([e]).numpy(), 0, g.uidx.numpy(), g.uval.numpy(), g.bidx.numpy(),
                        g.bval.numpy(), g.v.numpy(), g.lam_L.numpy(), g.lam_R.numpy(), g.edge_left.numpy(),
                        g.edge_right.numpy(), g.ybig.numpy(), g.C, g.rho, g.drop_tol, g.bigram_update == "exact",
                        np.zeros(1, dtype=np.int64))


@pytest.mark.parametrize("update", ["step", "exact"])
def test_every_factor_update_lowers_the_lagrangian_and_widening_resumes(update):
    K, D = 5, 3
    data = ts.data.synthetic_chain("train", n=6, num_labels=K, num_features=D, max_length=5, seed=7)
    g = GDMM(_model(K, D), data, C=0.7, rho=0.6, structure=Chain(K, normalize=False), batch_size=1,
             primal_every=0, engine="numba", bigram_update=update)
    g.step()  # builds the feature views
    widened = 0
    for _ in range(3):
        L0 = g.lagrangian()
        for t in torch.randperm(g.N).tolist():
            while _call_token(g, t) == 0:  # full: untouched, widen and call again
                assert g.lagrangian() == L0
                g._widen("u")
                widened += 1
            L1 = g.lagrangian()
            assert L1 <= L0 + 1e-12  # the exact block minimizer on the active set
            L0 = L1
        for e in torch.randperm(g.E).tolist():
            while _call_edge(g, e) == 0:
                g._widen("b")
                widened += 1
            L1 = g.lagrangian()
            assert L1 <= L0 + 1e-12
            L0 = L1
        g._multiplier_step()
    assert widened > 0
    # the duals stay on their shifted simplices and W, v equal their sums
    for idx, val, top in ((g.uidx, g.uval, g.y), (g.bidx, g.bval, g.ybig)):
        ok = idx >= 0
        assert bool(ok[:, 0].all()) and torch.equal(idx[:, 0], top)
        assert torch.allclose((val * ok).sum(1), torch.zeros(idx.shape[0], dtype=torch.float64), atol=1e-12)
        assert bool((val[:, 0] <= g.C + 1e-12).all() and (val[:, 0] >= -1e-12).all())
        assert bool((val[:, 1:][ok[:, 1:]] <= 1e-12).all())
    x = g.x
    W = x.t() @ g._dense(g.uidx, g.uval, K)
    v = g._dense(g.bidx, g.bval, K * K).sum(0).view(K, K)
    torch.testing.assert_close(g.W, W, rtol=0, atol=1e-12)
    torch.testing.assert_close(g.v, v, rtol=0, atol=1e-12)


def test_engine_rules(monkeypatch):
    K, D = 3, 3
    data = ts.data.synthetic_chain("train", n=3, num_labels=K, num_features=D, max_length=4, seed=1)
    assert GDMM(_model(K, D), data, batch_size=1).engine == "numba"  # auto on CPU
    assert GDMM(_model(K, D), data, batch_size=4).engine == "torch"  # block-Jacobi: the tensor code
    assert GDMM(_model(K, D), data, batch_size=1, bigram_search="index").engine == "torch"
    with pytest.raises(ValueError, match="engine must be"):
        GDMM(_model(K, D), data, engine="cuda")
    with pytest.raises(ValueError, match="engine='numba'.*batch_size=1"):
        GDMM(_model(K, D), data, batch_size=2, engine="numba")
    with pytest.raises(ValueError, match="engine='numba'"):
        GDMM(_model(K, D), data, batch_size=1, fmo="sampled", nu=2, engine="numba")
    monkeypatch.setattr(_numba, "numba", None)  # as without numba installed
    assert GDMM(_model(K, D), data, batch_size=1).engine == "torch"
    with pytest.raises(RuntimeError, match="numba"):
        GDMM(_model(K, D), data, batch_size=1, engine="numba")
