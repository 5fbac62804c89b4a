"""The oracles the slack-rescaling searches query (Choi et al., 2016, eqs. 7-8).

Per example i, a labelling y is the point ``(h(y), g(y))`` with ``h = 1 + s(y) - s(y_i)`` (margin
violation) and ``g = Delta(y_i, y)`` (error); the slack-rescaled oracle wants ``argmax_y h(y) g(y)``.

- the lambda-oracle ``O(lam) = argmax_y h(y) + lam g(y)``: margin-rescaled decoding with the loss scaled
  by ``lam`` (any structure, `StructureOracle`);
- the constrained lambda-oracle ``O_c(lam, alpha, beta)``: the same argmax over the labellings whose
  slope ``g / h`` lies in the wedge between ``beta`` and ``alpha`` (``h, g > 0``), each bound open or
  closed; exact by masking when the labellings can be enumerated (`TableOracle`).

Both are batched: ``lam``, ``alpha``, ``beta`` are ``(B,)`` tensors, one per example, and a boolean
``active (B,)`` says which examples take part in the call (only those are counted as oracle calls).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .._validation import check_finite, check_labels, check_tensor, shape_or_type


class OracleAnswer(NamedTuple):
    """``labels``: per example (``(B,)`` indices into the table, or the structure's labelling tensor);
    ``h``, ``g``: ``(B,)`` float64; ``found``: ``(B,)`` bool (False where a constrained wedge is empty)."""

    labels: torch.Tensor
    h: torch.Tensor
    g: torch.Tensor
    found: torch.Tensor


class TableOracle:
    """Exact oracles over enumerated labellings: ``h, g (B, N)`` (float64), labelling j of example b has
    the point ``(h[b, j], g[b, j])``. Ties go to the smallest j. Use `from_structure` for structures whose
    labellings can be enumerated (capability ``has_table_oracle``: `Multiclass`, `MultiLabel`)."""

    def __init__(self, h: torch.Tensor, g: torch.Tensor, labels: Optional[torch.Tensor] = None,
                 truth: Optional[torch.Tensor] = None):
        check_tensor("h", h)
        check_tensor("g", g)
        if h.shape != g.shape or h.dim() != 2:
            raise ValueError(f"h and g must be (B, N) tensors of one shape, got {tuple(h.shape)} and "
                             f"{tuple(g.shape)}")
        self.h, self.g = h.detach().to(torch.float64), g.detach().to(h.device, torch.float64)
        check_finite({"h": self.h, "g": self.g})
        if bool((self.g < 0).any()):
            raise ValueError("g (the task loss) must be >= 0")
        B, N = h.shape
        if labels is not None and (not isinstance(labels, torch.Tensor) or labels.dim() == 0 or labels.shape[0] != N):
            got = shape_or_type(labels)
            raise ValueError(f"labels must be a tensor with one row per column of h ({N}), got {got}")
        self.table_labels = labels  # (N, ...) the labelling of each column, or None (indices)
        # the true labelling's column (Phi = 0): given, else the first column with g = 0
        if truth is None:
            has_zero = (self.g == 0).any(1)
            if not bool(has_zero.all()):
                raise ValueError(f"g has no column with g = 0 (the truth) in rows "
                                 f"{(~has_zero).nonzero().squeeze(1)[:4].tolist()}: pass truth")
            truth = (self.g == 0).to(torch.int8).argmax(1)
        else:
            truth = check_labels("truth", truth, (B,), N, h.device)
        self.truth = truth
        self.calls = torch.zeros(h.shape[0], dtype=torch.long, device=h.device)

    @classmethod
    def from_structure(cls, structure, potentials, target) -> TableOracle:
        """The table of every labelling of a structure with ``has_table_oracle`` (`Multiclass`, `MultiLabel`;
        a TypeError names any other): `Structure.labelling_table`."""
        structure.require("has_table_oracle", "TableOracle.from_structure needs it", error=TypeError)
        pot, _, target = structure.validate(potentials, None, target)
        configs, s, g, column = structure.unchecked.labelling_table(pot, target)
        gold = s.gather(1, column.unsqueeze(1))
        return cls(1.0 + s - gold, g, configs, truth=column)

    @property
    def batch_size(self) -> int:
        return self.h.shape[0]

    def max_h(self) -> torch.Tensor:
        """``max_y h(y)`` (free from the table: not counted as a call)."""
        return self.h.max(1).values

    def max_g(self) -> torch.Tensor:
        return self.g.max(1).values

    def labelling(self, j: torch.Tensor) -> torch.Tensor:
        """The labellings of the column indices ``j (B,)``."""
        return j if self.table_labels is None else self.table_labels[j]

    def __call__(self, lam: torch.Tensor, active: Optional[torch.Tensor] = None) -> OracleAnswer:
        """The lambda-oracle ``argmax_j h + lam g`` per example."""
        self._count(active)
        j = (self.h + lam.to(torch.float64).unsqueeze(1) * self.g).argmax(1)
        return self._answer(j, torch.ones_like(j, dtype=torch.bool))

    @property
    def size(self) -> int:
        """N, the labellings per example."""
        return self.h.shape[1]

    def constrained(self, lam, alpha, beta, *, alpha_closed=None, beta_closed=None,
                    active: Optional[torch.Tensor] = None) -> OracleAnswer:
        """``argmax h + lam g`` over ``h > 0, g > 0`` and slopes ``g / h`` between the rays ``beta`` and
        ``alpha``, each a ``(B, 2)`` point ``(h_r, g_r)`` on the ray (slope ``g_r / h_r``; ``(0, 1)`` is the
        vertical ray, slope infinity), each inequality non-strict where ``*_closed`` (``(B,)`` bool;
        default: alpha closed, beta open, as in Choi et al., 2016, App. F). Slopes are compared by cross-multiplication,
        ``g h_r <= g_r h``: a labelling is never inside an open ray drawn through its own point, which is
        how angular search keeps a found labelling from coming back."""
        self._count(active)
        B = self.batch_size
        ones = torch.ones(B, dtype=torch.bool, device=self.h.device)
        ac = (ones if alpha_closed is None else alpha_closed).unsqueeze(1)
        bc = (~ones if beta_closed is None else beta_closed).unsqueeze(1)
        h, g = self.h, self.g
        alpha, beta = alpha.to(torch.float64), beta.to(torch.float64)
        lhs_a, rhs_a = g * alpha[:, :1], alpha[:, 1:] * h
        lhs_b, rhs_b = g * beta[:, :1], beta[:, 1:] * h
        below = torch.where(ac, lhs_a <= rhs_a, lhs_a < rhs_a)
        above = torch.where(bc, lhs_b >= rhs_b, lhs_b > rhs_b)
        mask = (h > 0) & (g > 0) & below & above
        score = (h + lam.to(torch.float64).unsqueeze(1) * g).masked_fill(~mask, -torch.inf)
        j = score.argmax(1)
        return self._answer(j, mask.any(1))

    def at(self, columns: torch.Tensor) -> OracleAnswer:
        """The best of the labellings ``columns (B, C)`` (column indices, -1: none) by ``Phi = h g`` per example,
        without an oracle call (angular search's label cache); ``found`` False where none has ``Phi > 0``."""
        if columns.dim() != 2 or columns.shape[0] != self.batch_size or columns.is_floating_point():
            raise ValueError(f"columns must be a ({self.batch_size}, C) integer tensor of column indices")
        if bool((columns >= self.size).any()) or bool((columns < -1).any()):
            raise ValueError(f"columns must be in [-1, {self.size})")
        c = columns.clamp_min(0)
        h, g = self.h.gather(1, c), self.g.gather(1, c)
        phi = torch.where((columns >= 0) & (h > 0) & (g > 0), h * g, torch.zeros_like(h))
        k = phi.argmax(1)
        rows = torch.arange(self.batch_size, device=c.device)
        return OracleAnswer(c[rows, k], h[rows, k], g[rows, k], phi[rows, k] > 0)

    def _answer(self, j, found) -> OracleAnswer:
        rows = torch.arange(self.batch_size, device=j.device)
        return OracleAnswer(j, self.h[rows, j], self.g[rows, j], found)

    def _count(self, active) -> None:
        self.calls += 1 if active is None else active.long()


class StructureOracle:
    """The lambda-oracle of any structure: ``argmax_y s(y) + lam Delta(y_i, y)`` by the structure's exact
    loss-augmented decoding (`Structure.max_oracle` with a per-example ``loss_weight``), returning the
    labelling and its ``(h, g)``. It has no constrained form (use `TableOracle` where it is needed).

    ``max_g`` is the structure's largest loss (Hamming: every position wrong) when known, and ``max_h``
    costs one plain MAP decode (counted as a call)."""

    def __init__(self, structure, potentials, target, lengths=None, *, backend: str = "auto"):
        self.structure, self.backend = structure, backend
        self.pot, self.lengths, self.target = structure.validate(potentials, lengths, target)
        dt = torch.float64
        self._pot64 = structure.from_tensors([None if t is None else t.detach().to(dt)
                                              for t in structure.tensors(self.pot)])
        self.gold = structure.unchecked.score(self._pot64, self.target, self.lengths)
        self.truth = self.target
        self.calls = torch.zeros(self.target.shape[0], dtype=torch.long, device=self.gold.device)

    @property
    def batch_size(self) -> int:
        return self.target.shape[0]

    def labelling(self, y):
        return y

    def _point(self, y):
        fast = self.structure.unchecked
        h = 1.0 + fast.score(self._pot64, y, self.lengths) - self.gold
        g = fast.task_loss(y, self.target, self.lengths)
        return h, g

    def __call__(self, lam: torch.Tensor, active: Optional[torch.Tensor] = None) -> OracleAnswer:
        self.calls += 1 if active is None else active.long()
        y, _ = self.structure.unchecked.max_oracle(self._pot64, self.target, self.lengths,
                                                   loss_weight=lam.to(torch.float64), backend=self.backend)
        h, g = self._point(y)
        return OracleAnswer(y, h, g, torch.ones_like(h, dtype=torch.bool))

    def max_h(self) -> torch.Tensor:
        self.calls += 1
        y = self.structure.unchecked.decode(self._pot64, self.lengths, backend=self.backend)
        return self._point(y)[0]

    def max_g(self) -> torch.Tensor:
        """``max_y Delta(y_i, y)`` (capability ``has_max_task_loss``; a NotImplementedError names a structure
        without it)."""
        self.structure.require("has_max_task_loss", "max_g needs it")
        return self.structure.unchecked.max_task_loss(self.target, self.lengths)

    def constrained(self, *args, **kwargs):
        raise NotImplementedError(f"no exact constrained lambda-oracle for {type(self.structure).__name__}: "
                                  "use TableOracle for enumerable structures")
