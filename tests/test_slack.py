"""Slack rescaling (seed 000): exact oracles against brute-force enumeration, the loss's gradient against
finite differences, and the multi-label structure."""

import itertools

import pytest
import torch
from conftest import needs_triton
from torchssvm.kernels import numba_available, slack_viterbi

import torchssvm as ts


def _chain_batch(B, T, K, seed, per_position=False, ends=True, integer=False):
    g = torch.Generator().manual_seed(seed)
    rnd = (lambda *s: torch.randint(-2, 3, s, generator=g).double()) if integer else \
        (lambda *s: torch.randn(*s, generator=g, dtype=torch.float64))
    unary = rnd(B, T, K)
    trans = rnd(B, T - 1, K, K) if per_position and T > 1 else rnd(K, K)
    start, end = (rnd(K), rnd(K)) if ends else (None, None)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    y = torch.randint(0, K, (B, T), generator=g)
    y[torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)] = -1
    return ts.ChainPotentials(unary, trans, start, end), lengths, y


def _brute_chain(chain, pot, lengths, y):
    """max(0, max_y' Delta(y') (1 + s(y') - s(y))) per example, by enumeration."""
    B, T, K = pot.unary.shape
    out = []
    for b in range(B):
        L = int(lengths[b])
        p = ts.ChainPotentials(pot.unary[b : b + 1], pot.transition[b : b + 1] if pot.transition.dim() == 4
                               else pot.transition, pot.start, pot.end)
        ys = torch.tensor(list(itertools.product(range(K), repeat=L)))
        cand = torch.full((ys.shape[0], T), -1, dtype=torch.long)
        cand[:, :L] = ys
        n = ys.shape[0]
        rep = ts.ChainPotentials(p.unary.expand(n, T, K), p.transition.expand(n, *p.transition.shape[1:])
                                 if p.transition.dim() == 4 else p.transition, p.start, p.end)
        ln = lengths[b : b + 1].expand(n)
        s = chain.score(rep, cand, ln)
        gold = chain.score(p, y[b : b + 1], lengths[b : b + 1])
        delta = chain.task_loss(cand, y[b : b + 1].expand(n, T), ln)
        out.append(max(0.0, float((delta * (1 + s - gold)).max())))
    return torch.tensor(out, dtype=torch.float64)


def _phi(structure, pot, y_hat, y, lengths=None):
    s = structure.score(pot, y_hat, lengths)
    gold = structure.score(pot, y, lengths)
    return structure.task_loss(y_hat, y, lengths) * (1 + s - gold)


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("T", [1, 2, 3, 5])
@pytest.mark.parametrize("normalize", [True, False])
def test_chain_slack_oracle_matches_enumeration(K, T, normalize):
    chain = ts.Chain(K, normalize=normalize)
    for seed, per_position, ends in [(0, False, True), (1, True, True), (2, False, False)]:
        pot, lengths, y = _chain_batch(6, T, K, seed + 10 * T + K, per_position=per_position, ends=ends)
        y_hat, value = chain.slack_max_oracle(pot, y, lengths)
        torch.testing.assert_close(value, _brute_chain(chain, pot, lengths, y), rtol=1e-10, atol=1e-10)
        # the returned labelling attains the value and is padded like the truth
        torch.testing.assert_close(_phi(chain, pot, y_hat, y, lengths).clamp_min(0), value, rtol=1e-10, atol=1e-10)
        assert torch.equal(y_hat < 0, y < 0)
        assert torch.equal(y_hat[value == 0], y[value == 0])


def test_chain_slack_oracle_with_exact_ties():
    chain = ts.Chain(3)
    pot, lengths, y = _chain_batch(40, 4, 3, 7, integer=True)  # integer scores: many exact ties
    y_hat, value = chain.slack_max_oracle(pot, y, lengths)
    torch.testing.assert_close(value, _brute_chain(chain, pot, lengths, y), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_phi(chain, pot, y_hat, y, lengths).clamp_min(0), value, rtol=1e-12, atol=1e-12)
    assert bool((value > 0).any()) and bool((value == 0).any())


def test_chain_slack_oracle_in_chunks_equals_whole(monkeypatch):
    from torchssvm.kernels.chain import slack_chain_torch

    chain = ts.Chain(4)
    pot, lengths, y = _chain_batch(9, 6, 4, 3, per_position=True)
    whole = chain.slack_max_oracle(pot, y, lengths)
    monkeypatch.setattr(slack_chain_torch, "_MAX_HISTORY_ELEMENTS", 6 * 7 * 4 * 2)  # chunks of 2
    parts = chain.slack_max_oracle(pot, y, lengths)
    assert torch.equal(whole[0], parts[0]) and torch.equal(whole[1], parts[1])


def _slack_args(pot, lengths, y, chain):
    gold = chain.score(pot, y, lengths)
    cost = 1.0 / lengths.double() if chain.normalize else torch.ones(lengths.shape[0], dtype=torch.float64)
    return (pot.unary, pot.transition, pot.start, pot.end, lengths, y, cost, gold)


@needs_triton()
@pytest.mark.parametrize("K", [2, 3, 5])
@pytest.mark.parametrize("T", [1, 2, 4, 6])
def test_triton_slack_dp_matches_enumeration_and_torch_bitwise(K, T):
    from torchssvm.kernels.chain.slack_chain_triton import slack_viterbi_triton

    chain = ts.Chain(K)
    for seed, per_position, ends, integer in [(0, False, True, False), (1, True, True, True),
                                              (2, False, False, True)]:
        pot, lengths, y = _chain_batch(5, T, K, seed + 10 * T + K, per_position=per_position, ends=ends,
                                       integer=integer)
        args = _slack_args(pot, lengths, y, chain)
        labels, value = slack_viterbi_triton(*args)
        ref = slack_viterbi(*args, backend="torch")
        assert torch.equal(labels, ref[0]) and torch.equal(value, ref[1])
        if T <= 4:
            torch.testing.assert_close(value, _brute_chain(chain, pot, lengths, y), rtol=1e-10, atol=1e-10)


@needs_triton()
@pytest.mark.parametrize("B,T,K,dtype", [(6, 14, 26, torch.float32), (3, 20, 23, torch.float64),
                                         (2, 9, 40, torch.float32)])
def test_triton_slack_dp_equals_torch_at_benchmark_shapes(B, T, K, dtype):
    """OCR-like (T 14, K 26) and CoNLL-like (K 23) shapes, non-power-of-two tiles, float32 and float64."""
    chain = ts.Chain(K)
    pot, lengths, y = _chain_batch(B, T, K, 5, integer=True)
    pot = ts.ChainPotentials(pot.unary.to(dtype), pot.transition.to(dtype), pot.start.to(dtype), pot.end.to(dtype))
    args = _slack_args(pot, lengths, y, chain)
    args = args[:6] + (args[6].to(dtype), args[7].to(dtype))
    a = slack_viterbi(*args, backend="torch")
    b = slack_viterbi(*args, backend="triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert bool((a[1] > 0).any())


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton())])
def test_slack_dp_returns_the_truth_when_every_labelling_scores_minus_inf(backend):
    """A position where every label is -inf: no labelling violates, and the truth (not a walk back through -inf
    scores) comes back with value 0, -1 padded past the length."""
    unary = torch.zeros(2, 4, 3, dtype=torch.float64)
    unary[:, 1] = -torch.inf
    target = torch.tensor([[2, 1, 2, 0], [1, 2, 0, -1]])
    lengths = torch.tensor([4, 3])
    labels, value = slack_viterbi(unary, torch.zeros(3, 3, dtype=torch.float64), None, None, lengths, target,
                                  torch.ones(2, dtype=torch.float64), torch.full((2,), -torch.inf, dtype=torch.float64),
                                  backend=backend)
    assert labels.tolist() == [[2, 1, 2, 0], [1, 2, 0, -1]] and value.tolist() == [0.0, 0.0]


def test_slack_dominates_margin_free_violation_and_is_zero_when_separated():
    chain = ts.Chain(3)
    pot, lengths, y = _chain_batch(5, 4, 3, 11)
    # truth far ahead: every other labelling has h = 1 + s(y') - s(y) < 0, so the loss is 0 and y_hat = y
    big = pot.unary + 100.0 * torch.nn.functional.one_hot(y.clamp_min(0), 3).double()
    y_hat, value = chain.slack_max_oracle(ts.ChainPotentials(big, *pot[1:]), y, lengths)
    assert torch.equal(value, torch.zeros(5, dtype=torch.float64)) and torch.equal(y_hat, y)


def test_multiclass_slack_oracle_matches_enumeration():
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    for mc in (ts.Multiclass(5), ts.Multiclass(5, class_weights=weights)):
        s = torch.randn(50, 5, generator=g, dtype=torch.float64)
        y = torch.randint(0, 5, (50,), generator=g)
        y_hat, value = mc.slack_max_oracle(s, y)
        c = mc._class_weight(y, torch.float64)
        brute = torch.stack([c * (k != y) * (1 + s[:, k] - s.gather(1, y.unsqueeze(1)).squeeze(1))
                             for k in range(5)], 1).max(1).values.clamp_min(0)
        torch.testing.assert_close(value, brute, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(_phi(mc, s, y_hat, y).clamp_min(0), value, rtol=1e-12, atol=1e-12)


# -- the multi-label structure ---------------------------------------------------------------------------
def _ml_batch(K, B, seed, edges="full", per_example=False):
    ml = ts.MultiLabel(K, edges=edges)
    g = torch.Generator().manual_seed(seed)
    unary = torch.randn(B, K, generator=g, dtype=torch.float64)
    E = ml.num_edges
    pairwise = None
    if E:
        pairwise = torch.randn(B, E, generator=g, dtype=torch.float64) if per_example else \
            torch.randn(E, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (B, K), generator=g)
    return ml, ts.MultiLabelPotentials(unary, pairwise), y


def _ml_brute(ml, pot, y, objective):
    K = ml.num_labels
    configs = torch.tensor(list(itertools.product([0, 1], repeat=K)))
    B = y.shape[0]
    best = []
    for b in range(B):
        p = ts.MultiLabelPotentials(pot.unary[b : b + 1].expand(len(configs), K),
                                    None if pot.pairwise is None else
                                    (pot.pairwise[b : b + 1].expand(len(configs), -1) if pot.pairwise.dim() == 2
                                     else pot.pairwise))
        s = ml.score(p, configs)
        loss = ml.task_loss(configs, y[b : b + 1].expand(len(configs), K))
        gold = ml.score(ts.MultiLabelPotentials(pot.unary[b : b + 1], None if pot.pairwise is None else
                                                (pot.pairwise[b : b + 1] if pot.pairwise.dim() == 2 else pot.pairwise)),
                        y[b : b + 1])
        best.append(float(objective(s, loss, gold).max()))
    return torch.tensor(best, dtype=torch.float64)


@pytest.mark.parametrize("edges,per_example",
                         [("full", False), ("full", True), ([(0, 2), (3, 1)], False), (None, False)])
def test_multilabel_oracles_match_enumeration(edges, per_example):
    ml, pot, y = _ml_batch(5, 12, 3, edges, per_example)
    y_map, v_map = ml.max_oracle(pot)
    torch.testing.assert_close(v_map, _ml_brute(ml, pot, y, lambda s, loss, gold: s), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ml.score(pot, y_map), v_map, rtol=1e-12, atol=1e-12)
    lw = torch.rand(12, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    y_aug, v_aug = ml.max_oracle(pot, y, loss_weight=lw)
    brute = torch.stack([_ml_brute(ml, pot, y[b : b + 1].expand(12, -1),
                                   lambda s, loss, gold, w=lw[b]: s + w * loss)[b] for b in range(12)])
    torch.testing.assert_close(v_aug, brute, rtol=1e-12, atol=1e-12)
    y_sl, v_sl = ml.slack_max_oracle(pot, y)
    torch.testing.assert_close(v_sl, _ml_brute(ml, pot, y, lambda s, loss, gold: loss * (1 + s - gold)).clamp_min(0),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_phi(ml, pot, y_sl, y).clamp_min(0), v_sl, rtol=1e-12, atol=1e-12)
    # score is <potentials, marginals>, and log_partition is the log-sum-exp of all scores
    m = ml.marginals(y, dtype=torch.float64)
    inner = (pot.unary * m.unary).sum(1)
    if pot.pairwise is not None:
        inner = inner + (pot.pairwise * m.pairwise).sum(1)
    torch.testing.assert_close(ml.score(pot, y), inner, rtol=1e-12, atol=1e-12)
    lz = _ml_brute(ml, pot, y, lambda s, loss, gold: torch.logsumexp(s, 0, keepdim=True))
    torch.testing.assert_close(ml.log_partition(pot), lz, rtol=1e-12, atol=1e-12)


def test_multilabel_validation_errors():
    with pytest.raises(ValueError, match="edges"):
        ts.MultiLabel(3, edges=[(0, 0)])
    with pytest.raises(ValueError, match="twice"):
        ts.MultiLabel(3, edges=[(0, 1), (1, 0)])
    with pytest.raises(ValueError, match="edges"):
        ts.MultiLabel(3, edges="chain")
    ml = ts.MultiLabel(3)
    with pytest.raises(ValueError, match="pairwise is None"):
        ml.max_oracle(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="pairwise must have shape"):
        ml.max_oracle(ts.MultiLabelPotentials(torch.zeros(2, 3), torch.zeros(4)))
    with pytest.raises(ValueError, match="outside"):
        ml.max_oracle(ts.MultiLabelPotentials(torch.zeros(2, 3), torch.zeros(3)), torch.full((2, 3), 2))
    big = ts.MultiLabel(17, edges=None)
    with pytest.raises(ValueError, match="K <= 16"):
        big.max_oracle(torch.zeros(1, 17))


# -- the loss -----------------------------------------------------------------------------------------
def _finite_difference_check(structure, tensors, make, y, lengths, eps=1e-6):
    """Autograd's gradient of the summed loss against central differences, entry by entry."""
    params = [t.clone().requires_grad_(True) for t in tensors]
    loss = ts.slack_rescaled_hinge_loss(structure, make(params), y, lengths, reduction="sum")
    grads = torch.autograd.grad(loss, params)
    for p, g in zip(params, grads):
        flat = p.detach().view(-1)
        num = torch.zeros_like(flat)
        for j in range(flat.numel()):
            vals = []
            for sign in (1, -1):
                q = [t.detach().clone() for t in params]
                q[[id(x) for x in params].index(id(p))].view(-1)[j] += sign * eps
                vals.append(float(ts.slack_rescaled_hinge_loss(structure, make(q), y, lengths, reduction="sum")))
            num[j] = (vals[0] - vals[1]) / (2 * eps)
        torch.testing.assert_close(g.view(-1), num, rtol=1e-5, atol=1e-6)


def test_slack_loss_gradient_matches_finite_differences_chain():
    chain = ts.Chain(3)
    pot, lengths, y = _chain_batch(4, 4, 3, 5, per_position=False)
    _finite_difference_check(chain, list(pot), lambda t: ts.ChainPotentials(*t), y, lengths)


def test_slack_loss_gradient_matches_finite_differences_multilabel_and_multiclass():
    ml, pot, y = _ml_batch(4, 5, 2)
    _finite_difference_check(ml, list(pot), lambda t: ts.MultiLabelPotentials(*t), y, None)
    s = torch.randn(6, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    yc = torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(5))
    _finite_difference_check(ts.Multiclass(4), [s], lambda t: t[0], yc, None)


def test_slack_loss_value_gradient_and_module():
    chain = ts.Chain(3)
    pot, lengths, y = _chain_batch(6, 5, 3, 8)
    unary = pot.unary.clone().requires_grad_(True)
    crit = ts.SlackRescaledHingeLoss(chain, reduction="none")
    loss = crit(ts.ChainPotentials(unary, *pot[1:]), y, lengths)
    torch.testing.assert_close(loss, _brute_chain(chain, pot, lengths, y), rtol=1e-10, atol=1e-10)
    loss.sum().backward()
    _, y_hat = ts.slack_rescaled_hinge_loss(chain, pot, y, lengths, return_argmax=True)
    delta = chain.task_loss(y_hat, y, lengths)
    m_hat = chain.marginals(y_hat, lengths, dtype=torch.float64).unary
    m_gold = chain.marginals(y, lengths, dtype=torch.float64).unary
    torch.testing.assert_close(unary.grad, delta.view(-1, 1, 1) * (m_hat - m_gold), rtol=1e-12, atol=1e-12)
    assert "search='exact'" in repr(crit)


def test_slack_loss_errors():
    chain = ts.Chain(3, class_weights=torch.tensor([1.0, 2.0, 1.0]))
    pot, lengths, y = _chain_batch(2, 3, 3, 0)
    with pytest.raises(ValueError, match="class_weights"):
        ts.slack_rescaled_hinge_loss(chain, pot, y, lengths)
    with pytest.raises(ValueError, match="search"):
        ts.SlackRescaledHingeLoss(ts.Chain(3), search="angular-typo")
    with pytest.raises(ValueError, match="backend"):
        slack_viterbi(pot.unary, pot.transition, None, None, lengths, y, torch.ones(2, dtype=torch.float64),
                      torch.zeros(2, dtype=torch.float64), backend="cuda-typo")


def test_slack_loss_trains_a_multilabel_model():
    """A linear multi-label model trained on the slack-rescaled loss fits separable synthetic data."""
    g = torch.Generator().manual_seed(0)
    K, D, n = 4, 6, 200
    W = torch.randn(D, K, generator=g)
    x = torch.randn(n, D, generator=g)
    y = (x @ W > 0).long()
    ml = ts.MultiLabel(K)
    lin = torch.nn.Linear(D, K).double()
    pair = torch.nn.Parameter(torch.zeros(ml.num_edges, dtype=torch.float64))
    opt = torch.optim.Adam([*lin.parameters(), pair], lr=0.05)
    first = None
    for _ in range(150):
        loss = ts.slack_rescaled_hinge_loss(ml, ts.MultiLabelPotentials(lin(x.double()), pair), y)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    y_hat = ml.decode(ts.MultiLabelPotentials(lin(x.double()).detach(), pair.detach()))
    assert float(loss) < 0.1 * first
    assert float((y_hat != y).double().mean()) < 0.05


@pytest.mark.parametrize("search", ["angular", "bisecting", "binary", "golden"])
def test_searched_slack_loss_is_a_certified_lower_bound_with_its_own_subgradient(search):
    """The searched loss is Phi of the labelling found (<= the exact loss; angular >= 0.999 of it), and the
    backward is that labelling's subgradient ``Delta(y_hat) (m(y_hat) - m(y*))``."""
    ml = ts.MultiLabel(5, edges="full")
    g = torch.Generator().manual_seed(4)
    pot = ts.MultiLabelPotentials(torch.randn(12, 5, generator=g, dtype=torch.float64, requires_grad=True),
                                  torch.randn(10, generator=g, dtype=torch.float64))
    y = torch.randint(0, 2, (12, 5), generator=g)
    exact = ts.slack_rescaled_hinge_loss(ml, pot, y, reduction="none")
    loss, y_hat = ts.slack_rescaled_hinge_loss(ml, pot, y, search=search, reduction="none", return_argmax=True)
    torch.testing.assert_close(loss, _phi(ml, pot, y_hat, y).clamp_min(0).detach(), rtol=1e-12, atol=1e-12)
    assert bool((loss <= exact + 1e-12).all())
    if search == "angular":
        assert bool((loss >= 0.999 * exact - 1e-12).all())
    loss.sum().backward()
    delta = ml.task_loss(y_hat, y)
    m_hat, m_gold = ml.marginals(y_hat, dtype=torch.float64).unary, ml.marginals(y, dtype=torch.float64).unary
    torch.testing.assert_close(pot.unary.grad, delta.unsqueeze(1) * (m_hat - m_gold), rtol=1e-12, atol=1e-12)


def test_searched_slack_loss_on_a_chain_and_angular_needs_the_constrained_oracle():
    chain = ts.Chain(3)
    pot, lengths, y = _chain_batch(6, 4, 3, 11)
    exact = ts.slack_rescaled_hinge_loss(chain, pot, y, lengths, reduction="none")
    loss, y_hat = ts.slack_rescaled_hinge_loss(chain, pot, y, lengths, search="bisecting", reduction="none",
                                               return_argmax=True)
    torch.testing.assert_close(loss, _phi(chain, pot, y_hat, y, lengths).clamp_min(0), rtol=1e-10, atol=1e-10)
    assert bool((loss <= exact + 1e-12).all()) and bool((loss > 0).any())
    with pytest.raises(ValueError, match="constrained"):
        ts.SlackRescaledHingeLoss(chain, search="angular")


def test_numba_backend_is_refused_for_the_exact_slack_oracle_only():
    """The exact slack-rescaled oracles have no numba twin: the loss says so when it is built (it failed in forward
    with a message about the other kernels); the searches over the loss-augmented decoder take numba."""
    with pytest.raises(ValueError, match="no numba twin"):
        ts.SlackRescaledHingeLoss(ts.Chain(3), backend="numba")
    pot = ts.ChainPotentials(torch.randn(2, 4, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64))
    y = torch.randint(0, 3, (2, 4))
    with pytest.raises(ValueError, match="no numba twin"):
        ts.slack_rescaled_hinge_loss(ts.Chain(3), pot, y, backend="numba")
    for structure, p, target in ((ts.Chain(3), pot, y), (ts.Multiclass(3), torch.randn(2, 3), y[:, 0])):
        with pytest.raises(ValueError, match="no numba twin"):  # it named Viterbi's twins, which the chain has
            structure.slack_max_oracle(p, target, backend="numba")
    if numba_available():
        searched = ts.slack_rescaled_hinge_loss(ts.Chain(3), pot, y, search="bisecting", backend="numba")
        assert torch.equal(searched, ts.slack_rescaled_hinge_loss(ts.Chain(3), pot, y, search="bisecting",
                                                                  backend="torch"))
