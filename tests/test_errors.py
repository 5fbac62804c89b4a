"""Bad input raises a clear error naming the argument; nothing is clipped or broadcast silently."""

import pytest
import torch

import torchssvm as ts


def pot(B=2, T=4, K=3, dtype=torch.float32):
    return ts.ChainPotentials(torch.zeros(B, T, K, dtype=dtype), torch.zeros(K, K, dtype=dtype),
                              torch.zeros(K, dtype=dtype), torch.zeros(K, dtype=dtype))


Y = torch.tensor([[0, 1, 2, 0], [1, 1, -1, -1]])
L = torch.tensor([4, 2])
loss = ts.StructuredHingeLoss(ts.Chain(3))


@pytest.mark.parametrize("y,msg", [
    (torch.tensor([[0, 1, 3, 0], [1, 1, -1, -1]]), "target holds label 3"),
    (torch.tensor([[0, -1, 2, 0], [1, 1, -1, -1]]), "target holds label -1"),
    (torch.tensor([[0, 1, 2, 0]]), r"target must have shape \(2, 4\)"),
    (torch.tensor([[0.0, 1, 2, 0], [1, 1, -1, -1]]), "target must be an integer tensor"),
])
def test_bad_labels(y, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        loss(pot(), y, L)


@pytest.mark.parametrize("lengths,msg", [
    (torch.tensor([4, 0]), "lengths must be >= 1"),
    (torch.tensor([5, 2]), "lengths must be <= the padded size 4"),
    (torch.tensor([4]), "lengths has 1 entries but the batch size is 2"),
    (torch.tensor([4.0, 2.0]), "lengths must be an integer tensor"),
])
def test_bad_lengths(lengths, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        loss(pot(), Y, lengths)


@pytest.mark.parametrize("name", ["unary", "transition", "start", "end"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_potentials(name, bad):
    p = pot()
    getattr(p, name).view(-1)[0] = bad
    what = f"{name} contains NaN$" if bad != bad else f"{name} contains Inf: potentials must be finite.*not -inf"
    with pytest.raises(ValueError, match=what):
        loss(p, Y, L)
    with pytest.raises(ValueError, match=what):
        ts.Chain(3).decode(p, L)


def test_mismatched_shapes():
    p = pot()
    with pytest.raises(ValueError, match=r"transition must have shape \(3, 3\)"):
        loss(ts.ChainPotentials(p.unary, torch.zeros(3, 4)), Y, L)
    with pytest.raises(ValueError, match="transition must have shape"):
        loss(ts.ChainPotentials(p.unary, torch.zeros(5, 3, 3, 3)), Y, L)
    with pytest.raises(ValueError, match=r"start must have shape \(3,\)"):
        loss(ts.ChainPotentials(p.unary, p.transition, torch.zeros(4)), Y, L)
    with pytest.raises(ValueError, match="unary has 5 labels"):
        loss(ts.ChainPotentials(torch.zeros(2, 4, 5), torch.zeros(5, 5)), Y, L)
    with pytest.raises(TypeError, match="transition must be a torch.Tensor"):
        loss(ts.ChainPotentials(p.unary, None), Y, L)
    with pytest.raises(ValueError, match=r"y must have shape \(2, 4\)"):
        ts.Chain(3).score(p, Y[:1], L)
    with pytest.raises(ValueError, match="unary must have 3 dimensions"):
        loss(ts.ChainPotentials(torch.zeros(4, 3), p.transition), Y, L)


def test_mismatched_dtype_and_device():
    p = pot()
    with pytest.raises(TypeError, match="transition has dtype torch.float64"):
        loss(ts.ChainPotentials(p.unary, p.transition.double()), Y, L)
    with pytest.raises(ValueError, match="transition is on meta"):
        loss(ts.ChainPotentials(p.unary, torch.zeros(3, 3, device="meta")), Y, L)
    with pytest.raises(ValueError, match="lengths is on meta"):
        ts.Chain(3).decode(p, L.to("meta"))
    with pytest.raises(ValueError, match="target is on meta"):
        loss(p, Y.to("meta"), L)


def test_bad_loss_weight_and_reduction():
    with pytest.raises(ValueError, match="loss_weight must be finite and >= 0"):
        ts.structured_hinge_loss(ts.Chain(3), pot(), Y, L, loss_weight=-1.0)
    with pytest.raises(ValueError, match=r"loss_weight must be a scalar or have shape \(2,\)"):
        ts.structured_hinge_loss(ts.Chain(3), pot(), Y, L, loss_weight=torch.ones(3))
    with pytest.raises(ValueError, match="reduction must be one of"):
        ts.StructuredHingeLoss(ts.Chain(3), reduction="max")
    with pytest.raises(TypeError, match="structure must be a torchssvm Structure"):
        ts.StructuredHingeLoss("chain")


def test_multiclass_errors():
    mc = ts.Multiclass(3)
    with pytest.raises(ValueError, match="target holds label 3"):
        ts.structured_hinge_loss(mc, torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="scores has 4 classes"):
        mc.decode(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="scores contains NaN"):
        mc.decode(torch.tensor([[0.0, float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="lengths must be None for Multiclass"):
        mc.decode(torch.zeros(2, 3), torch.tensor([1, 1]))


def test_structure_and_model_arguments():
    with pytest.raises(ValueError, match="num_labels must be >= 1"):
        ts.Chain(0)
    with pytest.raises(TypeError, match="num_labels must be an integer"):
        ts.Chain(2.5)
    with pytest.raises(ValueError, match=r"class_weights must have shape \(3,\)"):
        ts.Chain(3, class_weights=torch.ones(2))
    with pytest.raises(ValueError, match="bias must be one of"):
        ts.LinearChainModel(4, 3, bias="yes")
    model = ts.LinearChainModel(4, 3)
    with pytest.raises(ValueError, match="x must have 4 features"):
        model(torch.zeros(2, 3, 5))
    sparse = ts.LinearChainModel(4, 3, sparse=True)
    with pytest.raises(ValueError, match="x.ids holds attribute 4"):
        sparse(ts.TokenFeatures(torch.tensor([[[4, -1]]])))
    with pytest.raises(ValueError, match="x.ids holds attribute -7"):
        sparse(ts.TokenFeatures(torch.tensor([[[2, -7]]])))
    with pytest.raises(ValueError, match="backend must be one of"):
        ts.Multiclass(3).decode(torch.zeros(2, 3), backend="gpu")
    with pytest.raises(TypeError, match="loss_weight must be a floating-point tensor"):
        ts.structured_hinge_loss(ts.Chain(3), pot(), Y, L, loss_weight=torch.tensor([True, False]))
    with pytest.raises(ValueError, match="backend must be one of"):
        ts.Chain(3).decode(pot(), L, backend="cuda")


def test_metrics_and_evaluation_arguments():
    from torchssvm.evaluation import evaluate_chain
    from torchssvm.metrics import chunk_f1, labels_to_tags, sequence_errors, token_errors

    y, lengths = torch.tensor([[0, 1, 2], [1, 1, -1]]), torch.tensor([3, 2])
    assert token_errors(y, y, lengths) == (0, 5) and sequence_errors(y, y, lengths) == (0, 2)
    for fn in (token_errors, sequence_errors):
        with pytest.raises(ValueError, match="y_hat must have y's shape"):
            fn(y[:, :1], y, lengths)  # would broadcast
        with pytest.raises(ValueError, match="lengths has 1 entries"):
            fn(y, y, lengths[:1])
        with pytest.raises(ValueError, match="lengths must be <= the padded size 3"):
            fn(y, y, torch.tensor([4, 2]))
    with pytest.raises(ValueError, match=r"label ids in \[0, 2\)"):
        labels_to_tags(y, lengths, ["O", "B-NP"])  # 2 is no name; -1 would read the last name
    assert labels_to_tags(y, lengths, ["O", "B-NP", "I-NP"]) == [["O", "B-NP", "I-NP"], ["B-NP", "B-NP"]]
    with pytest.raises(TypeError, match="predicted must be a list of sentences"):
        chunk_f1(["B-NP", "I-NP"], ["B-NP", "B-NP"])  # one flat sentence: each str read letter by letter
    data = ts.data.synthetic_chain("train", 4, seed=0)
    model = ts.LinearChainModel(data.num_features, data.num_labels)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch_size must be >= 1"):
            evaluate_chain(model, ts.Chain(data.num_labels), data, batch_size=bad)


def test_solver_chunk_and_path_arguments():
    from torchssvm.optim import FrankWolfe, StructuredRisk, regularization_path
    from torchssvm.optim.primal.pegasos import Pegasos

    data = ts.data.synthetic_chain("train", 6, seed=0)
    model = ts.LinearChainModel(data.num_features, data.num_labels, dtype=torch.float64)
    for bad in (0, -1):  # -1 decoded nothing and reported a gap of 0 (FrankWolfe) or a risk of 0 (StructuredRisk)
        with pytest.raises(ValueError, match="chunk must be >= 1"):
            FrankWolfe(model, data, lam=0.1, chunk=bad)
        with pytest.raises(ValueError, match="chunk must be >= 1"):
            StructuredRisk(model, data, chunk=bad)
    for name, bad in (("lam_min", float("nan")), ("lam_min", -1.0), ("max_passes", 0)):
        with pytest.raises(ValueError, match=name):
            regularization_path(model, data, **{name: bad})
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="needs a step"):
        Pegasos([w], lam=0.5, average=True).averaged()


def test_metrics_take_lengths_none_and_conlleval_reads_untyped_tags():
    from torchssvm.metrics import chunk_f1, chunks, sequence_errors, token_errors

    y = torch.tensor([[0, 1, 2], [1, 1, 0]])
    y_hat = torch.tensor([[0, 1, 1], [1, 1, 0]])
    assert token_errors(y_hat, y, None) == (1, 6) and sequence_errors(y_hat, y, None) == (1, 2)
    # conlleval: a tag without a type is (prefix, ""), "B" "I" one chunk (it read them as chunks of type B and I)
    assert chunks(["B", "I", "O"]) == {(0, 2, "")}
    assert chunk_f1([["I", "I"]], [["B", "I"]])["f1"] == 100.0
    assert chunks(["NP", "NP", "O"]) == {(0, 2, "NP")}  # a bare type stays one I-chunk of that type


def test_hinge_module_checks_a_scalar_loss_weight_when_built():
    for bad, err in ((-1.0, ValueError), (float("nan"), ValueError), ("a", TypeError),
                     (torch.zeros(2, 2), ValueError), (torch.ones(2, dtype=torch.long), ValueError)):
        with pytest.raises(err, match="loss_weight"):
            ts.StructuredHingeLoss(ts.Chain(3), loss_weight=bad)
