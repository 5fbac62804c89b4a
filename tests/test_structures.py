"""Chain and Multiclass: the structure protocol against brute force and autograd."""

import math

import pytest
import torch
from conftest import brute_force_chain, needs_triton

import torchssvm as ts


def chain_pot(B, T, K, *, per_position=False, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    trans = torch.randn(B, T - 1, K, K, generator=g, dtype=dtype) if per_position else \
        torch.randn(K, K, generator=g, dtype=dtype)
    return ts.ChainPotentials(torch.randn(B, T, K, generator=g, dtype=dtype), trans,
                              torch.randn(K, generator=g, dtype=dtype), torch.randn(K, generator=g, dtype=dtype))


def random_labels(B, T, K, lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, K, (B, T), generator=g)
    return torch.where(torch.arange(T) < lengths[:, None], y, torch.full_like(y, -1))


@pytest.mark.parametrize("per_position", [False, True])
def test_score_is_inner_product_with_marginals(per_position):
    B, T, K = 5, 6, 4
    pot = chain_pot(B, T, K, per_position=per_position)
    lengths = torch.tensor([6, 1, 3, 5, 2])
    y = random_labels(B, T, K, lengths)
    chain = ts.Chain(K)
    mu = chain.marginals(y, lengths, per_position=per_position, dtype=torch.float64)
    expect = (pot.unary * mu.unary).sum((1, 2)) + (pot.start * mu.start).sum(1) + (pot.end * mu.end).sum(1)
    tr = pot.transition if per_position else pot.transition.unsqueeze(0)
    expect = expect + (tr * mu.transition).sum(tuple(range(1, mu.transition.dim())))
    assert torch.allclose(chain.score(pot, y, lengths), expect)
    # a shared-transition count equals the number of transitions
    if not per_position:
        assert mu.transition.sum((1, 2)).tolist() == (lengths - 1).tolist()


@pytest.mark.parametrize("per_position", [False, True])
def test_marginal_vjp_is_gradient_of_weighted_score(per_position):
    B, T, K = 4, 5, 3
    pot = chain_pot(B, T, K, per_position=per_position)
    pot = ts.ChainPotentials(*(t.requires_grad_() for t in pot))
    lengths = torch.tensor([5, 2, 1, 4])
    y = random_labels(B, T, K, lengths)
    w = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=torch.float64)
    chain = ts.Chain(K)
    grads = torch.autograd.grad((chain.score(pot, y, lengths) * w).sum(), list(pot))
    vjp = chain.marginal_vjp(y, w, pot, lengths, (True,) * 4)
    for g, v in zip(grads, vjp):
        assert torch.allclose(g, v)


def test_task_loss_hamming_normalized_and_weighted():
    y = torch.tensor([[0, 1, 2, -1], [1, 1, -1, -1]])
    y_hat = torch.tensor([[0, 2, 0, -1], [1, 0, -1, -1]])
    lengths = torch.tensor([3, 2])
    assert ts.Chain(3).task_loss(y_hat, y, lengths).tolist() == pytest.approx([2 / 3, 1 / 2])
    assert ts.Chain(3, normalize=False).task_loss(y_hat, y, lengths).tolist() == [2.0, 1.0]
    cw = torch.tensor([1.0, 2.0, 5.0])
    assert ts.Chain(3, normalize=False, class_weights=cw).task_loss(y_hat, y, lengths).tolist() == [7.0, 2.0]


@pytest.mark.parametrize("pad", [0, 2, 7, -5])
def test_padding_content_is_ignored(pad):
    pot = chain_pot(2, 4, 3)
    lengths = torch.tensor([2, 4])
    y = random_labels(2, 4, 3, lengths)
    y2 = y.clone()
    y2[0, 2:] = pad  # any padding value, even outside [0, K)
    chain = ts.Chain(3, class_weights=torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(chain.score(pot, y, lengths), chain.score(pot, y2, lengths))
    assert torch.equal(chain.decode(pot, lengths, target=y), chain.decode(pot, lengths, target=y2))
    assert torch.equal(chain.task_loss(y2, y2, lengths), chain.task_loss(y, y, lengths))
    for a, b in zip(chain.marginals(y, lengths), chain.marginals(y2, lengths)):
        assert torch.equal(a, b)
    loss = ts.StructuredHingeLoss(chain, reduction="none")
    assert torch.equal(loss(pot, y, lengths), loss(pot, y2, lengths))


@pytest.mark.parametrize("K", [2, 3, 4, 5])
@pytest.mark.parametrize("per_position", [False, True])
# exact ties need integer arithmetic, hence the unnormalized loss in the tied case
@pytest.mark.parametrize("normalize,ties", [(True, False), (False, False), (False, True)])
def test_loss_augmented_decode_matches_brute_force(K, normalize, per_position, ties):
    B, T = 7, 6
    pot = chain_pot(B, T, K, per_position=per_position, seed=3 + K)
    lw = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0, 10.0, 1.0], dtype=torch.float64)
    cw = torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0][:K])
    if ties:  # integer potentials, weights and losses: many exactly tied labellings
        pot = ts.ChainPotentials(*(t.round() for t in pot))
        lw, cw = lw.ceil(), cw.ceil()
    lengths = torch.tensor([6, 5, 4, 3, 2, 1, 6])
    y = random_labels(B, T, K, lengths, seed=4)
    chain = ts.Chain(K, normalize=normalize, class_weights=cw)
    y_hat, value = chain.max_oracle(pot, y, lengths, loss_weight=lw)
    for b in range(B):
        L = int(lengths[b])

        def loss(Y, b=b, L=L):
            d = ((Y != y[b, :L]) * cw.double()[y[b, :L]]).sum(1)
            return float(lw[b]) * (d / L if normalize else d)

        tr = pot.transition[b] if per_position else pot.transition
        y_bf, v_bf = brute_force_chain(pot.unary[b], tr, pot.start, pot.end, L, loss=loss)
        assert y_hat[b, :L].tolist() == y_bf
        assert float(value[b]) == pytest.approx(v_bf, abs=1e-9)
    # value = score + weighted task loss of the returned labelling
    recon = chain.score(pot, y_hat, lengths) + lw * chain.task_loss(y_hat, y, lengths)
    assert torch.allclose(value, recon)


def test_scalar_loss_weight_equals_tensor():
    pot = chain_pot(3, 4, 3, seed=7)
    y = random_labels(3, 4, 3, torch.tensor([4, 4, 4]))
    chain = ts.Chain(3)
    a = chain.decode(pot, target=y, loss_weight=2.0)
    b = chain.decode(pot, target=y, loss_weight=torch.full((3,), 2.0))
    assert torch.equal(a, b)


def test_a_loss_weight_past_the_dtype_range_gives_inf_not_nan():
    """float32 potentials with loss_weight 1e39 (finite in float64, inf in float32): every wrong label gets +inf;
    the true labels got inf * 0 = NaN and the value was NaN."""
    pot = ts.ChainPotentials(*(t.float() for t in chain_pot(2, 6, 4, seed=3)))
    y = random_labels(2, 6, 4, torch.tensor([6, 6]))
    _, value = ts.Chain(4, normalize=False).max_oracle(pot, y, loss_weight=1e39)
    assert torch.equal(value, torch.full((2,), torch.inf))


def test_a_loss_weight_past_the_dtype_range_in_the_enumerated_structures():
    """Multiclass and MultiLabel: +inf on every wrong labelling, not inf * 0 = NaN at the truth (the hinge was NaN
    with a zero gradient); Hierarchy's flip costs would add +inf and -inf in its float32 DP, so the overflow guard
    runs it in float64: the exact labelling (every node flipped), and the value +inf in float32."""
    g = torch.Generator().manual_seed(0)
    mc = ts.Multiclass(4)
    s, y = torch.randn(3, 4, generator=g), torch.tensor([0, 2, 3])
    y_hat, value = mc.max_oracle(s, y, loss_weight=1e39)
    assert torch.equal(value, torch.full((3,), torch.inf)) and bool((y_hat != y).all())
    heavy = ts.Multiclass(4, class_weights=torch.tensor([1e39, 1.0, 1.0, 1.0], dtype=torch.float64))
    _, value = heavy.slack_max_oracle(s, torch.tensor([0, 0, 1]))
    # computed in float64 (the cost 1e39 has no float32 value): exact where the product fits float32, +inf where not
    _, ref = heavy.slack_max_oracle(s.double(), torch.tensor([0, 0, 1]))
    assert not bool(value.isnan().any())
    torch.testing.assert_close(value, ref.float())
    ml = ts.MultiLabel(3)
    pot = ts.MultiLabelPotentials(torch.randn(2, 3, generator=g), torch.randn(ml.num_edges, generator=g))
    yl = torch.tensor([[1, 0, 1], [0, 0, 0]])
    y_hat, value = ml.max_oracle(pot, yl, loss_weight=1e39)
    assert torch.equal(value, torch.full((2,), torch.inf)) and bool((y_hat != yl).any(1).all())
    yh = torch.tensor([[1, 1, 0], [0, 0, 0]])
    y_hat, value = ts.Hierarchy([-1, 0, 0]).max_oracle(torch.randn(2, 3, generator=g), yh, loss_weight=1e39)
    assert torch.equal(y_hat, torch.tensor([[0, 0, 0], [1, 1, 1]])) and torch.equal(value, torch.full((2,), math.inf))


def test_multilabel_scores_mixed_precision_like_it_decodes():
    """A half-precision unary with a float32 shared pairwise (a network under autocast) passes `validate`; `score`
    raised in its matrix product ('addmv ... same dtype') while decoding and the losses worked."""
    g = torch.Generator().manual_seed(1)
    ml = ts.MultiLabel(3)
    unary, pairwise = torch.randn(4, 3, generator=g), torch.randn(ml.num_edges, generator=g)
    y = torch.randint(0, 2, (4, 3), generator=g)
    for half in (torch.float16, torch.bfloat16):
        got = ml.score(ts.MultiLabelPotentials(unary.to(half), pairwise), y)
        assert got.dtype == torch.float32  # compute_dtype, as the oracles
        torch.testing.assert_close(got, ml.score(ts.MultiLabelPotentials(unary.to(half).float(), pairwise), y))


@pytest.mark.parametrize("make", [
    lambda: ts.Hierarchy([-1, 0.5, 1.7]),
    lambda: ts.Hierarchy(torch.tensor([-1.0, 0.0])),
    lambda: ts.Tree([-1, 0.0, 1.9], num_labels=2),
    lambda: ts.Tree(torch.tensor([-1.0, 0.0]), num_labels=2),
    lambda: ts.MultiLabel(3, [(0.5, 1.9)]),
], ids=["hierarchy-list", "hierarchy-tensor", "tree-list", "tree-tensor", "multilabel-edges"])
def test_non_integer_parents_and_edges_are_refused_not_truncated(make):
    with pytest.raises(TypeError, match="parents|edge"):
        make()


def test_an_empty_hierarchy_names_parents():
    with pytest.raises(ValueError, match="parents"):
        ts.Hierarchy([])


@needs_triton()
def test_loss_augmented_decode_triton_equals_torch():
    pot = chain_pot(5, 7, 30, per_position=True, seed=2, dtype=torch.float32)
    lengths = torch.tensor([7, 3, 1, 6, 5])
    y = random_labels(5, 7, 30, lengths)
    chain = ts.Chain(30)
    lw = torch.rand(5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = chain.max_oracle(pot, y, lengths, loss_weight=lw, backend="torch")
    b = chain.max_oracle(pot, y, lengths, loss_weight=lw, backend="triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_half_precision_is_decoded_in_float32():
    pot = chain_pot(4, 6, 5, seed=9, dtype=torch.float32)
    lengths = torch.tensor([6, 5, 4, 3])
    chain = ts.Chain(5)
    ref = chain.decode(pot, lengths)
    half = ts.ChainPotentials(*(t.bfloat16().float().bfloat16() for t in pot))
    as32 = ts.ChainPotentials(*(t.float() for t in half))
    assert torch.equal(chain.decode(half, lengths), chain.decode(as32, lengths))
    assert ref.shape == (4, 6)


class TestMulticlass:
    def test_decode_and_loss_augmented(self):
        s = torch.tensor([[1.0, 2.0, 2.0], [0.0, 0.5, 0.2], [3.0, 0.0, 2.5]])
        y = torch.tensor([2, 1, 0])
        mc = ts.Multiclass(3)
        assert mc.decode(s).tolist() == [1, 1, 0]  # ties: smallest index
        y_hat, value = mc.max_oracle(s, y, loss_weight=torch.tensor([1.0, 0.0, 1.0]))
        # brute force: argmax_k s[k] + lw*[k != y]
        for b in range(3):
            aug = [float(s[b, k]) + (float([1.0, 0.0, 1.0][b]) if k != int(y[b]) else 0.0) for k in range(3)]
            assert int(y_hat[b]) == aug.index(max(aug))
            assert float(value[b]) == pytest.approx(max(aug))

    def test_protocol_consistency(self):
        g = torch.Generator().manual_seed(0)
        s = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
        y = torch.randint(0, 4, (6,), generator=g)
        mc = ts.Multiclass(4, class_weights=torch.tensor([1.0, 2.0, 3.0, 4.0]))
        assert torch.allclose(mc.score(s, y), (s * mc.marginals(y, dtype=torch.float64)).sum(1))
        w = torch.randn(6, generator=g, dtype=torch.float64)
        (grad,) = torch.autograd.grad((mc.score(s, y) * w).sum(), s)
        assert torch.allclose(grad, mc.marginal_vjp(y, w, s, None, (True,))[0])
        y_hat = torch.tensor([0, 1, 2, 3, 0, 1])
        expect = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)[y] * (y_hat != y)
        assert torch.equal(mc.task_loss(y_hat, y), expect)


def test_spatial_tree_scores_mixed_precision_in_float32():
    """A half unary with float32 weights (autocast): the deformation was cast to half, -inf past 65504."""
    st = ts.SpatialTree([-1, 0], 1, 2, loss="hamming")
    w = torch.tensor([[0.0, 7e4, 0.0, 0.0]])
    y = torch.tensor([[0, 1]])
    for half in (torch.float16, torch.bfloat16):
        got = st.score(ts.SpatialTreePotentials(torch.zeros(1, 2, 2, dtype=half), w), y)
        assert got.dtype == torch.float32 and float(got) == -7e4


def test_chain_loss_weight_past_the_range_with_a_zero_class_weight():
    """inf * 0 in float32 was NaN, and the oracle returned a wrong labelling."""
    ch = ts.Chain(2, class_weights=torch.tensor([0.0, 1.0]), normalize=False)
    pot = ts.ChainPotentials(torch.tensor([[[5.0, 0.0]]]), torch.zeros(2, 2))
    for backend in ("torch", "auto"):
        y_hat, value = ch.max_oracle(pot, torch.tensor([[0]]), loss_weight=1e39, backend=backend)
        assert y_hat.tolist() == [[0]] and float(value) == 5.0


def test_binary_hamming_tables_are_exact_at_the_truth_and_never_nan():
    """The slack oracle reported a violation of 3e-8 at the truth in float32 (about half of random trials), and
    costs past float32's range gave NaN tables (no violation reported)."""
    g = torch.Generator().manual_seed(0)
    cw = torch.tensor([2.7474, 1.7232, 1.4366, 2.3854, 1.0999, 0.8245, 0.1168], dtype=torch.float64)
    ml = ts.MultiLabel(7, None, normalize=True, class_weights=cw)
    for _ in range(50):
        tgt = torch.randint(0, 2, (1, 7), generator=g)
        y_hat, value = ml.slack_max_oracle(ts.MultiLabelPotentials(((2 * tgt - 1) * 50.0).float()), tgt)
        assert torch.equal(y_hat, tgt) and float(value) == 0.0
    big = ts.MultiLabel(2, None, normalize=False, class_weights=torch.tensor([1e39, 1.0], dtype=torch.float64))
    pot, t = ts.MultiLabelPotentials(torch.zeros(1, 2)), torch.tensor([[1, 0]])
    for oracle in (big.max_oracle, big.slack_max_oracle):
        _, value = oracle(pot, t)
        assert float(value) >= 3e38
    h = ts.Hierarchy([-1, 0, 0], normalize=False, class_weights=torch.tensor([1.0, 1e39, 1.0], dtype=torch.float64))
    _, value = h.slack_max_oracle(torch.zeros(1, 3), torch.tensor([[1, 1, 0]]))
    assert float(value) >= 3e38


def test_structure_arguments_are_checked():
    y = torch.tensor([[0, 1, 2]])
    for make, err, match in (
            (lambda: ts.Chain(3).marginals(y, dtype="float32"), TypeError, "dtype"),
            (lambda: ts.Chain(3).marginals(y, dtype=torch.long), TypeError, "dtype"),
            (lambda: ts.Multiclass(3).marginals(y[:, 0], dtype=torch.int32), TypeError, "dtype"),
            (lambda: ts.Hierarchy([-1, 0, 0], allow_empty="False"), TypeError, "allow_empty"),
            (lambda: ts.Chain(3, normalize="no"), TypeError, "normalize"),
            (lambda: ts.Chain(3).max_oracle(ts.ChainPotentials(torch.randn(1, 3, 3), torch.randn(3, 3),
                                                               [0.0, 0.0, 0.0])), TypeError, "start"),
            (lambda: ts.Chain(3).decode(ts.ChainPotentials(torch.randn(1, 3, 3), torch.randn(3, 3)),
                                        loss_weight=-1.0), ValueError, "loss_weight")):
        with pytest.raises(err, match=match):
            make()
