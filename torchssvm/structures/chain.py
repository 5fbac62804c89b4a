"""Linear chains: sequence labelling with unary, transition and start/end potentials."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from .. import kernels as _kernels
from .._validation import (
    POTENTIAL_INF_HINT,
    binary_labels,
    check_bool,
    check_finite,
    check_float_dtype,
    check_labels,
    check_lengths,
    check_shape,
    check_tensor,
    reads_values,
)
from ..kernels import chain_score_torch, slack_viterbi, viterbi
from .base import Structure, compute_dtype, logsumexp_scaled


def _detach(t):
    return None if t is None else t.detach()


class ChainPotentials(NamedTuple):
    """Scores of a batch of chains with K labels, padded to length T.

    - ``unary``: ``(B, T, K)``; entries past a sequence's length are ignored (but must be finite).
    - ``transition``: ``(K, K)`` shared or ``(B, T-1, K, K)`` per position; ``[i, j]`` scores label i
      followed by label j.
    - ``start``, ``end``: ``(K,)`` scores of the first / last label, or None.

    As marginals (`Chain.marginals`) the same container holds one-hot counts per example: unary
    ``(B, T, K)``, transition ``(B, K, K)`` (or ``(B, T-1, K, K)``), start and end ``(B, K)``.
    """

    unary: torch.Tensor
    transition: torch.Tensor
    start: Optional[torch.Tensor] = None
    end: Optional[torch.Tensor] = None


class Chain(Structure):
    """Output space of label sequences ``y in {0..K-1}^L`` with a first-order Markov score

    ``s(y) = start[y_0] + sum_t unary[t, y_t] + sum_t transition[y_{t-1}, y_t] + end[y_{L-1}]``.

    Task loss: Hamming, ``sum_t c[y_t] [y_hat_t != y_t]`` with optional per-class weights ``c`` (of the
    true label), divided by the length when ``normalize=True`` (the OCR / CoNLL convention of the BCFW
    papers). Labels are ``(B, T)`` long, padded with -1 past each length (positions past the length are
    ignored on input). MAP and loss-augmented decoding are exact (Viterbi; `torchssvm.kernels`).
    """

    potential_names = ("unary", "transition", "start", "end")
    has_slack_oracle = has_log_partition = has_max_task_loss = True
    oracle_op = "viterbi"

    def __init__(self, num_labels: int, *, normalize: bool = True, class_weights=None):
        super().__init__(num_labels, class_weights)
        self.normalize = check_bool("normalize", normalize)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        """Shapes, dtypes and devices always; the values (finite potentials, lengths in ``[1, T]``, labels in
        ``[0, K)`` within each length) of CPU tensors, and of device tensors in debug mode only
        (`torchssvm.set_debug`: reading them makes the host wait for the device). Unread lengths are clamped to
        ``[1, T]``, so that no kernel indexes past the padded size. Returns ``(potentials, lengths (B,) long,
        target (B, T) long with -1 past each length, or None)``."""
        pot, lengths, target, checked = self._validate(potentials, lengths, target, target_name)
        if not checked:
            lengths, target = self._unread(lengths, target, *pot.unary.shape[:2], pot.unary.device)
        return pot, lengths, target

    def _validate(self, potentials, lengths, target, target_name: str):
        """`validate` without the normalisation of unread values: ``(potentials, lengths, target, checked)``, with
        ``checked`` False where the values were not read (device tensors outside debug mode); then ``lengths`` is
        as given (None included) and ``target`` unnormalised (the fused hinge kernel takes them so)."""
        pot = self._as_potentials(potentials)
        check_tensor("unary", pot.unary, ndim=3, floating=True)
        check_tensor("transition", pot.transition, floating=True)
        B, T, K = pot.unary.shape
        if K != self.num_labels:
            raise ValueError(f"unary has {K} labels in its last dimension, expected {self.num_labels}")
        if T < 1:
            raise ValueError("unary must have at least one position (T >= 1)")
        ref = pot.unary
        self._check_common({"transition": pot.transition, "start": pot.start, "end": pot.end}, ref)
        if pot.transition.dim() == 2:
            check_shape("transition", pot.transition, (K, K), "shared")
        elif pot.transition.dim() == 4:
            check_shape("transition", pot.transition, (B, T - 1, K, K), "per position")
        else:
            raise ValueError(
                f"transition must have shape ({K}, {K}) or ({B}, {T - 1}, {K}, {K}), "
                f"got {tuple(pot.transition.shape)}"
            )
        for name in ("start", "end"):
            t = getattr(pot, name)
            if t is not None:
                check_shape(name, t, (K,))
        if reads_values(ref.device):
            check_finite({"unary": pot.unary, "transition": pot.transition, "start": pot.start, "end": pot.end},
                         POTENTIAL_INF_HINT)
            lengths = check_lengths(lengths, B, T, ref.device)
            if target is not None:
                target = check_labels(target_name, target, (B, T), K, ref.device, valid=self._valid(lengths, T))
            return pot, lengths, target, True
        if lengths is not None:
            lengths = check_lengths(lengths, B, T, ref.device, values=False)
        if target is not None:
            target = binary_labels(target, K)  # as `check_labels`
            check_tensor(target_name, target, integer=True, device=ref.device)
            check_shape(target_name, target, (B, T))
        return pot, lengths, target, False

    def _unread(self, lengths, target, B: int, T: int, device):
        """Lengths and target that `_validate` did not read, made safe to index with, without reading them:
        lengths clamped to ``[1, T]`` (all T when None), the target -1 past each length."""
        if lengths is None:
            lengths = torch.full((B,), T, dtype=torch.long, device=device)
        else:
            lengths = lengths.clamp(1, T)
        if target is not None:
            target = torch.where(self._valid(lengths, T), target.long(), -1)
        return lengths, target

    def _as_potentials(self, potentials) -> ChainPotentials:
        if isinstance(potentials, ChainPotentials):
            return potentials
        if isinstance(potentials, (tuple, list)) and 2 <= len(potentials) <= 4:
            return ChainPotentials(*potentials)
        raise TypeError(
            "potentials must be a ChainPotentials(unary, transition, start=None, end=None), "
            f"got {type(potentials).__name__}"
        )

    @staticmethod
    def _valid(lengths: torch.Tensor, T: int) -> torch.Tensor:
        return torch.arange(T, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)

    # -- the protocol -------------------------------------------------------------------------
    def _max_oracle(self, pot: ChainPotentials, lengths, target, loss_weight, backend):
        """Unchecked `max_oracle`. ``loss_weight``: ``(B,)`` tensor or None. Where the values are not read (a device
        outside debug mode) the Triton Viterbi guards its own sums against overflow (`guard_triton`, one launch
        more): the labelling exact, the value +-inf where the dtype cannot hold it."""
        dt = compute_dtype(pot)
        unary = pot.unary.detach().to(dt)
        if target is not None:
            # Hamming is decomposable: add its per-position weight to every wrong label.
            # the product in float64: a weight past dt's range times a zero class weight is 0, not inf * 0 = NaN
            pos_w = (self._position_loss_weights(target, lengths).to(torch.float64)
                     * loss_weight.to(torch.float64).unsqueeze(1)).to(dt)
            wrong = torch.ones_like(unary, dtype=torch.bool).scatter_(2, target.clamp_min(0).unsqueeze(2), False)
            # where, not a product: a weight past the dtype's range gives +inf on the wrong labels, not inf * 0 = NaN
            unary = unary + torch.where(wrong, pos_w.unsqueeze(2), 0.0)
        det = [None if t is None else t.detach().to(dt) for t in (pot.transition, pot.start, pot.end)]
        # unread magnitudes: the guard of the augmented unary (its Hamming weights included) on the device
        return viterbi(unary, det[0], det[1], det[2], lengths, backend=backend, guard=not reads_values(unary.device))

    # -- the margin-rescaled hinge, fused on a GPU ----------------------------------------------------------
    # With the Triton backend the hinge runs as `chain_hinge_prepare_triton` (the overflow guard's bound, then the
    # augmented unary, the truth's score, the lengths and target made safe, the value checks folded in), Viterbi
    # (which stores the hinge itself), and `chain_hinge_grad_triton` in the backward: five launches of its own and
    # no host wait per forward and backward, where the torch ops take many
    # more launches and wait for the device (docs/benchmarks/loss_cost_cuda.md; tests/test_loss_cost.py).
    # Elsewhere the inherited path: `_max_oracle`, `_score`, `marginal_vjp`; with deterministic algorithms the
    # backward too (the kernel adds the shared factors' counts atomically).
    @staticmethod
    def _fused(device, backend: str) -> bool:
        if backend == "numba":  # no fused form: the inherited path, with numba's Viterbi
            return False
        return _kernels.resolve("chain_hinge", backend, device) == "triton"

    def _hinge_inputs(self, potentials, lengths, target, backend):
        pot, lengths, target, checked = self._validate(potentials, lengths, target, "target")
        device = pot.unary.device
        fused = self._fused(device, backend) and target is not None
        if not checked and not fused:  # the fused kernel clamps and normalises them itself
            lengths, target = self._unread(lengths, target, *pot.unary.shape[:2], device)
        return pot, lengths, target

    def _hinge_forward(self, pot: ChainPotentials, lengths, target, loss_weight, backend):
        if target is None or not self._fused(pot.unary.device, backend):
            return super()._hinge_forward(pot, lengths, target, loss_weight, backend)
        from ..kernels.chain.chain_hinge_triton import chain_hinge_prepare_triton
        from ..kernels.chain.viterbi_triton import viterbi_triton

        dt = compute_dtype(pot)
        if isinstance(loss_weight, torch.Tensor):
            loss_weight = loss_weight.detach()
        # the potentials times the overflow guard's 2**-s (1 far from the limits), found on the device
        unary, gold, lengths, target, guard = chain_hinge_prepare_triton(
            pot.unary.detach(), pot.transition.detach(), _detach(pot.start), _detach(pot.end), lengths, target,
            loss_weight, self._device_class_weights(pot.unary.device), self.normalize, dt)
        det = [None if t is None else t.detach().to(dt) for t in (pot.transition, pot.start, pot.end)]
        # Viterbi stores the hinge max(value - gold, 0) * 2**s itself: NaN where the prepare kernel found a bad
        # label, length or loss weight, +inf where the hinge does not fit the dtype
        y_hat, loss = viterbi_triton(unary, det[0], det[1], det[2], lengths, guard=guard, scale_unary=False,
                                     gold=gold)
        return loss, y_hat, target, lengths

    def _marginal_difference(self, y_hat, target, lengths, weight, tensors, needs, backend="auto"):
        # the fused kernel is not differentiable in the weight (the incoming gradient), and takes no torch.func
        # wrappers: a double backward (create_graph=True through the hinge) and torch.func.grad take the torch twin
        if not self._fused(tensors[0].device, backend) or torch.are_deterministic_algorithms_enabled() or _needs_twin(
                weight, tensors):
            return super()._marginal_difference(y_hat, target, lengths, weight, tensors, needs, backend)
        from ..kernels.chain.chain_hinge_triton import chain_hinge_grad_triton

        return chain_hinge_grad_triton(y_hat, target, lengths, weight, *tensors, needs, compute_dtype(tensors))

    def _slack_max_oracle(self, pot: ChainPotentials, lengths, target, backend, margin=1.0):
        """``(y_hat, max(0, max_y Delta(y) (margin + s(y) - s(y*))))`` (``margin`` 1 but for the overflow guard's
        scaling, `Structure._slack_max_oracle`), exact by the error-count DP
        (`torchssvm.kernels.chain.slack_chain_torch`); needs a uniform Hamming cost (no ``class_weights``)."""
        if self.class_weights is not None:
            raise ValueError("the exact slack-rescaled chain oracle needs the same cost for every wrong "
                             "position: class_weights must be None")
        dt = compute_dtype(pot)
        det = ChainPotentials(*(None if t is None else t.detach().to(dt) for t in pot))
        gold = self._score(det, target, lengths)
        cost = 1.0 / lengths.to(dt) if self.normalize else torch.ones(lengths.shape, dtype=dt, device=lengths.device)
        return slack_viterbi(det.unary, det.transition, det.start, det.end, lengths, target, cost, gold,
                             backend=backend, margin=margin)

    def position_loss_weights(self, y: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` float64: the Hamming cost of a mistake at each position of labellings ``y`` (0 on padding),
        so that ``task_loss(y_hat, y) = sum_t w_t [y_hat_t != y_t]``. Unchecked: ``y`` and ``lengths`` as
        `validate` returns them (``lengths`` a tensor)."""
        return self._position_loss_weights(y, lengths)

    def _max_task_loss(self, target, lengths) -> torch.Tensor:
        w = self._position_loss_weights(target, lengths)
        return w.sum(1) if self.num_labels > 1 else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)

    def _position_loss_weights(self, y: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        T = y.shape[1]
        w = self._class_weight(y, torch.float64) * self._valid(lengths, T)
        if self.normalize:
            w = w / lengths.unsqueeze(1).to(torch.float64)
        return w

    def _score(self, pot: ChainPotentials, y, lengths) -> torch.Tensor:
        return chain_score_torch(pot.unary, pot.transition, pot.start, pot.end, y, lengths)

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        check_tensor("y", y, ndim=2)
        B, T = y.shape
        lengths = check_lengths(lengths, B, T, y.device)
        valid = self._valid(lengths, T)
        y = check_labels("y", y, (B, T), self.num_labels, y.device, valid=valid)
        y_hat = check_labels("y_hat", y_hat, (B, T), self.num_labels, y.device, valid=valid)
        return self._task_loss(y_hat, y, lengths)

    def _task_loss(self, y_hat, y, lengths) -> torch.Tensor:
        return (self._position_loss_weights(y, lengths) * (y_hat != y)).sum(1)

    def marginals(self, y, lengths=None, *, per_position: bool = False, dtype=torch.float32):
        """One-hot marginals of labellings ``y (B, T)``: a `ChainPotentials` of unary ``(B, T, K)``,
        transition counts ``(B, K, K)`` (or one-hot ``(B, T-1, K, K)`` with ``per_position``), start and
        end ``(B, K)``. ``score(pot, y) == <pot, marginals(y)>`` summed over each example's factors."""
        check_float_dtype(dtype)
        check_tensor("y", y, ndim=2)
        B, T = y.shape
        lengths = check_lengths(lengths, B, T, y.device)
        valid = self._valid(lengths, T)
        y = check_labels("y", y, (B, T), self.num_labels, y.device, valid=valid)
        K = self.num_labels
        yc = y.clamp_min(0)
        vf = valid.to(dtype)
        unary = torch.zeros(B, T, K, dtype=dtype, device=y.device).scatter_(2, yc.unsqueeze(2), vf.unsqueeze(2))
        pair_idx = yc[:, :-1] * K + yc[:, 1:]
        pair_w = vf[:, 1:]
        if per_position:
            trans = torch.zeros(B, T - 1, K * K, dtype=dtype, device=y.device)
            trans.scatter_(2, pair_idx.unsqueeze(2), pair_w.unsqueeze(2))
            trans = trans.view(B, T - 1, K, K)
        else:
            trans = torch.zeros(B, K * K, dtype=dtype, device=y.device)
            trans = trans.scatter_add_(1, pair_idx, pair_w).view(B, K, K)
        eye = torch.eye(K, dtype=dtype, device=y.device)
        start = eye[yc[:, 0]]
        end = eye[yc.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)]
        return ChainPotentials(unary, trans, start, end)

    def log_partition(self, potentials, lengths=None) -> torch.Tensor:
        """``log sum_y exp s(y)`` per example by the forward algorithm (differentiable with autograd:
        its gradient is the expected marginals). Used by the CRF likelihood baseline; decoded in at least
        float32."""
        return super().log_partition(potentials, lengths)

    def _score_bound(self, tensors, mags, aug):
        T = tensors[0].shape[1]
        u, tr = mags.get("unary", 0.0), mags.get("transition", 0.0)
        return T * (u + aug) + max(T - 1, 0) * tr + mags.get("start", 0.0) + mags.get("end", 0.0)

    def _loss_sites(self, tensors) -> int:
        return tensors[0].shape[1]

    def _log_partition(self, pot: ChainPotentials, lengths, scale=1.0) -> torch.Tensor:
        dt = compute_dtype(pot)
        unary, trans = pot.unary.to(dt), pot.transition.to(dt)
        T = unary.shape[1]
        alpha = unary[:, 0] + pot.start.to(dt) if pot.start is not None else unary[:, 0]
        for t in range(1, T):
            tr = trans[:, t - 1] if trans.dim() == 4 else trans
            new = logsumexp_scaled(alpha.unsqueeze(2) + tr, 1, scale) + unary[:, t]
            alpha = torch.where((lengths > t).unsqueeze(1), new, alpha)
        if pot.end is not None:
            alpha = alpha + pot.end.to(dt)
        return logsumexp_scaled(alpha, 1, scale)

    def _guards_own_hinge(self, device, backend: str) -> bool:
        return self._fused(device, backend)

    def _guards_own_oracle(self, device, backend: str) -> bool:
        return backend != "numba" and _kernels.resolve(self.oracle_op, backend, device) == "triton"

    # -- autograd plumbing -----------------------------------------------------------------------
    def tensors(self, potentials):
        return tuple(self._as_potentials(potentials))

    def from_tensors(self, tensors: Sequence[Optional[torch.Tensor]]) -> ChainPotentials:
        return ChainPotentials(*tensors)

    def marginal_vjp(self, y, weight, potentials, lengths, needs, dtype=None):
        pot = self._as_potentials(potentials)
        B, T, K = pot.unary.shape
        dtype, device = dtype or pot.unary.dtype, pot.unary.device
        weight = weight.to(dtype)
        valid = self._valid(lengths, T)
        yc = y.clamp_min(0)
        out = [None, None, None, None]
        if needs[0]:
            src = (weight.unsqueeze(1) * valid).unsqueeze(2)
            out[0] = torch.zeros(B, T, K, dtype=dtype, device=device).scatter_(2, yc.unsqueeze(2), src)
        if needs[1] and T > 1:
            pair_idx = yc[:, :-1] * K + yc[:, 1:]
            pair_w = weight.unsqueeze(1) * valid[:, 1:]
            if pot.transition.dim() == 2:
                g = torch.zeros(K * K, dtype=dtype, device=device)
                out[1] = g.index_add_(0, pair_idx.reshape(-1), pair_w.reshape(-1)).view(K, K)
            else:
                g = torch.zeros(B, T - 1, K * K, dtype=dtype, device=device)
                out[1] = g.scatter_(2, pair_idx.unsqueeze(2), pair_w.unsqueeze(2)).view(B, T - 1, K, K)
        elif needs[1]:
            out[1] = torch.zeros_like(pot.transition, dtype=dtype)
        if needs[2] and pot.start is not None:
            out[2] = torch.zeros(K, dtype=dtype, device=device).index_add_(0, yc[:, 0], weight)
        if needs[3] and pot.end is not None:
            last = yc.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
            out[3] = torch.zeros(K, dtype=dtype, device=device).index_add_(0, last, weight)
        return tuple(out)

    def __repr__(self) -> str:
        return f"Chain({self.num_labels}, normalize={self.normalize})"


def _needs_twin(weight, tensors) -> bool:
    """Whether the hinge's backward must take the torch twin: differentiated again (``create_graph=True``, the
    weight requiring grad) or under torch.func (its wrapped tensors have no storage for a kernel)."""
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)
    return (torch.is_grad_enabled() and isinstance(weight, torch.Tensor) and weight.requires_grad) or any(
        isinstance(t, torch.Tensor) and wrapped(t) for t in (weight, *tensors))
