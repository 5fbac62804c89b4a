"""Unary potentials of sparse token attributes read from a data set in place: the torch form (``embedding_bag``)
and its numba twin against an explicit loop."""

import pytest
import torch
from conftest import needs_numba

from torchssvm.optim.problems.sparse_unary import sparse_unary


def _data_set(n=8, T=7, A=5, D=30, K=4, seed=0, with_values=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, D, (n, T, A), generator=g)
    ids[torch.rand(n, T, A, generator=g) < 0.3] = -1
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    ids[0, :, 0] = 3  # a data set may hold ids past a sequence's length: they must be ignored
    values = torch.randn(n, T, A, generator=g, dtype=torch.float64) if with_values else None
    E = torch.randn(D, K, generator=g, dtype=torch.float64)
    return ids, values, lengths, E


def _explicit(ids, values, index, lengths, E, T):
    out = torch.zeros(index.shape[0], T, E.shape[1], dtype=E.dtype)
    for b, i in enumerate(index.tolist()):
        for t in range(int(lengths[i])):
            for a in range(ids.shape[2]):
                j = int(ids[i, t, a])
                if j >= 0:
                    out[b, t] += (1.0 if values is None else float(values[i, t, a])) * E[j]
    return out


@pytest.mark.parametrize("with_values", [True, False])
def test_torch_form_matches_an_explicit_loop(with_values):
    ids, values, lengths, E = _data_set(with_values=with_values)
    index = torch.tensor([5, 0, 3])
    T = int(lengths[index].max()) + 1  # wider than the batch: the extra position is padding, 0
    out = sparse_unary(ids, values, index, lengths, E, T)
    torch.testing.assert_close(out, _explicit(ids, values, index, lengths, E, T), rtol=1e-12, atol=1e-12)
    assert out[:, -1].abs().max() == 0


def test_absent_slots_weigh_nothing_whatever_their_value():
    """A value stored in a slot without an attribute (id -1) is ignored, NaN included, by the problem's torch form
    and by the model (the numba twin skips those slots)."""
    import torchssvm as ts

    ids, values, lengths, E = _data_set(seed=5)
    values = values.masked_fill(ids < 0, float("nan"))
    index = torch.tensor([1, 2, 6])
    T = int(lengths[index].max())
    out = sparse_unary(ids, values, index, lengths, E, T)
    torch.testing.assert_close(out, _explicit(ids, values, index, lengths, E, T), rtol=1e-12, atol=1e-12)
    model = ts.LinearChainModel(E.shape[0], E.shape[1], sparse=True, bias=None, dtype=torch.float64)
    with torch.no_grad():
        model.emission.copy_(E)
    unary = model.unary(ts.models.TokenFeatures(ids[index][:, :T], values[index][:, :T]))
    assert bool(torch.isfinite(unary).all())


@needs_numba()
@pytest.mark.parametrize("with_values", [True, False])
@pytest.mark.parametrize("parallel", [False, True])
def test_numba_twin_equals_the_torch_form(with_values, parallel, monkeypatch):
    from torchssvm.optim.problems import sparse_unary_numba as m

    monkeypatch.setattr(m, "_PARALLEL_MIN_WORK", 1 if parallel else 1 << 60)
    ids, values, lengths, E = _data_set(with_values=with_values, seed=3)
    for index in (torch.tensor([5, 0, 3, 7, 1]), torch.tensor([2]), torch.tensor([], dtype=torch.long)):
        T = int(lengths[index].max()) if index.numel() else 0
        out = m.sparse_unary_numba(ids, values, index, lengths, E, T)
        expected = sparse_unary(ids, values, index, lengths, E, T)
        if with_values:
            torch.testing.assert_close(out, expected, rtol=1e-13, atol=1e-13)
        else:  # sums of the same rows in the same order
            assert torch.equal(out, expected)
    out32 = m.sparse_unary_numba(ids, values, torch.tensor([1, 4]), lengths, E.float(), 7)
    assert out32.dtype == torch.float32


@needs_numba()
def test_numba_twin_checks_what_its_loop_does_not():
    from torchssvm.optim.problems.sparse_unary_numba import sparse_unary_numba

    ids, values, lengths, E = _data_set()
    index = torch.tensor([1, 2])
    T = int(lengths[index].max())
    with pytest.raises(ValueError, match="index must lie in"):
        sparse_unary_numba(ids, values, torch.tensor([1, 8]), lengths, E, T)
    with pytest.raises(ValueError, match="at most T"):
        sparse_unary_numba(ids, values, index, lengths, E, T - 1)
    with pytest.raises(ValueError, match="below E.shape"):
        sparse_unary_numba(ids, values, index, lengths, E[:10], T)
    with pytest.raises(ValueError, match="T must lie in"):
        sparse_unary_numba(ids, values, index, lengths, E, 8)
    with pytest.raises(ValueError, match="float32/float64"):
        sparse_unary_numba(ids, values, index, lengths, E.half(), T)


@needs_numba()
def test_sparse_chain_problem_potentials_take_the_twin_where_the_chain_kernels_are():
    from test_optim_problems import _sparse_problem

    from torchssvm.optim.problems.chain import ChainProblem
    from torchssvm.optim.problems.sparse_unary_numba import sparse_unary_numba

    model, ds = _sparse_problem(n=12)
    w = torch.randn(ChainProblem(model, ds).d, generator=torch.Generator().manual_seed(0), dtype=model.emission.dtype)
    idx = torch.tensor([3, 0, 11, 6])
    unary = {}
    for backend in ("auto", "numba", "torch"):
        problem = ChainProblem(model, ds, backend=backend)
        assert (problem._sparse_unary is sparse_unary_numba) == (backend != "torch")
        unary[backend] = problem.potentials(w, idx).unary
    torch.testing.assert_close(unary["auto"], unary["torch"], rtol=1e-12, atol=1e-12)
    problem.write_model(w)  # the model's own unary potentials on the gathered batch, within the lengths
    x = ds.x[idx]
    T = unary["torch"].shape[1]
    x = type(x)(x.ids[:, :T], None if x.values is None else x.values[:, :T])
    inside = torch.arange(T) < ds.lengths[idx].unsqueeze(1)
    assert not bool(inside.all())  # padding occurs; its potentials are the bias alone
    torch.testing.assert_close(unary["torch"][inside], model.unary(x).detach()[inside], rtol=1e-12, atol=1e-12)
    assert torch.equal(unary["torch"][~inside], model.bias.detach().expand(int((~inside).sum()), -1))
