"""The bigram factorwise maximization oracle of GDMM (`torchssvm.optim.gdmm.factor_oracles`): both methods
against an independent dense reference in float64 (values to 1e-12; any maximizer on ties), over sparse,
dense, integer (tied), all-negative tables, dense and sparse messages of both signs, exclusions that
remove the maximizers, fully excluded factors, tiny K and the brute-force fallback; `BigramIndex.refresh`
against a fresh index; the visit count; and the input checks."""

import pytest
import torch

from torchssvm.optim.gdmm.factor_oracles import BigramIndex, bigram_fmo

F64 = torch.float64
NINF = float("-inf")


def reference(v, mL, mR, rho, exclude=None):
    """max over allowed pairs of v + rho * (mL + mR), factor by factor, (B,) (-inf if nothing is allowed)."""
    g = v[None] + rho * (mL[:, :, None] + mR[:, None, :])
    g = g.reshape(g.shape[0], -1).clone()
    if exclude is not None:
        for b in range(exclude.shape[0]):
            for p in exclude[b].tolist():
                if p >= 0:
                    g[b, p] = NINF
    return g.max(dim=1).values


def check(v, mL, mR, rho, exclude=None, **kw):
    """Both methods agree with `reference`; returned pairs are allowed and score their value."""
    K = v.shape[0]
    want = reference(v, mL, mR, rho, exclude)
    out = {}
    for method in ("brute", "index"):
        index = BigramIndex(v) if method == "index" else None
        k1, k2, value, visited = bigram_fmo(v, mL, mR, rho, exclude, index=index, method=method, **kw)
        assert k1.dtype == k2.dtype == visited.dtype == torch.long and value.dtype == v.dtype
        none = want == NINF
        assert torch.equal(value == NINF, none), method
        assert torch.allclose(value[~none], want[~none], rtol=0, atol=1e-12), method
        assert (k1[none] == -1).all() and (k2[none] == -1).all()
        b = (~none).nonzero(as_tuple=True)[0]
        assert ((k1[b] >= 0) & (k1[b] < K) & (k2[b] >= 0) & (k2[b] < K)).all()
        at = v[k1[b], k2[b]] + rho * (mL[b, k1[b]] + mR[b, k2[b]])
        assert torch.allclose(at, value[b], rtol=0, atol=1e-12), method
        if exclude is not None:
            assert not (exclude[b] == (k1[b] * K + k2[b])[:, None]).any(), f"{method} returned an excluded pair"
        if method == "brute":
            assert (visited == K * K).all()
        out[method] = (k1, k2, value, visited)
    return out


def sparse_messages(B, K, nnz, g, scale=1.0):
    m = torch.zeros(B, K, dtype=F64)
    m.scatter_(1, torch.randint(0, K, (B, nnz), generator=g), scale * torch.randn(B, nnz, generator=g, dtype=F64))
    return m


def sparse_table(K, nnz, g):
    v = torch.zeros(K, K, dtype=F64)
    v.view(-1)[torch.randint(0, K * K, (nnz,), generator=g)] = torch.randn(nnz, generator=g, dtype=F64)
    return v


def random_exclude(B, K, A, g, pad=0.3):
    ex = torch.randint(0, K * K, (B, A), generator=g)
    return ex.masked_fill(torch.rand(B, A, generator=g) < pad, -1)


@pytest.mark.parametrize("seed", range(4))
def test_sparse_table_sparse_messages(seed):
    g = torch.Generator().manual_seed(seed)
    K, B = 60, 40
    v = sparse_table(K, 3 * K, g)
    check(v, sparse_messages(B, K, 3, g), sparse_messages(B, K, 3, g), 0.7, random_exclude(B, K, 4, g))
    check(v, sparse_messages(B, K, 3, g, 5.0), sparse_messages(B, K, 3, g, 5.0), 2.0)  # large messages


@pytest.mark.parametrize("seed", range(3))
def test_dense_table_and_dense_messages(seed):
    g = torch.Generator().manual_seed(seed)
    K, B = 35, 30
    v = torch.randn(K, K, generator=g, dtype=F64)
    check(v, sparse_messages(B, K, 2, g), sparse_messages(B, K, 2, g), 0.3, random_exclude(B, K, 6, g))
    # messages nonzero on most labels: S_L, S_R cover nearly everything
    mL, mR = torch.randn(B, K, generator=g, dtype=F64), torch.randn(B, K, generator=g, dtype=F64)
    mL[torch.rand(B, K, generator=g) < 0.2] = 0
    check(v, mL, mR, 1.3, random_exclude(B, K, 5, g))


def test_integer_values_with_many_ties():
    g = torch.Generator().manual_seed(5)
    K, B = 30, 50
    v = torch.randint(-2, 3, (K, K), generator=g).to(F64)
    v[torch.rand(K, K, generator=g) < 0.7] = 0
    mL = torch.randint(-1, 2, (B, K), generator=g).to(F64) * (torch.rand(B, K, generator=g) < 0.1)
    mR = torch.randint(-1, 2, (B, K), generator=g).to(F64) * (torch.rand(B, K, generator=g) < 0.1)
    for rho in (1.0, 0.5, 3.0):
        check(v, mL, mR, rho, random_exclude(B, K, 3, g))
    check(torch.zeros(K, K, dtype=F64), mL, mR, 1.0)  # every pair ties wherever messages vanish


def test_all_negative_table_and_signed_messages():
    g = torch.Generator().manual_seed(6)
    K, B = 40, 40
    v = -torch.rand(K, K, generator=g, dtype=F64) - 0.1
    check(v, sparse_messages(B, K, 4, g), sparse_messages(B, K, 4, g), 0.5, random_exclude(B, K, 3, g))
    check(v, -sparse_messages(B, K, 4, g).abs(), sparse_messages(B, K, 4, g).abs(), 1.0)
    check(v, torch.zeros(B, K, dtype=F64), torch.zeros(B, K, dtype=F64), 1.0)


def test_excluding_the_maximizers():
    g = torch.Generator().manual_seed(7)
    K, B = 30, 25
    v = sparse_table(K, 4 * K, g)
    mL, mR = sparse_messages(B, K, 2, g), sparse_messages(B, K, 2, g)
    picked = []
    for _ in range(4):  # exclude the current maximizer four times over, plus padding and random pairs
        ex = torch.stack(picked, 1) if picked else torch.full((B, 0), -1, dtype=torch.long)
        k1, k2, _, _ = bigram_fmo(v, mL, mR, 0.9, ex, method="brute")
        picked.append(k1 * K + k2)
    ex = torch.cat([torch.stack(picked, 1), random_exclude(B, K, 3, g)], dim=1)
    check(v, mL, mR, 0.9, ex)
    check(v, mL, mR, 0.9, ex.int())  # any integer dtype


def test_every_pair_excluded():
    g = torch.Generator().manual_seed(8)
    K, B = 3, 4
    v = torch.randn(K, K, generator=g, dtype=F64)
    ex = torch.full((B, K * K), -1, dtype=torch.long)
    ex[0] = torch.arange(K * K)  # factor 0: nothing allowed
    ex[1, :-1] = torch.arange(K * K - 1)  # factor 1: only the last pair
    out = check(v, sparse_messages(B, K, 1, g), sparse_messages(B, K, 1, g), 1.0, ex)
    for k1, k2, value, _ in out.values():
        assert k1[0] == k2[0] == -1 and value[0] == NINF
        assert k1[1] == K - 1 and k2[1] == K - 1


def test_tiny_label_sets():
    g = torch.Generator().manual_seed(9)
    v1 = torch.tensor([[0.5]], dtype=F64)
    m = torch.tensor([[0.0], [2.0], [0.0]], dtype=F64)
    out = check(v1, m, m.flip(0), 1.5, torch.tensor([[-1], [-1], [0]]))
    assert out["index"][2][0] == 0.5 and out["index"][2][2] == NINF
    v2 = torch.randn(2, 2, generator=g, dtype=F64)
    for _ in range(5):
        mL, mR = torch.randn(6, 2, generator=g, dtype=F64), torch.randn(6, 2, generator=g, dtype=F64)
        mL[::2] = 0
        check(v2, mL, mR, 0.8, random_exclude(6, 2, 2, g))
    empty = torch.zeros(0, 2, dtype=F64)
    k1, k2, value, visited = bigram_fmo(v2, empty, empty, 1.0, index=BigramIndex(v2))
    assert k1.shape == k2.shape == value.shape == visited.shape == (0,)


def test_top_rows_one_falls_back_and_stays_exact():
    g = torch.Generator().manual_seed(10)
    K, B = 40, 30
    v = torch.randn(K, K, generator=g, dtype=F64)
    mL, mR = sparse_messages(B, K, 3, g), sparse_messages(B, K, 3, g)
    # the best column of each of the top rows is one that every factor's S_R holds
    hot = 7
    v[:, hot] += 10.0
    mR[:, hot] = 0.25
    # a fallback counts top_rows + K rows on top of S_L and S_R; a certified scan at most top_rows
    out = check(v, mL, mR, 1.0, random_exclude(B, K, 2, g), top_rows=1)
    assert (out["index"][3] >= (K + 1) * K).any(), "the fallback path was not exercised"
    out = check(v, mL, mR, 1.0, top_rows=K + 5)  # more rows than exist: all scanned, never a fallback
    lines = (mL != 0).sum(1) + (mR != 0).sum(1)
    assert (out["index"][3] <= (lines + K) * K).all()


def test_refresh_matches_a_fresh_index():
    g = torch.Generator().manual_seed(11)
    K, B = 50, 20
    v = sparse_table(K, 3 * K, g)
    index = BigramIndex(v)
    assert index.refresh_visits == K * K
    rows = torch.tensor([3, 17, 17, 40])
    cols = torch.tensor([0, 17, 49])
    r, c = torch.meshgrid(rows, cols, indexing="ij")
    v[r, c] = torch.randn(r.shape, generator=g, dtype=F64) * 3
    v[rows[0], cols[1]] = -100.0  # lowers a maximum
    index.refresh(rows=rows, cols=cols)
    assert index.refresh_visits == (3 + 3) * K  # duplicates read once
    fresh = BigramIndex(v.clone())
    for name in ("row_max", "col_max", "row_order", "col_order"):
        assert torch.equal(getattr(index, name), getattr(fresh, name)), name
    ar = torch.arange(K)
    assert torch.equal(v[ar, index.row_arg], index.row_max) and torch.equal(v[index.col_arg, ar], index.col_max)
    mL, mR = sparse_messages(B, K, 2, g), sparse_messages(B, K, 2, g)
    _, _, value, _ = bigram_fmo(v, mL, mR, 1.0, index=index)
    assert torch.allclose(value, reference(v, mL, mR, 1.0), rtol=0, atol=1e-12)
    v[:, 5] = 4.0  # a whole column: every row maximum may move, so refresh all rows
    index.refresh(cols=torch.tensor([5]))
    assert index.refresh_visits == (K + 1) * K
    assert torch.equal(index.row_max, BigramIndex(v.clone()).row_max)
    index.refresh()
    assert index.refresh_visits == 2 * K * K


def test_visits_are_sublinear_for_sparse_inputs():
    g = torch.Generator().manual_seed(12)
    K, B = 400, 64
    v = sparse_table(K, 5 * K, g)
    mL, mR = sparse_messages(B, K, 5, g), sparse_messages(B, K, 5, g)
    assert ((mL != 0).sum(1) <= 5).all() and ((mR != 0).sum(1) <= 5).all()
    index = BigramIndex(v)
    _, _, value, visited = bigram_fmo(v, mL, mR, 0.7, index=index)
    assert torch.allclose(value, reference(v, mL, mR, 0.7), rtol=0, atol=1e-12)
    assert (visited < K * K / 10).all(), visited.max()


def _inputs(K=4, B=3):
    g = torch.Generator().manual_seed(0)
    v = torch.randn(K, K, generator=g, dtype=F64)
    return v, torch.zeros(B, K, dtype=F64), torch.zeros(B, K, dtype=F64), BigramIndex(v)


def _with(**changes):
    v, mL, mR, index = _inputs()
    kw = dict(v=v, mL=mL, mR=mR, rho=1.0, exclude=None, index=index, method="index", top_rows=4)
    kw.update(changes)
    return lambda: bigram_fmo(**kw)


def _nan(shape):
    t = torch.zeros(shape, dtype=F64)
    t.view(-1)[0] = float("nan")
    return t


def _nan_after_refresh():
    v, _, _, index = _inputs()
    v[1, 2] = float("nan")
    index.refresh(rows=torch.tensor([1]), cols=torch.tensor([2]))


@pytest.mark.parametrize("call, error, name", [
    (_with(v=[[1.0]]), TypeError, "v"),
    (_with(v=torch.zeros(4, 3, dtype=F64)), ValueError, "v"),
    (_with(v=torch.zeros(4, 4, dtype=torch.long)), TypeError, "v"),
    (_with(v=_nan((4, 4)), method="brute"), ValueError, "v"),
    (lambda: BigramIndex(_nan((4, 4))), ValueError, "v"),
    (lambda: BigramIndex(torch.zeros(0, 0, dtype=F64)), ValueError, "v"),
    (_with(mL=torch.zeros(3, 5, dtype=F64)), ValueError, "mL"),
    (_with(mL=torch.zeros(3, 4)), TypeError, "mL"),
    (_with(mL=torch.zeros(3, 4, dtype=torch.long)), TypeError, "mL"),
    (_with(mL=torch.full((3, 4), float("inf"), dtype=F64)), ValueError, "mL"),
    (_with(mR=torch.zeros(2, 4, dtype=F64)), ValueError, "mR"),
    (_with(mR=_nan((3, 4))), ValueError, "mR"),
    (_with(rho=0.0), ValueError, "rho"),
    (_with(rho=-1.0), ValueError, "rho"),
    (_with(rho=float("inf")), ValueError, "rho"),
    (_with(rho=float("nan")), ValueError, "rho"),
    (_with(rho="1"), TypeError, "rho"),
    (_with(rho=True), TypeError, "rho"),
    (_with(exclude=torch.zeros(3, 2)), TypeError, "exclude"),
    (_with(exclude=torch.zeros(3, dtype=torch.long)), ValueError, "exclude"),
    (_with(exclude=torch.zeros(2, 2, dtype=torch.long)), ValueError, "exclude"),
    (_with(exclude=torch.tensor([[0], [-2], [0]])), ValueError, "exclude"),
    (_with(exclude=torch.tensor([[0], [16], [0]])), ValueError, "exclude"),
    (_with(method="fast"), ValueError, "method"),
    (_with(index=None), TypeError, "index"),
    (_with(index=BigramIndex(torch.zeros(5, 5, dtype=F64))), ValueError, "index"),
    (_with(index=BigramIndex(torch.zeros(4, 4, dtype=F64))), ValueError, "index"),
    (_with(top_rows=0), ValueError, "top_rows"),
    (_with(top_rows=1.5), TypeError, "top_rows"),
    (lambda: _nan_after_refresh(), ValueError, "v"),
    (lambda: _inputs()[3].refresh(rows=torch.tensor([4])), ValueError, "rows"),
    (lambda: _inputs()[3].refresh(cols=torch.tensor([0.0])), TypeError, "cols"),
])
def test_bad_inputs_name_the_argument(call, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        call()
