"""Kernel SSVM by 1-slack cutting planes with exact or sampled cuts (Yu & Joachims, 2008).

The primal is OP1 of Yu & Joachims (2008) with margin rescaling and the 0/1 task loss, C on the *average* slack:

    min_w  1/2 ||w||^2 + C (1/N) sum_i max_y [Delta(y_i, y) - <w, Psi(x_i, y_i) - Psi(x_i, y)>],

with the joint kernel ``K((x, y), (x', y')) = k(x, x') <F_y, F_y'>``: multiclass ``F = I_K``
(``Psi = phi(x) (x) e_y``), binary ``F_{+-1} = +-1/2`` (``Psi = y phi(x) / 2``, SVM-struct's convention: the
hinge is ``max(0, 1 - y f(x))`` with ``f = <w, phi>``, the SVM without bias at ``C_svm = C / N``; the library's
``lam`` is ``1 / C``).

A cut is a kernel expansion (Yu & Joachims, 2008): basis examples ``l`` with label-difference rows
``E_l = F_{y_l} - F_{y^_l}`` and one coefficient ``a``, ``g = a sum_l phi(x_l) (x) E_l``, and an offset ``c``;
``w = sum_k alpha_k g_k`` solves the working-set QP (OP2) ``max sum alpha c - 1/2 alpha^T G alpha`` over
``alpha >= 0, sum alpha <= C`` (`simplex_qp`, warm-started). Ways to make the cut:

- ``sampling="exact"`` (Alg. 1): all N examples, basis = the violators I, ``a = 1/N``. Stops when the exact
  cut is violated by at most ``eps``; the QP value is then a certified lower bound (``gap``).
- ``"linear"`` (Alg. 3): all N examples are scored (exact offset ``c = (1/N) sum Delta``, exact exit test),
  the basis is ``r`` draws with replacement from I, ``a = |I| / (N r)``; re-drawn until the sampled cut is
  violated by more than ``eps`` (at most ``max_resample`` times).
- ``"constant"`` (Alg. 2): ``r`` uniform draws from all N, offset and ``g`` both sampled, ``a = 1/r``; stops
  after ``patience`` (p = 4) consecutive non-violated samples. Cost independent of N.
- ``"hybrid"`` (ours, an instance of Alg. 4's template): constant-time cuts until Alg. 2's stop, then the cache
  is built for the cuts so far (``N U`` evaluations, U their distinct basis points) and linear-time cuts with
  ``r_linear`` draws continue from that ``w`` to Alg. 3's exact exit test. Constant-time's stop is decided by
  a sampled violation whose noise (``sqrt(err / r)``, about 5e-3 on Checkers at r = 1500) is far above
  ``eps``, so it stops early; the linear-time phase finishes the job in few iterations, each ``N r_linear``
  evaluations, instead of the hundreds a cold linear-time run needs.

Exact and linear keep the paper's cache (section 4.2.1): ``A[k] (N, S)`` = ``g_k . Psi(x_i, .)`` in label
feature space, so scoring all examples and the new Gram row cost no kernel evaluation; a new cut costs
``N m`` evaluations (``m`` its basis size). Constant-time scores its ``r`` draws against every cut's basis
(``O(t r^2)``). Cuts with zero weight for ``inactive_after`` iterations are dropped (Yu & Joachims, 2008: 20).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Optional

import torch

from ..._validation import check_positive_int, check_seed, check_square_sums
from .._state import (
    AGE_CAUSE,
    check_close,
    check_range,
    checked_generator_state,
    checked_scalars,
    checked_tensor,
    require_keys,
)
from ..cutting_planes.simplex_qp import simplex_qp
from ..solver import Solver
from .mercer import MercerKernel

SAMPLINGS = ("exact", "linear", "constant", "hybrid")
# Kernel blocks are consumed block by block (kernel, then a product with the expansion's rows) so that a block
# is still in cache when it is read again: 2^21 float64 entries (16 MiB), where the constant-time step's whole
# (r, U) block (r draws against all basis points) would not stay in cache.
BLOCK_ENTRIES = 1 << 21


class CutCache:
    """The rows ``A[k] (N, S')`` of the cuts (Yu & Joachims, 2008) in a growable buffer of slots.

    At N = 850,000 one row is 6.8 MB and a working set holds a hundred or more; adding a cut writes one row,
    dropping cuts frees their slots without moving any row, and ``sum_k alpha_k A[k]`` is one matrix-vector
    product over the buffer (free slots weigh 0). Concatenating and re-indexing a ``(T, N, S')`` tensor
    each iteration instead spent two thirds of a linear-time iteration copying it."""

    def __init__(self, N: int, width: int, device):
        self.N, self.width = N, width
        self.buf = torch.zeros(0, N, width, dtype=torch.float64, device=device)
        self.slot = torch.zeros(0, dtype=torch.long, device=device)
        self.free: list = []

    def rows(self) -> torch.Tensor:
        """``(T, N, S')`` in cut order (a copy)."""
        return self.buf[self.slot]

    def set(self, rows: torch.Tensor, layout: Optional[tuple] = None) -> None:
        """The cuts' rows ``(T, N, S')`` in cut order, compacted, or placed as ``layout = (capacity, slot (T,),
        free)`` of `layout` says: `scores` then sums the same slots in the same order, so a resumed run is bitwise
        the one saved."""
        if layout is None:
            self.buf = rows.to(torch.float64, memory_format=torch.contiguous_format, copy=True)
            self.slot = torch.arange(rows.shape[0], device=rows.device)
            self.free = []
            return
        capacity, slot, free = layout
        self.buf = torch.zeros(capacity, self.N, self.width, dtype=torch.float64, device=rows.device)
        self.buf[slot] = rows.to(torch.float64)
        self.slot, self.free = slot.clone(), list(free)

    def layout(self) -> tuple:
        """``(capacity, slot (T,), free)``: where `set` puts the rows back."""
        return self.buf.shape[0], self.slot.clone(), list(self.free)

    def add(self, row: torch.Tensor) -> None:
        if not self.free:
            cap = self.buf.shape[0]
            grown = torch.zeros(max(8, 2 * cap), self.N, self.width, dtype=torch.float64, device=self.buf.device)
            grown[:cap] = self.buf
            self.buf, self.free = grown, list(range(grown.shape[0] - 1, cap - 1, -1))
        k = self.free.pop()
        self.buf[k] = row
        self.slot = torch.cat([self.slot, self.slot.new_tensor([k])])

    def keep(self, mask: torch.Tensor) -> None:
        self.free += self.slot[~mask].tolist()
        self.slot = self.slot[mask]

    def scores(self, alpha: torch.Tensor) -> torch.Tensor:
        """``sum_k alpha_k A[k]``, ``(N, S')``."""
        weight = torch.zeros(self.buf.shape[0], dtype=torch.float64, device=self.buf.device)
        weight[self.slot] = alpha
        return (weight @ self.buf.view(self.buf.shape[0], -1)).view(self.N, self.width)

    def at(self, idx: torch.Tensor) -> torch.Tensor:
        """``A[k][idx]`` for every cut, ``(T, m, S')``."""
        return self.buf[:, idx, :][self.slot]


class KernelCuttingPlane(Solver):
    """``solver = KernelCuttingPlane(x, y, lam=..., kernel="rbf", gamma=..., sampling="linear", r=400)``;
    ``solver.step()`` makes one cut and re-solves the QP; `fit` runs to the paper's stopping rule.

    Args:
        x: ``(N, D)`` float features on any device (kernel blocks are computed there, in float64 like the
            QP, the scores and the cache).
        y: ``(N,)``: ``-1/+1`` (binary, also when only one of them occurs) or ``0..K-1`` (multiclass, ``num_classes``
            or ``max + 1`` classes).
        lam: the regularization ``lam > 0`` of ``lam/2 ||w||^2 + (1/N) sum_i H_i`` (every solver's). The algorithm
            runs on OP1, the same objective times ``1 / lam``, with ``C = 1 / lam``: the same iterates ``w``; the
            reports' ``primal`` / ``dual`` / ``gap`` are OP1's (``lam`` times them are the ``lam`` form's).
            Default (neither ``lam`` nor ``C``): ``C = 1``.
        C: deprecated (a DeprecationWarning; positional or keyword): the average-slack C of OP1 (> 0);
            `KernelCuttingPlane.from_C` is the C form.
        kernel, gamma: `MercerKernel` (``"rbf"`` with ``exp(-gamma ||x - x'||^2)``, or ``"linear"``).
        sampling: ``"exact"``, ``"linear"``, ``"constant"`` or ``"hybrid"``.
        r: draws per sampled cut (constant-time draws in ``"hybrid"``).
        r_linear: the linear-time phase's draws per cut in ``"hybrid"`` (default: r).
        eps: violation tolerance (Yu & Joachims, 2008: 0.001).
        inactive_after: QP iterations with zero weight before a cut is dropped (0: never).
        patience: consecutive non-violated samples that stop constant-time (Yu & Joachims, 2008: 4).
        max_resample: draws per linear-time iteration before the most violated draw is taken anyway.
        qp_tol: QP Frank-Wolfe gap, relative to ``eps C``.
        seed: sampling seed. chunk: most rows per kernel block (blocks also stop at ``BLOCK_ENTRIES`` entries,
            so each stays in cache between the kernel and the product that consumes it).
        writer: TensorBoard ``SummaryWriter`` or None.

    Reports (`step`): ``violation`` (exact for exact / linear, sampled for constant), ``xi``, ``added``,
    ``cuts``, ``dual`` (the working-set QP's value: a lower bound of OP1 only with exact cuts), ``primal``
    (exact / linear: OP1 at the iterate, from the pass), ``gap_estimate = primal - dual`` (whenever the primal is
    computed) and ``gap``, the same number where it is a certificate only: ``sampling="exact"`` (``gap_exact``);
    with sampled cuts the QP over them is not a lower bound (the sampled offsets and cuts over- or under-estimate
    the risk; a linear-time run was seen reporting ``primal - dual = -6.3e-4``), so ``gap`` is None there and no
    stop reads it. ``train_error``, ``kernel_evaluations``, ``time``, ``converged`` (never on a NaN violation).
    """

    tag = "kernel_cp"

    @classmethod
    def from_C(cls, x: torch.Tensor, y: torch.Tensor, C: float = 1.0, **kwargs):
        """The solver of OP1 of Yu & Joachims (2008) with average-slack ``C`` (``lam = 1 / C``); the other arguments
        are those of `KernelCuttingPlane`."""
        solver = cls.__new__(cls)
        solver._C_form = True
        solver.__init__(x, y, C, **kwargs)
        return solver

    def __init__(self, x: torch.Tensor, y: torch.Tensor, C: Optional[float] = None, *, lam: Optional[float] = None,
                 kernel: str = "rbf",
                 gamma: Optional[float] = None, num_classes: Optional[int] = None, sampling: str = "linear",
                 r: int = 400, r_linear: Optional[int] = None, eps: float = 1e-3, inactive_after: int = 20,
                 patience: int = 4, max_resample: int = 100, qp_tol: float = 1e-3, seed: int = 0, chunk: int = 4096,
                 writer=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] == 0 or not x.is_floating_point():
            raise ValueError("x must be a non-empty (N, D) float tensor")
        if not torch.isfinite(x).all():
            raise ValueError("x holds NaN or Inf")
        check_square_sums("x", x, dtype=x.dtype)  # else inf kernel products: NaN kernel values and reports
        N = x.shape[0]
        if not isinstance(y, torch.Tensor) or y.shape != (N,) or y.is_floating_point():
            raise ValueError(f"y must be a ({N},) integer tensor")
        if y.device != x.device:
            raise ValueError(f"y is on {y.device} but x is on {x.device}")
        if num_classes is not None:
            check_positive_int("num_classes", num_classes, minimum=2)
        seed = check_seed(seed)
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        if lam is not None and C is not None:
            raise ValueError("pass lam or C, not both (lam = 1 / C)")
        if C is not None and not getattr(self, "_C_form", False):
            warnings.warn("KernelCuttingPlane(x, y, C) is deprecated: pass lam = 1 / C, or use "
                          "KernelCuttingPlane.from_C(x, y, C, ...)", DeprecationWarning, stacklevel=2)
        if lam is not None:
            if not (isinstance(lam, (int, float)) and not isinstance(lam, bool) and lam > 0 and math.isfinite(lam)):
                raise ValueError(f"lam must be a finite number > 0, got {lam!r}")
            C = 1.0 / lam
        C = 1.0 if C is None else C
        for name, value in (("C", C), ("eps", eps), ("qp_tol", qp_tol)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
                    and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        r_linear = r if r_linear is None else r_linear
        for name, value, low in (("r", r, 1), ("r_linear", r_linear, 1), ("inactive_after", inactive_after, 0),
                                 ("patience", patience, 1), ("max_resample", max_resample, 1), ("chunk", chunk, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        values = set(y.unique().tolist())
        # -1/+1 labels are binary, also when one class is missing from y (a subset); 0..K-1 are multiclass
        self.binary = num_classes is None and values <= {-1, 1}
        kw = {"dtype": torch.float64, "device": x.device}
        if self.binary:
            self.F = torch.tensor([[-0.5], [0.5]], **kw)  # state 0: y = -1, state 1: y = +1
            self.truth = (y > 0).long()
        else:
            K = int(num_classes) if num_classes is not None else int(y.max()) + 1
            if int(y.min()) < 0 or int(y.max()) >= K or K < 2:
                raise ValueError(f"multiclass y must hold labels in [0, {K}) with at least 2 classes")
            self.F = torch.eye(K, **kw)
            self.truth = y.long()
        self.x, self.N, self.S = x, N, self.F.shape[0]
        self.kernel = MercerKernel(kernel, gamma)
        self.kernel.fit_scale(x)
        self.C, self.sampling, self.r, self.r_linear, self.eps = float(C), sampling, r, r_linear, float(eps)
        self.lam = float(lam) if lam is not None else 1.0 / self.C
        # the cut oracle in use: "hybrid" starts constant-time and switches to linear-time (`_switch_to_linear`)
        self.mode = "constant" if sampling == "hybrid" else sampling
        self.inactive_after, self.patience, self.max_resample = inactive_after, patience, max_resample
        self.qp_tol, self.chunk, self.writer = float(qp_tol), chunk, writer
        self.generator = torch.Generator().manual_seed(seed)
        # the cuts: basis example indices, label-difference rows (m, S') and coefficient per cut
        self.basis: list = []
        self.diffs: list = []
        self.coef = torch.zeros(0, **kw)
        self.offsets = torch.zeros(0, **kw)
        self.alpha = torch.zeros(0, **kw)
        self.age = torch.zeros(0, dtype=torch.long, device=x.device)
        self.G = torch.zeros(0, 0, **kw)
        self._cache = CutCache(N, self.F.shape[1], x.device)  # A[k]: g_k . (phi(x_i) (x) e), exact / linear only
        self.quiet = 0
        # "hybrid": how many of the cuts (always the first ones: removal keeps the order) are constant-time cuts
        self.sampled_cuts = 0
        self._cat = None
        self.steps_done, self.seconds, self.qp_seconds = 0, 0.0, 0.0

    # -- scores ---------------------------------------------------------------------------------
    def _concat(self):
        """All cuts' bases concatenated, cached until the cut set changes: ``(indices (M,), label-difference
        rows (M, S'), cut of each row (M,), unique indices (U,), position in the unique indices (M,))``.
        Sampled bases repeat examples (draws with replacement, violators recur across cuts), so kernel
        blocks are evaluated against the U unique points only."""
        if self._cat is None:
            idx = torch.cat(self.basis)
            sizes = torch.tensor([b.numel() for b in self.basis], device=idx.device)
            cut = torch.repeat_interleave(torch.arange(len(self.basis), device=idx.device), sizes)
            uniq, inv = torch.unique(idx, return_inverse=True)
            self._cat = (idx, torch.cat(self.diffs), cut, uniq, inv)
        return self._cat

    def _basis_expansion(self):
        """The expansion of ``w`` over the unique basis points: ``(indices (U,), weighted rows (U, S'))``,
        row weight ``alpha_k a_k`` summed over the cuts (and repeats) holding the point."""
        if not self.basis:
            return None, None
        idx, diffs, cut, uniq, inv = self._concat()
        weighted = diffs * (self.alpha * self.coef)[cut].unsqueeze(1)
        rows = torch.zeros(uniq.numel(), diffs.shape[1], dtype=diffs.dtype, device=diffs.device)
        return uniq, rows.index_add_(0, inv, weighted)

    def _expansion_scores(self, x: torch.Tensor) -> torch.Tensor:
        """``w . (phi(x) (x) e)`` in label-feature space, ``(q, S')``, from the kernel expansion."""
        out = torch.zeros(x.shape[0], self.F.shape[1], dtype=torch.float64, device=x.device)
        idx, rows = self._basis_expansion()
        if idx is None:
            return out
        keep = rows.abs().sum(1) > 0
        idx, rows = idx[keep], rows[keep]
        return self._kernel_product(x, idx, rows)

    def _kernel_product(self, x: torch.Tensor, idx: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """``k(x, x_idx) @ W`` ``(q, W.shape[1])`` in float64, one cache-sized kernel block at a time."""
        out = torch.empty(x.shape[0], W.shape[1], dtype=torch.float64, device=x.device)
        xb = self.x[idx]
        step = self._block_rows(idx.numel())
        for s in range(0, x.shape[0], step):
            out[s : s + step] = self.kernel(x[s : s + step], xb, torch.float64) @ W
        return out

    def _block_rows(self, width: int) -> int:
        """Rows per kernel block against ``width`` basis points: at most ``chunk`` and ``BLOCK_ENTRIES`` entries."""
        return max(1, min(self.chunk, BLOCK_ENTRIES // max(width, 1)))

    def decision_function(self, x: torch.Tensor) -> torch.Tensor:
        """Scores of new inputs ``x (q, D)`` (float, finite, on the training data's device): ``f(x) = <w, phi(x)>``
        ``(q,)`` (binary) or ``(q, K)``."""
        D = self.x.shape[1]
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != D or not x.is_floating_point():
            got = f"shape {tuple(x.shape)} and dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a (q, {D}) float tensor like the training data, got {got}")
        if x.device != self.x.device:
            raise ValueError(f"x is on {x.device} but the training data are on {self.x.device}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError("x holds NaN or Inf")
        count = self.kernel.evaluations
        f = self._expansion_scores(x.to(self.x.dtype))
        self.kernel.evaluations = count  # prediction is not training cost
        return f[:, 0] if self.binary else f

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Labels ``(q,)``: ``-1 / +1`` (binary; ``f = 0`` gives +1) or the class of the largest score (the first)."""
        return self._labels_from(self.decision_function(x).view(x.shape[0], -1))

    def _labels_from(self, fS: torch.Tensor) -> torch.Tensor:
        """`predict`'s labels from label-feature scores ``(q, S')``."""
        if self.binary:
            return torch.where(fS[:, 0] >= 0, 1, -1)
        return fS.argmax(1)

    def _errors(self, fS: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Whether `predict` is wrong on training examples ``idx`` with scores ``fS (q, S')``, ``(q,)`` bool."""
        truth = self.truth[idx]
        return self._labels_from(fS) != (2 * truth - 1 if self.binary else truth)

    def _oracle(self, fS: torch.Tensor, idx: torch.Tensor):
        """Loss-augmented argmax for examples ``idx`` with label-feature scores ``fS (q, S')``: ``(y^, Delta,
        H)``; ties go to the truth (no violation)."""
        scores = fS @ self.F.T  # (q, S)
        truth = self.truth[idx]
        delta = torch.ones_like(scores)
        delta.scatter_(1, truth.unsqueeze(1), 0.0)
        value = delta + scores
        s_truth = scores.gather(1, truth.unsqueeze(1)).squeeze(1)
        best, yhat = value.max(1)
        yhat = torch.where(best > s_truth, yhat, truth)
        H = (torch.maximum(best, s_truth) - s_truth)
        return yhat, delta.gather(1, yhat.unsqueeze(1)).squeeze(1), H

    def _score_draws(self, draw: torch.Tensor):
        """Constant-time scoring of the draws against the expansion, block by block: ``(fS (r, S'), y^ (r,),
        Delta (r,), Kviol (v, U))``, where ``Kviol`` keeps the kernel rows of the v violators (``Delta > 0``),
        the only ones a new cut's Gram row needs."""
        dev = draw.device
        uniq, rows = self._basis_expansion()
        if uniq is None:
            fS = torch.zeros(draw.numel(), self.F.shape[1], dtype=torch.float64, device=dev)
            yhat, delta, _ = self._oracle(fS, draw)
            return fS, yhat, delta, torch.zeros(int((delta > 0).sum()), 0, dtype=torch.float64, device=dev)
        xb = self.x[uniq]
        step = self._block_rows(uniq.numel())
        parts = []
        for s in range(0, draw.numel(), step):
            block = self.kernel(self.x[draw[s : s + step]], xb, torch.float64)  # (step, U)
            fS = block @ rows
            yhat, delta, _ = self._oracle(fS, draw[s : s + step])
            parts.append((fS, yhat, delta, block[delta > 0]))
        return tuple(torch.cat(p) for p in zip(*parts))

    def _w_dot_cut(self, fS_basis: torch.Tensor, E: torch.Tensor, a: float) -> float:
        """``<w, g>`` of a cut ``a sum_l phi(x_l) (x) E_l`` from the label-feature scores of its basis."""
        return a * float((fS_basis * E).sum())

    def _linear_time_draw(self, I: torch.Tensor):
        """Alg. 3's sample: ``r`` indices drawn with replacement from the violators ``I`` and the coefficient
        ``a = |I| / (N r)`` that makes ``g`` unbiased for the exact cut (examples outside I contribute 0)."""
        r = self.r_linear if self.sampling == "hybrid" else self.r
        draw = I[torch.randint(I.numel(), (r,), generator=self.generator).to(I.device)]
        return draw, I.numel() / (self.N * r)

    def training_scores(self) -> torch.Tensor:
        """``w . (phi(x_i) (x) e)`` of the training examples, ``(N, S')`` (from the cache when there is one)."""
        if self.mode != "constant" and self.basis:
            return self._cache.scores(self.alpha)
        count = self.kernel.evaluations
        fS = self._expansion_scores(self.x)
        self.kernel.evaluations = count
        return fS

    # -- adding and removing cuts ---------------------------------------------------------------
    def _add(self, idx: torch.Tensor, E: torch.Tensor, a: float, c: float, Kblock=None) -> None:
        """Append a cut; its Gram row from the cache (exact / linear) or from ``Kblock`` (constant-time:
        ``k(x_idx, all bases)``, computed for scoring) plus ``k(x_idx, x_idx)``."""
        t = self.offsets.shape[0]
        row = torch.zeros(t + 1, dtype=torch.float64, device=self.x.device)
        if self.mode == "constant":
            if t:  # <g_k, g_new> = a a_k sum_{l in new, j in cut k} k(x_l, x_j) <E_l, E_j>
                _, diffs, cut, _, inv = self._concat()
                Z = Kblock.T @ E  # (U, S'): sum_l k(x_l, x_u) E_l per unique basis point u
                per_row = (Z[inv] * diffs).sum(1)  # (M,)
                row[:t] = a * self.coef * torch.zeros(t, dtype=row.dtype, device=row.device).index_add_(0, cut, per_row)
            Kself = self.kernel(self.x[idx], self.x[idx], torch.float64)
            row[t] = a * a * float((Kself * (E @ E.T)).sum())
        else:
            self._cache.add(self._kernel_product(self.x, idx, a * E))
            # <g_k, g_new> = a sum_l <A_k[idx_l], E_l>
            row = a * (self._cache.at(idx) * E.unsqueeze(0)).sum((1, 2))
        G = torch.zeros(t + 1, t + 1, dtype=torch.float64, device=self.x.device)
        G[:t, :t] = self.G
        G[t, :] = row
        G[:, t] = row
        self.G = G
        self._cat = None
        self.basis.append(idx)
        self.diffs.append(E)
        self.coef = torch.cat([self.coef, self.coef.new_tensor([a])])
        self.offsets = torch.cat([self.offsets, self.offsets.new_tensor([c])])
        self.alpha = torch.cat([self.alpha, self.alpha.new_zeros(1)])
        self.age = torch.cat([self.age, self.age.new_zeros(1)])

    @property
    def cache(self) -> torch.Tensor:
        """The cut rows ``A (T, N, S')`` in cut order (exact / linear, and hybrid after its switch; a copy)."""
        return self._cache.rows()

    def _switch_to_linear(self) -> None:
        """``"hybrid"``: end the constant-time phase. The cache ``A[k] = g_k . (phi(x_i) (x) e)`` of every cut so
        far comes from one pass of kernel blocks against the U distinct basis points, ``k(x, x_U) W`` with
        ``W[u, (k, s)] = a_k sum of the rows E_l of cut k at point u`` (``N U`` evaluations, training cost)."""
        S1, T = self.F.shape[1], len(self.basis)
        if T:
            _, diffs, cut, uniq, inv = self._concat()
            W = torch.zeros(uniq.numel(), T, S1, dtype=torch.float64, device=self.x.device)
            W.index_put_((inv, cut), diffs * self.coef[cut].unsqueeze(1), accumulate=True)
            flat = self._kernel_product(self.x, uniq, W.reshape(uniq.numel(), T * S1))
            self._cache.set(flat.view(self.N, T, S1).permute(1, 0, 2))
        self.mode, self.quiet, self.sampled_cuts = "linear", 0, T

    def _remove_inactive(self) -> int:
        if self.inactive_after == 0 or self.offsets.numel() == 0:
            return 0
        self.age = torch.where(self.alpha > 0, torch.zeros_like(self.age), self.age + 1)
        keep = self.age < self.inactive_after
        removed = int((~keep).sum())
        if removed:
            self.sampled_cuts = int(keep[: self.sampled_cuts].sum())
            kept = keep.nonzero().squeeze(1)
            self.basis = [self.basis[k] for k in kept.tolist()]
            self.diffs = [self.diffs[k] for k in kept.tolist()]
            for name in ("coef", "offsets", "alpha", "age"):
                setattr(self, name, getattr(self, name)[keep])
            self.G = self.G[keep][:, keep]
            self._cat = None
            if self.mode != "constant":
                self._cache.keep(keep)
        return removed

    def _solve_qp(self) -> int:
        x0 = self.alpha
        self.alpha, info = simplex_qp(self.G, self.offsets, self.C, x0, inequality=True,
                                      tol=self.qp_tol * self.eps * self.C)
        return info["iterations"]

    def _xi(self) -> float:
        """The working set's slack ``max(0, max_k c_k - <w, g_k>)``; in the linear-time phase of ``"hybrid"`` over
        its own cuts only: the constant-time cuts' sampled offsets overestimate the risk, and their max would pass
        the exit test before a single linear-time cut is added."""
        k0 = self.sampled_cuts if self.mode != "constant" else 0
        if self.offsets.numel() <= k0:
            return 0.0
        return max(0.0, float((self.offsets[k0:] - self.G[k0:] @ self.alpha).max()))

    def dual_value(self) -> float:
        """The QP's value ``sum alpha c - 1/2 alpha^T G alpha`` (a lower bound of OP1 with exact cuts)."""
        return float(self.alpha @ self.offsets) - 0.5 * float(self.alpha @ (self.G @ self.alpha))

    def duality_gap(self) -> dict:
        """``primal``, ``dual`` and ``gap_estimate = primal - dual`` of the current iterate, the model `predict` uses
        (a pass over the training set, from the cut cache in exact and linear mode, else through the kernel
        expansion; not training cost), with its ``train_error``; ``gap``: the same number where the cuts are exact
        (``sampling="exact"``, ``gap_exact``: ``dual`` bounds OP1 from below and the gap is a certificate), else
        None (sampled cuts certify nothing)."""
        obj = self.objective()
        dual = self.dual_value()
        exact = self.sampling == "exact"
        estimate = obj["primal"] - dual
        return {"primal": obj["primal"], "dual": dual, "gap": estimate if exact else None,
                "gap_estimate": estimate, "gap_exact": exact, "train_error": obj["train_error"]}

    def objective(self) -> dict:
        """OP1 at the current ``w`` by a full pass (kernel expansion; not counted as training cost):
        ``{"primal", "risk", "train_error"}``."""
        return self._objective_from(self.training_scores())

    def _objective_from(self, fS, H=None):
        """OP1 from the training scores ``fS (N, S')``; ``H`` the losses of the oracle pass, if already made."""
        if H is None:
            H = self._oracle(fS, torch.arange(self.N, device=self.x.device))[2]
        err = float(self._errors(fS, torch.arange(self.N, device=fS.device)).double().mean())
        risk = float(H.mean())
        half_norm = 0.5 * float(self.alpha @ (self.G @ self.alpha))
        return {"primal": half_norm + self.C * risk, "risk": risk, "train_error": err}

    # -- one iteration --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        dev = self.x.device
        xi = self._xi()
        dual = self.dual_value()
        report = {}
        added = False
        resamples = 0
        if self.mode == "constant":
            draw = torch.randint(self.N, (self.r,), generator=self.generator).to(dev)
            fS, yhat, delta, Kviol = self._score_draws(draw)
            c = float(delta.mean())
            E = self.F[self.truth[draw]] - self.F[yhat]
            a = 1.0 / self.r
            violation = c - self._w_dot_cut(fS, E, a) - xi  # the sampled cut's value is mean H over the draws
            if violation > self.eps:
                keep = delta > 0
                self._add(draw[keep], E[keep], a, c, Kviol)
                added, self.quiet = True, 0
            else:
                self.quiet += 1
            converged = self.quiet >= self.patience
            if converged and self.sampling == "hybrid":
                self._switch_to_linear()
                converged = False
            report["train_error_sampled"] = float(self._errors(fS, draw).double().mean())
        else:
            all_idx = torch.arange(self.N, device=dev)
            if self.basis:
                fS = self._cache.scores(self.alpha)
            else:
                fS = torch.zeros(self.N, self.F.shape[1], dtype=torch.float64, device=dev)
            yhat, delta, H = self._oracle(fS, all_idx)
            violation = float(H.mean()) - xi  # exact cut's violation c' - <w, g'> - xi
            obj = self._objective_from(fS, H)
            report.update({"primal": obj["primal"], "train_error": obj["train_error"]})
            converged = violation <= self.eps
            if not converged:
                I = (delta > 0).nonzero().squeeze(1)
                c = float(delta.mean())
                E_all = self.F[self.truth] - self.F[yhat]
                if self.mode == "exact":
                    self._add(I, E_all[I], 1.0 / self.N, c)
                else:
                    best = None
                    for resamples in range(1, self.max_resample + 1):  # noqa: B007 (reported)
                        draw, a = self._linear_time_draw(I)
                        v = c - self._w_dot_cut(fS[draw], E_all[draw], a)
                        if best is None or v > best[0]:
                            best = (v, draw)
                        if v > xi + self.eps:
                            break
                    self._add(best[1], E_all[best[1]], a, c)
                added = True
        qp_iter, removed = 0, 0
        if added:
            tq = time.perf_counter()
            qp_iter = self._solve_qp()
            self.qp_seconds += time.perf_counter() - tq
            removed = self._remove_inactive()
        self.steps_done += 1
        self.seconds += time.perf_counter() - t0
        converged = bool(converged) and math.isfinite(violation) and math.isfinite(report.get("primal", 0.0))
        r = {"violation": violation, "xi": xi, "added": int(added), "removed": removed,
             "cuts": int(self.offsets.numel()), "dual": dual, "qp_iterations": qp_iter, "resamples": resamples,
             "kernel_evaluations": self.kernel.evaluations, "time": self.seconds, "qp_seconds": self.qp_seconds,
             "iteration": self.steps_done, "converged": converged, "mode": self.mode, **report}
        if "primal" in r:
            exact = self.sampling == "exact"
            r["gap_estimate"] = r["primal"] - dual
            r["gap"] = r["gap_estimate"] if exact else None  # sampled cuts: no certificate
            r["gap_exact"] = exact
        self._log(r)
        return r

    # -- loop (`Solver`) -------------------------------------------------------------------------
    limit_integer = True
    requires_limit = False  # `fit` with no limit runs to the sampling scheme's stopping rule (``converged``)
    report_keys = ("primal", "dual", "gap", "gap_estimate", "violation", "cuts", "train_error", "kernel_evaluations",
                   "time")

    def _progress(self) -> int:
        return self.steps_done

    def _estimated(self, report: dict) -> tuple:
        """With sampled cuts the QP's value bounds nothing (Yu & Joachims, 2008, Sec. 4): it is logged as
        ``kernel_cp/dual_estimate``; with exact cuts as ``kernel_cp/dual``."""
        return () if self.sampling == "exact" else ("dual",)

    def fit(self, max_iter: Optional[int] = None, time_budget: Optional[float] = None, *, callback=None,
            checkpoint=None, checkpoint_every: int = 1) -> list:
        """`step` until the stopping rule of the sampling scheme (``converged``), ``max_iter`` iterations in all
        (none when ``steps_done`` is already there) or ``time_budget`` seconds. Returns the reports (the loop is
        `Solver._fit`).

        Each report certifies the iterate its step started from; a step that adds a cut then re-solves the QP. So
        after a stop on ``max_iter`` or ``time_budget`` the last report's gap is not the returned model's:
        `duality_gap` gives that one (a ``converged`` stop added no cut, and its report is the model's).
        ``checkpoint``: a file to resume from and to write every ``checkpoint_every`` steps (`Solver._fit`)."""
        return self._fit({"max_iter": max_iter, "time_budget": time_budget}, callback=callback,
                         checkpoint=checkpoint, checkpoint_every=checkpoint_every)

    # -- state ----------------------------------------------------------------------------------
    def _config(self) -> dict:
        """The settings that a state is bound to (`_state.check_config`): its cuts, cached rows and scores are of
        this training set's size, this kernel (its scale after `MercerKernel.fit_scale`) and this C."""
        return {"N": self.N, "num_states": self.S, "kernel": self.kernel.name, "gamma": self.kernel.gamma,
                "C": self.C, "sampling": self.sampling}

    _state_tensors = ("coef", "offsets", "alpha", "age", "G")
    _state_scalars = ("quiet", "sampled_cuts", "steps_done", "seconds")
    _kept = ("basis", "diffs", "sizes", "cache", "mode", "kernel_evaluations", "generator")

    def _extra_state(self) -> dict:
        cat = (lambda xs, shape: torch.cat(xs) if xs else torch.zeros(shape))  # noqa: E731
        return {"basis": cat(self.basis, (0,)).long(), "diffs": cat(self.diffs, (0, self.F.shape[1])).double(),
                "sizes": torch.tensor([b.numel() for b in self.basis], dtype=torch.long), "cache": self.cache,
                "cache_layout": self._cache_layout(), "mode": self.mode, "kernel_evaluations": self.kernel.evaluations,
                "generator": self.generator.get_state()}

    def _cache_layout(self) -> torch.Tensor:
        """The cache's layout as one long tensor ``[capacity, T, slot (T), free...]``."""
        capacity, slot, free = self._cache.layout()
        return torch.tensor([capacity, slot.numel(), *slot.tolist(), *free], dtype=torch.long)

    def _checked_layout(self, saved, rows: int, device) -> Optional[tuple]:
        """`_cache_layout` of a state, checked: None for states without one (the rows are then compacted)."""
        if saved is None or rows == 0:
            return None
        ok = isinstance(saved, torch.Tensor) and saved.dim() == 1 and not saved.is_floating_point() and \
            saved.numel() >= 2 and int(saved[1]) == rows and saved.numel() >= 2 + rows
        if ok:
            capacity = int(saved[0])
            slot, free = saved[2 : 2 + rows], saved[2 + rows :]
            both = torch.cat([slot, free])
            ok = both.numel() == capacity and bool((both.sort().values == torch.arange(capacity)).all())
        if not ok:
            raise ValueError("state_dict['cache_layout'] is not the layout of a cache of "
                             f"{rows} rows (capacity, count, then a permutation of the slots)")
        return capacity, slot.to(device), free.tolist()

    def _state_shape(self, key: str, state: dict) -> tuple:
        t = state["sizes"].numel()  # the saved number of cuts (`_checked_state` checked the sizes first)
        return (t, t) if key == "G" else (t,)

    def _checked_state(self, state: dict) -> dict:
        """Also the cuts' basis and rows (by the saved sizes), the cache and its layout, the mode, the kernel's
        count and the generator."""
        require_keys(state, (*self._state_tensors, *self._state_scalars, *self._kept))
        sizes = state["sizes"]
        if not isinstance(sizes, torch.Tensor) or sizes.dim() != 1 or sizes.is_floating_point() or (sizes < 0).any():
            raise ValueError("state_dict['sizes'] must be a 1-D integer tensor of basis sizes >= 0")
        out = super()._checked_state(state)
        dev, S1 = self.x.device, self.F.shape[1]
        t, m = sizes.numel(), int(sizes.sum())
        basis = checked_tensor(state, "basis", (m,), torch.zeros(0, dtype=torch.long, device=dev))
        if m and (int(basis.min()) < 0 or int(basis.max()) >= self.N):
            raise ValueError(f"state_dict['basis'] must hold example indices in [0, {self.N})")
        diffs = checked_tensor(state, "diffs", (m, S1), self.F)
        cache = state["cache"]
        rows = cache.shape[0] if isinstance(cache, torch.Tensor) and cache.dim() == 3 and cache.shape[0] in (0, t) \
            else t
        out["_cache"] = checked_tensor(state, "cache", (rows, self.N, S1), self.F)
        out["_layout"] = self._checked_layout(state.get("cache_layout"), rows, dev)
        if state["mode"] not in ("exact", "linear", "constant"):
            raise ValueError(f"state_dict['mode'] must be 'exact', 'linear' or 'constant', got {state['mode']!r}")
        out["mode"] = state["mode"]
        out["_kernel_evaluations"] = checked_scalars(state, {"kernel_evaluations": int})["kernel_evaluations"]
        out["_generator"] = checked_generator_state(state)
        out["basis"] = list(basis.split(sizes.tolist())) if t else []
        out["diffs"] = list(diffs.split(sizes.tolist())) if t else []
        return out

    def _data(self) -> dict:
        return {"x": self.x, "truth": self.truth}

    # kernel entries a load may spend recomputing the Gram matrix and the cache of the saved cuts (beyond it, the
    # cache is checked at the cuts' basis points only, and beyond U^2 > budget the Gram matrix is not recomputed)
    consistency_budget = 1 << 24
    consistency_rtol = 1e-9

    def _cut_kinds(self, c: dict, t: int) -> list:
        """For each saved cut, how it was made: ``"exact"``, ``"linear"`` or ``"constant"``."""
        if self.sampling != "hybrid":
            return [self.sampling] * t
        if c["mode"] == "constant":
            return ["constant"] * t
        return ["constant"] * c["sampled_cuts"] + ["linear"] * (t - c["sampled_cuts"])

    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """What the saved cuts imply, recomputed without an oracle (Yu & Joachims, 2008): the mode of the sampling
        scheme; each basis row ``E_l = F_{y_l} - F_{y^_l}`` with ``y^_l != y_l`` (a violator); each cut's
        coefficient and offset from its basis size (0/1 loss: exact ``a = 1/N``, ``c = m/N``; linear-time ``c =
        a r``, ``a N r`` an integer in ``[1, N]``; constant-time ``a = 1/r``, ``c = m/r``); ``alpha >= 0``, ``sum
        alpha <= C``; ages as `_remove_inactive` leaves them; the Gram matrix ``G`` and the cache rows recomputed
        from the kernel (within ``consistency_budget`` kernel entries); counters."""
        rtol, N = self.consistency_rtol, self.N
        mode, t, steps = c["mode"], c["offsets"].numel(), c["steps_done"]
        allowed = ("constant", "linear") if self.sampling == "hybrid" else (self.sampling,)
        if mode not in allowed:
            raise ValueError(f"state_dict['mode'] = {mode!r} cannot arise with sampling={self.sampling!r}")
        if t > steps:
            raise ValueError(f"state_dict holds {t} cuts after {steps} steps (at most one cut per step)")
        if c["_kernel_evaluations"] < 0:
            raise ValueError(f"state_dict['kernel_evaluations'] must be >= 0, got {c['_kernel_evaluations']}")
        if mode != "constant" and c["quiet"] != 0:
            raise ValueError(f"state_dict['quiet'] = {c['quiet']} must be 0 outside the constant-time phase")
        if not 0 <= c["sampled_cuts"] <= (t if self.sampling == "hybrid" and mode == "linear" else 0):
            raise ValueError(f"state_dict['sampled_cuts'] = {c['sampled_cuts']} does not fit {t} cuts in mode "
                             f"{mode!r}")
        rows = c["_cache"].shape[0]
        if rows != (0 if mode == "constant" else t):
            raise ValueError(f"state_dict['cache'] holds {rows} rows; mode {mode!r} with {t} cuts keeps "
                             f"{0 if mode == 'constant' else t}")
        for key in ("coef", "offsets", "alpha", "G"):
            if not bool(torch.isfinite(c[key]).all()):
                raise ValueError(f"state_dict[{key!r}] holds Inf: the state is corrupt")
        if t == 0:
            return
        sizes = torch.tensor([b.numel() for b in c["basis"]], dtype=torch.float64, device=self.x.device)
        if bool((sizes < 1).any()):
            raise ValueError("state_dict['sizes']: every cut has a basis of at least one violator")
        idx, diffs = torch.cat(c["basis"]), torch.cat(c["diffs"])
        truth = self.truth[idx]
        other = self.F[truth].unsqueeze(1) - diffs.unsqueeze(1) - self.F.unsqueeze(0)  # (M, S, S')
        dist = other.abs().amax(2)
        dist.scatter_(1, truth.unsqueeze(1), math.inf)  # y^ != y
        if not bool((dist.amin(1) <= 1e-12).all()):
            raise ValueError("state_dict['diffs'] holds a row that is not F[y_l] - F[y^] for a label y^ != y_l")
        coef, offsets = c["coef"], c["offsets"]
        kinds = self._cut_kinds(c, t)
        r_lin = self.r_linear if self.sampling == "hybrid" else self.r
        a_rec, c_rec = torch.empty_like(coef), torch.empty_like(offsets)
        for k, kind in enumerate(kinds):
            m = float(sizes[k])
            if kind == "exact":
                a_rec[k], c_rec[k] = 1.0 / N, m / N
            elif kind == "constant":
                if m > self.r:
                    raise ValueError(f"state_dict['sizes']: constant-time cut {k} has {int(m)} > r = {self.r} points")
                a_rec[k], c_rec[k] = 1.0 / self.r, m / self.r
            else:
                if m != r_lin:
                    raise ValueError(f"state_dict['sizes']: linear-time cut {k} has {int(m)} points, not r = {r_lin}")
                violators = round(float(coef[k]) * N * r_lin)
                if not 1 <= violators <= N:
                    raise ValueError(f"state_dict['coef'][{k}] is not |I| / (N r) for a violator count |I| in [1, N]")
                a_rec[k], c_rec[k] = violators / (N * r_lin), violators / N
        # a ratio of integers, rounded once
        check_close("coef", coef, a_rec, float(a_rec.abs().max()), 1e-14, "the cuts' basis sizes and sampling")
        check_close("offsets", offsets, c_rec, 1.0, 1e-14, "the cuts' basis sizes (0/1 loss)")
        alpha = c["alpha"]
        check_range("alpha", alpha, 0.0, self.C, tol=rtol * self.C, what="the cuts' weights lie in [0, C]")
        if float(alpha.sum()) > self.C * (1 + rtol * t):
            raise ValueError(f"state_dict['alpha'] sums to {float(alpha.sum())!r} > C = {self.C}")
        age = c["age"]
        if self.inactive_after == 0:
            check_range("age", age.to(torch.float64), 0, 0, what="inactive_after = 0: ages stay 0", cause=AGE_CAUSE)
        else:
            check_range("age", age.to(torch.float64), 0, self.inactive_after - 1,
                        what=f"ages lie in [0, inactive_after - 1 = {self.inactive_after - 1}]", cause=AGE_CAUSE)
            if not bool(((age == 0) == (alpha > 0)).all()):
                raise ValueError("state_dict['age'] disagrees with alpha: a cut's age is 0 exactly when its weight "
                                 "is > 0 (`_remove_inactive` after each QP)")
        self._check_kernel_terms(c, idx, diffs, coef, t, rows)
        # alpha solves the working-set QP (each new cut re-solves it to qp_tol eps C; dropped cuts had weight 0)
        grad = c["G"] @ alpha - offsets
        fw = float(alpha @ grad) - self.C * min(0.0, float(grad.min()))
        tol = self.qp_tol * self.eps * self.C + 1e-12 * self.C * (float(c["G"].abs().max()) * self.C + 1.0)
        if not fw <= tol:
            raise ValueError(f"state_dict['alpha'] does not solve the working-set QP of its cuts (Frank-Wolfe gap "
                             f"{fw:.3g} > {tol:.3g}): the state is corrupt or was edited")

    def _check_kernel_terms(self, c, idx, diffs, coef, t, rows) -> None:
        """``G`` and the cache recomputed from the kernel over the U distinct basis points (`_switch_to_linear`'s
        ``W``): all N rows of the cache when ``N U`` entries fit ``consistency_budget``, else those at the basis
        points; ``G_kl = sum_u <A_k[u], W[u, l]>``."""
        S1, dev = self.F.shape[1], self.x.device
        cut = torch.repeat_interleave(torch.arange(t, device=dev), torch.tensor([b.numel() for b in c["basis"]],
                                                                               device=dev))
        uniq, inv = torch.unique(idx, return_inverse=True)
        U = uniq.numel()
        if U * U > self.consistency_budget:
            G = c["G"]
            check_close("G", G, G.T, float(G.abs().max()), self.consistency_rtol, "its transpose")
            return
        W = torch.zeros(U, t, S1, dtype=torch.float64, device=dev)
        W.index_put_((inv, cut), diffs * coef[cut].unsqueeze(1), accumulate=True)
        Wf = W.reshape(U, t * S1)
        count = self.kernel.evaluations
        try:
            full = self.N * U <= self.consistency_budget
            A = self._kernel_product(self.x if full else self.x[uniq], uniq, Wf).view(-1, t, S1)
        finally:
            self.kernel.evaluations = count  # a check, not training
        at_basis = A[uniq] if full else A
        G_rec = torch.einsum("uks,uls->kl", at_basis, W)
        check_close("G", c["G"], G_rec, float(G_rec.abs().max()), self.consistency_rtol,
                    "the kernel of the cuts' basis points")
        if rows:
            cache = c["_cache"]
            saved = cache if full else cache[:, uniq]
            rec = A.permute(1, 0, 2)
            check_close("cache", saved, rec, max(float(rec.abs().max()), 1e-300), self.consistency_rtol,
                        "the kernel of the cuts' basis points" + ("" if full else " (at the basis points)"))

    def _set_state(self, checked: dict) -> None:
        cache, layout = checked.pop("_cache"), checked.pop("_layout")
        self.kernel.evaluations = checked.pop("_kernel_evaluations")
        self.generator.set_state(checked.pop("_generator"))
        self._cat = None
        super()._set_state(checked)
        self._cache.set(cache, layout)
