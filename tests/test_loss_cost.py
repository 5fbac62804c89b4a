"""The chain hinge without fixed costs on a GPU (issue 40, deliverable 3): the fused Triton path equals the torch
path; a forward + backward on a (simulated) CUDA device never makes the host wait and launches a handful of
kernels; bad device values are not read on the host but cannot reach out of bounds, make the example's loss NaN,
and raise the CPU's errors in debug mode (`torchssvm.set_debug`)."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import needs_triton

import torchssvm as ts

pytestmark = needs_triton()


def _problem(B, T, K, *, per_position=False, start_end=False, dtype=torch.float32, trans_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    unary = torch.randn(B, T, K, generator=g).to(dtype)
    trans = torch.randn(*((B, T - 1) if per_position else ()), K, K, generator=g).to(trans_dtype or dtype)
    se = [torch.randn(K, generator=g).to(dtype) for _ in range(2)] if start_end else [None, None]
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    y = torch.randint(0, K, (B, T), generator=g)
    return [unary, trans, *se], lengths, y


def _hinge(chain, tensors, y, lengths, backend, loss_weight=1.0, reduction="none"):
    leaves = [None if t is None else t.clone().requires_grad_() for t in tensors]
    lw = loss_weight.clone().requires_grad_() if isinstance(loss_weight, torch.Tensor) else loss_weight
    loss, y_hat = ts.structured_hinge_loss(chain, ts.ChainPotentials(*leaves), y, lengths, loss_weight=lw,
                                           reduction=reduction, backend=backend, return_argmax=True)
    weights = torch.arange(1, loss.numel() + 1, dtype=loss.dtype, device=loss.device).view(loss.shape)  # each its own
    (loss * weights).sum().backward()
    return loss.detach(), y_hat, [None if t is None else t.grad for t in leaves], getattr(lw, "grad", None)


CASES = {
    "shared": dict(shape=(5, 7, 4)),
    "start and end": dict(shape=(5, 7, 4), start_end=True),
    "per position": dict(shape=(5, 7, 4), per_position=True, start_end=True),
    "one position": dict(shape=(3, 1, 4), start_end=True),
    "K = 70": dict(shape=(4, 9, 70), start_end=True),
    "float64": dict(shape=(4, 6, 5), start_end=True, dtype=torch.float64),
    "bfloat16 unary, float32 transition": dict(shape=(4, 6, 5), dtype=torch.bfloat16, trans_dtype=torch.float32),
    "float16": dict(shape=(4, 6, 5), start_end=True, dtype=torch.float16),
    "class weights, not normalized": dict(shape=(5, 7, 4), class_weights=[1.0, 2.0, 0.5, 3.0], normalize=False),
    "loss weight tensor": dict(shape=(5, 7, 4), loss_weight=[0.5, 1.0, 2.0, 0.0, 3.0]),
    "loss weight 0.1, mean": dict(shape=(5, 7, 4), loss_weight=0.1, reduction="mean"),
    "no lengths, sum": dict(shape=(5, 7, 4), lengths=False, reduction="sum"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_triton_hinge_equals_the_torch_path(case):
    """Same loss-augmented labelling, loss and gradients as the torch path (the loss and the shared factors' sums
    to rounding), in the same dtypes."""
    c = CASES[case]
    B, T, K = c["shape"]
    tensors, lengths, y = _problem(B, T, K, per_position=c.get("per_position", False),
                                   start_end=c.get("start_end", False), dtype=c.get("dtype", torch.float32),
                                   trans_dtype=c.get("trans_dtype"))
    cw = c.get("class_weights")
    chain = ts.Chain(K, normalize=c.get("normalize", True), class_weights=None if cw is None else torch.tensor(cw))
    lw = c.get("loss_weight", 1.0)
    lw = torch.tensor(lw, dtype=torch.float64) if isinstance(lw, list) else lw
    lengths = lengths if c.get("lengths", True) else None
    ref = _hinge(chain, tensors, y, lengths, "torch", lw, c.get("reduction", "none"))
    got = _hinge(chain, tensors, y, lengths, "triton", lw, c.get("reduction", "none"))
    assert torch.equal(ref[1], got[1])
    assert ref[0].dtype == got[0].dtype
    torch.testing.assert_close(got[0], ref[0])
    for a, b in zip(ref[2], got[2]):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype
            torch.testing.assert_close(b, a)
    if ref[3] is not None:
        torch.testing.assert_close(got[3], ref[3])


def test_fused_hinge_reads_raw_padding_and_falls_back_under_deterministic_algorithms():
    """The fused kernel takes the target as given (anything past a length, 99 here, is ignored, as the CPU
    normalises it); with deterministic algorithms the backward takes the torch path (no atomic adds)."""
    tensors, lengths, y = _problem(6, 8, 5, start_end=True)
    padded = torch.where(torch.arange(8) < lengths[:, None], y, 99)
    chain = ts.Chain(5)
    ref = _hinge(chain, tensors, padded, lengths, "torch")
    got = _hinge(chain, tensors, padded, lengths, "triton")
    assert torch.equal(ref[1], got[1])
    torch.testing.assert_close(got[0], ref[0])
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        det = _hinge(chain, tensors, padded, lengths, "triton")
    finally:
        torch.use_deterministic_algorithms(before)
    for a, b, c in zip(ref[2], got[2], det[2]):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(c, a)


@pytest.mark.parametrize("loss_fn", [ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss])
def test_double_backward_through_the_fused_hinge_equals_the_torch_path(loss_fn):
    """A gradient penalty through the hinge (``create_graph=True``): the gradient is linear in the incoming one, so
    the penalty's gradient reaches a scale that multiplies the loss. The fused kernel is not differentiable in it;
    the backward takes the torch twin then (it silently dropped that term: 4.71 against 7.39)."""
    tensors, lengths, y = _problem(3, 4, 3, start_end=True, dtype=torch.float64, seed=3)
    v = torch.randn(3, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    chain = ts.Chain(3)
    out = {}
    for backend in ("torch", "triton"):
        unary = tensors[0].clone().requires_grad_()
        scale = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
        loss = scale * loss_fn(chain, ts.ChainPotentials(unary, *tensors[1:]), y, lengths, reduction="sum",
                               backend=backend)
        (g,) = torch.autograd.grad(loss, unary, create_graph=True)
        (loss + (g * v).sum()).backward()
        # d/d scale of scale * (h + <dh/du, v>) is h + <dh/du, v>: the hinge is piecewise linear in the potentials
        expected = loss.detach() / 2 + (g.detach() / 2 * v).sum()
        assert g.requires_grad
        torch.testing.assert_close(scale.grad, expected)
        out[backend] = (scale.grad, unary.grad)
    torch.testing.assert_close(out["triton"][0], out["torch"][0])
    torch.testing.assert_close(out["triton"][1], out["torch"][1])


# ------------------------------------------------------------------------------------------------ the device
def _on_device(tensors, lengths, y):
    return ([None if t is None else t.to("cuda", non_blocking=True).requires_grad_() for t in tensors],
            lengths.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True))


def test_hinge_forward_and_backward_on_a_device_never_waits():
    """StructuredHingeLoss on a Chain, forward + backward on the simulated CUDA device with ``backend="auto"``
    (Triton): no host sync, at most 14 launches (measured 13: the overflow guard's bound, the prepare kernel,
    Viterbi storing the hinge, the mean in float64 and its cast back, the gradient's fill and kernel, and autograd's
    own 6: the seed, the casts' and the mean's backward, the two gradient accumulations...; 14 while autograd filled
    a zero gradient for the labelling output, which the backward never reads; 12 before the guard, with
    the loss's subtraction and clamp, 11 with the guard and a float32 mean, which overflowed near 3.4e38 / B). Before
    issue 40 the same call synced 3 times (the checks of finite potentials, lengths and labels) and launched 84
    kernels. Debug mode restores the checks' reads."""
    from torchssvm.testing import simulated_cuda

    B, T, K = 8, 12, 10
    tensors, lengths, y = _problem(B, T, K)
    crit = ts.StructuredHingeLoss(ts.Chain(K))
    with simulated_cuda() as mode:
        (unary, trans, _, _), d_lengths, d_y = _on_device(tensors, lengths, y)

        def call():
            crit(ts.ChainPotentials(unary, trans), d_y, d_lengths).backward()

        call()  # the gradients exist from here on: each later call accumulates into them
        syncs, launches = mode.syncs, mode.launches
        call()
        assert mode.syncs - syncs == 0, mode.sync_sites
        assert mode.launches - launches <= 14, mode.launch_sites
        grad = unary.grad.cpu()
        previous = ts.set_debug(True)
        try:
            syncs = mode.syncs
            call()
            assert mode.syncs - syncs == 3  # finite potentials, lengths, labels: one read each
        finally:
            ts.set_debug(previous)
    cpu_unary = tensors[0].clone().requires_grad_()
    ts.StructuredHingeLoss(ts.Chain(K))(ts.ChainPotentials(cpu_unary, tensors[1]), y, lengths).backward()
    torch.testing.assert_close(grad, 2 * cpu_unary.grad)


def test_class_weights_tensor_loss_weight_and_decode_on_a_device_never_wait():
    """Class weights are copied to the device once (not per call); a device loss weight is not read; MAP decoding
    and the loss-augmented oracle do not read the lengths or labels either."""
    from torchssvm.testing import simulated_cuda

    B, T, K = 6, 7, 5
    tensors, lengths, y = _problem(B, T, K, start_end=True)
    chain = ts.Chain(K, class_weights=torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0]))
    with simulated_cuda() as mode:
        d_tensors, d_lengths, d_y = _on_device(tensors, lengths, y)
        lw = torch.linspace(0.5, 2.0, B, dtype=torch.float64).to("cuda", non_blocking=True)
        pot = ts.ChainPotentials(*d_tensors)
        ts.structured_hinge_loss(chain, pot, d_y, d_lengths, loss_weight=lw).backward()
        syncs = mode.syncs
        loss = ts.structured_hinge_loss(chain, pot, d_y, d_lengths, loss_weight=lw)
        loss.backward()
        detached = ts.ChainPotentials(*(t.detach() for t in d_tensors))
        y_map = chain.decode(detached, d_lengths)
        y_aug, _ = chain.max_oracle(detached, d_y, d_lengths, loss_weight=lw)
        assert mode.syncs == syncs, mode.sync_sites
        loss, y_map, y_aug = loss.detach().cpu(), y_map.cpu(), y_aug.cpu()
    lw_cpu = torch.linspace(0.5, 2.0, B, dtype=torch.float64)
    assert float(loss) == pytest.approx(float(ts.structured_hinge_loss(chain, ts.ChainPotentials(*tensors), y,
                                                                       lengths, loss_weight=lw_cpu)), rel=1e-5)
    assert torch.equal(y_map, chain.decode(ts.ChainPotentials(*tensors), lengths))
    assert torch.equal(y_aug, chain.max_oracle(ts.ChainPotentials(*tensors), y, lengths, loss_weight=lw_cpu)[0])


BAD = {  # what is wrong, the argument's value on the device, the CPU's error
    "label >= K": ("y", lambda y, L: y.index_put((torch.tensor([1]), torch.tensor([0])), torch.tensor(5)),
                   "target holds label 5"),
    "negative label": ("y", lambda y, L: y.index_put((torch.tensor([1]), torch.tensor([2])), torch.tensor(-3)),
                       "target holds label -3"),
    "length > T": ("lengths", lambda y, L: L.index_put((torch.tensor([1]),), torch.tensor(9)),
                   "lengths must be <= the padded size 6"),
    "length 0": ("lengths", lambda y, L: L.index_put((torch.tensor([1]),), torch.tensor(0)),
                 "lengths must be >= 1"),
    "negative loss weight": ("loss_weight", None, "loss_weight must be finite and >= 0"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_device_values_give_a_nan_loss_or_in_debug_mode_the_cpu_error(what):
    """A bad label, length or loss weight on the device is not read on the host: the kernels clamp what they
    index, and the fused prepare kernel's flag makes that example's loss NaN (the others' are exact); debug mode
    raises the CPU's ValueError; on the CPU it always does."""
    from torchssvm.testing import simulated_cuda

    B, T, K = 4, 6, 5
    tensors, lengths, y = _problem(B, T, K, start_end=True)
    lengths = torch.tensor([6, 4, 5, 6])
    name, bad, msg = BAD[what]
    lw = torch.ones(B, dtype=torch.float64)
    if name == "loss_weight":
        lw[1] = -1.0
    else:
        y, lengths = (bad(y, lengths), lengths) if name == "y" else (y, bad(y, lengths))
    chain = ts.Chain(K)
    with pytest.raises(ValueError, match=msg):  # the CPU
        ts.structured_hinge_loss(chain, ts.ChainPotentials(*tensors), y, lengths, loss_weight=lw)
    with simulated_cuda() as mode:
        d_tensors, d_lengths, d_y = _on_device(tensors, lengths, y)
        d_lw = lw.to("cuda", non_blocking=True)
        pot = ts.ChainPotentials(*d_tensors)
        syncs = mode.syncs
        loss = ts.structured_hinge_loss(chain, pot, d_y, d_lengths, loss_weight=d_lw, reduction="none")
        loss.sum().backward()
        chain.decode(ts.ChainPotentials(*(t.detach() for t in d_tensors)), d_lengths)  # stays in bounds
        assert mode.syncs == syncs
        loss = loss.detach().cpu()
        previous = ts.set_debug(True)
        try:
            with pytest.raises(ValueError, match=msg):
                ts.structured_hinge_loss(chain, pot, d_y, d_lengths, loss_weight=d_lw)
        finally:
            ts.set_debug(previous)
    bad_rows = torch.isnan(loss)
    assert bad_rows.tolist() == [False, True, False, False]
    good = ~bad_rows
    ref = ts.structured_hinge_loss(chain, ts.ChainPotentials(*(t[good] for t in tensors[:1]), *tensors[1:]), y[good],
                                   lengths[good], loss_weight=lw[good], reduction="none")
    torch.testing.assert_close(loss[good], ref.detach())


def test_wrong_shapes_on_a_device_raise_at_once():
    """Shapes, dtypes and devices are metadata: checked eagerly on the device too, without a sync."""
    from torchssvm.testing import simulated_cuda

    tensors, lengths, y = _problem(4, 6, 5)
    loss = ts.StructuredHingeLoss(ts.Chain(5))
    with simulated_cuda() as mode:
        (unary, trans, _, _), d_lengths, d_y = _on_device(tensors, lengths, y)
        pot = ts.ChainPotentials(unary, trans)
        with pytest.raises(ValueError, match=r"target must have shape \(4, 6\)"):
            loss(pot, d_y[:, :5], d_lengths)
        with pytest.raises(TypeError, match="target must be an integer tensor"):
            loss(pot, d_y.float(), d_lengths)
        with pytest.raises(ValueError, match="lengths has 3 entries but the batch size is 4"):
            loss(pot, d_y, d_lengths[:3])
        with pytest.raises(ValueError, match=r"transition must have shape \(5, 5\)"):
            loss(ts.ChainPotentials(unary, trans[:, :4]), d_y, d_lengths)
        with pytest.raises(ValueError, match="loss_weight must be a scalar or have shape"):
            loss(pot, d_y, d_lengths, loss_weight=torch.ones(3, dtype=torch.float64).to("cuda", non_blocking=True))
        assert mode.syncs == 0


def test_debug_switch():
    """`set_debug` returns the previous setting; ``TORCHSSVM_DEBUG=1`` turns debug mode on at import."""
    assert ts.debug_enabled() is False
    assert ts.set_debug(True) is False
    try:
        assert ts.debug_enabled() is True
    finally:
        assert ts.set_debug(False) is True
    env = dict(os.environ, TORCHSSVM_DEBUG="1")
    out = subprocess.run([sys.executable, "-c", "import torchssvm; print(torchssvm.debug_enabled())"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
