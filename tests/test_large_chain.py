import pytest
import torch
from torchssvm.kernels import viterbi

import torchssvm as ts
from torchssvm.data import synthetic_large_chain

_MODEL_KEYS = ("prototypes", "initial_probs", "successor_table", "successor_probs")


def _valid(ds):
    return torch.arange(ds.y.shape[1]).unsqueeze(0) < ds.lengths.unsqueeze(1)


def _sq_dists(ds):
    P = ds.meta["prototypes"].to(ds.x.dtype)
    return ds.x.pow(2).sum(-1, keepdim=True) - 2 * ds.x @ P.T + P.pow(2).sum(-1)


def test_exported():
    assert ts.data.synthetic_large_chain is synthetic_large_chain
    assert "synthetic_large_chain" in ts.data.__all__


def test_seeded_and_deterministic():
    a = synthetic_large_chain("train", 60, num_labels=200, seed=3)
    b = synthetic_large_chain("train", 60, num_labels=200, seed=3)
    c = synthetic_large_chain("train", 60, num_labels=200, seed=4)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.lengths, b.lengths)
    for k in _MODEL_KEYS:
        assert torch.equal(a.meta[k], b.meta[k])
    assert not torch.equal(a.meta["prototypes"], c.meta["prototypes"])
    assert not torch.equal(a.y, c.y)


def test_train_and_test_share_the_model_but_not_the_samples():
    tr = synthetic_large_chain("train", 80, num_labels=300, seed=1)
    te = synthetic_large_chain("test", 80, num_labels=300, seed=1)
    for k in _MODEL_KEYS:
        assert torch.equal(tr.meta[k], te.meta[k]), k
    assert not torch.equal(tr.y, te.y) and not torch.equal(tr.x, te.x)
    assert (tr.meta["split"], te.meta["split"]) == ("train", "test")
    assert tr.name != te.name


def test_shapes_lengths_padding_and_labels():
    ds = synthetic_large_chain("train", 50, num_labels=120, num_features=7, min_length=3, max_length=9, seed=2)
    assert ds.x.shape == (50, 9, 7) and ds.x.dtype == torch.float32
    assert ds.y.shape == (50, 9) and ds.y.dtype == torch.long and ds.lengths.shape == (50,)
    assert (ds.num_labels, ds.num_features, len(ds)) == (120, 7, 50)
    assert int(ds.lengths.min()) >= 3 and int(ds.lengths.max()) <= 9
    valid = _valid(ds)
    assert bool((ds.y[valid] >= 0).all()) and bool((ds.y[valid] < 120).all())
    assert bool((ds.y[~valid] == -1).all()) and bool((ds.x[~valid] == 0).all())
    assert bool((ds.x[valid].abs().sum(-1) > 0).all())
    batch = ds[:4]
    assert batch.x.shape[1] == int(ds.lengths[:4].max())
    ds64 = synthetic_large_chain("train", 5, num_labels=10, dtype=torch.float64)
    assert ds64.x.dtype == torch.float64
    fixed = synthetic_large_chain("train", 5, num_labels=10, min_length=4, max_length=4)
    assert fixed.lengths.tolist() == [4] * 5


def test_model_tables_are_consistent():
    K, S = 150, 6
    ds = synthetic_large_chain("train", 10, num_labels=K, num_features=5, successors=S, seed=5)
    m = ds.meta
    assert m["prototypes"].shape == (K, 5)
    torch.testing.assert_close(m["prototypes"].norm(dim=1), torch.ones(K, dtype=m["prototypes"].dtype))
    assert m["successor_table"].shape == (K, S) and m["successor_probs"].shape == (K, S)
    assert bool((m["successor_table"] >= 0).all()) and bool((m["successor_table"] < K).all())
    # the successors of each label are distinct
    assert bool((m["successor_table"].sort(dim=1).values.diff(dim=1) > 0).all())
    torch.testing.assert_close(m["successor_probs"].sum(1), torch.ones(K, dtype=torch.float64))
    torch.testing.assert_close(m["initial_probs"].sum(), torch.tensor(1.0, dtype=torch.float64))
    # Zipf: probabilities are decreasing along the successor list and skewed over the labels
    assert bool((m["successor_probs"].diff(dim=1) < 0).all())
    p = m["initial_probs"].sort(descending=True).values
    assert float(p[0] / p[-1]) == pytest.approx(K ** 1.1, rel=1e-6)


def test_observed_bigrams_are_allowed_and_sparse():
    K, S = 1000, 8
    ds = synthetic_large_chain("train", 400, num_labels=K, successors=S, seed=0)
    m = ds.meta
    allowed = torch.zeros(K, K, dtype=torch.bool)
    allowed[torch.arange(K).unsqueeze(1), m["successor_table"]] = True
    pair = _valid(ds)[:, 1:]
    prev, nxt = ds.y[:, :-1][pair], ds.y[:, 1:][pair]
    assert prev.numel() > 0 and bool(allowed[prev, nxt].all())
    distinct = int((prev * K + nxt).unique().numel())
    assert m["num_bigrams"] == distinct
    assert m["num_allowed_bigrams"] == K * S
    assert distinct <= K * S and distinct < K * K // 100


def test_labels_are_zipf_skewed():
    K = 1000
    ds = synthetic_large_chain("train", 400, num_labels=K, seed=0)
    counts = torch.bincount(ds.y[_valid(ds)], minlength=K)
    top = counts.sort(descending=True).values
    assert float(top[:10].sum() / counts.sum()) > 0.2  # a few common labels ...
    assert int((counts == 0).sum()) > K // 10  # ... and many rare ones


def test_meta_records_the_parameters():
    ds = synthetic_large_chain("test", 12, num_labels=40, num_features=3, min_length=2, max_length=6, successors=4,
                               zipf=0.8, noise=0.5, seed=9)
    expect = {"generator": "synthetic_large_chain", "split": "test", "n": 12, "num_labels": 40, "num_features": 3,
              "min_length": 2, "max_length": 6, "successors": 4, "zipf": 0.8, "noise": 0.5, "seed": 9}
    assert {k: ds.meta[k] for k in expect} == expect
    assert isinstance(ds.meta["num_bigrams"], int)
    sub = ds.subset([0, 1])
    assert sub.meta["num_labels"] == 40


@pytest.mark.parametrize("kwargs, name", [
    ({"split": "valid"}, "split"),
    ({"n": 0}, "n"),
    ({"num_labels": 1}, "num_labels"),
    ({"num_features": 0}, "num_features"),
    ({"min_length": 0}, "min_length"),
    ({"max_length": 0}, "max_length"),
    ({"min_length": 6, "max_length": 5}, "max_length"),
    ({"successors": 0}, "successors"),
    ({"num_labels": 5, "successors": 6}, "successors"),
    ({"zipf": -0.5}, "zipf"),
    ({"zipf": float("nan")}, "zipf"),
    ({"noise": -1.0}, "noise"),
    ({"noise": float("inf")}, "noise"),
    ({"seed": -1}, "seed"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    kwargs = {"n": 3, "num_labels": 20, **kwargs}
    with pytest.raises(ValueError, match=name):
        synthetic_large_chain(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    ({"num_labels": 10.0}, "num_labels"),
    ({"zipf": "1"}, "zipf"),
    ({"noise": True}, "noise"),
    ({"dtype": torch.long}, "dtype"),
    ({"dtype": "float32"}, "dtype"),
])
def test_wrong_types_raise_type_error(kwargs, name):
    """Wrong types are TypeErrors, as in the other loaders (`check_real`, `check_float_dtype`)."""
    with pytest.raises(TypeError, match=name):
        synthetic_large_chain(**{"n": 3, "num_labels": 10, **kwargs})


def test_features_carry_signal_but_unaries_are_ambiguous():
    ds = synthetic_large_chain("test", 300, seed=0)  # K = 1000, default noise
    valid = _valid(ds)
    acc = float((_sq_dists(ds).argmin(-1) == ds.y)[valid].float().mean())
    majority = float(torch.bincount(ds.y[valid]).max()) / int(valid.sum())
    assert 0.3 < acc < 0.8
    assert acc > majority + 0.15
    exact = synthetic_large_chain("test", 50, num_labels=200, noise=0.0, seed=0)
    assert bool((_sq_dists(exact).argmin(-1) == exact.y)[_valid(exact)].all())


def test_true_bigram_model_beats_unaries():
    K = 300
    ds = synthetic_large_chain("test", 100, num_labels=K, seed=2)
    m, valid = ds.meta, _valid(ds)
    unary = -_sq_dists(ds) / (2 * m["noise"] ** 2)
    trans = torch.full((K, K), -1e9)
    trans.scatter_(1, m["successor_table"], m["successor_probs"].log().float())
    labels, _ = viterbi(unary, trans, m["initial_probs"].log().float(), None, ds.lengths, backend="torch")
    oracle = float((labels == ds.y)[valid].float().mean())
    nearest = float((unary.argmax(-1) == ds.y)[valid].float().mean())
    assert oracle > nearest + 0.2 and oracle > 0.85
