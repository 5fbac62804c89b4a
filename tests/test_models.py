"""Linear models and the joint feature map phi = VJP of the model."""

import pytest
import torch

import torchssvm as ts
from torchssvm.models import TokenFeatures


def explicit_phi_chain(x, y, L, D, K, bias):
    """phi(x, y) of the OCR chain model built by hand: emission, transition, global/first/last bias."""
    em = torch.zeros(D, K, dtype=torch.float64)
    tr = torch.zeros(K, K, dtype=torch.float64)
    for t in range(L):
        em[:, y[t]] += x[t].double()
    for t in range(1, L):
        tr[y[t - 1], y[t]] += 1
    parts = [em.reshape(-1), tr.reshape(-1)]
    if bias is not None:
        parts.append(torch.bincount(y[:L], minlength=K).double())
    if bias == "ocr":
        parts.append(torch.nn.functional.one_hot(y[0], K).double())
        parts.append(torch.nn.functional.one_hot(y[L - 1], K).double())
    return torch.cat(parts)


@pytest.mark.parametrize("bias", ["ocr", "global", None])
def test_joint_feature_dense_chain_matches_explicit(bias):
    B, T, D, K = 3, 5, 4, 3
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 3])
    y = torch.randint(0, K, (B, T), generator=g)
    y = torch.where(torch.arange(T) < lengths[:, None], y, torch.full_like(y, -1))
    model = ts.LinearChainModel(D, K, bias=bias, dtype=torch.float64)
    chain = ts.Chain(K)
    mu = chain.marginals(y, lengths, dtype=torch.float64)
    phi = ts.joint_feature(model, x, mu, per_example=True)
    for b in range(B):
        assert torch.allclose(phi[b], explicit_phi_chain(x[b], y[b], int(lengths[b]), D, K, bias))
    assert torch.allclose(ts.joint_feature(model, x, mu), phi.sum(0))
    # <w, phi(x, y)> == score(model(x), y) for random w
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(generator=g)
    w = torch.nn.utils.parameters_to_vector(model.parameters())
    assert torch.allclose(phi @ w, chain.score(model(x), y, lengths))


def test_ocr_model_dimension_is_4082():
    model = ts.LinearChainModel(128, 26, bias="ocr")
    assert sum(p.numel() for p in model.parameters()) == 4082


def test_sparse_tokens_equal_dense_one_hot():
    B, T, A, D, K = 2, 4, 3, 7, 3
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, D, (B, T, A), generator=g)
    ids[0, 1, 2] = -1
    ids[1, 3, :] = -1
    values = torch.rand(B, T, A, generator=g, dtype=torch.float64)
    dense = torch.zeros(B, T, D, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for a in range(A):
                if ids[b, t, a] >= 0:
                    dense[b, t, ids[b, t, a]] += values[b, t, a]
    sparse_model = ts.LinearChainModel(D, K, sparse=True, dtype=torch.float64)
    dense_model = ts.LinearChainModel(D, K, dtype=torch.float64)
    with torch.no_grad():
        for p, q in zip(sparse_model.parameters(), dense_model.parameters()):
            p.normal_(generator=g)
            q.copy_(p)
    us = sparse_model(TokenFeatures(ids, values)).unary
    assert torch.allclose(us, dense_model(dense).unary)
    y = torch.randint(0, K, (B, T), generator=g)
    mu = ts.Chain(K).marginals(y, dtype=torch.float64)
    assert torch.allclose(ts.joint_feature(sparse_model, TokenFeatures(ids, values), mu),
                          ts.joint_feature(dense_model, dense, mu))

    # indexing selects batch rows like a tensor, an int included
    for index in (1, slice(1, 2), torch.tensor([1, 0])):
        part = TokenFeatures(ids, values)[index]
        assert torch.equal(part.ids, ids[index]) and torch.equal(part.values, values[index])
    assert torch.allclose(sparse_model(TokenFeatures(ids, values)[1:2]).unary, us[1:2])
    assert TokenFeatures(ids)[0].values is None and len(TokenFeatures(ids, values)) == 2


def test_multiclass_model_joint_feature():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (5,), generator=g)
    model = ts.LinearMulticlassModel(3, 4, dtype=torch.float64)
    phi = ts.joint_feature(model, x, ts.Multiclass(4).marginals(y, dtype=torch.float64), per_example=True)
    for b in range(5):
        expect = torch.zeros(3, 4, dtype=torch.float64)
        expect[:, y[b]] = x[b]
        bias = torch.nn.functional.one_hot(y[b], 4).double()
        assert torch.allclose(phi[b], torch.cat([expect.reshape(-1), bias]))


def test_joint_feature_per_example_takes_any_tuple_of_marginals():
    """A NamedTuple, a plain tuple or a list of marginals give the same per-example rows."""
    g = torch.Generator().manual_seed(4)
    model = ts.LinearChainModel(3, 4, dtype=torch.float64)
    x = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (2, 5), generator=g)
    mu = ts.Chain(4).marginals(y, dtype=torch.float64)
    named = ts.joint_feature(model, x, mu, per_example=True)
    assert named.shape == (2, sum(p.numel() for p in model.parameters()))
    assert torch.equal(ts.joint_feature(model, x, tuple(mu), per_example=True), named)
    assert torch.equal(ts.joint_feature(model, x, list(mu), per_example=True), named)
    assert torch.allclose(named.sum(0), ts.joint_feature(model, x, mu))
    empty = ts.joint_feature(model, x[:0], ts.Chain(4).marginals(y[:0], dtype=torch.float64), per_example=True)
    assert empty.shape == (0, named.shape[1]) and empty.dtype == torch.float64


def test_joint_feature_refuses_missing_and_mismatched_marginals():
    """A None part of the marginals (start / end of a bias='ocr' model) was skipped, so <w, phi> was not the score;
    per_example=True paired the first rows of a longer x with the marginals."""
    g = torch.Generator().manual_seed(0)
    model = ts.LinearChainModel(4, 3, dtype=torch.float64)
    ch = ts.Chain(3)
    x, y = torch.randn(2, 5, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (2, 5), generator=g)
    mu = ch.marginals(y)
    with pytest.raises(ValueError, match="marginals.start is None"):
        ts.joint_feature(model, x, ts.ChainPotentials(mu.unary, mu.transition))
    with pytest.raises(ValueError, match="x holds 3 examples but marginals 2"):
        ts.joint_feature(model, torch.randn(3, 5, 4, dtype=torch.float64), mu, per_example=True)
    sparse = ts.LinearChainModel(6, 3, sparse=True, dtype=torch.float64)
    ids = torch.randint(-1, 6, (2, 5, 3), generator=g)
    assert ts.joint_feature(sparse, ts.TokenFeatures(ids), mu, per_example=True).shape == (2, sum(
        p.numel() for p in sparse.parameters()))


def test_sparse_ids_of_any_integer_dtype():
    """embedding_bag takes int32 / int64 only: int16 ids passed the check and failed inside torch."""
    g = torch.Generator().manual_seed(0)
    model = ts.LinearChainModel(6, 3, sparse=True, dtype=torch.float64)
    torch.nn.init.normal_(model.emission, generator=g)
    ids = torch.randint(-1, 6, (2, 3, 4), generator=g)
    ref = model(ts.TokenFeatures(ids)).unary
    for dt in (torch.int8, torch.int16, torch.int32, torch.uint8):
        if dt == torch.uint8:
            continue  # no -1 in uint8
        torch.testing.assert_close(model(ts.TokenFeatures(ids.to(dt))).unary, ref, rtol=0, atol=0)


def test_multiclass_model_takes_a_sparse_bag_of_words():
    """A sparse ``x`` (COO or CSR) is used as is: the scores and the weight's gradient are the dense input's."""
    model = ts.LinearMulticlassModel(5, 3, dtype=torch.float64)
    torch.nn.init.normal_(model.weight, generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).clamp_min(0.5) - 0.5
    results = []
    for xx in (x, x.to_sparse()):
        model.weight.grad = None
        s = model(xx)
        (s * s).sum().backward()
        results.append((s.detach(), model.weight.grad.clone()))
    torch.testing.assert_close(results[1][0], results[0][0])
    torch.testing.assert_close(results[1][1], results[0][1])
