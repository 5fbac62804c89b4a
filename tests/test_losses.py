"""StructuredHingeLoss: values against brute force, gradients against finite differences, training."""

import pytest
import torch
from conftest import brute_force_chain
from test_structures import chain_pot, random_labels

import torchssvm as ts


@pytest.mark.parametrize("per_position", [False, True])
def test_hinge_value_matches_brute_force(per_position):
    B, T, K = 5, 4, 3
    pot = chain_pot(B, T, K, per_position=per_position, seed=11)
    lengths = torch.tensor([4, 3, 2, 1, 4])
    y = random_labels(B, T, K, lengths, seed=12)
    chain = ts.Chain(K)
    loss = ts.StructuredHingeLoss(chain, reduction="none")(pot, y, lengths)
    for b in range(B):
        L = int(lengths[b])
        tr = pot.transition[b] if per_position else pot.transition

        def delta(Y, b=b, L=L):
            return (Y != y[b, :L]).sum(1).double() / L

        _, v_bf = brute_force_chain(pot.unary[b], tr, pot.start, pot.end, L, loss=delta)
        gold = float(chain.score(pot, y, lengths)[b])
        assert float(loss[b]) == pytest.approx(v_bf - gold, abs=1e-9)
    assert (loss >= 0).all()
    mean = ts.StructuredHingeLoss(chain)(pot, y, lengths)
    assert float(mean) == pytest.approx(float(loss.mean()))


@pytest.mark.parametrize("per_position", [False, True])
def test_hinge_gradient_matches_finite_differences(per_position):
    B, T, K = 4, 5, 4
    pot = chain_pot(B, T, K, per_position=per_position, seed=21)
    pot = ts.ChainPotentials(*(3 * t for t in pot))  # larger scale: unique, well separated maximizers
    lengths = torch.tensor([5, 3, 2, 4])
    y = random_labels(B, T, K, lengths, seed=22)
    w = torch.tensor([1.0, -0.5, 2.0, 0.7], dtype=torch.float64)
    chain = ts.Chain(K)

    def f(*tensors):
        return (ts.structured_hinge_loss(chain, ts.ChainPotentials(*tensors), y, lengths, reduction="none") * w).sum()

    inputs = [t.clone().requires_grad_() for t in pot]
    grads = torch.autograd.grad(f(*inputs), inputs)
    eps = 1e-6
    for i, (t, g) in enumerate(zip(pot, grads)):
        flat = t.reshape(-1)
        for j in range(0, flat.numel(), max(1, flat.numel() // 25)):
            plus = [p.clone() for p in pot]
            minus = [p.clone() for p in pot]
            plus[i].view(-1)[j] += eps
            minus[i].view(-1)[j] -= eps
            fd = (f(*plus) - f(*minus)) / (2 * eps)
            assert float(g.reshape(-1)[j]) == pytest.approx(float(fd), abs=1e-6), (i, j)


def test_hinge_gradient_is_marginal_difference():
    B, T, K = 3, 4, 3
    pot = ts.ChainPotentials(*(t.requires_grad_() for t in chain_pot(B, T, K, seed=5)))
    lengths = torch.tensor([4, 2, 3])
    y = random_labels(B, T, K, lengths, seed=6)
    chain = ts.Chain(K)
    loss, y_hat = ts.structured_hinge_loss(chain, pot, y, lengths, reduction="sum", return_argmax=True)
    loss.backward()
    mh = chain.marginals(y_hat, lengths, dtype=torch.float64)
    mg = chain.marginals(y, lengths, dtype=torch.float64)
    assert torch.allclose(pot.unary.grad, mh.unary - mg.unary)
    assert torch.allclose(pot.transition.grad, (mh.transition - mg.transition).sum(0))
    assert torch.allclose(pot.start.grad, (mh.start - mg.start).sum(0))
    assert torch.allclose(pot.end.grad, (mh.end - mg.end).sum(0))


def test_multiclass_hinge_is_crammer_singer():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(8, 5, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 5, (8,), generator=g)
    loss = ts.structured_hinge_loss(ts.Multiclass(5), s, y, reduction="none")
    margin = s + 1.0 - torch.nn.functional.one_hot(y, 5)
    expect = margin.max(1).values - s.gather(1, y[:, None]).squeeze(1)
    assert torch.allclose(loss, expect)
    loss.sum().backward()
    auto = s.detach().clone().requires_grad_()
    m = auto + 1.0 - torch.nn.functional.one_hot(y, 5)
    (m.max(1).values - auto.gather(1, y[:, None]).squeeze(1)).sum().backward()
    assert torch.allclose(s.grad, auto.grad)


def test_only_requested_gradients():
    pot = chain_pot(2, 3, 3, seed=1)
    unary = pot.unary.clone().requires_grad_()
    y = random_labels(2, 3, 3, torch.tensor([3, 3]))
    ts.StructuredHingeLoss(ts.Chain(3))(ts.ChainPotentials(unary, pot.transition), y).backward()
    assert unary.grad is not None and pot.transition.grad is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_potentials_match_float32(dtype):
    """Half potentials decode in float32 and accumulate shared-factor gradients in float32: the result
    equals the float32 computation on the same (rounded) values up to the final rounding."""
    B, T, K = 256, 50, 5
    pot = chain_pot(B, T, K, seed=2, dtype=torch.float32)
    y = random_labels(B, T, K, torch.full((B,), T), seed=3)
    half = ts.ChainPotentials(*(t.to(dtype).requires_grad_() for t in pot))
    full = ts.ChainPotentials(*(t.detach().float().requires_grad_() for t in half))
    chain = ts.Chain(K)
    lh = ts.StructuredHingeLoss(chain)(half, y)
    lf = ts.StructuredHingeLoss(chain)(full, y)
    lh.backward()
    lf.backward()
    assert lh.dtype == torch.float32 and half.transition.grad.dtype == dtype  # the loss as autocast's losses
    assert float(lh.detach()) == pytest.approx(float(lf.detach()), rel=1e-2)
    for h, f in zip(half, full):
        assert float(f.grad.abs().max()) > 0
        assert torch.allclose(h.grad.float(), f.grad, rtol=1e-2, atol=1e-3)


def test_loss_weight_gradient_is_task_loss():
    pot = chain_pot(4, 5, 3, seed=12)
    lengths = torch.tensor([5, 4, 3, 2])
    y = random_labels(4, 5, 3, lengths, seed=13)
    lw = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    chain = ts.Chain(3)
    loss, y_hat = ts.structured_hinge_loss(chain, pot, y, lengths, loss_weight=lw, reduction="sum",
                                           return_argmax=True)
    loss.backward()
    assert torch.allclose(lw.grad, chain.task_loss(y_hat, y, lengths))


def test_small_network_trains_with_torch_optim():
    """An MLP producing unary potentials, a learned transition, the hinge loss and Adam."""
    train = ts.data.synthetic_chain("train", 300, num_labels=4, num_features=8, noise=1.0, seed=3)
    test = ts.data.synthetic_chain("test", 200, num_labels=4, num_features=8, noise=1.0, seed=3)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    trans = torch.nn.Parameter(torch.zeros(4, 4))
    chain = ts.Chain(4)
    criterion = ts.StructuredHingeLoss(chain)
    opt = torch.optim.Adam([*net.parameters(), trans], lr=1e-2)

    def error(ds):
        b = ds[:]
        y_hat = chain.decode(ts.ChainPotentials(net(b.x), trans), b.lengths)
        wrong, total = ts.metrics.token_errors(y_hat, b.y, b.lengths)
        return wrong / total

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        before = error(test)
    first = None
    for _ in range(15):
        for batch in train.batches(32, shuffle=True, generator=gen):
            loss = criterion(ts.ChainPotentials(net(batch.x), trans), batch.y, batch.lengths)
            first = float(loss.detach()) if first is None else first
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        after = error(test)
        final = float(criterion(ts.ChainPotentials(net(train[:].x), trans), train[:].y, train[:].lengths))
    assert final < 0.5 * first
    assert after < 0.6 * before and after < 0.2
    assert trans.grad is not None and trans.abs().sum() > 0


@pytest.mark.parametrize("per_position", [False, True])
def test_crf_log_partition_and_gradient_match_brute_force(per_position):
    import itertools

    B, T, K = 3, 4, 3
    pot = ts.ChainPotentials(*(t.requires_grad_() for t in chain_pot(B, T, K, per_position=per_position, seed=8)))
    lengths = torch.tensor([4, 2, 3])
    y = random_labels(B, T, K, lengths, seed=9)
    chain = ts.Chain(K)
    nll = ts.crf_negative_log_likelihood(chain, pot, y, lengths, reduction="sum")
    nll.backward()
    # brute force: enumerate every labelling, log-sum-exp of scores, expected marginals
    expect_nll = 0.0
    expect_grad = torch.zeros_like(pot.unary)
    for b in range(B):
        L = int(lengths[b])
        Y = torch.full((K**L, T), -1, dtype=torch.long)
        Y[:, :L] = torch.tensor(list(itertools.product(range(K), repeat=L)))
        rep = ts.ChainPotentials(pot.unary[b : b + 1].detach().expand(K**L, T, K),
                                 pot.transition[b : b + 1].detach().expand(K**L, T - 1, K, K) if per_position
                                 else pot.transition.detach(), pot.start.detach(), pot.end.detach())
        lens = torch.full((K**L,), L)
        scores = chain.score(rep, Y, lens)
        log_z = torch.logsumexp(scores, 0)
        expect_nll += float(log_z) - float(chain.score(pot, y, lengths)[b].detach())
        p = torch.softmax(scores, 0)
        mu = chain.marginals(Y, lens, dtype=torch.float64).unary
        expect_grad[b] = (p[:, None, None] * mu).sum(0) - chain.marginals(y, lengths, dtype=torch.float64).unary[b]
    assert float(nll) == pytest.approx(expect_nll, abs=1e-9)
    assert torch.allclose(pot.unary.grad, expect_grad, atol=1e-9)


def test_multiclass_crf_is_cross_entropy():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(6, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (6,), generator=g)
    nll = ts.CRFLoss(ts.Multiclass(4))(s, y)
    assert float(nll) == pytest.approx(float(torch.nn.functional.cross_entropy(s, y)))


def test_losses_edge_cases_and_errors():
    """An empty MultiLabel batch gives an empty loss; the CRF loss on a structure without a log partition and an
    unknown backend raise, naming what is missing."""
    ml = ts.MultiLabel(3)
    empty = ts.MultiLabelPotentials(torch.zeros(0, 3), torch.zeros(3))
    y0 = torch.zeros(0, 3, dtype=torch.long)
    assert ts.structured_hinge_loss(ml, empty, y0, reduction="none").shape == (0,)
    assert ts.slack_rescaled_hinge_loss(ml, empty, y0, reduction="none").shape == (0,)
    assert ml.decode(empty).shape == (0, 3)
    tree = ts.Tree([-1, 0, 0], 2)
    tpot = ts.TreePotentials(torch.zeros(1, 3, 2), torch.zeros(2, 2, 2))
    with pytest.raises(NotImplementedError, match="Tree has no log_partition"):
        ts.crf_negative_log_likelihood(tree, tpot, torch.zeros(1, 3, dtype=torch.long))
    scores, y = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    for fn in (ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss):
        with pytest.raises(ValueError, match="backend must be one of"):
            fn(ts.Multiclass(3), scores, y, backend="bogus")
    for module in (ts.StructuredHingeLoss, ts.SlackRescaledHingeLoss):
        with pytest.raises(ValueError, match="backend must be one of"):
            module(ts.Multiclass(3), backend="cuda")


def test_hinge_module_moves_a_tensor_loss_weight_with_it():
    crit = ts.StructuredHingeLoss(ts.Multiclass(3), loss_weight=torch.tensor([1.0, 2.0]))
    assert "loss_weight" in dict(crit.named_buffers()) and "loss_weight" not in crit.state_dict()
    crit = crit.to(torch.float64)  # .to(device) moves it the same way
    assert crit.loss_weight.dtype == torch.float64
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.5]])
    # loss_weight (1, 2): the first example's hinge 1 + 1 - 0, the second's 2 + 0.5 - 0
    assert crit(scores, torch.tensor([0, 0])).item() == pytest.approx((2.0 + 2.5) / 2)


def test_binary_labellings_may_be_bool():
    """A multi-label (or two-label chain) target of bool is the labelling of its 0 / 1: the same loss as the long one;
    a bool target of more labels is refused, naming it."""
    g = torch.Generator().manual_seed(7)
    ml = ts.MultiLabel(4)
    pot = ts.MultiLabelPotentials(torch.randn(5, 4, generator=g), torch.randn(6, generator=g))
    y = torch.randint(0, 2, (5, 4), generator=g)
    for fn in (ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss):
        torch.testing.assert_close(fn(ml, pot, y.bool(), reduction="none"), fn(ml, pot, y, reduction="none"))
    chain = ts.Chain(2)
    cpot = ts.ChainPotentials(torch.randn(2, 3, 2, generator=g), torch.randn(2, 2, generator=g))
    yc = torch.randint(0, 2, (2, 3), generator=g)
    torch.testing.assert_close(ts.structured_hinge_loss(chain, cpot, yc.bool()),
                               ts.structured_hinge_loss(chain, cpot, yc))
    with pytest.raises(TypeError, match="target must be an integer tensor"):
        ts.structured_hinge_loss(ts.Chain(3), (torch.randn(2, 3, 3), torch.randn(3, 3)), yc.bool())


def test_a_rest_offset_that_requires_grad_is_refused():
    """A spatial tree's rest offsets are constants of the score (no gradient reaches them): one that requires grad is
    refused rather than silently left without a gradient; detached it is the same loss."""
    st = ts.SpatialTree([-1, 0, 0], 2, 3, loss="hamming")
    g = torch.Generator().manual_seed(8)
    rest = torch.randn(2, 2, dtype=torch.float64, generator=g)
    unary = torch.randn(2, 3, 6, dtype=torch.float64, generator=g)
    weights = torch.rand(2, 4, dtype=torch.float64, generator=g)
    y = torch.randint(0, 6, (2, 3), generator=g)
    with pytest.raises(ValueError, match=r"rest requires grad.*pass rest.detach\(\)"):
        ts.structured_hinge_loss(st, ts.SpatialTreePotentials(unary, weights, rest.clone().requires_grad_()), y)
    with torch.no_grad():  # nothing to differentiate: accepted
        st.score(ts.SpatialTreePotentials(unary, weights, rest.clone().requires_grad_()), y)
    ts.structured_hinge_loss(st, ts.SpatialTreePotentials(unary, weights, rest), y)
    mt = ts.MixtureSpatialTree([-1, 0, 0], 2, 3, num_types=2)
    mpot = ts.MixtureTreePotentials(torch.randn(2, 3, 6, dtype=torch.float64, generator=g),
                                    torch.rand(2, 2, 4, dtype=torch.float64, generator=g),
                                    torch.randn(2, 2, 2, dtype=torch.float64, generator=g).requires_grad_())
    with pytest.raises(ValueError, match="rest requires grad"):
        mt.score(mpot, (torch.randint(0, 6, (2, 3), generator=g), torch.randint(0, 2, (2, 3), generator=g)))
