"""The structure protocol shared by every output structure (docs/design.md, "Structures").

A structure describes an output space and its oracles and holds no learned parameters. Potentials are a
small typed container per structure (a plain tensor for `Multiclass`, `ChainPotentials` for `Chain`);
labels are integer tensors. All operations are batched over a leading dimension B.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Optional, Sequence, Tuple

import torch

from .._device import host_to_device
from .._validation import (
    check_fits,
    check_loss_weight,
    check_loss_weight_value,
    check_positive_int,
    check_tensor,
    collect_magnitudes,
    reads_values,
    refuse_vmap,
)
from ..kernels.backends import STRUCTURE_ORACLE, forms, resolve

_AUTOCAST_FAMILY = (torch.float16, torch.bfloat16, torch.float32)
# what `refuse_vmap` names
VMAP = ("the structures' checked calls (max_oracle, decode, slack_max_oracle, score, log_partition, "
        "labelling_table)")


def compute_dtype(tensors) -> torch.dtype:
    """The dtype oracles and scores run in: float32 for any mix of half precision and float32, else the
    potentials' own dtype (float64 stays float64)."""
    dtypes = {t.dtype for t in tensors if t is not None}
    if dtypes <= set(_AUTOCAST_FAMILY):
        return torch.float32
    (dtype,) = dtypes
    return dtype


@contextlib.contextmanager
def no_autocast():
    """Turn ``torch.autocast`` off (CPU and CUDA) for the oracles and scores: autocast would run their matrix
    products in half precision, whatever the potentials' dtype, and pick wrong argmaxes. They run in
    `compute_dtype` instead (float32 for half-precision potentials)."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            if _autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def binary_hamming_table(costs: torch.Tensor, target: torch.Tensor, configs: torch.Tensor) -> torch.Tensor:
    """``(B, C)``: ``sum_k costs_k [configs_ck != target_bk]`` for 0 / 1 labellings ``target (B, K)`` and
    ``configs (C, K)``, costs ``(B, K)`` or ``(K,)``; two products of non-negative terms,
    ``[c != t] = t (1 - c) + (1 - t) c``: exactly 0 at ``configs == target`` (the form ``t + c - 2 t c`` leaves
    float32 rounding there, a violation where none is) and never NaN (costs past the dtype's range are held at
    its largest value, where ``inf - inf`` would give NaN)."""
    t = target.to(costs.dtype)
    c = configs.to(costs.dtype)
    costs = costs.expand_as(t).clamp_max(torch.finfo(costs.dtype).max)
    return (costs * t) @ (1 - c).t() + (costs * (1 - t)) @ c.t()


def truth_unless_violated(y_hat: torch.Tensor, value: torch.Tensor, target: torch.Tensor):
    """The slack oracles' convention: ``(target, 0)`` where no labelling has ``Phi > 0`` (another may tie
    with the truth at 0), else ``(y_hat, value)``."""
    none = value <= 0
    mask = none.view(-1, *([1] * (target.dim() - 1)))
    return torch.where(mask, target, y_hat), value.clamp_min(0)


# -- numerics at the dtype's limits ------------------------------------------------------------------------------
# A score is a sum of potentials: finite float32 potentials near 1e38 overflow in it (and inf - inf gives NaN in a
# loss), and a partial sum of Viterbi or the forward algorithm can overflow even where the labelling's score does
# not. The checked tier and the losses therefore bound every sum an oracle forms from the potentials' largest
# magnitudes, which the finiteness check reads anyway (`collect_magnitudes`: no extra host read), and
#
# - compute in the potentials' compute dtype as before where ``_HEADROOM`` times the bound fits it (always, in
#   practice: the fast path is unchanged);
# - else, for float16 / bfloat16 / float32 potentials, compute in float64 (a sum of float32 values cannot overflow
#   it) and cast the result back, with an OverflowError naming the result when it does not fit (a loss of 6e38
#   has no float32 value: inf would hide it, NaN would follow in the mean);
# - else (float64 potentials near 1e308): no wider dtype is left. A result homogeneous in the potentials (the
#   margin-rescaled hinge, with its loss weight; a score; the loss-augmented value) is computed on the potentials
#   times 2**-shift (exact: a power of two) and scaled back, with an OverflowError where it does not fit float64.
#   So is a log-partition function (and the CRF loss), which is homogeneous once its log-sum-exp carries the scale
#   as a temperature: ``log Z(theta) = c log Z_c(theta / c)``, ``log Z_c(phi) = (1/c) log sum_y exp(c s_phi(y))``
#   (`logsumexp_scaled`), and the exact slack-rescaled value, once its margin 1 is scaled too: ``Delta (2**-shift +
#   s'(y) - s'(y*))`` (the searches over lambda-oracles form the products themselves: an OverflowError naming the
#   potentials). The bound is conservative: such an error can come where the exact result would have fit. Offsets
#   that enter the score non-linearly (`Structure.offset_names`: a spatial tree's rest offsets) are never scaled.
#
# The oracles' values next to their labellings (`max_oracle`, `slack_max_oracle`) become an honest +-inf where they
# do not fit: the labelling is exact and `decode` needs no value. The losses, `score` and `log_partition` raise.
#
# On device tensors outside debug mode the magnitudes are not read (a read makes the host wait for the device,
# docs/gpu.md): there a `Chain` reduces them on the device instead. Its Triton hinge and `max_oracle` guard
# themselves inside their kernels (`torchssvm.kernels.chain.guard_triton`); its `score`, `log_partition`, CRF loss
# and its `max_oracle` and hinge on the torch backend take the same power of two from a handful of torch reductions
# (`device_scaling`), with no host wait: a result that does not fit is an honest +-inf (the CPU's OverflowError,
# which a device cannot raise without a read), never NaN; so do its exact slack-rescaled loss and oracle, with the
# margin at ``1 / c`` (the torch and Triton twins take it). Debug mode (`torchssvm.set_debug`) reads the magnitudes
# with the finiteness check (no extra wait) and guards as on the CPU. The other structures read their potentials on
# every device, so they are guarded everywhere.
_HEADROOM = 4.0  # an oracle forms differences of two bounded sums (2x); 2x more for its rounding and log-sum-exp
_SCALABLE: dict = {}  # (structure class, hook): whether the hook takes the guard's scale (`Structure._scalable`)


def lw_magnitude(loss_weight) -> float:
    """The largest ``loss_weight`` as a float, for the overflow guard: a number, or a tensor whose values are read
    where `reads_values` allows (else 0.0: an unread device weight is not part of the bound, and a weight past the
    compute dtype's range gives an honest +inf loss, never NaN: the oracles add it with ``where``)."""
    if not isinstance(loss_weight, torch.Tensor):
        return float(loss_weight)
    if not loss_weight.numel() or not reads_values(loss_weight.device):
        return 0.0
    return float(loss_weight.detach().max())


def scaled(tensors, shift: int, offsets: Sequence[bool] = ()):
    """The potential tensors in float64, times ``2**-shift`` (exact: a power of two; None kept), except those whose
    ``offsets`` entry is True (only widened: `Structure.offset_names`)."""
    out = []
    for i, t in enumerate(tensors):
        if t is not None:
            t = t.to(torch.float64)
            if shift and not (i < len(offsets) and offsets[i]):
                t = torch.ldexp(t, torch.tensor(-shift, dtype=torch.float64, device=t.device))
        out.append(t)
    return out


def logsumexp_scaled(x: torch.Tensor, dim: int, scale=1.0) -> torch.Tensor:
    """``(1 / scale) log sum exp(scale x)`` along ``dim``: a log-sum-exp at temperature ``1 / scale``, with which a
    log-partition function is homogeneous in its potentials, ``log Z(theta) = c log Z_c(theta / c)`` for
    ``log Z_c(phi) = (1/c) log sum_y exp(c s_phi(y))``. The overflow guard runs the forward algorithm on the
    potentials times ``1 / c`` (a power of two: exact), whose sums fit where those of ``theta`` do not, and
    ``c (x - max x)`` is exact or underflows to a weight of 0. ``scale``: a number, or a 0-dim tensor on ``x``'s
    device (`device_scaling`).

    The value is `torch.logsumexp`'s, bitwise at ``scale`` 1 (the same steps: the max, an infinite one not
    subtracted, ``log sum exp(x - max) + max``); the gradient is ``softmax(scale x)``, normalised by the same sum.
    `torch.logsumexp`'s own backward, ``exp(x - result)``, is not: where ``|x|`` is so large that ``log K`` is lost
    in the rounding of the result (float32 logits of 1e8), several entries get a weight of 1, and a CRF's marginals
    came out as 2 or 3."""
    m = torch.nan_to_num(x.detach().amax(dim, keepdim=True), nan=math.nan, posinf=0.0, neginf=0.0)
    if not isinstance(scale, torch.Tensor) and scale == 1:
        return (x - m).exp().sum(dim).log() + m.squeeze(dim)
    log_sum = ((x - m) * scale).exp().sum(dim).log()
    if isinstance(scale, torch.Tensor):  # one launch for the division and the sum
        return torch.addcdiv(m.squeeze(dim), log_sum, scale.to(x.dtype))
    return log_sum / scale + m.squeeze(dim)


def device_scaling(tensors, coefficient: float, loss_weight=0.0, per_unit: float = 0.0,
                   offsets: Sequence[bool] = ()):
    """The overflow guard on a device whose values are not read: ``(low, c)`` with ``c = 2**s`` a 0-dim tensor of
    the tensors' `compute_dtype` on their device and ``low`` the tensors in that dtype times ``1 / c`` (exact;
    ``offsets`` entries True: not scaled, None kept). The structure's bound (`Structure._score_bound`, linear in the
    magnitudes) is ``coefficient M + per_unit L``, ``M`` the largest ``|entry|`` of the scaled tensors and ``L`` the
    largest ``|loss_weight|`` (a number, or a tensor on the device); with ``M < 2**e_M`` and ``per_unit L /
    coefficient < 2**e_L`` (exponents by `torch.frexp` / `math.frexp`: exact, and no product that could overflow the
    dtype), ``s = max(0, max(e_M, e_L) + k - floor(log2 max))`` for the least ``k`` with ``2**k >= 2 * 4 *
    coefficient``, so that ``4 (coefficient M + per_unit L) <= 2**s max`` (``_HEADROOM``). No host read and about a
    dozen launches (the magnitudes and the scaling as `torch._foreach_norm` / `torch._foreach_mul`); ``s = 0``
    (``c = 1``, every value bitwise as unscaled) far from the limits, and where ``M`` or ``L`` is not finite (frexp's
    exponent of inf and NaN is 0: NaN and inf inputs give what they gave before)."""
    dt = compute_dtype(tensors)
    scale_me = [t is not None and not (i < len(offsets) and offsets[i]) for i, t in enumerate(tensors)]
    wide = [None if t is None else t.to(dt) for t in tensors]
    live = [t.detach() for t, me in zip(wide, scale_me) if me]
    device = next(t for t in wide if t is not None).device
    norms = torch._foreach_norm([t for t in live if t.numel()], math.inf) if any(t.numel() for t in live) else []
    m = torch.stack(list(norms)).amax() if norms else torch.zeros((), dtype=dt, device=device)
    e = torch.frexp(m).exponent
    if per_unit > 0:  # the loss weight's exponent, and that of per_unit / coefficient, added: no overflow
        extra = math.ceil(math.log2(per_unit / coefficient))
        if isinstance(loss_weight, torch.Tensor):
            if loss_weight.numel():
                lw = loss_weight.detach().abs().amax().to(torch.float64)
                e = torch.maximum(e, torch.frexp(lw).exponent + extra)
        elif loss_weight and math.isfinite(loss_weight):
            e = e.clamp_min(math.frexp(abs(float(loss_weight)))[1] + extra)
    k = math.ceil(math.log2(2.0 * _HEADROOM * coefficient))
    s = (e + (k - math.floor(math.log2(torch.finfo(dt).max)))).clamp_min_(0).to(dt)
    c, inv = torch.exp2(s), torch.exp2(-s)
    scaled_live = iter(torch._foreach_mul([t for t, me in zip(wide, scale_me) if me], inv) if live else [])
    low = [next(scaled_live) if me else t for t, me in zip(wide, scale_me)]
    return low, c


#: The capabilities a structure may declare (class attributes of `Structure`, all False there), with what each one
#: gives. Callers ask them (`Structure.require`), never the structure's type.
CAPABILITIES = {
    "has_slack_oracle": "exact slack-rescaled oracle",
    "has_log_partition": "log_partition",
    "has_table_oracle": "table of every labelling, the exact constrained lambda-oracle",
    "has_max_task_loss": "largest task loss in closed form",
}


class Unchecked:
    """The unchecked tier of a structure's protocol: ``structure.unchecked.<name>(...)``.

    Each method has the name and the arguments of the checked method of `Structure` (``max_oracle``, ``decode``,
    ``slack_max_oracle``, ``score``, ``task_loss``, ``log_partition``, ``labelling_table``) and returns exactly what
    that one returns on valid input, without the checks: the caller guarantees *validated* inputs, that is

    - ``potentials``, ``lengths`` and ``target`` / ``y`` / ``y_hat`` as `Structure.validate` returns them (the
      structure's potentials container; shapes, dtypes, devices, finiteness and label ranges checked; a chain's
      lengths a ``(B,)`` long tensor, its labels -1 past each length);
    - ``loss_weight`` a number or a ``(B,)`` float tensor (float64 as the checked tier builds it), finite, ``>= 0``;
    - ``backend`` a name `torchssvm.kernels.resolve` accepts for the structure's ``oracle_op`` on that device;
    - the structure has the capability the method needs (`Structure.require`).

    No ``torch.autocast`` handling either: a caller that may run under autocast enters
    `torchssvm.structures.base.no_autocast` itself. Three methods have no checked twin: ``max_task_loss`` (for
    callers that hold validated targets) and the hinge losses' steps ``hinge_forward`` and ``marginal_difference``
    (after `Structure.validate_hinge`).

    Internal callers (`torchssvm.losses`, `torchssvm.search`, `torchssvm.optim.problems`) validate once at their own
    boundary and then use this tier. A structure does not override it: it implements the underscore hooks
    (``_max_oracle`` ...) that both tiers call."""

    __slots__ = ("structure",)

    def __init__(self, structure: Structure):
        self.structure = structure

    def max_oracle(self, potentials, target=None, lengths=None, *, loss_weight=1.0, backend="auto"):
        lw = None
        if target is not None:
            lw = loss_weight if isinstance(loss_weight, torch.Tensor) else torch.full(
                (target.shape[0],), float(loss_weight), dtype=torch.float64, device=target.device)
        return self.structure._max_oracle(potentials, lengths, target, lw, backend)

    def decode(self, potentials, lengths=None, *, target=None, loss_weight=1.0, backend="auto"):
        return self.max_oracle(potentials, target, lengths, loss_weight=loss_weight, backend=backend)[0]

    def slack_max_oracle(self, potentials, target, lengths=None, *, backend="auto", margin=1.0):
        """``margin``: the 1 of ``Delta (1 + s(y) - s(y*))``; the overflow guard's ``2**-s`` with the potentials times
        ``2**-s`` gives the value at ``2**-s`` of its size."""
        return self.structure._with_scale("_slack_max_oracle", margin, potentials, lengths, target, backend)

    def score(self, potentials, y, lengths=None) -> torch.Tensor:
        return self.structure._score(potentials, y, lengths)

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        return self.structure._task_loss(y_hat, y, lengths)

    def log_partition(self, potentials, lengths=None, *, scale=1.0) -> torch.Tensor:
        """``(1 / scale) log sum_y exp(scale s(y))`` (`logsumexp_scaled`): ``log Z`` at ``scale`` 1; the overflow
        guard's ``log Z(theta) / c`` from the potentials ``theta / c`` at ``scale`` ``c``."""
        return self.structure._with_scale("_log_partition", scale, potentials, lengths)

    def labelling_table(self, potentials, target):
        return self.structure._labelling_table(potentials, target)

    def max_task_loss(self, target, lengths=None) -> torch.Tensor:
        """``max_y Delta(target, y)`` per example, float64 ``(B,)`` (capability ``has_max_task_loss``)."""
        return self.structure._max_task_loss(target, lengths)

    def hinge_forward(self, potentials, target, lengths, *, loss_weight=1.0, backend="auto"):
        """The margin-rescaled hinge per example without autograd, on what `Structure.validate_hinge` returned:
        ``(loss (B,), y_hat, target, lengths)``, the last two as `marginal_difference` takes them."""
        return self.structure._hinge_forward(potentials, lengths, target, loss_weight, backend)

    def overflow_plan(self, tensors, magnitudes: dict, *, loss_weight: float = 0.0, slack: bool = False,
                      homogeneous: bool = False):
        """The overflow guard of the losses ("numerics at the dtype's limits"): ``(wide, shift)``, whether the potential
        ``tensors`` must be computed in float64 so that no sum overflows, and by what power of two to scale them down
        first (homogeneous results only: `scaled`), given ``magnitudes`` (``{name: max |entry|}``, from
        `torchssvm._validation.collect_magnitudes` around the validation; empty: not read, ``(False, 0)``), the
        largest ``loss_weight`` (a float) and ``slack`` (the slack-rescaled products). An OverflowError naming the
        potentials (or the loss weight) where no plan fits."""
        s = self.structure
        return s._plan(tensors, magnitudes, loss_weight * s._cost_max(), slack, homogeneous)

    def scalable(self, op: str) -> bool:
        """Whether ``op`` (``"log_partition"`` or ``"slack_max_oracle"``) takes the overflow guard's scaling: its
        hook has the ``scale`` / ``margin`` argument (a structure written before they existed has not)."""
        return self.structure._scalable("_" + op)

    def guards_own_hinge(self, device, backend: str = "auto") -> bool:
        """Whether ``hinge_forward`` guards its own sums on ``device`` where the values are not read (a `Chain`'s
        fused Triton hinge), so that the loss need not scale the potentials first (`device_scaling`)."""
        return self.structure._guards_own_hinge(device, backend)

    def scaled(self, tensors, shift: int):
        """The potential tensors as the guard's plan ``(True, shift)`` computes on them: float64, times ``2**-shift``
        (`scaled`; the structure's offsets only widened)."""
        return scaled(tensors, shift, self.structure._offsets())

    def guard_plan(self, tensors, magnitudes: dict, *, loss_weight=0.0, slack: bool = False,
                   homogeneous: bool = False, guarded: bool = False):
        """The overflow guard's plan for a loss: `overflow_plan`'s ``(wide, shift)`` where the values were read
        (``magnitudes`` from the validation); where they were not (a device outside debug mode) and the result is
        ``homogeneous`` in the potentials, unless the call guards itself (``guarded``), ``[low, c]``: the tensors
        times ``1 / c`` and the power of two ``c`` that `device_scaling` finds on the device (the largest
        ``loss_weight``, a number or a device tensor, reduced there). Compute on ``low``, multiply by ``c``."""
        return self.structure._guard_plan(tensors, magnitudes, loss_weight, slack, homogeneous, guarded)

    def marginal_difference(self, y_hat, target, lengths, weight, tensors, needs, backend="auto"):
        """``sum_b weight_b (marginals(y_hat_b) - marginals(target_b))`` per potential tensor (None where ``needs``
        is False): the hinges' gradient."""
        return self.structure._marginal_difference(y_hat, target, lengths, weight, tensors, needs, backend)

    def __repr__(self) -> str:
        return f"{self.structure!r}.unchecked"


class Structure:
    """Base class of the output structures: the protocol that losses, searches and dual problems call.

    **Checked tier** (the boundary; user input): `validate`, `max_oracle`, `decode`, `slack_max_oracle`, `score`,
    `task_loss`, `marginals`, `log_partition`, `labelling_table` and `validate_hinge` check their arguments
    (shapes, dtypes, devices, label ranges, ``loss_weight``, ``backend``) and raise a ValueError / TypeError naming
    the argument.

    **Unchecked tier** (internal callers that validated once): ``structure.unchecked.<name>``, the same names and
    arguments without the checks (`Unchecked` says what "validated" means).

    **Capabilities**: class attributes, False here, that a subclass sets True where it implements the hook
    (`CAPABILITIES`): ``has_slack_oracle`` (``_slack_max_oracle``), ``has_log_partition`` (``_log_partition``),
    ``has_table_oracle`` (``_labelling_table``), ``has_max_task_loss`` (``_max_task_loss``); and the property
    ``has_numba_oracle`` (from the backend table). Callers ask the capability, not the structure's type:
    `require` raises a NotImplementedError naming the structure and the capability. A capability is declared per
    class; a limit of size or value of one instance (MultiLabel enumerates at most 2^16 labellings; Chain's slack
    oracle needs uniform costs) is a ValueError at the call.

    **What a new structure implements**: ``validate``, ``_max_oracle``, ``_score``, ``_task_loss``, ``marginals``,
    ``tensors``, ``from_tensors`` and ``marginal_vjp``; sets ``potential_names`` (and ``oracle_op`` where its oracle
    runs a kernel with several backends); and, for each capability it declares, that capability's hook. It may
    override ``_hinge_inputs`` / ``_hinge_forward`` / ``_marginal_difference`` to fuse the hinge's steps (`Chain`
    on Triton). The underscore methods are these hooks: nothing outside `torchssvm.structures` calls them
    (tests/test_structure_protocol.py).
    """

    has_slack_oracle: bool = False
    has_log_partition: bool = False
    has_table_oracle: bool = False
    has_max_task_loss: bool = False

    #: names of the potential tensors, in the order of `tensors()` (used in error messages)
    potential_names: Tuple[str, ...] = ()
    #: names of the potential tensors that are offsets, not weights of the joint feature map: the score is not
    #: homogeneous in them (a spatial tree's rest offsets enter through ``|l_c - l_p - r|^2``), so the overflow guard's
    #: power-of-two scaling leaves them as they are
    offset_names: Tuple[str, ...] = ()
    #: the row of the backend table (`torchssvm.kernels.backends.FORMS`) that says which ``backend`` forms
    #: ``max_oracle`` has: a structure whose oracle runs a kernel names it (``"viterbi"``)
    oracle_op: str = STRUCTURE_ORACLE

    @property
    def has_numba_oracle(self) -> bool:
        """Whether ``max_oracle`` accepts ``backend="numba"`` (a compiled CPU twin; from the backend table)."""
        return "numba" in forms(self.oracle_op)

    @property
    def unchecked(self) -> Unchecked:
        """The unchecked tier of the protocol (`Unchecked`): for callers whose inputs are validated."""
        return Unchecked(self)

    def require(self, capability: str, needed_by: str = "", error=NotImplementedError) -> None:
        """Raise ``error`` (NotImplementedError by default) naming this structure and ``capability`` (a key of
        `CAPABILITIES`) unless the structure has it; ``needed_by`` says who needs it."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; one of {tuple(CAPABILITIES)}")
        if not getattr(self, capability):
            raise error(f"{type(self).__name__} has no {CAPABILITIES[capability]} ({capability} is False)"
                        + (f": {needed_by}" if needed_by else ""))

    def __init__(self, num_labels: int, class_weights: Optional[torch.Tensor] = None):
        self.num_labels = check_positive_int("num_labels", num_labels, minimum=1)
        if class_weights is not None:
            check_tensor("class_weights", class_weights, ndim=1)
            if class_weights.shape[0] != self.num_labels:
                raise ValueError(
                    f"class_weights must have shape ({self.num_labels},), got {tuple(class_weights.shape)}"
                )
            if not bool(torch.isfinite(class_weights).all()) or bool((class_weights < 0).any()):
                raise ValueError("class_weights must be finite and >= 0")
            class_weights = class_weights.detach().to(torch.float64)
        self.class_weights = class_weights

    # -- the protocol -------------------------------------------------------------------------
    def decode(self, potentials, lengths=None, *, target=None, loss_weight=1.0, backend="auto"):
        """MAP labelling; with ``target`` the loss-augmented (margin-rescaled) max-oracle
        ``argmax_y loss_weight * Delta(target, y) + s(y)``. ``loss_weight``: scalar or ``(B,)``."""
        return self.max_oracle(
            potentials, target, lengths=lengths, loss_weight=loss_weight, backend=backend
        )[0]

    def max_oracle(self, potentials, target=None, lengths=None, *, loss_weight=1.0, backend="auto"):
        """``(y_hat, value)`` with ``value = max_y loss_weight * Delta(target, y) + s(y)`` per example
        (``Delta`` omitted when ``target`` is None). Validates (`validate`, ``backend``, ``loss_weight``),
        then calls the structure's unchecked ``_max_oracle(potentials, lengths, target, loss_weight (B,) or
        None, backend)``."""
        refuse_vmap(VMAP, potentials, target, lengths, loss_weight)
        with collect_magnitudes() as mags:
            pot, lengths, target = self.validate(potentials, lengths, target)
        first = self.tensors(pot)[0]
        resolve(self.oracle_op, backend, first.device)
        lw = None
        if target is not None:
            lw = check_loss_weight(loss_weight, first.shape[0], first.device, torch.float64)
        else:  # it weighs nothing here, but a bad value is not silently taken (checked without building a tensor)
            check_loss_weight_value(loss_weight)
        with no_autocast():
            return self._guarded(pot, mags, lambda p, c: self._max_oracle(p, lengths, target,
                                                                          None if lw is None else lw * c, backend),
                                 "max_oracle: the value", loss_weight=0.0 if lw is None else loss_weight,
                                 homogeneous=True, saturate=True,
                                 guarded=self._guards_own_oracle(first.device, backend))

    def _max_oracle(self, potentials, lengths, target, loss_weight, backend):
        raise NotImplementedError

    def slack_max_oracle(self, potentials, target, lengths=None, *, backend="auto"):
        """The exact slack-rescaled oracle (Choi et al., 2016, eq. 6): ``(y_hat, value)`` with
        ``value = max(0, max_y Delta(target, y) (1 + s(y) - s(target)))`` per example and ``y_hat`` a
        maximizer (``target`` itself when nothing violates)."""
        if backend == "numba":
            raise ValueError("backend='numba': the exact slack-rescaled oracles have no numba twin; use "
                             "backend='auto' (torch on CPU, Triton on a GPU) or 'torch'")
        self.require("has_slack_oracle")
        refuse_vmap(VMAP, potentials, target, lengths)
        with collect_magnitudes() as mags:
            pot, lengths, target = self.validate(potentials, lengths, target)
        resolve(STRUCTURE_ORACLE, backend, self.tensors(pot)[0].device)
        with no_autocast():
            return self._guarded(pot, mags, lambda p, c: self._with_scale("_slack_max_oracle", c, p, lengths, target,
                                                                          backend),
                                 "slack_max_oracle: the value", slack=True, saturate=True,
                                 homogeneous=self._scalable("_slack_max_oracle"))

    def _slack_max_oracle(self, potentials, lengths, target, backend, margin=1.0):
        """``(y_hat, max(0, max_y Delta(target, y) (margin + s(y) - s(target))))``: the slack-rescaled oracle, whose
        ``margin`` (1; the overflow guard's ``2**-s`` with the potentials times ``2**-s``) makes it homogeneous."""
        self.require("has_slack_oracle")
        raise NotImplementedError(f"{type(self).__name__} declares has_slack_oracle but has no _slack_max_oracle")

    def score(self, potentials, y, lengths=None) -> torch.Tensor:
        """``<theta, one_hot(y)>`` per example, shape ``(B,)``, in `compute_dtype` (float32 for half precision: a
        float16 sum overflows at 65504), summed where it cannot overflow (`_guarded`)."""
        refuse_vmap(VMAP, potentials, y, lengths)
        with collect_magnitudes() as mags:
            pot, lengths, y = self.validate(potentials, lengths, y, target_name="y")
        with no_autocast():
            return self._guarded(pot, mags, lambda p, c: self._score(p, y, lengths), "score", homogeneous=True)

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        """``Delta(y, y_hat)`` per example, float64 ``(B,)``."""
        raise NotImplementedError

    def marginals(self, y, lengths=None, **kwargs):
        """One-hot factor marginals of ``y`` (per example), the gradient of `score` in the potentials."""
        raise NotImplementedError

    def log_partition(self, potentials, lengths=None) -> torch.Tensor:
        """``log sum_y exp s(y)`` per example (for the CRF likelihood baseline), where tractable (capability
        ``has_log_partition``)."""
        self.require("has_log_partition")
        refuse_vmap(VMAP, potentials, lengths)
        with collect_magnitudes() as mags:
            pot, lengths, _ = self.validate(potentials, lengths)
        with no_autocast():
            return self._guarded(pot, mags, lambda p, c: self._with_scale("_log_partition", 1 / c, p, lengths),
                                 "log_partition", homogeneous=self._scalable("_log_partition"))

    def _log_partition(self, potentials, lengths, scale=1.0) -> torch.Tensor:
        """``(1 / scale) log sum_y exp(scale s(y))`` (the log-sum-exps by `logsumexp_scaled`)."""
        self.require("has_log_partition", "the CRF loss needs one")
        raise NotImplementedError(f"{type(self).__name__} declares has_log_partition but has no _log_partition")

    def labelling_table(self, potentials, target):
        """Every labelling, scored (capability ``has_table_oracle``): ``(labels (N, ...), scores (B, N) float64,
        losses (B, N) float64, truth (B,))`` with ``labels[j]`` the j-th labelling, ``scores[b, j]`` its score
        ``s(y)``, ``losses[b, j]`` its task loss ``Delta(target_b, y)`` and ``truth[b]`` the column of ``target_b``.
        What `torchssvm.search.TableOracle.from_structure` builds its exact oracles from."""
        self.require("has_table_oracle")
        refuse_vmap(VMAP, potentials, target)
        pot, _, target = self.validate(potentials, None, target)
        with no_autocast():
            return self._labelling_table(pot, target)

    def _labelling_table(self, potentials, target):
        self.require("has_table_oracle")
        raise NotImplementedError(f"{type(self).__name__} declares has_table_oracle but has no _labelling_table")

    def _max_task_loss(self, target, lengths) -> torch.Tensor:
        self.require("has_max_task_loss")
        raise NotImplementedError(f"{type(self).__name__} declares has_max_task_loss but has no _max_task_loss")

    def validate_hinge(self, potentials, lengths, target, *, backend="auto"):
        """The boundary of the structured hinge loss: `validate` and the check of ``backend``; returns
        ``(potentials, lengths, target)`` as ``unchecked.hinge_forward`` takes them (a structure that fuses the hinge
        may leave values for its kernel to check and normalise: `Chain` on Triton)."""
        return self._hinge_inputs(potentials, lengths, target, backend)

    # -- the hinge losses' steps (`torchssvm.losses`; a structure may fuse them) ---------------------------------
    def _hinge_inputs(self, potentials, lengths, target, backend):
        """`validate` and the backend's check for `structured_hinge_loss`: ``(potentials, lengths, target)``, as
        `_hinge_forward` takes them."""
        pot, lengths, target = self.validate(potentials, lengths, target)
        resolve(self.oracle_op, backend, self.tensors(pot)[0].device)
        return pot, lengths, target

    def _hinge_forward(self, pot, lengths, target, loss_weight, backend):
        """The margin-rescaled hinge ``max(0, max_y [loss_weight Delta(target, y) + s(y)] - s(target))`` per
        example, in `compute_dtype`, without autograd: ``(loss (B,), y_hat, target, lengths)``, the last two as
        the backward takes them. ``loss_weight``: a number or a ``(B,)`` float64 tensor."""
        tensors = self.tensors(pot)
        if isinstance(loss_weight, torch.Tensor):
            loss_weight = loss_weight.detach()
        else:
            loss_weight = torch.full((tensors[0].shape[0],), float(loss_weight), dtype=torch.float64,
                                     device=tensors[0].device)
        y_hat, value = self._max_oracle(pot, lengths, target, loss_weight, backend)
        dt = value.dtype
        gold = self._score(self.from_tensors([None if t is None else t.to(dt) for t in tensors]), target, lengths)
        # float32 for half-precision potentials, as autocast's own losses: a float16 loss overflows GradScaler's
        # scale (65536 > float16's max) and sums of a large batch
        return (value - gold).clamp_min(0).to(compute_dtype(tensors)), y_hat, target, lengths

    def _marginal_difference(self, y_hat, target, lengths, weight, tensors, needs, backend="auto"):
        """``sum_b weight_b (marginals(y_hat_b) - marginals(target_b))`` per potential tensor (None where not
        needed): the hinges' gradient. Counts are summed over the batch: half precision accumulates in float32 and
        is cast back at the end."""
        pot = self.from_tensors(tensors)
        acc = compute_dtype(tensors)
        with no_autocast():
            g_hat = self.marginal_vjp(y_hat, weight, pot, lengths, needs, dtype=acc)
            g_gold = self.marginal_vjp(target, weight, pot, lengths, needs, dtype=acc)
        return tuple(None if a is None else (a - b).to(t.dtype) for a, b, t in zip(g_hat, g_gold, tensors))

    # -- plumbing for autograd Functions --------------------------------------------------------
    def tensors(self, potentials) -> Tuple[Optional[torch.Tensor], ...]:
        """The potential tensors (None for absent optional ones), in `potential_names` order."""
        raise NotImplementedError

    def from_tensors(self, tensors: Sequence[Optional[torch.Tensor]]):
        raise NotImplementedError

    def marginal_vjp(self, y, weight, potentials, lengths, needs: Sequence[bool], dtype=None):
        """``sum_b weight_b * marginals(y)_b`` reduced to each potential tensor's shape (None where
        ``needs`` is False or the tensor is absent): the gradient of ``sum_b weight_b * score_b``.
        Accumulated in ``dtype`` (default: the potentials' dtype); labels must be -1 padded."""
        raise NotImplementedError

    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        """Check potentials, lengths and target at the boundary; return them normalized (labels past a
        sequence's length set to -1)."""
        raise NotImplementedError

    # -- the overflow guard (see "numerics at the dtype's limits" above) ------------------------------------------
    def _score_bound(self, tensors, mags: dict, aug: float) -> Optional[float]:
        """An upper bound on ``|s(y)|`` plus ``aug`` at every site of the task loss, for every labelling ``y`` and on
        every partial sum the structure's oracles form, from the potential ``tensors``' shapes and ``mags``
        (``{potential name: max |entry|}``, absent names 0); None: no bound known (the structure is not guarded)."""
        return None

    def _loss_sites(self, tensors) -> int:
        """How many terms the task loss sums at most (its largest value is at most that times `_cost_max`)."""
        return 1

    def _cost_max(self) -> float:
        """The largest cost of one mistake: the largest class weight, else 1."""
        cw = self.class_weights
        if cw is None or not cw.numel():
            return 1.0
        key = (cw._version, cw.data_ptr())
        cached = self.__dict__.get("_cost_max_cache")
        if cached is None or cached[0] != key:
            cached = (key, float(cw.max()))
            self.__dict__["_cost_max_cache"] = cached
        return cached[1]

    def _plan(self, tensors, mags: dict, aug: float = 0.0, slack: bool = False, homogeneous: bool = False):
        """How the oracles run so that no sum overflows: ``(wide, shift)``, ``wide`` True for float64 rather than
        `compute_dtype`, ``shift`` > 0 to run on the potentials (and the loss weight) times ``2**-shift`` and scale the
        result back (exact: a power of two; only for ``homogeneous`` results, the margin-rescaled hinge, the score,
        the loss-augmented value, the log-partition with its temperature, the slack-rescaled value with its margin
        ``2**-shift``, where float64 itself is not enough). ``(False, 0)`` where nothing was read
        (``mags`` empty) or the structure has no bound; an OverflowError naming the potentials (or the loss weight)
        where no plan fits."""
        if not mags:
            return False, 0
        bound = self._score_bound(tensors, mags, aug)
        if bound is None:
            return False, 0
        if slack:  # Delta(y) (1 + s(y) - s(y*))
            bound = max(1.0, self._loss_sites(tensors) * self._cost_max()) * (1.0 + 2.0 * bound)
        need = _HEADROOM * bound
        dt = compute_dtype(tensors)
        if need <= torch.finfo(dt).max:
            return False, 0
        f64 = torch.finfo(torch.float64).max
        if need <= f64:
            return True, 0
        if homogeneous:
            # the bound is linear in the potentials' magnitudes (not in the offsets, lengths): in a Python float it may
            # overflow itself, so it is taken at 2**-128 of them
            low = {k: (v if k in self.offset_names else math.ldexp(v, -128)) for k, v in mags.items()}
            bound_low = self._score_bound(tensors, low, math.ldexp(aug, -128))
            if slack:  # the margin scales with the potentials: Delta(y) (2**-shift + s'(y) - s'(y*))
                bound_low = max(1.0, self._loss_sites(tensors) * self._cost_max()) * (
                    math.ldexp(1.0, -128) + 2.0 * bound_low)
            need_low = _HEADROOM * bound_low
            if math.isfinite(need_low) and need_low > 0:
                return True, max(1, math.ceil(math.log2(need_low) + 128 - math.log2(f64)) + 1)
        name = str(dt).replace("torch.", "")
        parts = ", ".join(f"|{k}| <= {v:.3e}" for k, v in mags.items() if v)
        if aug and _HEADROOM * self._score_bound(tensors, mags, 0.0) <= f64:
            raise OverflowError(f"loss_weight: {aug:.3e} (times the largest mistake cost) makes the loss-augmented "
                                f"scores overflow {name} (a bound of {bound:.3e}); pass a smaller loss_weight or "
                                "rescale the potentials")
        raise OverflowError(f"potentials: the score of a labelling (or a sum the oracle forms) can reach {bound:.3e} "
                            f"({parts}), which overflows float64 (|x| <= {f64:.3e} with a margin of {_HEADROOM:g}); "
                            "rescale the potentials")

    def _guard_plan(self, tensors, mags: dict, loss_weight=0.0, slack: bool = False, homogeneous: bool = False,
                    guarded: bool = False):
        """`Unchecked.guard_plan`: ``(wide, shift)`` from `_plan` where the values were read; where they were not (a
        device outside debug mode) and the result is ``homogeneous`` (and the call does not guard itself:
        ``guarded``), ``[low, c]`` from `_device_scaling`, a list so that the two kinds cannot be mistaken."""
        if homogeneous and not guarded:
            scaling = self._device_scaling(tensors, mags, loss_weight, slack)
            if scaling is not None:
                return list(scaling)
        return self._plan(tensors, mags, lw_magnitude(loss_weight) * self._cost_max(), slack, homogeneous)

    def _guarded(self, pot, mags: dict, fn, what: str, *, loss_weight=0.0, slack: bool = False,
                 homogeneous: bool = False, saturate: bool = False, guarded: bool = False):
        """``fn(pot, c)`` (``c`` the factor by which the potentials were scaled, for the loss weight) as
        `_guard_plan` says, with its floating results back in `compute_dtype`: an OverflowError naming ``what`` where
        one does not fit, or with ``saturate`` (the oracles' values, next to labellings that are exact) an honest
        +-inf; on a device's plan an honest +-inf. Half-precision potentials are cast to float32 first, as the
        oracles do."""
        tensors = self.tensors(pot)
        dt = compute_dtype(tensors)
        plan = self._guard_plan(tensors, mags, loss_weight, slack, homogeneous, guarded)
        if isinstance(plan, list):  # the device's power of two c
            low, c = plan
            out = fn(self.from_tensors(low), 1 / c)

            def up(x):
                return x * c.to(x.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

            return tuple(up(x) for x in out) if isinstance(out, tuple) else up(out)
        wide, shift = plan
        if not wide:
            return fn(self.from_tensors([None if t is None else t.to(dt) for t in tensors]), 1.0)
        out = fn(self.from_tensors(scaled(tensors, shift, self._offsets())), 2.0 ** -shift)

        def back(x):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                return x
            if not saturate:
                check_fits(what, x, dt, shift=shift)
            return torch.ldexp(x, torch.tensor(shift, dtype=x.dtype, device=x.device)).to(dt) if shift else x.to(dt)

        return tuple(back(x) for x in out) if isinstance(out, tuple) else back(out)

    _SCALE_ARGUMENTS = {"_log_partition": "scale", "_slack_max_oracle": "margin"}

    def _scalable(self, hook: str) -> bool:
        """Whether the structure's ``hook`` (``"_log_partition"`` or ``"_slack_max_oracle"``) takes the argument with
        which the overflow guard makes its result homogeneous (``scale``, ``margin``): a hook written before it had one
        is never scaled (an OverflowError where float64 cannot hold its sums, no guard on a device)."""
        if hook not in self._SCALE_ARGUMENTS:
            raise ValueError(f"no overflow-guard scaling for {hook!r}; one of {sorted(self._SCALE_ARGUMENTS)}")
        key = (type(self), hook)
        if key not in _SCALABLE:  # passed by keyword: a positional-only parameter of that name does not count
            p = inspect.signature(getattr(type(self), hook)).parameters.get(self._SCALE_ARGUMENTS[hook])
            _SCALABLE[key] = p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        return _SCALABLE[key]

    def _with_scale(self, hook: str, value, *args):
        """``hook(*args)`` with its guard argument (`_SCALE_ARGUMENTS`: ``scale``, ``margin``) set to ``value``, by
        keyword, and without it at the number 1: a structure whose hook has none (written before it had one) still
        works, and the guard never scales for it (`_scalable`)."""
        if not isinstance(value, torch.Tensor) and value == 1:
            return getattr(self, hook)(*args)
        return getattr(self, hook)(*args, **{self._SCALE_ARGUMENTS[hook]: value})

    def _offsets(self) -> Tuple[bool, ...]:
        """Per potential tensor, whether it is an offset (`offset_names`), which the guard's scaling leaves alone."""
        return tuple(name in self.offset_names for name in self.potential_names)

    def _device_scaling(self, tensors, mags: dict, loss_weight=0.0, slack: bool = False):
        """`Unchecked.device_scaling`: ``(low, c)`` from `device_scaling` where the values were not read (``mags``
        empty, tensors on a device outside debug mode), the structure has a bound and no offsets; else None.
        ``loss_weight``: a number or a device tensor (its largest entry, reduced there, times the largest cost of a
        mistake, at every loss site, is part of the bound). ``slack``: for the slack-rescaled products ``Delta(y)
        (margin + s(y) - s(y*))``, whose bound is ``max(1, the largest task loss) (1 + 2 bound)``."""
        first = next((t for t in tensors if t is not None), None)
        if mags or first is None or reads_values(first.device) or any(self._offsets()):
            return None
        coefficient = self._score_bound(tensors, dict.fromkeys(self.potential_names, 1.0), 0.0)
        if coefficient is None or coefficient <= 0:
            return None
        if slack:  # the margin 1 / c <= 1 is in the headroom
            coefficient *= 2.0 * max(1.0, self._loss_sites(tensors) * self._cost_max())
        per_unit = self._score_bound(tensors, {}, 1.0) * self._cost_max()  # the bound is linear in the loss weight
        return device_scaling(tensors, coefficient, loss_weight, per_unit, self._offsets())

    def _guards_own_hinge(self, device, backend: str) -> bool:
        """Whether ``_hinge_forward`` on ``device`` with ``backend`` guards its own sums where the values are not read
        (a `Chain`'s fused Triton hinge does): then the loss does not scale them first."""
        return False

    def _guards_own_oracle(self, device, backend: str) -> bool:
        """Whether ``_max_oracle`` on ``device`` with ``backend`` guards its own sums where the values are not read
        (a `Chain`'s Triton Viterbi does, in its kernels): then `_guarded` does not scale them first."""
        return False

    # -- shared helpers ------------------------------------------------------------------------
    def _check_common(self, tensors: dict, ref: torch.Tensor) -> None:
        """Optional potential tensors must be floating, on ``ref``'s device, of ``ref``'s dtype, except
        that the autocast family (float16, bfloat16, float32) may mix: under ``torch.autocast`` a network's
        unary comes out in half precision while a transition parameter stays float32. Oracles then run in
        float32 and each gradient comes back in its tensor's own dtype."""
        for name, t in tensors.items():
            if t is None:
                continue
            check_tensor(name, t, floating=True, device=ref.device)
            mixed_ok = t.dtype in _AUTOCAST_FAMILY and ref.dtype in _AUTOCAST_FAMILY
            check_tensor(name, t, dtype=None if mixed_ok else ref.dtype)

    def _class_weight(self, y: torch.Tensor, dtype) -> torch.Tensor:
        """Weight of each true label (1 without class weights); padding (-1) gets weight 0 later."""
        if self.class_weights is None:
            return torch.ones(y.shape, dtype=dtype, device=y.device)
        return self._device_class_weights(y.device).to(dtype)[y.clamp_min(0)]

    def _device_class_weights(self, device) -> Optional[torch.Tensor]:
        """``class_weights`` (float64) on ``device``, copied there once (a plain copy from the host would make the
        host wait for the device on every call) and again only after an in-place change of them."""
        cw = self.class_weights
        if cw is None or cw.device == torch.device(device):
            return cw
        key = (str(device), cw._version)
        cache = self.__dict__.setdefault("_class_weights_on", {})
        if key not in cache:
            cache.clear()
            cache[key] = host_to_device(cw, device)
        return cache[key]

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_class_weights_on", None)  # device copies: not pickled
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_labels})"
