"""The slack-rescaled SSVM of any `DualProblem` with an exact slack oracle, as a margin-rescaled one.

Choi et al. (2016, eq. 4): ``max_y L(y) (1 - <w, psi(y)>) = max_y L(y) - <w, L(y) psi(y)>`` is
margin rescaling with the scaled joint features ``psi~(y) = L(y) psi(y)``. In the marginal coordinates
of the solvers the block vector of a labelling becomes ``L(y) (m(y_i) - m(y))``, so a BCFW corner is
``w_s = L(y) psi(y) / (lam n)`` with ``l_s = L(y) / n``, and the dual, the blocks' convex structure and
the duality gap are those of the slack objective

    P(w) = lam/2 ||w||^2 + (1/n) sum_i max_y L_i(y) (1 + <w, phi(x_i, y) - phi(x_i, y_i)>).

Products (``inner``, ``gram``, ``accumulate``) are linear in the block vectors and pass through
unchanged; only the oracle (the exact slack oracle of the base problem), the corners and the
scores of labellings change. Every solver over `DualProblem` (BCFW with all its variants, Frank-Wolfe,
SSG) then trains the slack-rescaled SSVM with a certified gap.
"""

from __future__ import annotations

from .base import DualProblem
from .chain import ChainProblem


class SlackRescaledProblem(DualProblem):
    """Args:
        base: a `DualProblem` implementing ``slack_oracle`` (`ChainProblem` without class weights,
            `FeatureTableProblem`).

    Other attributes (``model``, ``structure``, ``lengths`` ...) are read from ``base``.
    """

    def __init__(self, base: DualProblem):
        if not isinstance(base, DualProblem):
            raise TypeError(f"base must be a DualProblem, got {type(base).__name__}")
        if isinstance(base, SlackRescaledProblem):
            raise ValueError("base is already slack-rescaled")
        if type(base).slack_oracle is DualProblem.slack_oracle:
            raise ValueError(f"{type(base).__name__} has no exact slack oracle: slack rescaling is not available")
        if isinstance(base, ChainProblem) and base.structure.class_weights is not None:
            raise ValueError("slack rescaling of a chain needs the same cost for every wrong position: the "
                             "structure's class_weights must be None")
        self.base = base
        self.n, self.d, self.m = base.n, base.d, base.m
        self.label_width, self.truth = base.label_width, base.truth
        self.dtype, self.device = base.dtype, base.device
        self.label_bound = base.label_bound

    def __getattr__(self, name):  # only called for attributes not found on the wrapper
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"SlackRescaledProblem({type(self.base).__name__}, n={self.n}, d={self.d})"

    # -- parameters: the base's ------------------------------------------------------------------
    def initial_w(self):
        return self.base.initial_w()

    def write_model(self, w):
        self.base.write_model(w)

    def fingerprint_data(self):
        # the rescaling too: a state of the margin-rescaled objective on the same data bounds nothing here
        return {**self.base.fingerprint_data(), "rescaling": "slack"}

    def parameter_slices(self):
        return self.base.parameter_slices()

    def chunks(self, size: int = 1024):
        return self.base.chunks(size)

    # -- what slack rescaling changes ------------------------------------------------------------
    def block_index(self, idx):
        return self.base.block_index(idx)

    @property
    def graph_safe(self) -> bool:
        return getattr(self.base, "graph_safe", False)

    def static_block_index(self, idx):
        return self.base.static_block_index(idx)

    def potentials(self, w, idx):
        return self.base.potentials(w, idx)

    def oracle(self, theta, idx):
        """``argmax_y L(y) (1 + s(y) - s(y_i))``, its loss and value (the hinge term of the slack
        objective, ``>= 0``): the exact slack oracle of the base problem."""
        return self.base.slack_oracle(theta, idx)

    def slack_oracle(self, theta, idx):
        return self.base.slack_oracle(theta, idx)

    def decode(self, theta, idx):
        raise NotImplementedError("the regularization path is not available with slack rescaling: its "
                                  "initialization needs argmax_y L(y) (s(y) - s(y_i)), which no oracle provides yet")

    def labels_score(self, theta, idx, labels):
        """``<w, phi~(y)> = s(y_i) + L(y) (s(y) - s(y_i))`` (scaled features; the truth keeps ``s(y_i)``)."""
        s = self.base.labels_score(theta, idx, labels)
        gold = self.base.labels_score(theta, idx, self.truth[idx].unsqueeze(1))
        return gold + self.base.task_loss(idx, labels) * (s - gold)

    def task_loss(self, idx, labels):
        return self.base.task_loss(idx, labels)

    def corner(self, idx, labels):
        """``L(y) (m(y_i) - m(y))``."""
        loss = self.base.task_loss(idx, labels.unsqueeze(1)).squeeze(1)
        return self.base.corner(idx, labels) * loss.to(self.dtype).unsqueeze(1)

    def max_loss(self, idx):
        return self.base.max_loss(idx)  # the hinge at w = 0: max_y L(y) (1 + 0)

    # -- linear in the block vectors: unchanged --------------------------------------------------
    def inner(self, theta, z):
        return self.base.inner(theta, z)

    def gram(self, idx_a, z_a, idx_b=None, z_b=None):
        return self.base.gram(idx_a, z_a, idx_b, z_b)

    def sqnorm(self, idx, z):
        return self.base.sqnorm(idx, z)

    def accumulate(self, w, idx, z, coef):
        self.base.accumulate(w, idx, z, coef)
