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
