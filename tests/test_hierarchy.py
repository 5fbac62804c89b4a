"""The hierarchical multi-label structure against enumeration of its outputs (the closures of leaf sets)."""

import pytest
import torch

import torchssvm as ts

FORESTS = [[-1, 0, 0, 1, 1, 2, -1, 6], [-1, 0, 1, 2], [-1, -1, -1], [-1, 0, 0, 0, 1, 1, 3]]


def _brute(h, theta, objective):
    configs = h.configurations()
    s = theta @ configs.double().t()
    val, j = objective(s, configs).max(1)
    return configs[j], val


@pytest.mark.parametrize("parents", FORESTS)
@pytest.mark.parametrize("allow_empty", [True, False])
def test_hierarchy_oracles_match_enumeration(parents, allow_empty):
    h = ts.Hierarchy(parents, allow_empty=allow_empty)
    g = torch.Generator().manual_seed(len(parents))
    theta = torch.randn(40, len(parents), generator=g, dtype=torch.float64)
    configs = h.configurations()
    y = configs[torch.randint(0, configs.shape[0], (40,), generator=g)]
    y_map, v_map = h.max_oracle(theta)
    _, v_ref = _brute(h, theta, lambda s, c: s)
    torch.testing.assert_close(v_map, v_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h.score(theta, y_map), v_map, rtol=1e-12, atol=1e-12)  # a valid output
    lw = torch.rand(40, generator=g, dtype=torch.float64) * 3
    y_aug, v_aug = h.max_oracle(theta, y, loss_weight=lw)
    ref = torch.stack([_brute(h, theta[b : b + 1],
                              lambda s, c, b=b: s + lw[b] * h.task_loss(c, y[b].expand_as(c)))[1][0]
                       for b in range(40)])
    torch.testing.assert_close(v_aug, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h.score(theta, y_aug) + lw * h.task_loss(y_aug, y), v_aug, rtol=1e-12, atol=1e-12)
    y_sl, v_sl = h.slack_max_oracle(theta, y)
    gold = h.score(theta, y)
    ref = torch.stack([_brute(h, theta[b : b + 1], lambda s, c, b=b: h.task_loss(c, y[b].expand_as(c))
                              * (1 + s - gold[b]))[1][0] for b in range(40)]).clamp_min(0)
    torch.testing.assert_close(v_sl, ref, rtol=1e-12, atol=1e-12)


def test_hierarchy_with_integer_ties_and_the_loss():
    h = ts.Hierarchy(FORESTS[0])
    g = torch.Generator().manual_seed(9)
    theta = torch.randint(-2, 3, (60, 8), generator=g).double()  # ties: zero-gain subtrees stay off
    y_map, v_map = h.max_oracle(theta)
    torch.testing.assert_close(v_map, _brute(h, theta, lambda s, c: s)[1], rtol=0, atol=0)
    torch.testing.assert_close(h.score(theta, y_map), v_map, rtol=0, atol=0)
    y = h.configurations()[torch.randint(0, 16, (60,), generator=g)]
    t = theta.clone().requires_grad_(True)
    loss = ts.slack_rescaled_hinge_loss(h, t, y, reduction="sum")
    loss.backward()
    _, y_hat = ts.slack_rescaled_hinge_loss(h, theta, y, return_argmax=True)
    expect = h.task_loss(y_hat, y).unsqueeze(1) * (y_hat - y).double()
    torch.testing.assert_close(t.grad, expect, rtol=1e-12, atol=1e-12)


def test_hierarchy_errors():
    with pytest.raises(ValueError, match="cycle"):
        ts.Hierarchy([1, 2, 0])
    with pytest.raises(ValueError, match="parents"):
        ts.Hierarchy([-1, 5])
    h = ts.Hierarchy([-1, 0, 0])
    theta = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="parent is off"):
        h.max_oracle(theta, torch.tensor([[0, 1, 0]]))
    with pytest.raises(ValueError, match="without any of its children"):
        h.max_oracle(theta, torch.tensor([[1, 0, 0]]))
    with pytest.raises(ValueError, match="allow_empty"):
        ts.Hierarchy([-1, 0, 0], allow_empty=False).max_oracle(theta, torch.tensor([[0, 0, 0]]))
    with pytest.raises(ValueError, match="leaves"):
        ts.Hierarchy([-1] * 17).configurations()
