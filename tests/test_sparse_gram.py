"""The factored Gram of sparse-attribute emission features (torch and the numba twin) against explicit (R, D K)
vectors."""

import pytest
import torch
from conftest import needs_numba

from torchssvm.optim.problems import sparse_gram
from torchssvm.optim.problems.sparse_gram import attribute_rows, sparse_emission_gram, sparse_emission_sqnorm


def _batch(R=7, T=5, A=4, D=9, K=3, seed=0, with_values=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, D, (R, T, A), generator=g)  # small D: attributes shared by many blocks
    ids[torch.rand(R, T, A, generator=g) < 0.3] = -1  # absent attributes
    ids[0, 3:] = -1  # a short sequence (padding)
    ids[1, 0, :2] = 4  # the same attribute twice in one token
    values = torch.randn(R, T, A, generator=g, dtype=torch.float64) if with_values else None
    u = torch.randn(R, T, K, generator=g, dtype=torch.float64)
    u[2, 1:4] = 0.0  # tokens whose vector is zero (a FW direction where the labellings agree)
    u[3] = 0.0
    return ids, values, u, D


def _explicit(ids, values, u, D):
    R, T, A = ids.shape
    K = u.shape[2]
    E = torch.zeros(R, D, K, dtype=torch.float64)
    for r in range(R):
        for t in range(T):
            for a in range(A):
                if ids[r, t, a] >= 0:
                    v = 1.0 if values is None else float(values[r, t, a])
                    E[r, ids[r, t, a]] += v * u[r, t]
    return E.reshape(R, D * K)


@pytest.mark.parametrize("dense_min", [None, 1, 2, 3, 5, 1000])
@pytest.mark.parametrize("with_values", [True, False])
def test_gram_matches_explicit_vectors(dense_min, with_values):
    ids, values, u, D = _batch(with_values=with_values)
    E = _explicit(ids, values, u, D)
    G = sparse_emission_gram(ids, values, u, dense_min)
    torch.testing.assert_close(G, E @ E.T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sparse_emission_sqnorm(ids, values, u), (E * E).sum(1), rtol=1e-12, atol=1e-12)


def test_pair_chunks_give_the_same_gram(monkeypatch):
    ids, values, u, D = _batch(R=12, seed=3)
    E = _explicit(ids, values, u, D)
    monkeypatch.setattr(sparse_gram, "_PAIR_CHUNK_ELEMENTS", 7)  # many small chunks of pairs
    torch.testing.assert_close(sparse_emission_gram(ids, values, u, 1000), E @ E.T, rtol=1e-12, atol=1e-12)


def test_rows_are_distinct_block_attribute_pairs():
    ids, values, u, D = _batch()
    attr, row, V = attribute_rows(ids, values, u)
    keys = attr * ids.shape[0] + row
    assert torch.equal(keys, torch.unique(keys))  # sorted by attribute, then block, no repeats
    E = _explicit(ids, values, u, D).view(ids.shape[0], D, -1)
    torch.testing.assert_close(V, E[row, attr], rtol=1e-12, atol=1e-12)


def test_all_absent_gives_zero():
    ids = torch.full((3, 4, 2), -1)
    u = torch.randn(3, 4, 5, dtype=torch.float64)
    assert torch.equal(sparse_emission_gram(ids, None, u), torch.zeros(3, 3, dtype=torch.float64))
    assert torch.equal(sparse_emission_sqnorm(ids, None, u), torch.zeros(3, dtype=torch.float64))


# -- the compiled CPU twin (numba) ------------------------------------------------------------------------------


@needs_numba()
@pytest.mark.parametrize("dense_min", [None, 1, 2, 3, 5, 1000])
@pytest.mark.parametrize("with_values", [True, False])
def test_numba_twin_matches_explicit_vectors_and_the_torch_rows(dense_min, with_values):
    from torchssvm.optim.problems.sparse_gram_numba import attribute_rows_numba, sparse_emission_gram_numba

    for seed in range(3):
        ids, values, u, D = _batch(with_values=with_values, seed=seed)
        rows = attribute_rows_numba(ids, values, u)
        for a, b in zip(rows, attribute_rows(ids, values, u)):  # the same pairs and rows, summed in token order
            assert torch.equal(a, b)
        E = _explicit(ids, values, u, D)
        torch.testing.assert_close(sparse_emission_gram_numba(ids, values, u, dense_min), E @ E.T, rtol=1e-12,
                                   atol=1e-12)
        torch.testing.assert_close(sparse_emission_gram_numba(ids, values, u, dense_min, rows=rows),
                                   sparse_emission_gram(ids, values, u, dense_min), rtol=1e-13, atol=1e-13)
    ids, values, u, D = _batch()
    ids[:] = -1
    assert torch.equal(sparse_emission_gram_numba(ids, values, u), torch.zeros(ids.shape[0], ids.shape[0],
                                                                               dtype=torch.float64))
    empty = (ids[:0], values[:0], u[:0])  # an empty batch, as the torch twin takes it
    for a, b in zip(attribute_rows_numba(*empty), attribute_rows(*empty)):
        assert a.shape == b.shape and a.shape[0] == 0
    assert sparse_emission_gram_numba(*empty).shape == (0, 0)
    with pytest.raises(ValueError, match="values must have the shape"):
        attribute_rows_numba(ids, values[:, :2], u)
    with pytest.raises(ValueError, match="float32/float64"):
        attribute_rows_numba(ids, values, u.to(torch.bfloat16))


@needs_numba()
def test_sparse_chain_problem_uses_the_numba_twin_where_the_chain_kernels_are():
    from test_optim_problems import _sparse_problem

    from torchssvm.optim.problems import sparse_gram_numba
    from torchssvm.optim.problems.chain import ChainProblem

    model, ds = _sparse_problem(n=12)
    picked, grams = {}, {}
    for backend in ("auto", "numba", "torch"):
        problem = ChainProblem(model, ds, backend=backend)
        picked[backend] = problem._sparse_gram
        idx = torch.arange(12)
        labels = torch.randint(0, 3, (12, problem.T), generator=torch.Generator().manual_seed(1))
        labels[problem.truth < 0] = -1
        z = problem.corner(idx, labels)
        grams[backend] = problem.gram(idx, z)
    assert picked["auto"] is picked["numba"] is sparse_gram_numba.sparse_emission_gram_numba
    assert picked["torch"] is sparse_emission_gram
    torch.testing.assert_close(grams["auto"], grams["torch"], rtol=1e-12, atol=1e-12)
    assert grams["torch"].abs().max() > 0


def _data_set(n=9, T=6, A=4, D=40, K=3, seed=0, with_values=True):
    """A data set's padded attributes ``(n, T, A)`` and lengths (padding holds -1 ids)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, D, (n, T, A), generator=g)
    ids[torch.rand(n, T, A, generator=g) < 0.3] = -1
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    ids[torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)] = -1
    values = torch.randn(n, T, A, generator=g, dtype=torch.float64) if with_values else None
    return ids, values, lengths, D


@needs_numba()
@pytest.mark.parametrize("with_values", [True, False])
@pytest.mark.parametrize("D", [40, 10**6])  # many entries per attribute (counting sort), few (merge sort)
def test_numba_rows_read_a_data_set_in_place(with_values, D):
    """With ``index`` the twins read the data set's arrays in place: the same rows, bitwise, as on the gathered
    batch, with the batch narrower than the data set (T < T')."""
    from torchssvm.optim.problems.sparse_gram_numba import attribute_rows_numba, sparse_emission_gram_numba

    ids, values, lengths, _ = _data_set(D=D, with_values=with_values)
    index = torch.tensor([7, 2, 5, 0])
    T = int(lengths[index].max())
    u = torch.randn(4, T, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    u[1, 0] = 0.0
    x_ids = ids[index][:, :T]
    x_vals = None if values is None else values[index][:, :T]
    expected = attribute_rows(x_ids, x_vals, u)
    assert expected[0].numel() > 0 and int(expected[0].max()) >= (D // 2 if D > 100 else 0)
    for rows in (attribute_rows_numba(ids, values, u, index), attribute_rows(ids, values, u, index),
                 attribute_rows_numba(x_ids, x_vals, u)):
        for a, b in zip(rows, expected):
            assert torch.equal(a, b)
    E = _explicit(x_ids, x_vals, u, D) if D < 100 else None
    G = sparse_emission_gram_numba(ids, values, u, index=index)
    torch.testing.assert_close(G, sparse_emission_gram(x_ids, x_vals, u), rtol=1e-13, atol=1e-13)
    if E is not None:
        torch.testing.assert_close(G, E @ E.T, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="index must lie in"):
        attribute_rows_numba(ids, values, u, torch.tensor([7, 2, 5, 9]))
    with pytest.raises(ValueError, match="T <= ids.shape"):
        attribute_rows_numba(ids, values, torch.zeros(4, 7, 3, dtype=torch.float64), index)


@needs_numba()
def test_numba_update_of_w_equals_index_add():
    from torchssvm.optim.problems.sparse_gram_numba import add_attribute_rows_numba, attribute_rows_numba

    ids, values, u, D = _batch(R=9, seed=5)
    rows = attribute_rows_numba(ids, values, u)
    g = torch.Generator().manual_seed(2)
    coef = torch.rand(9, generator=g, dtype=torch.float64)
    E = torch.randn(D, 3, generator=g, dtype=torch.float64)
    expected = E.clone().index_add_(0, rows[0], rows[2] * coef[rows[1]].unsqueeze(1))
    E_torch = E.clone()
    sparse_gram.add_attribute_rows(E_torch, rows, coef)
    add_attribute_rows_numba(E, rows, coef)
    assert torch.equal(E, expected) and torch.equal(E_torch, expected)  # the same products, in the same order
    with pytest.raises(ValueError, match="outside E"):
        add_attribute_rows_numba(E[: int(rows[0].max())].clone(), rows, coef)
    with pytest.raises(ValueError, match="dtype"):
        add_attribute_rows_numba(E.float(), rows, coef)
