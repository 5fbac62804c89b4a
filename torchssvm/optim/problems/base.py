"""The convex SSVM seen by the dual solvers: blocks in marginal space.

A `DualProblem` is the n-slack margin-rescaled SSVM (Osokin et al., 2016, eq. 1)

    P(w) = lam/2 ||w||^2 + (1/n) sum_i max_y H_i(y; w),   H_i(y; w) = L_i(y) - <w, psi_i(y)>,

with ``psi_i(y) = phi(x_i, y_i) - phi(x_i, y)``, exposed in the coordinates the solvers store (docs/design.md,
"Dual blocks in marginal space"). Block i is a flat vector ``z_i`` of size ``m``, the difference of
one-hot factor marginals ``m(y_i) - mu_i`` with ``mu_i`` a convex combination of labellings' marginals;
the block's primal part is ``w_i = Phi_i z_i / (lam n)`` where ``Phi_i`` is the (linear) joint feature map
of example i. Solvers never build ``Phi_i``: they use the operations below, batched over an index tensor
``idx (B,)``, made by ``block_index`` from a host index.

- ``potentials(w, idx)``: the model's potentials of the examples at parameters ``w`` (float64),
  ``theta_i = Phi_i^T w`` in marginal coordinates, so that ``<w, Phi_i z> = inner(theta, z)``.
- ``oracle(theta, idx)``: loss-augmented decoding ``argmax_y H_i(y; w)``: labels, their losses ``L_i``
  and ``max_y H_i(y; w)``.
- ``decode(theta, idx)``: plain MAP labels (the regularization path's initialization).
- ``labels_score(theta, idx, labels)``: ``<theta_i, m(y)>`` of ``(B, C, width)`` candidate labellings.
- ``task_loss(idx, labels)``: ``L_i(y)`` of ``(B, C, width)`` labellings.
- ``corner(idx, labels)``: ``m(y_i) - m(y)``, the block vector of the labelling (a simplex corner);
  ``corner_difference(idx, labels, other)`` the difference of two corners (a pairwise step's direction) and
  ``fw_direction(idx, labels, z)`` = ``corner(idx, labels) - z`` (a FW step's).
- ``inner(theta, z)``, ``gram(idx_a, z_a, idx_b, z_b)`` = ``<Phi_a z_a, Phi_b z_b>`` and ``sqnorm``.
- ``accumulate(w, idx, z, coef)``: ``w += sum_b coef_b Phi_b z_b`` in place.
- ``max_loss(idx)``: ``max_y L_i(y)`` without an oracle call.
- ``block_losses(idx, z)`` and ``block_violation(idx, z)`` (optional): what blocks ``z`` imply without an oracle,
  for checking a loaded state (`DualSolver._check_consistency`): ``sum_y alpha_i(y) L_i(y)`` where the task loss is
  linear in the block coordinates, and how far ``z_i`` lies outside ``m(y_i) - M`` (M: the marginal polytope);
  ``block_violation_exact`` says whether a block it finds inside is a dual block (else `DualSolver` seals ``z``).
- ``fingerprint_data()``: the data tensors a solver's state is bound to (`torchssvm.optim.fingerprint`).
- ``slack_oracle(theta, idx)`` (optional): the exact slack-rescaled oracle ``argmax_y L_i(y) (1 + <theta_i,
  m(y) - m(y_i)>)``, its loss and ``max(0, value)``; problems that have it can be trained slack-rescaled
  (`SlackRescaledProblem`).

Labellings are long tensors of a fixed ``label_width`` padded with -1 (a chain: the padded length).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._device import host_to_device


class DualProblem:
    """Base class; see the module docstring for the contract. Subclasses set ``n``, ``d``, ``m``,
    ``label_width``, ``truth`` ``(n, label_width)`` and ``dtype`` (float64)."""

    n: int
    d: int
    m: int
    label_width: int
    truth: torch.Tensor
    dtype = torch.float64
    device = torch.device("cpu")
    # labels are in [0, label_bound) (None: not bounded by one number); -1 is padding
    label_bound: Optional[int] = None

    # -- parameters -----------------------------------------------------------------------------
    def initial_w(self) -> torch.Tensor:
        """The starting ``w`` (zeros: all dual mass on the ground truth)."""
        return torch.zeros(self.d, dtype=self.dtype, device=self.device)

    def write_model(self, w: torch.Tensor) -> None:
        """Copy ``w`` into the user's model (no-op for problems without one)."""

    def parameter_slices(self) -> dict:
        """``{name: (start, stop, shape)}`` of named parameter groups in ``w`` (for box constraints)."""
        return {"w": (0, self.d, (self.d,))}

    def block_index(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx (B,)`` long on the host, on the problem's device: the index the solvers then pass to the
        operations below. Queued behind the device's work (`host_to_device`); problems whose shapes depend on
        the blocks (a chain's longest sentence) read them here from the host copy rather than from the device."""
        return host_to_device(idx, self.device)

    def static_block_index(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx (B,)`` long, already on the problem's device (drawn there), as the index the operations below
        take, without the host reading it: problems whose shapes depend on the blocks take the data set's largest
        (a chain pads every batch to its longest sentence), so that the shapes are static."""
        return idx

    # -- oracles and products (implemented by subclasses) ---------------------------------------
    def potentials(self, w: torch.Tensor, idx: torch.Tensor):
        raise NotImplementedError

    def oracle(self, theta, idx: torch.Tensor):
        raise NotImplementedError

    def decode(self, theta, idx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def labels_score(self, theta, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def task_loss(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def corner(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def corner_difference(self, idx: torch.Tensor, labels: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``corner(idx, labels) - corner(idx, other)`` ``(B, m)``; problems whose marginals are exact counts
        override it with the one product ``m(other) - m(labels)``."""
        return self.corner(idx, labels) - self.corner(idx, other)

    def fw_direction(self, idx: torch.Tensor, labels: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``corner(idx, labels) - z`` ``(B, m)``, the FW direction from the blocks' ``z (B, m)``; problems may
        build it in one pass (the same floats)."""
        return self.corner(idx, labels) - z

    def inner(self, theta, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def gram(self, idx_a: torch.Tensor, z_a: torch.Tensor, idx_b: Optional[torch.Tensor] = None,
             z_b: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError

    def sqnorm(self, idx: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.diagonal(self.gram(idx, z))

    def accumulate(self, w: torch.Tensor, idx: torch.Tensor, z: torch.Tensor, coef: torch.Tensor) -> None:
        raise NotImplementedError

    def max_loss(self, idx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def slack_oracle(self, theta, idx: torch.Tensor):
        raise NotImplementedError(f"{type(self).__name__} has no exact slack-rescaled oracle")

    # -- what blocks imply (checks of a loaded state) --------------------------------------------
    def block_losses(self, idx: torch.Tensor, z: torch.Tensor) -> Optional[torch.Tensor]:
        """``sum_y alpha_i(y) L_i(y)`` ``(B,)`` (= ``n l_i``) implied by blocks ``z (B, m)`` when the task loss is
        linear in the marginals, ``L_i(y) = L_i(y_i) + <c_i, m(y_i) - m(y)>``: then it is ``<c_i, z_i>``
        whatever the weights ``alpha_i``. None (the default) where the loss is not linear in the coordinates."""
        return None

    def block_violation(self, idx: torch.Tensor, z: torch.Tensor) -> Optional[torch.Tensor]:
        """``(B,)``: the largest violation of the linear constraints that every block ``z_i = m(y_i) - mu_i``
        satisfies (``mu_i`` in the marginal polytope: entries in [0, 1], rows summing to 1, zeros on padding); 0
        for a block that could be a dual block. None (the default) where a problem has no such description."""
        return None

    # whether ``block_violation(idx, z) == 0`` makes ``z`` a dual block (the constraints describe ``m(y_i) - M``
    # exactly), not only a block that meets necessary constraints; a loaded state's ``z`` is sealed where not
    block_violation_exact: bool = False

    def fingerprint_data(self) -> dict:
        """``{name: tensor or setting}``: the training data (features, labels, losses) a state of this problem is
        bound to: the public tensor attributes but the model's weights (``weight``), which the solvers write, and
        the settings of its ``structure`` where it has one (`fingerprint.settings`: edges, loss, class weights)."""
        from ..fingerprint import settings, tensor_attributes

        data = tensor_attributes(self, exclude=("weight",))
        structure = getattr(self, "structure", None)
        if structure is not None:
            data.update({f"structure.{k}": v for k, v in settings(structure).items()})
        return data

    # -- derived --------------------------------------------------------------------------------
    @torch.no_grad()
    def primal(self, w: torch.Tensor, lam: float, chunk: int = 1024) -> float:
        """The exact primal ``lam/2 ||w||^2 + (1/n) sum_i max_y H_i(y; w)`` by one oracle pass."""
        hinge = 0.0
        for idx in self.chunks(chunk):
            _, _, H = self.oracle(self.potentials(w, idx), idx)
            hinge += float(H.clamp_min(0).sum())  # H_i(y_i) = 0: never below 0
        return 0.5 * lam * float(w @ w) + hinge / self.n

    def chunks(self, size: int = 1024):
        """Index tensors covering ``0..n-1`` in order (for full oracle passes)."""
        for s in range(0, self.n, size):
            yield self.block_index(torch.arange(s, min(s + size, self.n)))
