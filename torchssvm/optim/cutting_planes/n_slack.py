"""The n-slack cutting-plane SSVM solver (SVM-struct's n-slack algorithm; Yu & Joachims, 2008).

Each example i keeps a working set ``W_i`` of labellings (cuts; the truth is slot 0, its cut is the
constraint ``xi_i >= 0``). A pass separates every example at the current ``w``: it finds a labelling with
(approximately) the largest ``H_i(y; w)`` and adds it to ``W_i`` when ``H_i(y) > xi_i + eps`` with
``xi_i = max_{y in W_i} H_i(y; w)``; then the working-set QP is solved. The QP is the SSVM dual
restricted to the working sets, a product of simplices (one per example) in the dual weights
``alpha_i(y)``:

    min_alpha  f(alpha) = lam/2 ||w(alpha)||^2 - sum_i l_i(alpha),
    w(alpha) = sum_i sum_y alpha_i(y) Phi_i c_i(y) / (lam n),   l_i = (1/n) sum_y alpha_i(y) L_i(y),

with ``c_i(y)`` the problem's corner (``m(y_i) - m(y)``; loss-scaled under slack rescaling), i.e. the
BCFW dual of `DualSolver` on a subset of corners, solved by block-coordinate descent with the coordinated
mini-batch step of docs/design.md (`_solve_qp`). The partial derivative is ``-H_i(y; w) / n``, so a gradient is
one batched scoring of the cuts, and the restricted QP has a Frank-Wolfe gap that stops it.

Why block moves (measured, see docs/benchmarks/slack.md): a full-gradient accelerated method (FISTA with
restarts on the block-simplex projection kernel) was tried first; the parameters every example shares
(bias, pairwise) make its global Lipschitz constant about n times the per-block one, and on Yeast it needed
> 1,000 iterations per QP. Exact per-block minimization by FISTA on the projection kernel
(``qp_step="projected"``) fixes the coupling but costs ~100 small iterations per block move; pairwise
moves between cuts reach the same optimum 10x or more faster on the tests' problems and are the default.

Cuts whose weight stayed 0 for ``inactive_after`` consecutive passes are removed (SVM-struct's rule).
Separation is ``"exact"`` (the problem's oracle: exact loss-augmented decoding, or the exact slack oracle
under ``rescaling="slack"``) or a callable ``separation(problem, theta, idx, xi) -> labels (B, width)``,
e.g. a slack-rescaling search of `torchssvm.search` over lambda-oracles (Choi et al., 2016, Table 1). The
duality gap after a pass is exact when separation is exact (the oracle pass gives the primal at the
iterate); `duality_gap` certifies any iterate.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Union

import torch

from ..._validation import check_seed
from ...kernels import project_simplex
from .._state import check_range, checked_generator_state, checked_tensor, require_keys
from ..dual_solver import DualSolver
from ..frank_wolfe.box_qp import box_qp

QP_STEPS = ("pairwise", "projected")


class NSlackCuttingPlane(DualSolver):
    """``solver = NSlackCuttingPlane(model, dataset, lam=1e-2, eps=1e-3)``; ``solver.step()`` runs one
    separation pass over all examples and one working-set QP solve; `fit` loops until no cut is added.

    Args:
        model, dataset, lam, writer, structure, backend, rescaling: see `DualSolver` (no box constraints).
        separation: ``"exact"`` or a callable (see the module docstring).
        eps: a cut is added when it is violated by more than ``eps`` (SVM-struct's epsilon).
        inactive_after: passes with zero weight after which a cut is removed (0: never).
        qp_step: the block moves of the working-set QP (`_solve_qp`): ``"pairwise"`` (default) or
            ``"projected"``.
        qp_max_iter, qp_tol, qp_batch, qp_inner: sweeps, Frank-Wolfe-gap tolerance (the QP stops at ``gap <=
            qp_tol * eps``), blocks per coordinated step, and FISTA iterations per block (``"projected"``).
        seed: seed of the QP's block order.
        chunk: examples per batched separation call.

    Reports (`step`): ``primal``, ``dual``, ``gap`` (``gap_exact`` when separation is exact), ``added``
    cuts, mean ``working_set`` size, ``qp_iterations``, ``qp_gap``, ``passes``, ``oracle_calls``,
    ``separation_seconds``, ``time``; ``converged`` when no cut was added and the working-set QP was already solved
    (the pass's primal is then within ``eps`` of the QP's value; a pass that adds no cut to an unsolved QP, after
    ``qp_max_iter`` ran out, solves it further instead).

    `fit` is `DualSolver.fit`, which also stops at the first pass that adds no cut (``converged``); with no limit
    given it runs until then. The pass that certifies ``gap <= gap_tol`` leaves the iterate it certified in the
    model (each `step` reports the gap of the iterate it started from, then adds cuts and re-solves).
    """

    tag = "nslack"

    def __init__(self, model, dataset=None, lam: float = 1e-2, *,
                 separation: Union[str, Callable] = "exact", eps: float = 1e-3, inactive_after: int = 50,
                 qp_max_iter: int = 200, qp_tol: float = 0.1, qp_step: str = "pairwise", qp_batch: int = 64,
                 qp_inner: int = 100,
                 chunk: int = 1024, seed: int = 0, writer=None, structure=None, backend: str = "auto",
                 rescaling: str = "margin"):
        if qp_step not in QP_STEPS:
            raise ValueError(f"qp_step must be one of {QP_STEPS}, got {qp_step!r}")
        if not (separation == "exact" or callable(separation)):
            raise ValueError(f"separation must be 'exact' or a callable, got {separation!r}")
        for name, value in (("eps", eps), ("qp_tol", qp_tol)):
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name, value, low in (("inactive_after", inactive_after, 0), ("qp_max_iter", qp_max_iter, 1),
                                 ("qp_batch", qp_batch, 1), ("qp_inner", qp_inner, 1), ("chunk", chunk, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        super().__init__(model, dataset, lam, box=None, writer=writer, structure=structure, backend=backend,
                         rescaling=rescaling)
        self.separation, self.eps = separation, float(eps)
        self.backend = backend if backend in ("torch", "triton") else "auto"  # the projection: no numba twin
        self.inactive_after, self.qp_max_iter, self.qp_tol = inactive_after, qp_max_iter, qp_tol
        self.qp_step, self.qp_batch, self.qp_inner, self.chunk = qp_step, qp_batch, qp_inner, chunk
        self.generator = torch.Generator().manual_seed(check_seed(seed))
        p = self.problem
        kw = {"device": p.device}
        # working sets, padded: slot 0 is the truth
        self.labels = p.truth.unsqueeze(1).clone()  # (n, C, width)
        self.loss = torch.zeros(p.n, 1, dtype=torch.float64, **kw)
        self.alpha = torch.ones(p.n, 1, dtype=torch.float64, **kw)
        self.used = torch.ones(p.n, 1, dtype=torch.bool, **kw)
        self.age = torch.zeros(p.n, 1, dtype=torch.long, **kw)
        self.separation_seconds = 0.0
        self.cuts_added = 0

    # -- working sets ---------------------------------------------------------------------------
    def _truth_score(self, idx: torch.Tensor, theta) -> torch.Tensor:
        return self.problem.labels_score(theta, idx, self.problem.truth[idx].unsqueeze(1))  # (B, 1)

    def _violation(self, idx, theta, labels, loss, s_truth) -> torch.Tensor:
        """``H_i(y; w) = L_i(y) - <theta_i, m(y_i) - m(y)>`` of labellings ``(B, C, width)`` with losses ``(B, C)``."""
        return loss - s_truth + self.problem.labels_score(theta, idx, labels)

    def _cut_scores(self, idx: torch.Tensor, theta, s_truth=None) -> torch.Tensor:
        """``H_i(y; w)`` of every slot of blocks ``idx`` (``-inf`` on unused slots)."""
        s_truth = self._truth_score(idx, theta) if s_truth is None else s_truth
        H = self._violation(idx, theta, self.labels[idx], self.loss[idx], s_truth)
        return H.masked_fill(~self.used[idx], -math.inf)

    def _add(self, rows: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor) -> None:
        free = ~self.used[rows]
        need = int((~free.any(1)).sum()) > 0
        if need:  # one more slot for everyone
            self._widen(1)
            free = ~self.used[rows]
        slot = free.to(torch.int8).argmax(1)  # the first free slot
        self.labels[rows, slot] = labels.to(self.labels.dtype)
        self.loss[rows, slot] = loss.to(torch.float64)
        self.alpha[rows, slot] = 0.0
        self.age[rows, slot] = 0
        self.used[rows, slot] = True

    def _widen(self, k: int) -> None:
        """``k`` more (unused) slots for every block."""
        n = self.used.shape[0]
        self.labels = torch.cat([self.labels, self.labels[:, :1].expand(-1, k, -1).clone().fill_(-1)], 1)
        for name in ("loss", "alpha", "age"):
            t = getattr(self, name)
            setattr(self, name, torch.cat([t, t.new_zeros(n, k)], 1))
        self.used = torch.cat([self.used, self.used.new_zeros(n, k)], 1)

    def _remove_inactive(self) -> int:
        if self.inactive_after == 0:
            return 0
        inactive = self.used & (self.alpha == 0)
        self.age = torch.where(inactive, self.age + 1, torch.zeros_like(self.age))
        drop = inactive & (self.age >= self.inactive_after)
        drop[:, 0] = False
        count = int(drop.sum())
        if count:
            self.used &= ~drop
            self.labels[drop] = -1
            self.loss[drop] = 0.0
            self.age[drop] = 0
        return count

    # -- the working-set QP ---------------------------------------------------------------------
    def _slot_corners(self):
        """Per slot c >= 1: the rows that use it and their corners ``(c, rows, Z (R, m), L (R,))``."""
        p = self.problem
        out = []
        for c in range(1, self.used.shape[1]):
            rows = self.used[:, c].nonzero().squeeze(1)
            if rows.numel():
                out.append((c, rows, p.corner(rows, self.labels[rows, c].long()), self.loss[rows, c]))
        return out

    def _primal_w(self, alpha: torch.Tensor, corners) -> torch.Tensor:
        p = self.problem
        v = torch.zeros(p.d, dtype=torch.float64, device=p.device)
        scale = 1.0 / (self.lam * self.n)
        for c, rows, Z, _ in corners:
            p.accumulate(v, rows, Z, alpha[rows, c] * scale)
        return v

    def _block_corners(self, idx: torch.Tensor):
        """Corners of every slot of blocks ``idx``: ``(B C, m)`` (unused slots: the truth, corner 0)."""
        p = self.problem
        B, C = idx.shape[0], self.used.shape[1]
        labels = torch.where(self.used[idx].unsqueeze(2), self.labels[idx], p.truth[idx].unsqueeze(1))
        return p.corner(idx.repeat_interleave(C), labels.reshape(B * C, -1).long())

    def _qp_gap(self) -> float:
        """Frank-Wolfe gap of the restricted QP, ``sum_i (max_{y in W_i} H_i(y) - sum_y alpha_i(y) H_i(y)) / n``
        at the current ``w`` (one scoring of every cut, no oracle call)."""
        p, total = self.problem, 0.0
        for idx in p.chunks(self.chunk):
            total += float(self._qp_block_gaps(idx).sum())
        return total / self.n

    def _qp_block_gaps(self, idx: torch.Tensor) -> torch.Tensor:
        """``max_{y in W_i} H_i(y) - sum_y alpha_i(y) H_i(y)`` ``(B,)`` of blocks ``idx``."""
        H = self._cut_scores(idx, self.problem.potentials(self.w, idx))
        return H.amax(1) - (self.alpha[idx] * H.masked_fill(~self.used[idx], 0.0)).sum(1)

    def _solve_qp(self, qp_gap=None):
        """Block-coordinate descent on the working-set QP, coordinated across a mini-batch of blocks.

        Blocks are visited in random mini-batches of ``qp_batch``. Each block's move is either a pairwise
        move (``qp_step="pairwise"``: all the weight of its least violated active cut to its most violated
        cut, the BCPFW direction of Osokin et al. (2016) restricted to the working set), or towards the minimizer of
        its own QP with the others fixed (``"projected"``, `_block_minimize`: FISTA on the block-simplex
        kernel with the block's ``C x C`` Hessian ``Q_i = G_i / (lam n^2)``, ``G_i`` the Gram matrix of its
        cuts). The step lengths ``gamma in [0, 1]^B`` of the mini-batch minimize the quadratic
        jointly (the coordinated box QP of BCFW's mini-batches, `box_qp`), so every step decreases ``f`` and
        the coupling between blocks through shared parameters costs no step length. Sweeps stop at a
        Frank-Wolfe gap ``<= qp_tol * eps`` (``qp_gap``: that gap at the current iterate, when the caller has it)."""
        p, n = self.problem, self.n
        target = self.qp_tol * self.eps
        gen = self.generator
        sweeps, qp_gap = 0, self._qp_gap() if qp_gap is None else qp_gap
        while qp_gap > target and sweeps < self.qp_max_iter:
            sweeps += 1
            order = torch.randperm(n, generator=gen).to(p.device)
            for s in range(0, n, self.qp_batch):
                self._qp_batch_step(order[s : s + self.qp_batch])
            qp_gap = self._qp_gap()
            self._tick("qp", sweeps, self.qp_max_iter)
        self._sync_duals(self._slot_corners())
        return sweeps, qp_gap

    def _qp_moves(self, idx: torch.Tensor):
        """The moves of blocks ``idx`` (`_solve_qp`): ``(used (B, C), d (B, C), gain (B,), dz (B, m))``, the
        directions in the weights and in block coordinates and their first-order decreases."""
        p, n, lam = self.problem, self.n, self.lam
        used = self.used[idx]
        B, C = used.shape
        theta = p.potentials(self.w, idx)
        H = self._cut_scores(idx, theta).masked_fill(~used, 0.0)
        grad = -H / n
        rows = torch.arange(B, device=p.device)
        if self.qp_step == "pairwise":  # mass from the worst active cut to the best cut
            best = H.masked_fill(~used, -math.inf).argmax(1)
            worst = H.masked_fill(~(used & (self.alpha[idx] > 0)), math.inf).argmin(1)
            d = torch.zeros_like(grad)
            move = self.alpha[idx][rows, worst]
            d[rows, best] += move
            d[rows, worst] -= move
            # the move in block coordinates, move (Z_best - Z_worst): only the two corners it involves (for count
            # marginals one scatter, `corner_difference`), not the corners of all C slots
            labels = self.labels[idx]
            dz = p.corner_difference(idx, labels[rows, best].long(), labels[rows, worst].long()) * move.unsqueeze(1)
        else:
            Z = self._block_corners(idx)
            rep = idx.repeat_interleave(C)
            Q = p.gram(rep, Z).view(B, C, B, C)[rows, :, rows, :] / (lam * n * n)  # (B, C, C) blocks
            d = self._block_minimize(self.alpha[idx], grad, Q, used) - self.alpha[idx]
            dz = torch.bmm(d.unsqueeze(1), Z.view(B, C, -1)).squeeze(1)  # the moves in block coordinates, (B, m)
        gain = -(grad * d).sum(1)  # first-order decrease of each block's move
        return used, d, gain, dz

    def _qp_batch_step(self, idx: torch.Tensor) -> None:
        """One coordinated step of the blocks ``idx``: their moves (`_qp_moves`) with the step lengths of the
        mini-batch's box QP."""
        p, n, lam = self.problem, self.n, self.lam
        used, d, gain, dz = self._qp_moves(idx)
        if not bool((gain > 0).any()):
            return
        H2 = p.gram(idx, dz) / (lam * n * n)
        gamma = box_qp(gain.clamp_min(0), H2, torch.ones_like(gain))
        self.alpha[idx] = (self.alpha[idx] + gamma.unsqueeze(1) * d).clamp_min(0) * used
        p.accumulate(self.v, idx, dz, gamma / (lam * n))
        self._sync_w()

    def _block_minimize(self, a0, grad, Q, used):
        """Each block's QP with the other blocks fixed, ``min_{a in simplex} <grad, a - a0> + 1/2 (a - a0)^T Q
        (a - a0)``, by FISTA (accelerated projected gradient with restart) on the block-simplex kernel,
        batched over the blocks; step ``1 / lambda_max(Q_i)``."""
        L = torch.linalg.eigvalsh(Q)[:, -1].clamp_min(1e-300).unsqueeze(1)
        x, y, t = a0, a0, 1.0
        for k in range(self.qp_inner):
            g = grad + torch.bmm(Q, (y - a0).unsqueeze(2)).squeeze(2)
            x_new = project_simplex(y - g / L, used, backend=self.backend)
            if float((g * (x_new - x)).sum()) > 0:  # gradient restart (O'Donoghue & Candes)
                t = 1.0
            t_next = 0.5 * (1 + math.sqrt(1 + 4 * t * t))
            y = x_new + ((t - 1) / t_next) * (x_new - x)
            x, t = x_new, t_next
            if k % 10 == 9:  # the blocks' own Frank-Wolfe gaps: stop when every block QP is solved
                gx = grad + torch.bmm(Q, (x - a0).unsqueeze(2)).squeeze(2)
                fw = (gx * x).sum(1) - gx.masked_fill(~used, math.inf).min(1).values
                if float(fw.max()) <= 1e-13:
                    break
        return x

    def _sync_duals(self, corners) -> None:
        p = self.problem
        self.alpha = self.alpha / self.alpha.sum(1, keepdim=True)  # exact simplices after the line searches
        self.z.zero_()
        self.ell.zero_()
        for c, rows, Z, L in corners:
            a = self.alpha[rows, c]
            self.z.index_add_(0, rows, Z * a.unsqueeze(1))
            self.ell.index_add_(0, rows, a * L / self.n)
        self.v = self._primal_w(self.alpha, corners)
        self._sync_w()
        p.write_model(self.w)

    # -- one pass -------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        n = self.n
        exact = self.separation == "exact"
        hinge, gaps, pending, added, t_sep = self._separate()
        self.oracle_calls += n
        primal = 0.5 * self.lam * float(self.w @ self.w) + float(hinge.sum()) / n
        dual = self.dual_value()
        self.block_gaps = gaps
        # The pass's primal and dual are those of w before the cuts it found re-solve the QP: during
        # fit(gap_tol), a pass that certifies the gap keeps that w (the re-solve raises the dual but may raise P)
        hold = self._hold_below is not None and exact and primal - dual <= self._hold_below
        found = added
        if hold:
            pending, added = [], 0
        self._add_cuts(pending)
        self.cuts_added += added
        # also without a new cut: an unsolved working-set QP (qp_max_iter ran out) is solved further, and the pass
        # certifies w (converged) only when no sweep was needed
        target = self.qp_tol * self.eps
        if added:
            qp_iter, qp_gap = self._solve_qp()
        else:
            qp_iter, qp_gap = 0, self._qp_gap()
            if qp_gap > target and not hold:
                qp_iter, qp_gap = self._solve_qp(qp_gap)
        removed = self._remove_inactive()
        self.steps_done += 1
        self.separation_seconds += t_sep
        self.seconds += time.perf_counter() - t0
        removed, held = self._pass_totals(removed)
        r = {"primal": primal, "dual": dual, "gap": primal - dual, "gap_exact": exact, "added": added,
             "removed": removed, "working_set": held / n, "qp_iterations": qp_iter,
             "qp_gap": qp_gap, "passes": self.oracle_calls / n, "oracle_calls": self.oracle_calls,
             "separation_seconds": self.separation_seconds, "time": self.seconds,
             "converged": found == 0 and qp_iter == 0 and qp_gap <= target}
        self._log(r)
        return r

    def _separate(self):
        """The separation pass over the blocks held: ``(hinge (n,), gaps (n,), pending cuts, added, seconds)``."""
        p, n = self.problem, self.n
        exact = self.separation == "exact"
        hinge = torch.zeros(p.n, dtype=torch.float64, device=p.device)
        gaps = torch.zeros_like(hinge)
        added = 0
        t_sep, done = 0.0, 0
        pending = []
        for idx in p.chunks(self.chunk):
            theta = p.potentials(self.w, idx)
            s_truth = self._truth_score(idx, theta)
            xi = self._cut_scores(idx, theta, s_truth).amax(1).clamp_min(0)
            ts = time.perf_counter()
            if exact:
                labels, loss, _ = p.oracle(theta, idx)
            else:
                labels = self.separation(p, theta, idx, xi)
                loss = p.task_loss(idx, labels.unsqueeze(1)).squeeze(1)
            t_sep += time.perf_counter() - ts
            H = self._violation(idx, theta, labels.unsqueeze(1), loss.unsqueeze(1), s_truth).squeeze(1)
            hinge[idx] = H.clamp_min(0)
            gaps[idx] = (p.inner(theta, self.z[idx]) + hinge[idx]) / n - self.ell[idx]
            new = H > xi + self.eps
            if bool(new.any()):
                pending.append((idx[new], labels[new], loss[new]))
                added += int(new.sum())
            done += idx.shape[0]
            self._tick("pass", done, p.n)
        return hinge, gaps, pending, added, t_sep

    def _add_cuts(self, pending) -> None:
        for rows, labels, loss in pending:
            self._add(rows, labels, loss)

    def _pass_totals(self, removed: int):
        """The cuts removed and the cuts held (slot 0 aside), over every block."""
        return removed, float(self.used[:, 1:].sum())

    requires_limit = False  # `fit` with no limit runs until a pass adds no cut (``converged``)

    _working_set = ("labels", "loss", "alpha", "used", "age")
    _state_scalars = DualSolver._state_scalars + ("cuts_added", "separation_seconds")

    def _extra_state(self) -> dict:
        s = super()._extra_state()
        s.update({k: getattr(self, k).clone() for k in self._working_set})
        s["generator"] = self.generator.get_state()
        return s

    def _checked_state(self, state: dict) -> dict:
        require_keys(state, (*self._working_set, "generator"))
        out = super()._checked_state(state)
        used = state["used"]
        if not (isinstance(used, torch.Tensor) and used.dim() == 2):
            raise ValueError(f"state_dict['used'] must be a tensor with {self.problem.n} rows and one column per "
                             "slot")
        for k in self._working_set:
            cur = getattr(self, k)
            out[k] = checked_tensor(state, k, (self.problem.n, used.shape[1]) + tuple(cur.shape[2:]), cur)
        out["_generator"] = checked_generator_state(state)
        return out

    def _sealed(self) -> tuple:
        return ()  # z and l are recomputed from the working sets

    def _check_consistency(self, c: dict) -> None:
        """`DualSolver._check_consistency`, then the working sets against the blocks (each pass ends with
        ``z`` and ``l`` rebuilt from them: `_sync_duals`), and ages ``>= 0``."""
        super()._check_consistency(c)
        self._check_working_set(c, c["labels"], c["loss"], c["alpha"], c["used"],
                                torch.ones(self.problem.n, dtype=torch.bool, device=c["used"].device), "state_dict")
        check_range("age", c["age"], 0, torch.iinfo(torch.long).max, what="passes since a cut was last active")

    def _set_state(self, checked: dict) -> None:
        self.generator.set_state(checked.pop("_generator"))
        super()._set_state(checked)
