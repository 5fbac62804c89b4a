"""Multi-label classification as a pairwise binary Markov random field (Finley & Joachims, 2008;
Choi et al., 2016, section 5).

K binary labels ``y in {0, 1}^K`` with the score

    s(y) = sum_k unary[k] y_k + sum_{(k, l) in edges} pairwise[e] y_k y_l,

which is every pairwise binary MRF up to a constant (a general 2 x 2 edge table reparametrizes into the
unaries and one interaction per edge). Decoding, loss-augmented decoding and the slack-rescaled oracle
are exact by enumeration of the ``2^K`` labellings, batched, for ``K <= MAX_ENUMERATION_LABELS``;
larger K raises a clear error (an LP-relaxation oracle is not implemented).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from .._validation import (
    POTENTIAL_INF_HINT,
    check_bool,
    check_finite,
    check_float_dtype,
    check_int_sequence,
    check_labels,
    check_shape,
    check_tensor,
)
from .base import Structure, binary_hamming_table, compute_dtype, logsumexp_scaled, truth_unless_violated

#: Exact enumeration limit: 2^16 = 65,536 labellings per example.
MAX_ENUMERATION_LABELS = 16
# (batch x labellings) scores materialized at once
_MAX_SCORE_ELEMENTS = 1 << 24


class MultiLabelPotentials(NamedTuple):
    """``unary (B, K)`` scores of each label being on; ``pairwise`` ``(E,)`` shared or ``(B, E)`` per example,
    the score of both labels of edge e being on. As marginals (`MultiLabel.marginals`): ``y (B, K)`` and
    ``y_k y_l (B, E)``."""

    unary: torch.Tensor
    pairwise: Optional[torch.Tensor] = None


class MultiLabel(Structure):
    """Args:
        num_labels: K.
        edges: ``"full"`` (every pair ``k < l``), a list of ``(k, l)`` pairs, or None (independent labels).
        normalize: divide the Hamming loss by K (the "label loss" of the papers); else count errors.
        class_weights: optional ``(K,)`` cost of a mistake on each label.

    Labels are ``(B, K)`` integer tensors of 0 / 1 (or bool tensors).
    """

    potential_names = ("unary", "pairwise")
    has_slack_oracle = has_log_partition = has_table_oracle = has_max_task_loss = True

    def __init__(self, num_labels: int, edges="full", *, normalize: bool = True, class_weights=None):
        super().__init__(num_labels, class_weights)
        K = self.num_labels
        if isinstance(edges, str):
            if edges != "full":
                raise ValueError(f"edges must be 'full', a list of (k, l) pairs or None, got {edges!r}")
            pairs = [(k, l) for k in range(K) for l in range(k + 1, K)]
        elif edges is None:
            pairs = []
        else:
            pairs = []
            for e in edges:
                if not hasattr(e, "__len__") or len(e) != 2:
                    raise ValueError(f"edges must hold (k, l) pairs, got {e!r}")
                k, l = check_int_sequence("an edge of edges", e)
                if not (0 <= k < K and 0 <= l < K) or k == l:
                    raise ValueError(f"edges holds ({k}, {l}): labels must be distinct and in [0, {K})")
                pairs.append((min(k, l), max(k, l)))
            if len(set(pairs)) != len(pairs):
                raise ValueError("edges holds a pair twice")
        self.edges = torch.tensor(pairs, dtype=torch.long).view(-1, 2)
        self.normalize = check_bool("normalize", normalize)
        self._configs = None

    @property
    def num_edges(self) -> int:
        return self.edges.shape[0]

    # -- validation ---------------------------------------------------------------------------
    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        if lengths is not None:
            raise ValueError("lengths must be None for MultiLabel (every example has K labels)")
        pot = self._as_potentials(potentials)
        check_tensor("unary", pot.unary, ndim=2, floating=True)
        B, K = pot.unary.shape
        if K != self.num_labels:
            raise ValueError(f"unary has {K} labels in its last dimension, expected {self.num_labels}")
        E = self.num_edges
        if pot.pairwise is None:
            if E:
                raise ValueError(f"pairwise is None but the structure has {E} edges")
        else:
            self._check_common({"pairwise": pot.pairwise}, pot.unary)
            if pot.pairwise.dim() == 1:
                check_shape("pairwise", pot.pairwise, (E,), "shared")
            else:
                check_shape("pairwise", pot.pairwise, (B, E), "per example")
        check_finite({"unary": pot.unary, "pairwise": pot.pairwise}, POTENTIAL_INF_HINT)
        if target is not None:
            target = check_labels(target_name, target, (B, K), 2, pot.unary.device)
        return pot, None, target

    def _as_potentials(self, potentials) -> MultiLabelPotentials:
        if isinstance(potentials, MultiLabelPotentials):
            return potentials
        if isinstance(potentials, torch.Tensor):
            return MultiLabelPotentials(potentials, None)
        if isinstance(potentials, (tuple, list)) and 1 <= len(potentials) <= 2:
            return MultiLabelPotentials(*potentials)
        raise TypeError(f"potentials must be a MultiLabelPotentials(unary, pairwise=None), got "
                        f"{type(potentials).__name__}")

    def _check_enumerable(self) -> None:
        if self.num_labels > MAX_ENUMERATION_LABELS:
            raise ValueError(f"exact MultiLabel oracles enumerate 2^K labellings and support K <= "
                             f"{MAX_ENUMERATION_LABELS}; got K = {self.num_labels} (no LP-relaxation oracle yet)")

    # -- enumeration ------------------------------------------------------------------------------
    def configurations(self, device=None) -> torch.Tensor:
        """Every labelling, ``(2^K, K)`` long; row j is the binary expansion of j (label 0 = lowest bit)."""
        self._check_enumerable()
        if self._configs is None:
            j = torch.arange(2 ** self.num_labels)
            self._configs = (j.unsqueeze(1) >> torch.arange(self.num_labels)) & 1
        return self._configs.to(device) if device is not None else self._configs

    def _config_scores(self, pot: MultiLabelPotentials, configs: torch.Tensor, dtype) -> torch.Tensor:
        """``(B, C)``: ``s(y)`` of every example for every row of ``configs (C, K)``."""
        c = configs.to(dtype)
        s = pot.unary.detach().to(dtype) @ c.t()
        if self.num_edges:
            e = self.edges.to(configs.device)
            both = c[:, e[:, 0]] * c[:, e[:, 1]]  # (C, E)
            pw = pot.pairwise.detach().to(dtype)
            s = s + (pw @ both.t() if pw.dim() == 2 else (both @ pw).unsqueeze(0))
        return s

    def _config_losses(self, target: torch.Tensor, configs: torch.Tensor, dtype) -> torch.Tensor:
        """``(B, C)``: ``Delta(target, y)`` for every row of ``configs``."""
        return binary_hamming_table(self._label_costs(target, dtype), target, configs)

    def label_costs(self, target: torch.Tensor, dtype) -> torch.Tensor:
        """``(B, K)`` of ``dtype``: the cost of a mistake on each label of labellings ``target (B, K)``, so that
        ``task_loss(y_hat, y) = sum_k c_k [y_hat_k != y_k]``. Unchecked: ``target`` as `validate` returns it."""
        return self._label_costs(target, dtype)

    def _label_costs(self, target: torch.Tensor, dtype) -> torch.Tensor:
        K = self.num_labels
        w = torch.ones(target.shape, dtype=dtype, device=target.device)
        if self.class_weights is not None:
            w = w * self.class_weights.to(device=target.device, dtype=dtype)
        return w / K if self.normalize else w

    def _labelling_table(self, pot, target):
        configs = self.configurations(pot.unary.device)
        bits = 2 ** torch.arange(self.num_labels, device=target.device)
        return (configs, self._config_scores(pot, configs, torch.float64),
                self._config_losses(target, configs, torch.float64), (target * bits).sum(1))

    def _max_task_loss(self, target, lengths) -> torch.Tensor:
        return self._label_costs(target, torch.float64).sum(1)  # every label wrong

    def _enumerate(self, pot, target, objective, costs=None):
        """``argmax_y objective(scores, losses, rows)`` over all labellings, in chunks of examples ``rows`` (a
        slice of the batch), with ``scores, losses (b, 2^K)`` (the Hamming losses of per-label ``costs (B, K)``,
        default the structure's); ties: the smallest configuration index."""
        self._check_enumerable()
        dt = compute_dtype(pot)
        if target is not None and costs is None:
            costs = self._label_costs(target, dt)
        configs = self.configurations(pot.unary.device)
        B, C = pot.unary.shape[0], configs.shape[0]
        chunk = max(1, _MAX_SCORE_ELEMENTS // C)
        labels, values = [], []
        for s in range(0, B, chunk):
            part = MultiLabelPotentials(pot.unary[s : s + chunk],
                                        pot.pairwise[s : s + chunk] if pot.pairwise is not None and
                                        pot.pairwise.dim() == 2 else pot.pairwise)
            scores = self._config_scores(part, configs, dt)
            losses = None if target is None else binary_hamming_table(costs[s : s + chunk], target[s : s + chunk],
                                                                      configs)
            value, j = objective(scores, losses, slice(s, s + chunk)).max(1)
            labels.append(configs[j])
            values.append(value)
        if not labels:  # an empty batch
            return configs.new_empty((0, configs.shape[1])), torch.empty(0, dtype=dt, device=configs.device)
        return torch.cat(labels), torch.cat(values)

    # -- the protocol -------------------------------------------------------------------------
    def _max_oracle(self, pot, lengths, target, loss_weight, backend):
        if target is None:
            return self._enumerate(pot, None, lambda s, loss, rows: s)
        # the per-label costs times the weight in float64, then cast (K numbers per example): a weight past the
        # dtype's range times a small class weight can fit it; where a cost does not, `binary_hamming_table` holds it
        # at the dtype's largest value, so a wrong labelling's loss is +inf and the truth's exactly 0 (not inf * 0)
        costs = (self._label_costs(target, torch.float64)
                 * loss_weight.to(torch.float64).unsqueeze(1)).to(compute_dtype(pot))
        return self._enumerate(pot, target, lambda s, loss, rows: s + loss, costs=costs)

    def _slack_max_oracle(self, pot, lengths, target, backend, margin=1.0):
        """``(y_hat, max(0, max_y Delta(y) (margin + s(y) - s(y*))))`` by enumeration; the truth when nothing
        violates (``margin`` 1 but for the overflow guard's scaling, `Structure._slack_max_oracle`)."""
        dt = compute_dtype(pot)
        gold = self._score(MultiLabelPotentials(*(None if t is None else t.detach().to(dt) for t in pot)),
                           target, None)
        y_hat, value = self._enumerate(pot, target,
                                       lambda s, loss, rows: loss * (margin + s - gold[rows].unsqueeze(1)))
        return truth_unless_violated(y_hat, value, target)

    def _score(self, pot, y, lengths) -> torch.Tensor:
        dt = compute_dtype(pot)  # a half unary with a float32 shared pairwise (a network under autocast): float32
        yf = y.to(dt)
        s = (pot.unary.to(dt) * yf).sum(1)
        if self.num_edges:
            e = self.edges.to(y.device)
            both = yf[:, e[:, 0]] * yf[:, e[:, 1]]
            pw = pot.pairwise.to(dt)
            s = s + ((pw * both).sum(1) if pw.dim() == 2 else both @ pw)
        return s

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        if lengths is not None:
            raise ValueError("lengths must be None for MultiLabel (every example has K labels)")
        check_tensor("y", y, ndim=2)
        y = check_labels("y", y, (y.shape[0], self.num_labels), 2, y.device)
        y_hat = check_labels("y_hat", y_hat, tuple(y.shape), 2, y.device)
        return self._task_loss(y_hat, y, None)

    def _task_loss(self, y_hat, y, lengths) -> torch.Tensor:
        return (self._label_costs(y, torch.float64) * (y_hat != y)).sum(1)

    def marginals(self, y, lengths=None, *, dtype=torch.float32) -> MultiLabelPotentials:
        """``y (B, K)`` and the edge indicators ``y_k y_l (B, E)`` (None without edges)."""
        check_float_dtype(dtype)
        if lengths is not None:
            raise ValueError("lengths must be None for MultiLabel (every example has K labels)")
        check_tensor("y", y, ndim=2)
        y = check_labels("y", y, (y.shape[0], self.num_labels), 2, y.device)
        yf = y.to(dtype)
        if not self.num_edges:
            return MultiLabelPotentials(yf, None)
        e = self.edges.to(y.device)
        return MultiLabelPotentials(yf, yf[:, e[:, 0]] * yf[:, e[:, 1]])

    def log_partition(self, potentials, lengths=None) -> torch.Tensor:
        """``log sum_y exp s(y)`` by enumeration (K <= MAX_ENUMERATION_LABELS), differentiable."""
        return super().log_partition(potentials, lengths)

    def _score_bound(self, tensors, mags, aug):
        return self.num_labels * (mags.get("unary", 0.0) + aug) + self.num_edges * mags.get("pairwise", 0.0)

    def _loss_sites(self, tensors) -> int:
        return self.num_labels

    def _log_partition(self, pot, lengths, scale=1.0) -> torch.Tensor:
        self._check_enumerable()
        dt = compute_dtype(pot)
        c = self.configurations(pot.unary.device).to(dt)
        s = pot.unary.to(dt) @ c.t()
        if self.num_edges:
            e = self.edges.to(c.device)
            both = c[:, e[:, 0]] * c[:, e[:, 1]]
            pw = pot.pairwise.to(dt)
            s = s + (pw @ both.t() if pw.dim() == 2 else (both @ pw).unsqueeze(0))
        return logsumexp_scaled(s, 1, scale)

    # -- autograd plumbing -----------------------------------------------------------------------
    def tensors(self, potentials):
        return tuple(self._as_potentials(potentials))

    def from_tensors(self, tensors: Sequence[Optional[torch.Tensor]]) -> MultiLabelPotentials:
        return MultiLabelPotentials(*tensors)

    def marginal_vjp(self, y, weight, potentials, lengths, needs, dtype=None):
        pot = self._as_potentials(potentials)
        dtype = dtype or pot.unary.dtype
        yf = y.to(dtype)
        wt = weight.to(dtype).unsqueeze(1)
        out = [None, None]
        if needs[0]:
            out[0] = wt * yf
        if len(needs) > 1 and needs[1] and pot.pairwise is not None:
            e = self.edges.to(y.device)
            both = wt * yf[:, e[:, 0]] * yf[:, e[:, 1]]
            out[1] = both if pot.pairwise.dim() == 2 else both.sum(0)
        return tuple(out)

    def __repr__(self) -> str:
        return f"MultiLabel({self.num_labels}, edges={self.num_edges}, normalize={self.normalize})"
