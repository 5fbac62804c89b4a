"""The marginal-coordinate operations of the dual problems against explicit joint feature vectors."""

import itertools

import pytest
import torch

import torchssvm as ts
from torchssvm.models import TokenFeatures, joint_feature
from torchssvm.optim import ChainProblem, FeatureTableProblem, MultiLabelProblem, SlackRescaledProblem


def _dense_problem(seed=0, n=5, K=3, D=4, T=5, bias="ocr"):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    lengths[0] = T
    x = torch.randn(n, T, D, generator=g)
    y = torch.randint(0, K, (n, T), generator=g)
    y[torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)] = -1
    ds = ts.data.SequenceDataset(x, y, lengths, num_labels=K, num_features=D)
    model = ts.LinearChainModel(D, K, bias=bias, dtype=torch.float64)
    return model, ds


def _sparse_problem(seed=0, n=4, K=3, D=9, T=5, A=3):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    lengths[0] = T
    ids = torch.randint(-1, D, (n, T, A), generator=g)
    vals = torch.rand(n, T, A, generator=g, dtype=torch.float64)
    y = torch.randint(0, K, (n, T), generator=g)
    y[torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)] = -1
    ds = ts.data.SequenceDataset(TokenFeatures(ids, vals), y, lengths, num_labels=K, num_features=D)
    model = ts.LinearChainModel(D, K, sparse=True, dtype=torch.float64)
    return model, ds


def _random_w(problem, seed):
    return torch.randn(problem.d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _phi(model, ds, i, labels, problem):
    """Explicit phi(x_i, y) as a d-vector via autograd (joint_feature)."""
    b = ds[i]
    T = b.y.shape[1]
    y = labels[:T].unsqueeze(0)
    mus = problem.structure.marginals(y, b.lengths, dtype=torch.float64)
    return joint_feature(model, b.x if isinstance(b.x, TokenFeatures) else b.x.double(), mus)


def _load_w(model, w):
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(w, model.parameters())


@pytest.mark.parametrize("kind", ["dense", "dense-global", "dense-nobias", "sparse"])
def test_chain_problem_products_match_explicit_features(kind):
    if kind == "sparse":
        model, ds = _sparse_problem()
    else:
        model, ds = _dense_problem(bias={"dense": "ocr", "dense-global": "global", "dense-nobias": None}[kind])
    p = ChainProblem(model, ds)
    w = _random_w(p, 1)
    _load_w(model, w)
    n = p.n
    idx = torch.arange(n)
    g = torch.Generator().manual_seed(2)
    # random labellings and their corners z = m(y_i) - m(y)
    labels = torch.randint(0, p.K, (n, p.T), generator=g)
    labels[torch.arange(p.T).unsqueeze(0) >= p.lengths.unsqueeze(1)] = -1
    z = p.corner(idx, labels)
    psi = torch.stack([_phi(model, ds, i, p.truth[i], p) - _phi(model, ds, i, labels[i], p) for i in range(n)])
    theta = p.potentials(w, idx)
    torch.testing.assert_close(p.inner(theta, z), psi @ w, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(p.gram(idx, z), psi @ psi.T, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(p.sqnorm(idx, z), (psi * psi).sum(1), rtol=1e-10, atol=1e-10)
    a, b = torch.tensor([0, 2]), torch.tensor([1, 3, 2])
    torch.testing.assert_close(p.gram(a, z[a], b, z[b]), psi[a] @ psi[b].T, rtol=1e-10, atol=1e-10)
    coef = torch.rand(n, generator=g, dtype=torch.float64)
    acc, fresh = torch.zeros(p.d, dtype=torch.float64), torch.zeros(p.d, dtype=torch.float64)
    p.accumulate(acc, idx, z, coef)  # after gram(idx, z): with what gram built
    ChainProblem(model, ds).accumulate(fresh, idx, z, coef)  # without
    torch.testing.assert_close(acc, coef @ psi, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fresh, coef @ psi, rtol=1e-10, atol=1e-10)
    # the oracle: labels, loss and max H against enumeration
    lab, loss, H = p.oracle(theta, idx)
    for i in range(n):
        L = int(p.lengths[i])
        best = -1e300
        for ys in itertools.product(range(p.K), repeat=L):
            yy = torch.full((p.T,), -1)
            yy[:L] = torch.tensor(ys)
            h = float(p.task_loss(idx[i : i + 1], yy.view(1, 1, -1))) - float(p.inner(
                p.potentials(w, idx[i : i + 1]), p.corner(idx[i : i + 1], yy.view(1, -1))))
            best = max(best, h)
        assert abs(float(H[i]) - best) < 1e-9
        zi = p.corner(idx[i : i + 1], lab[i : i + 1])
        assert abs(float(loss[i]) - float(H[i]) - float(p.inner(p.potentials(w, idx[i : i + 1]), zi))) < 1e-9
    assert (p.max_loss(idx) >= loss - 1e-12).all()
    # a pairwise step's direction in one scatter: the same floats as the difference of the two corners
    assert torch.equal(p.corner_difference(idx, lab, labels), p.corner(idx, lab) - p.corner(idx, labels))
    # a FW step's direction from a dual point in one pass (numba) or after the corner (torch): the same floats
    zs = torch.rand(n, p.m, generator=g, dtype=torch.float64)
    for backend in ("torch", "auto"):
        q = ChainProblem(model, ds, backend=backend)
        assert torch.equal(q.fw_direction(idx, lab, zs), q.corner(idx, lab) - zs)


@pytest.mark.parametrize("kind", ["multilabel", "slack"])
def test_corner_difference_is_the_difference_of_two_corners(kind):
    g = torch.Generator().manual_seed(3)
    if kind == "multilabel":  # its own override (0/1 marginals)
        x = torch.randn(6, 3, generator=g, dtype=torch.float64)
        y = torch.randint(0, 2, (6, 4), generator=g)
        p = MultiLabelProblem(x, y, ts.structures.MultiLabel(4, edges="full"))
        a, b = torch.randint(0, 2, (2, 6, 4), generator=g)
    else:  # the protocol's default: corners scaled by the loss
        p = SlackRescaledProblem(ChainProblem(*_dense_problem()))
        a, b = (torch.randint(0, p.base.K, (p.n, p.T), generator=g) for _ in range(2))
        pad = torch.arange(p.T).unsqueeze(0) >= p.base.lengths.unsqueeze(1)
        a[pad], b[pad] = -1, -1
    idx = torch.arange(p.n)
    diff = p.corner_difference(idx, a, b)
    assert diff.abs().sum() > 0
    assert torch.equal(diff, p.corner(idx, a) - p.corner(idx, b))


@pytest.mark.parametrize("sparse", [True, False])
def test_accumulate_reuses_gram_work_only_for_the_same_unmodified_direction(sparse):
    """`gram` keeps its attribute rows (sparse) or joint features (dense) for `accumulate` on the same direction;
    a modified direction or another index tensor gets fresh ones."""
    model, ds = _sparse_problem(seed=4, n=6) if sparse else _dense_problem()
    p = ChainProblem(model, ds)
    idx = torch.arange(p.n)
    g = torch.Generator().manual_seed(5)
    labels = torch.randint(0, p.K, (p.n, p.T), generator=g)
    labels[torch.arange(p.T).unsqueeze(0) >= p.lengths.unsqueeze(1)] = -1
    z = p.corner(idx, labels)
    coef = torch.rand(p.n, generator=g, dtype=torch.float64)
    fresh = torch.zeros(p.d, dtype=torch.float64)
    ChainProblem(model, ds).accumulate(fresh, idx, z, coef)  # no gram before: the per-token path
    T = p._batch_T(idx)
    p.gram(idx, z)
    assert p._gram_memo_for(idx, z, T) is not None
    assert p._gram_memo_for(idx.clone(), z, T) is None  # another index tensor
    reused = torch.zeros(p.d, dtype=torch.float64)
    p.accumulate(reused, idx, z, coef)
    torch.testing.assert_close(reused, fresh, rtol=1e-12, atol=1e-12)
    assert p._gram_memo is None  # used once, then dropped
    p.gram(idx, z)
    z.mul_(2.0)  # modified in place after gram: what gram built is stale and must not be used
    assert p._gram_memo_for(idx, z, T) is None
    doubled = torch.zeros(p.d, dtype=torch.float64)
    p.accumulate(doubled, idx, z, coef)
    torch.testing.assert_close(doubled, 2.0 * fresh, rtol=1e-12, atol=1e-12)


def test_chain_problem_writes_model_and_validates():
    model, ds = _dense_problem()
    p = ChainProblem(model, ds)
    w = _random_w(p, 3)
    p.write_model(w)
    torch.testing.assert_close(torch.nn.utils.parameters_to_vector(model.parameters()), w)
    with pytest.raises(ValueError, match="num_features"):
        ChainProblem(ts.LinearChainModel(5, 3), ds)
    with pytest.raises(TypeError, match="model"):
        ChainProblem(torch.nn.Linear(2, 2), ds)


def test_feature_table_validation():
    F = torch.zeros(2, 3, 4)
    L = torch.ones(2, 3)
    y = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="L_i"):
        FeatureTableProblem(F, L, y)
    L[0, 0] = L[1, 1] = 0
    FeatureTableProblem(F, L, y)
    with pytest.raises(ValueError, match="losses"):
        FeatureTableProblem(F, -L, y)
    with pytest.raises(ValueError, match="truth"):
        FeatureTableProblem(F, L, torch.tensor([0, 3]))


def _one_sequence(x=None, y=None, lengths=None, D=2, sparse=False):
    x = torch.randn(1, 3, D, generator=torch.Generator().manual_seed(0)) if x is None else x
    y = torch.tensor([[0, 1, 1]]) if y is None else y
    lengths = torch.tensor([3]) if lengths is None else lengths
    ds = ts.data.SequenceDataset(x, y, lengths, num_labels=3, num_features=D)
    return ChainProblem(ts.LinearChainModel(D, 3, sparse=sparse, dtype=torch.float64), ds)


@pytest.mark.parametrize("kwargs, err, match", [
    # a label -1 inside a length was clamped to 0 in the loss: the oracle's H then differed from L - <theta, m>
    ({"y": torch.tensor([[0, -1, 1]])}, ValueError, r"dataset.y holds label -1"),
    ({"y": torch.tensor([[0, 3, 1]])}, ValueError, r"dataset.y holds label 3"),
    ({"lengths": torch.tensor([0])}, ValueError, r"dataset.lengths must be in \[1, 3\]"),
    ({"lengths": torch.tensor([4])}, ValueError, r"dataset.lengths must be in \[1, 3\]"),
    ({"x": torch.full((1, 3, 2), float("nan"))}, ValueError, "dataset.x contains NaN"),  # BCFW certified inf
    ({"x": torch.randn(1, 3, 5)}, ValueError, "dataset.x must have num_features = 2"),
    ({"x": torch.zeros(1, 3, 2, dtype=torch.long)}, TypeError, "token ids"),
    # values of another shape were broadcast in the potentials, read flat in the Gram matrix
    ({"x": TokenFeatures(torch.tensor([[[0, 1], [1, 2], [2, 0]]]), torch.ones(1, 3, 1)), "D": 3, "sparse": True},
     ValueError, "dataset.x.values must have the shape of dataset.x.ids"),
    ({"x": TokenFeatures(torch.tensor([[[0, -2], [1, 2], [2, 0]]])), "D": 3, "sparse": True},
     ValueError, "dataset.x.ids holds attribute -2"),
    ({"x": TokenFeatures(torch.tensor([[[0, 3], [1, 2], [2, 0]]])), "D": 3, "sparse": True},
     ValueError, "dataset.x.ids holds attribute 3"),
    ({"x": TokenFeatures(torch.tensor([[[0, 1]] * 3]), torch.full((1, 3, 2), float("inf"))), "D": 3,
      "sparse": True}, ValueError, "dataset.x.values contains Inf"),
])
def test_chain_problem_checks_its_sequences(kwargs, err, match):
    with pytest.raises(err, match=match):
        _one_sequence(**kwargs)


def test_chain_problem_takes_padding_beyond_the_lengths():
    p = _one_sequence(y=torch.tensor([[0, 1, -1]]), lengths=torch.tensor([2]))
    assert p.T == 2 and p.truth.tolist() == [[0, 1]]


def test_a_problem_is_not_rebuilt_with_another_structure_or_backend():
    """make_problem used a DualProblem as is and dropped these silently."""
    model, ds = _dense_problem()
    p = ChainProblem(model, ds)
    with pytest.raises(ValueError, match="structure must be None"):
        ts.optim.BCFW(p, lam=0.1, structure=ts.Chain(3, normalize=False))
    with pytest.raises(ValueError, match="backend='torch' differs"):
        ts.optim.BCFW(p, lam=0.1, backend="torch")
    assert ts.optim.BCFW(ChainProblem(model, ds, backend="torch"), lam=0.1, backend="torch").problem.backend == "torch"


def test_slack_rescaling_of_a_weighted_chain_is_refused_when_built():
    model, ds = _dense_problem()
    weighted = ChainProblem(model, ds, ts.Chain(3, class_weights=torch.tensor([1.0, 2.0, 1.0])))
    with pytest.raises(ValueError, match="class_weights must be None"):
        SlackRescaledProblem(weighted)
