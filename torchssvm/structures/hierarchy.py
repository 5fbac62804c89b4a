"""Hierarchical multi-label classification (Cai & Hofmann, 2004; the experiments of
Choi et al., 2016, section 5).

A forest of N nodes (``parents[n]``: the parent of node n, -1 for a root); the labels are its leaves. A
multi-label ``Y`` (a set of leaves) switches on every node that is an ancestor of (or is) one of its
leaves, and scores the sum of those nodes' potentials:

    s(Y) = sum_{n in Anc(Y)} theta[n].

Labellings are ``(B, N)`` 0 / 1 over all nodes (the closure), and the task loss is the Hamming distance
over all nodes, inner ones included (optionally weighted per node and divided by N). Decoding and
loss-augmented decoding are exact by max-sum on the forest (leaves to roots): a node that is on keeps
the children whose subtree gains, and at least its best child. The slack-rescaled oracle enumerates
the leaf sets (at most ``2^MAX_ENUMERATION_LEAVES``).
"""

from __future__ import annotations

from typing import Optional, Sequence

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
from .base import Structure, binary_hamming_table, compute_dtype, truth_unless_violated

MAX_ENUMERATION_LEAVES = 16


class Hierarchy(Structure):
    """Args:
        parents: ``parents[n]`` is the parent of node n (an int in ``[0, N)``) or -1 for a root; a forest.
        normalize: divide the Hamming loss by N.
        class_weights: optional ``(N,)`` cost of a mistake on each node.
        allow_empty: whether the empty multi-label (every node off) is an output.
    """

    potential_names = ("scores",)
    has_slack_oracle = True

    def __init__(self, parents: Sequence[int], *, normalize: bool = True, class_weights=None,
                 allow_empty: bool = True):
        parents = list(check_int_sequence("parents", parents))
        if not parents:
            raise ValueError("parents must hold at least one node")
        super().__init__(len(parents), class_weights)
        N = len(parents)
        for n, p in enumerate(parents):
            if not (p == -1 or 0 <= p < N) or p == n:
                raise ValueError(f"parents[{n}] = {p}: must be -1 (a root) or another node in [0, {N})")
        children = [[] for _ in range(N)]
        for n, p in enumerate(parents):
            if p >= 0:
                children[p].append(n)
        depth = []
        for n in range(N):  # every node must reach a root: no cycles
            d, m = 0, n
            while parents[m] != -1:
                m, d = parents[m], d + 1
                if d > N:
                    raise ValueError("parents has a cycle")
            depth.append(d)
        self.parents, self.children = parents, children
        self.roots = [n for n in range(N) if parents[n] == -1]
        self.leaves = [n for n in range(N) if not children[n]]
        self.post_order = sorted(range(N), key=lambda n: -depth[n])  # children before parents
        self.normalize, self.allow_empty = check_bool("normalize", normalize), check_bool("allow_empty", allow_empty)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, potentials, lengths=None, target=None, *, target_name: str = "target"):
        if lengths is not None:
            raise ValueError("lengths must be None for Hierarchy")
        check_tensor("scores", potentials, ndim=2, floating=True)
        B, N = potentials.shape
        if N != self.num_labels:
            raise ValueError(f"scores has {N} nodes in its last dimension, expected {self.num_labels}")
        check_finite({"scores": potentials}, POTENTIAL_INF_HINT)
        if target is not None:
            target = self._check_labelling(target_name, target, B, potentials.device)
        return potentials, None, target

    def _check_labelling(self, name, y, B, device):
        y = check_labels(name, y, (B, self.num_labels), 2, device)
        par = torch.tensor([max(p, 0) for p in self.parents], device=y.device)
        has_parent = torch.tensor([p >= 0 for p in self.parents], device=y.device)
        if bool(((y == 1) & has_parent & (y[:, par] == 0)).any()):
            raise ValueError(f"{name} switches on a node whose parent is off (labellings are closed under "
                             "ancestors)")
        for n in range(self.num_labels):
            if self.children[n] and bool(((y[:, n] == 1) & (y[:, self.children[n]] == 0).all(1)).any()):
                raise ValueError(f"{name} switches on inner node {n} without any of its children (labels are "
                                 "leaf sets)")
        if not self.allow_empty and bool((y.sum(1) == 0).any()):
            raise ValueError(f"{name} holds an empty multi-label but allow_empty=False")
        return y

    # -- oracles --------------------------------------------------------------------------------
    def _node_costs(self, dtype, device) -> torch.Tensor:
        c = torch.ones(self.num_labels, dtype=dtype, device=device)
        if self.class_weights is not None:
            c = c * self.class_weights.to(device=device, dtype=dtype)
        return c / self.num_labels if self.normalize else c

    def _max_oracle(self, scores, lengths, target, loss_weight, backend):
        dt = compute_dtype([scores])
        theta = scores.detach().to(dt)
        const = torch.zeros(theta.shape[0], dtype=dt, device=theta.device)
        if target is not None:  # Hamming over nodes is decomposable: +c when a node flips
            # the product in float64, then cast: a weight past dt's range times a small cost can fit dt
            c = (self._node_costs(torch.float64, theta.device)
                 * loss_weight.to(torch.float64).unsqueeze(1)).to(dt)
            if not bool(torch.isfinite(c).all()):  # the DP would add +inf and -inf flips: NaN
                raise OverflowError(f"loss_weight times the node costs overflows {dt}: use float64 potentials or a "
                                    "smaller loss_weight / class_weights")
            t = target.to(dt)
            theta = theta + c * (1 - 2 * t)
            const = (c * t).sum(1)
        y, value = self._max_sum(theta)
        return y, value + const

    def _max_sum(self, theta):
        """Max-sum on the forest: ``(y (B, N), best score (B,))``; ties keep nodes off, then the smallest child."""
        B, N = theta.shape
        on = [None] * N  # on[n]: best score of n's subtree with n on
        for n in self.post_order:
            kids = self.children[n]
            if not kids:
                on[n] = theta[:, n]
                continue
            sub = torch.stack([on[c] for c in kids], 1)
            gain = sub.clamp_min(0).sum(1)
            on[n] = theta[:, n] + torch.where((sub > 0).any(1), gain, sub.max(1).values)
        roots = torch.stack([on[r] for r in self.roots], 1)
        pos = roots.clamp_min(0).sum(1)
        if self.allow_empty:
            value = pos
        else:
            value = torch.where((roots > 0).any(1), pos, roots.max(1).values)
        y = torch.zeros(B, N, dtype=torch.long, device=theta.device)

        def choose(nodes, parent_on, forced):
            sub = torch.stack([on[c] for c in nodes], 1)
            keep = (sub > 0) & parent_on.unsqueeze(1)
            need = forced & parent_on & ~keep.any(1)  # on, but no child gains: the best child (first max)
            first = torch.nn.functional.one_hot(sub.argmax(1), len(nodes)).bool() & need.unsqueeze(1)
            return keep | first

        root_on = choose(self.roots, torch.ones(B, dtype=torch.bool, device=theta.device),
                         torch.full((B,), not self.allow_empty, device=theta.device))
        for j, r in enumerate(self.roots):
            y[:, r] = root_on[:, j].long()
        for n in reversed(self.post_order):  # parents before children
            kids = self.children[n]
            if kids:
                pick = choose(kids, y[:, n] == 1, torch.ones(B, dtype=torch.bool, device=theta.device))
                for j, c in enumerate(kids):
                    y[:, c] = pick[:, j].long()
        return y, value

    def configurations(self, device=None) -> torch.Tensor:
        """Every output, ``(M, N)`` 0 / 1: the closures of the leaf sets (the empty one if allowed)."""
        L = len(self.leaves)
        if L > MAX_ENUMERATION_LEAVES:
            raise ValueError(f"enumerating Hierarchy outputs supports at most {MAX_ENUMERATION_LEAVES} leaves, "
                             f"got {L}")
        j = torch.arange(2 ** L)
        chosen = (j.unsqueeze(1) >> torch.arange(L)) & 1  # (2^L, L)
        y = torch.zeros(2 ** L, self.num_labels, dtype=torch.long)
        for k, leaf in enumerate(self.leaves):
            n = leaf
            while n != -1:
                y[:, n] |= chosen[:, k]
                n = self.parents[n]
        if not self.allow_empty:
            y = y[1:]
        return y.to(device) if device is not None else y

    def _slack_max_oracle(self, scores, lengths, target, backend, margin=1.0):
        """``(y_hat, max(0, max_Y Delta (margin + s(Y) - s(Y*))))`` by enumeration of the leaf sets (``margin`` 1 but
        for the overflow guard's scaling, `Structure._slack_max_oracle`)."""
        dt = compute_dtype([scores])
        theta = scores.detach().to(dt)
        configs = self.configurations(theta.device)
        s = theta @ configs.to(dt).t()
        gold = (theta * target.to(dt)).sum(1, keepdim=True)
        loss = binary_hamming_table(self._node_costs(dt, theta.device), target, configs)
        value, j = (loss * (margin + s - gold)).max(1)
        return truth_unless_violated(configs[j], value, target)

    # -- scores, losses, marginals --------------------------------------------------------------
    def _score_bound(self, tensors, mags, aug):
        return self.num_labels * (mags.get("scores", 0.0) + 2.0 * aug)  # theta + c (1 - 2 t), and sum c t

    def _loss_sites(self, tensors) -> int:
        return self.num_labels

    def _score(self, scores, y, lengths) -> torch.Tensor:
        return (scores * y.to(scores.dtype)).sum(1)

    def task_loss(self, y_hat, y, lengths=None) -> torch.Tensor:
        if lengths is not None:
            raise ValueError("lengths must be None for Hierarchy")
        check_tensor("y", y, ndim=2)
        check_shape("y", y, (y.shape[0], self.num_labels))
        y = self._check_labelling("y", y, y.shape[0], y.device)
        y_hat = self._check_labelling("y_hat", y_hat, y.shape[0], y.device)
        return self._task_loss(y_hat, y, None)

    def _task_loss(self, y_hat, y, lengths) -> torch.Tensor:
        return (self._node_costs(torch.float64, y.device) * (y_hat != y)).sum(1)

    def marginals(self, y, lengths=None, *, dtype=torch.float32) -> torch.Tensor:
        """The node indicators ``(B, N)``: the gradient of `score` in the node potentials."""
        check_float_dtype(dtype)
        if lengths is not None:
            raise ValueError("lengths must be None for Hierarchy")
        check_tensor("y", y, ndim=2)
        return self._check_labelling("y", y, y.shape[0], y.device).to(dtype)

    def tensors(self, potentials):
        return (potentials,)

    def from_tensors(self, tensors: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
        return tensors[0]

    def marginal_vjp(self, y, weight, potentials, lengths, needs, dtype=None):
        if not needs[0]:
            return (None,)
        return (weight.to(dtype or potentials.dtype).unsqueeze(1) * y.to(dtype or potentials.dtype),)

    def __repr__(self) -> str:
        return f"Hierarchy({self.num_labels} nodes, {len(self.leaves)} leaves, normalize={self.normalize})"
