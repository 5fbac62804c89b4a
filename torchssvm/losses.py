"""Structured losses: the margin-rescaled and slack-rescaled hinges (autograd Functions with an explicit
backward) and, as the baseline they are compared against, the CRF negative log-likelihood.

Structured hinge loss:

Margin rescaling (Taskar et al., 2003; Tsochantaridis et al., 2005): per example

    H(theta; y*) = max_y [ loss_weight * Delta(y*, y) + s_theta(y) ] - s_theta(y*)  >= 0,

with the max found by the structure's exact loss-augmented oracle, run without autograd. Its gradient
with respect to every potential tensor is the difference of one-hot factor marginals
``marginals(y_hat) - marginals(y*)`` (a subgradient where the maximizer is not unique).

Each loss validates its inputs once (`Structure.validate_hinge` / `Structure.validate`, and the capability it needs:
`Structure.require`), then calls the structure's unchecked tier (``structure.unchecked``).

Numerics: no loss gives NaN or a wrong finite value for finite potentials. The magnitudes that the finiteness check
reads bound every sum the oracles form; where that bound does not fit the compute dtype (float32 potentials near
1e38), the loss is computed in float64 and cast back, and a loss that float32 cannot hold (6e38) is an OverflowError
naming it rather than an inf; float64 potentials whose sums could pass 1.8e308 are an OverflowError naming the
potentials (`torchssvm.structures.base`, "numerics at the dtype's limits"). On device tensors outside debug mode the
values are not read (docs/gpu.md: a read makes the host wait for the device): there the hinge on a `Chain` is guarded
inside its fused Triton kernels (`torchssvm.kernels.chain.guard_triton`), and its hinge on the torch backend, its CRF
loss and its exact slack-rescaled loss (with its margin ``1 / c``) at a power of two ``c`` found on the device
(`torchssvm.structures.base.device_scaling`): +inf where the loss does not fit, never NaN.

The CRF loss is guarded as the hinge: ``log Z(theta) - s(y*) = c (log Z_c(theta / c) - s_{theta / c}(y*))`` with the
log-sum-exps at temperature ``1 / c`` (`torchssvm.structures.base.logsumexp_scaled`, whose gradient is the softmax
normalised by its own sum: `torch.logsumexp`'s is not where ``log K`` is lost in the rounding of large logits).
"""

from __future__ import annotations

import torch
from torch import nn

from ._validation import (
    check_bool,
    check_fits,
    check_loss_weight,
    check_loss_weight_value,
    collect_magnitudes,
    refuse_vmap,
)
from .kernels import check_backend, resolve
from .structures.base import Structure, compute_dtype, no_autocast

REDUCTIONS = ("mean", "sum", "none")


class _StructuredHinge(torch.autograd.Function):
    # forward without ctx, and `setup_context`: the form torch.func's transforms (grad, jvp's refusal) need. The
    # forward returns the target and lengths it normalised, for the backward (not differentiable; callers drop them)
    @staticmethod
    def forward(structure, target, lengths, loss_weight, backend, plan, *tensors):
        if isinstance(plan, tuple):
            pot = structure.from_tensors(_widened(structure, tensors, plan))
            if plan[1]:  # potentials scaled by 2**-shift: the loss weight too (the hinge is homogeneous in both)
                loss_weight = loss_weight * 2.0 ** -plan[1]
        else:  # `Unchecked.guard_plan`: the device's power of two (unread values)
            low, c = plan
            if not isinstance(loss_weight, torch.Tensor):
                loss_weight = torch.full((target.shape[0],), float(loss_weight), dtype=torch.float64,
                                         device=target.device)
            pot, loss_weight = structure.from_tensors(low), loss_weight / c.to(torch.float64)
        with no_autocast():  # the oracle and the gold score in compute_dtype, not autocast's half precision
            loss, y_hat, target, lengths = structure.unchecked.hinge_forward(pot, target, lengths,
                                                                             loss_weight=loss_weight, backend=backend)
        loss = _narrowed(loss, tensors, plan, "structured_hinge_loss: the loss")
        return loss, y_hat, *_views(target, lengths)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_hinge_context(ctx, inputs[0], inputs[4], output, inputs[6:])

    @staticmethod
    def backward(ctx, grad_loss, *_grad_labels):
        if grad_loss is None:  # only the labellings were used (`set_materialize_grads(False)`)
            return (None,) * (6 + len(ctx.saved_tensors) - 3)
        y_hat, target, lengths, *tensors = ctx.saved_tensors
        fast = ctx.structure.unchecked
        grads = fast.marginal_difference(y_hat, target, lengths, grad_loss, tensors, ctx.needs_input_grad[6:],
                                         ctx.backend)
        grad_lw = None
        if ctx.needs_input_grad[3]:  # d loss / d loss_weight = Delta(y*, y_hat)
            grad_lw = grad_loss.to(torch.float64) * fast.task_loss(y_hat, target, lengths)
        return (None, None, None, grad_lw, None, None) + grads


def _views(*tensors):
    """Views of ``tensors`` (None stays None): a forward may not return an input as-is that its `setup_context`
    saves (the validated target can be the caller's own tensor)."""
    return tuple(None if t is None else t.view_as(t) for t in tensors)


def _save_hinge_context(ctx, structure, backend, output, tensors) -> None:
    """What a hinge's backward reads: the structure, the backend, and the labellings, lengths and potentials."""
    _, y_hat, target, lengths = output
    ctx.structure, ctx.backend = structure, backend
    ctx.save_for_backward(y_hat, target, lengths, *tensors)
    ctx.mark_non_differentiable(*(t for t in (y_hat, target, lengths) if t is not None))
    # the labellings' gradients are never read: no zero-filled tensors for them (a launch each on a GPU)
    ctx.set_materialize_grads(False)


def _widened(structure, tensors, plan):
    """The potential tensors as the overflow guard's ``plan`` ``(wide, shift)`` asks (`Unchecked.overflow_plan`):
    unchanged, in float64, or in float64 times ``2**-shift`` (`Unchecked.scaled`)."""
    wide, shift = plan
    return structure.unchecked.scaled(tensors, shift) if wide else tensors


def _narrowed(loss: torch.Tensor, tensors, plan, what: str) -> torch.Tensor:
    """A loss computed as the guard's ``plan`` says, back in the potentials' `compute_dtype` (and scaled back): an
    OverflowError naming ``what`` where it does not fit (an inf would hide the loss, and NaN follow in a mean or a
    gradient step); for a device's plan ``[low, c]``, times ``c``: +inf where it does not fit, never NaN."""
    if not isinstance(plan, tuple):
        return loss * plan[1].to(loss.dtype)
    wide, shift = plan
    if not wide:
        return loss
    dt = compute_dtype(tensors)
    check_fits(what, loss, dt, shift=shift)
    if shift:
        loss = torch.ldexp(loss, torch.tensor(shift, dtype=loss.dtype, device=loss.device))
    return loss.to(dt)


def _check_target(target) -> None:
    """``target`` must be a tensor: a clear TypeError rather than an AttributeError deep in a structure."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor of labels, got {type(target).__name__}")


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    """The batch ``"mean"`` or ``"sum"`` of per-example losses, accumulated where it cannot overflow: float32 (and
    half) losses in float64, so that losses near 3.4e38 do not sum to inf (their mean is finite, and so is a sum that
    float32 holds), and a float64 mean near 1.8e308 at a power-of-two scale. On the CPU the result is read: a sum
    float32 cannot hold is an OverflowError. On a device nothing is read (docs/gpu.md): such a sum is +inf, a float32
    mean or sum costs one launch more (the cast back) and a float64 mean two (the exact scalings by ``2**-k``,
    ``2**k``, ``2**k >= B``). The mean of no losses is NaN, as `torch.mean`'s."""
    if reduction == "none":
        return loss
    if not loss.is_floating_point():
        return loss.mean() if reduction == "mean" else loss.sum()
    dt = loss.dtype
    if loss.device.type != "cpu":  # no read (none of its own in debug mode either)
        if dt != torch.float64:
            return (loss.mean(dtype=torch.float64) if reduction == "mean" else loss.sum(dtype=torch.float64)).to(dt)
        if reduction == "sum":
            return loss.sum()
        k = max(1, (loss.numel() - 1).bit_length())  # the scaled entries sum below float64's max; exact scalings
        return loss.mul(2.0 ** -k).mean().mul(2.0 ** k)
    out = loss.mean(dtype=torch.float64) if reduction == "mean" else loss.sum(dtype=torch.float64)
    if loss.numel() and not bool(torch.isfinite(out)) and bool(torch.isfinite(loss).all()):
        if reduction == "sum":
            raise OverflowError(f"the sum of the losses overflows {str(dt).replace('torch.', '')}; use "
                                "reduction='mean' or 'none'")
        k = max(1, (loss.numel() - 1).bit_length())  # 2**k >= B: the scaled entries sum below float64's max
        two = torch.tensor(k, dtype=torch.float64, device=loss.device)
        out = torch.ldexp(torch.ldexp(loss.to(torch.float64), -two).mean(), two)
    if dt != torch.float64 and loss.numel():
        hint = ("use reduction='mean' or 'none'" if reduction == "sum" else
                "a loss is past the dtype's range itself: use float64 potentials")  # the mean of finite ones fits
        check_fits(f"the {reduction} of the losses", out.detach(), dt, hint=hint)
    return out.to(dt)


def _check_structure(structure) -> None:
    if not isinstance(structure, Structure):
        raise TypeError(f"structure must be a torchssvm Structure, got {type(structure).__name__}")


def _check_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def structured_hinge_loss(
    structure: Structure,
    potentials,
    target: torch.Tensor,
    lengths=None,
    *,
    loss_weight=1.0,
    reduction: str = "mean",
    backend: str = "auto",
    return_argmax: bool = False,
):
    """Margin-rescaled structured hinge loss.

    Args:
        structure: e.g. ``Chain(K)`` or ``Multiclass(K)``.
        potentials: the structure's potentials (``ChainPotentials`` or ``(B, K)`` scores), any dtype;
            half precision is decoded in float32.
        target: true labels (``(B, T)`` for chains, ``(B,)`` for multiclass).
        lengths: ``(B,)`` sequence lengths for chains.
        loss_weight: scalar or ``(B,)`` multiplier of the task loss inside the max (a tensor that
            requires grad receives ``Delta(target, y_hat)``, the loss's derivative in it).
        reduction: ``"mean"`` | ``"sum"`` | ``"none"`` over examples.
        return_argmax: also return the loss-augmented labelling ``y_hat``.
    """
    _check_structure(structure)
    _check_reduction(reduction)
    _check_target(target)
    refuse_vmap("the structured losses", potentials, target, lengths, loss_weight)
    with collect_magnitudes() as mags:
        pot, lengths, target = structure.validate_hinge(potentials, lengths, target, backend=backend)
    tensors = structure.tensors(pot)
    if isinstance(loss_weight, torch.Tensor):
        lw = check_loss_weight(loss_weight, tensors[0].shape[0], tensors[0].device, torch.float64)
    else:  # a number stays one (no tensor filled per call)
        check_loss_weight_value(loss_weight)
        lw = float(loss_weight)
    plan = structure.unchecked.guard_plan(tensors, mags, loss_weight=lw, homogeneous=True,
                                          guarded=structure.unchecked.guards_own_hinge(tensors[0].device, backend))
    loss, y_hat, _, _ = _StructuredHinge.apply(structure, target, lengths, lw, backend, plan, *tensors)
    loss = _reduce(loss, reduction)
    return (loss, y_hat) if check_bool("return_argmax", return_argmax) else loss


class StructuredHingeLoss(nn.Module):
    """Module wrapper of `structured_hinge_loss`: ``loss = criterion(potentials, target, lengths)``."""

    def __init__(self, structure: Structure, reduction: str = "mean", *, loss_weight=1.0, backend: str = "auto"):
        super().__init__()
        _check_structure(structure)
        self.structure = structure
        self.reduction = _check_reduction(reduction)
        check_loss_weight_value(loss_weight)  # as far as it can be without a batch (its shape: per call)
        if isinstance(loss_weight, torch.Tensor) and not loss_weight.requires_grad:
            # a buffer, so that .to(device) moves it with the module (not saved: it is a setting, not a parameter)
            self.register_buffer("loss_weight", loss_weight, persistent=False)
        else:
            self.loss_weight = loss_weight
        self.backend = check_backend(backend)

    def forward(self, potentials, target, lengths=None, *, loss_weight=None):
        return structured_hinge_loss(
            self.structure,
            potentials,
            target,
            lengths,
            loss_weight=self.loss_weight if loss_weight is None else loss_weight,
            reduction=self.reduction,
            backend=self.backend,
        )

    def extra_repr(self) -> str:
        return f"{self.structure!r}, reduction={self.reduction!r}"


class _SlackRescaledHinge(torch.autograd.Function):
    # the form of `_StructuredHinge` (torch.func's transforms)
    @staticmethod
    def forward(structure, target, lengths, backend, search, plan, *tensors):
        if isinstance(plan, tuple):  # the margin scales with the potentials (a shift only for search="exact")
            pot, margin = structure.from_tensors(_widened(structure, tensors, plan)), 2.0 ** -plan[1]
        else:  # `Unchecked.guard_plan`: the device's power of two (unread values)
            pot, margin = structure.from_tensors(plan[0]), 1 / plan[1]
        with no_autocast():
            if search == "exact":
                y_hat, value = structure.unchecked.slack_max_oracle(pot, target, lengths, backend=backend,
                                                                    margin=margin)
            else:
                y_hat, value = _searched_oracle(structure, pot, target, lengths, backend, search)
        value = _narrowed(value, tensors, plan, "slack_rescaled_hinge_loss: the loss")
        # float32 for half precision (see _StructuredHinge)
        return value.to(compute_dtype(tensors)), y_hat, *_views(target, lengths)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_hinge_context(ctx, inputs[0], inputs[3], output, inputs[6:])

    @staticmethod
    def backward(ctx, grad_loss, *_grad_labels):
        if grad_loss is None:  # only the labellings were used (`set_materialize_grads(False)`)
            return (None,) * (6 + len(ctx.saved_tensors) - 3)
        y_hat, target, lengths, *tensors = ctx.saved_tensors
        fast = ctx.structure.unchecked
        # d/dtheta Delta(y_hat) (1 + s(y_hat) - s(y*)) = Delta(y_hat) (marginals(y_hat) - marginals(y*))
        with no_autocast():
            weight = grad_loss.to(torch.float64) * fast.task_loss(y_hat, target, lengths)
        grads = fast.marginal_difference(y_hat, target, lengths, weight, tensors, ctx.needs_input_grad[6:],
                                         ctx.backend)
        return (None, None, None, None, None, None) + grads


SEARCHES = ("exact", "angular", "bisecting", "binary", "golden")


def _check_search(search: str, structure=None) -> str:
    """``search``, checked, and the capability it needs of ``structure``: ``"angular"`` the constrained
    lambda-oracle (``has_table_oracle``, a ValueError), ``"exact"`` the exact slack oracle (``has_slack_oracle``, a
    NotImplementedError); the other searches need the loss-augmented oracle, which every structure has."""
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
    if structure is not None:
        if search == "angular":
            exact = " or 'exact'" if structure.has_slack_oracle else ""
            structure.require("has_table_oracle", "search='angular' needs the constrained lambda-oracle; use "
                              f"'bisecting', 'binary', 'golden' (the lambda-oracle){exact}", error=ValueError)
        elif search == "exact":
            structure.require("has_slack_oracle", "search='exact' needs it; use a search over the loss-augmented "
                              "oracle: 'bisecting', 'binary' or 'golden'")
    return search


def _check_slack_backend(search: str, backend: str) -> None:
    if backend == "numba" and search == "exact":
        raise ValueError("backend='numba' with search='exact': the exact slack-rescaled oracles have no numba twin; "
                         "use backend='auto' (numba where a twin exists) or 'torch', or a search over the "
                         "loss-augmented decoder")


def _searched_oracle(structure, pot, target, lengths, backend, search):
    """``(y_hat, Phi(y_hat))`` found by a search of `torchssvm.search` over lambda-oracles (angular: the
    table oracle with its constrained form; the others: loss-augmented decoding of the structure)."""
    from .search import StructureOracle, TableOracle, angular_search, binary_search, bisecting_search, golden_search

    if search == "angular":
        result = angular_search(TableOracle.from_structure(structure, pot, target))
    else:
        oracle = StructureOracle(structure, pot, target, lengths, backend=backend)
        if search == "bisecting":
            result = bisecting_search(oracle)
        elif search == "binary":
            result = binary_search(oracle)
        else:
            result = golden_search(oracle, torch.zeros(target.shape[0], dtype=torch.float64, device=target.device))
    return result.labels, result.phi


def slack_rescaled_hinge_loss(
    structure: Structure,
    potentials,
    target: torch.Tensor,
    lengths=None,
    *,
    search: str = "exact",
    reduction: str = "mean",
    backend: str = "auto",
    return_argmax: bool = False,
):
    """Slack-rescaled structured hinge loss (Tsochantaridis et al., 2005; Choi et al., 2016, eq. 4): per example

        max_y Delta(y*, y) (1 + s_theta(y) - s_theta(y*))  >= 0,

    with the subgradient ``Delta(y_hat) (marginals(y_hat) - marginals(y*))`` in the potentials (explicit
    backward; zero when nothing violates, ``y_hat = y*``).

    Args:
        structure: ``Chain(K)`` (exact error-count DP, uniform Hamming cost), ``Multiclass(K)``,
            ``MultiLabel(K)`` or ``Hierarchy(parents)`` (exact by enumeration).
        potentials, target, lengths, reduction, backend, return_argmax: as `structured_hinge_loss`.
        search: how the most violating labelling is found: ``"exact"`` (the structure's exact oracle), or a
            search over lambda-oracles (`torchssvm.search`): ``"angular"`` (Multiclass / MultiLabel; exact
            up to its 0.999 stop), ``"bisecting"``, ``"binary"``, ``"golden"`` (any structure with a
            loss-augmented decoder; they may miss the maximum, so the loss is then a lower bound and
            its gradient the subgradient at the labelling found).
    """
    _check_structure(structure)
    _check_reduction(reduction)
    _check_search(search, structure)
    _check_slack_backend(search, backend)
    _check_target(target)
    refuse_vmap("the structured losses", potentials, target, lengths)
    with collect_magnitudes() as mags:
        pot, lengths, target = structure.validate(potentials, lengths, target)
    tensors = structure.tensors(pot)
    resolve(structure.oracle_op, backend, tensors[0].device)
    # the searches call the loss-augmented oracle with weights up to a few times the largest slack ratio: bound
    # them as the exact oracle's products. The exact oracle is homogeneous with its margin scaled too; the searches
    # form Delta (1 + s - s*) themselves, so they are not scaled (float64 past the bound: an OverflowError)
    plan = structure.unchecked.guard_plan(
        tensors, mags, slack=True, homogeneous=search == "exact" and structure.unchecked.scalable("slack_max_oracle"))
    loss, y_hat, _, _ = _SlackRescaledHinge.apply(structure, target, lengths, backend, search, plan, *tensors)
    loss = _reduce(loss, reduction)
    return (loss, y_hat) if check_bool("return_argmax", return_argmax) else loss


class SlackRescaledHingeLoss(nn.Module):
    """Module wrapper of `slack_rescaled_hinge_loss`: ``loss = criterion(potentials, target, lengths)``."""

    def __init__(self, structure: Structure, reduction: str = "mean", *, search: str = "exact", backend: str = "auto"):
        super().__init__()
        _check_structure(structure)
        self.structure = structure
        self.reduction = _check_reduction(reduction)
        self.search = _check_search(search, structure)
        self.backend = check_backend(backend)
        _check_slack_backend(self.search, self.backend)

    def forward(self, potentials, target, lengths=None):
        return slack_rescaled_hinge_loss(self.structure, potentials, target, lengths, search=self.search,
                                         reduction=self.reduction, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.structure!r}, reduction={self.reduction!r}, search={self.search!r}"


def crf_negative_log_likelihood(structure: Structure, potentials, target: torch.Tensor, lengths=None, *,
                                reduction: str = "mean"):
    """``log Z(theta) - s_theta(y*)`` per example, the conditional random field loss over the same
    potentials (forward algorithm for chains; autograd gives its gradient). A baseline to compare the
    hinge loss against, not a max-margin loss."""
    _check_structure(structure)
    _check_reduction(reduction)
    _check_target(target)
    refuse_vmap("the structured losses", potentials, target, lengths)
    structure.require("has_log_partition", "the CRF loss needs one")
    with collect_magnitudes() as mags:
        pot, lengths, target = structure.validate(potentials, lengths, target)
    tensors = structure.tensors(pot)
    # homogeneous with its log-sum-exps at temperature 1 / c:
    # log Z(theta) - s(y*) = c (log Z_c(theta / c) - s_{theta / c}(y*))
    plan = structure.unchecked.guard_plan(tensors, mags, homogeneous=structure.unchecked.scalable("log_partition"))
    with no_autocast():
        low, scale = (_widened(structure, tensors, plan), 2.0 ** plan[1]) if isinstance(plan, tuple) else plan
        log_z = structure.unchecked.log_partition(structure.from_tensors(low), lengths, scale=scale)
        as_log_z = [None if t is None else t.to(log_z.dtype) for t in low]
        nll = log_z - structure.unchecked.score(structure.from_tensors(as_log_z), target, lengths)
    nll = _narrowed(nll, tensors, plan, "crf_negative_log_likelihood: the loss")
    return _reduce(nll.to(compute_dtype(tensors)), reduction)  # float32 for half precision (see _StructuredHinge)


class CRFLoss(nn.Module):
    """Module wrapper of `crf_negative_log_likelihood`."""

    def __init__(self, structure: Structure, reduction: str = "mean"):
        super().__init__()
        _check_structure(structure)
        self.structure = structure
        self.reduction = _check_reduction(reduction)

    def forward(self, potentials, target, lengths=None):
        return crf_negative_log_likelihood(self.structure, potentials, target, lengths, reduction=self.reduction)
