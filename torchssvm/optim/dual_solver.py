"""What every dual SSVM solver shares: blocks, the primal ``w(alpha)``, box constraints, the exact gap.

State, in float64 (Osokin et al., 2016, in the marginal coordinates of `torchssvm.optim.problems`):

- ``z (n, m)``: block i's ``m(y_i) - mu_i``; ``w_i = Phi_i z_i / (lam n)``.
- ``ell (n,)``: ``l_i = (1/n) sum_y alpha_i(y) L_i(y)``.
- ``v (d,)``: ``sum_i w_i`` (= ``A alpha``); ``w = clip(v, lower, upper)`` with box constraints (App. H,
  eq. 56-57), else ``w = v``.

The dual value is ``D = sum_i l_i - lam/2 ||w||^2 - lam (beta_u^T u - beta_l^T l)`` with
``beta_u = [v - u]_+`` and ``beta_l = [l - v]_+`` (0 without a box), and the exact duality gap
``sum_i g_i = P(w) - D`` comes from a full oracle pass (`duality_gap`).
"""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from .._validation import check_positive_float
from ._state import box_state, check_close, check_range
from .problems import DualProblem, make_problem, rescaling_of
from .solver import Solver


def _check_lam(lam) -> float:
    return check_positive_float("lam", lam)


def parse_box(box, problem: DualProblem):
    """``(lower, upper)`` float64 ``(d,)`` bounds from ``box``, or None.

    ``box`` is None, a pair ``(lower, upper)`` of numbers / ``(d,)`` tensors / None, or a dict mapping
    parameter names (`DualProblem.parameter_slices`, e.g. ``"transition"``) to such pairs; unnamed
    parameters stay unbounded. Example: ``box={"transition": (0.0, None)}`` (positivity)."""
    if box is None:
        return None
    d, kw = problem.d, {"dtype": torch.float64, "device": problem.device}
    lower = torch.full((d,), -math.inf, **kw)
    upper = torch.full((d,), math.inf, **kw)

    def fill(name, sl, pair):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"box{name} must be a pair (lower, upper), got {pair!r}")
        a, b = sl
        for target, value, what in ((lower, pair[0], "lower"), (upper, pair[1], "upper")):
            if value is None:
                continue
            t = torch.as_tensor(value, **kw)
            if t.dim() > 0:
                t = t.reshape(-1)
                if t.numel() != b - a:
                    raise ValueError(f"box{name} {what} bound has {t.numel()} entries, expected {b - a}")
            if torch.isnan(t).any():
                raise ValueError(f"box{name} {what} bound holds NaN")
            if bool((torch.isposinf(t) if what == "lower" else torch.isneginf(t)).any()):  # an empty box
                raise ValueError(f"box{name} {what} bound holds {'+inf' if what == 'lower' else '-inf'}")
            target[a:b] = t

    if isinstance(box, dict):
        slices = problem.parameter_slices()
        for name, pair in box.items():
            if name not in slices:
                raise ValueError(f"box names parameter {name!r}; the model has {sorted(slices)}")
            fill(f"[{name!r}]", slices[name][:2], pair)
    else:
        fill("", (0, d), box)
    if (lower > upper).any():
        raise ValueError("box has a lower bound above its upper bound")
    if torch.isinf(lower).all() and torch.isinf(upper).all():
        return None
    return lower, upper


@torch.no_grad()
def exact_block_gaps(problem: DualProblem, w: torch.Tensor, z: torch.Tensor, ell: torch.Tensor, chunk: int = 1024,
                     progress=None, *, n: Optional[int] = None):
    """Exact block gaps ``g_i`` and hinge terms ``max_y H_i(y; w)`` by one oracle call per block:
    ``g_i = (<theta_i, z_i> + max_y H_i) / n - l_i`` (Osokin et al., 2016, in marginal coordinates).
    ``progress(done, problem.n)``, when given, is called after each chunk. ``n``: the number of examples of the
    objective (default ``problem.n``; a shard of `torchssvm.distributed` holds fewer)."""
    n = problem.n if n is None else n
    gaps = torch.empty(problem.n, dtype=torch.float64, device=problem.device)
    hinge = torch.empty_like(gaps)
    done = 0
    for idx in problem.chunks(chunk):
        theta = problem.potentials(w, idx)
        _, _, H = problem.oracle(theta, idx)
        H = H.clamp_min(0)  # H_i(y_i) = 0: an exact oracle never returns less ([C] falls back to y_i)
        hinge[idx] = H
        gaps[idx] = (problem.inner(theta, z[idx]) + H) / n - ell[idx]
        done += idx.shape[0]
        if progress is not None:
            progress(done, problem.n)  # the blocks this process decodes (a shard's, under torchssvm.distributed)
    return gaps, hinge


class DualSolver(Solver):
    """Base of the dual solvers (`BCFW`, `FrankWolfe`); subclasses implement `step`.

    Args:
        model: a `LinearChainModel` (with ``dataset``) or a `DualProblem`.
        dataset: the training set for ``model``.
        lam: the regularization ``lam > 0`` of ``lam/2 ||w||^2 + (1/n) sum_i H_i(w)``.
        box: box constraints on ``w`` (`parse_box`), or None.
        writer: a TensorBoard ``SummaryWriter`` (scalars per step, histogram of block gaps), or None.
        structure, backend: passed to the problem (task loss, oracle backend).
        rescaling: ``"margin"`` (default) or ``"slack"``: the slack-rescaled SSVM (Choi et al., 2016) through
            `SlackRescaledProblem` (corners ``L(y) psi(y) / (lam n)``, losses ``L(y) / n``); needs a
            problem with an exact slack oracle (chains without class weights, feature tables).
    """

    tag = "dual"

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, box=None, writer=None, structure=None,
                 backend: str = "auto", rescaling: str = "margin"):
        self.problem = make_problem(model, dataset, structure, backend=backend, rescaling=rescaling)
        self.lam = _check_lam(lam)
        p = self.problem
        self.n = p.n
        kw = {"dtype": torch.float64, "device": p.device}
        self.z = torch.zeros(p.n, p.m, **kw)
        self.ell = torch.zeros(p.n, **kw)
        self.v = p.initial_w().to(torch.float64)
        self.box = parse_box(box, p)
        self.w = self._clip(self.v)
        self.writer = writer
        self.block_gaps = torch.full((p.n,), math.inf, **kw)  # last computed g_i (inf: never computed)
        self.oracle_calls = 0
        self.steps_done = 0
        self.seconds = 0.0
        self.last_exact: Optional[dict] = None
        # fit(gap_tol=...) sets it (`Solver._fit`): a solver whose step measures the gap of w and then moves w
        # (FrankWolfe, NSlack) keeps w in the pass that certifies the gap, so that the model holds that iterate
        self._hold_below: Optional[float] = None
        p.write_model(self.w)

    # -- primal / dual --------------------------------------------------------------------------
    def _clip(self, v: torch.Tensor) -> torch.Tensor:
        if self.box is None:
            return v
        return torch.maximum(torch.minimum(v, self.box[1]), self.box[0])

    def _sync_w(self) -> None:
        self.w = self._clip(self.v)

    def dual_value(self) -> float:
        """``D(alpha) = sum_i l_i - lam/2 ||w||^2 - lam (beta_u^T u - beta_l^T l)`` (exact, no oracle)."""
        return float(self._dual_tensor())

    def _dual_tensor(self) -> torch.Tensor:
        """`dual_value` as a 0-dim tensor on the solver's device (read with other values in one go)."""
        d = self.ell.sum() - 0.5 * self.lam * (self.w @ self.w)
        if self.box is not None:
            lo, up = self.box
            fu, fl = torch.isfinite(up), torch.isfinite(lo)
            bu = torch.where(fu, (self.v - up).clamp_min(0), 0.0)
            bl = torch.where(fl, (lo - self.v).clamp_min(0), 0.0)
            d = d - self.lam * (bu @ torch.where(fu, up, 0.0) - bl @ torch.where(fl, lo, 0.0))
        return d

    def _full_pass(self, chunk: int = 1024):
        hook = None if self._progress_hook is None else (lambda done, n: self._tick("gap", done, n))
        return exact_block_gaps(self.problem, self.w, self.z, self.ell, chunk, progress=hook)

    def duality_gap(self) -> dict:
        """Exact ``primal``, ``dual`` and ``gap`` at the current iterate with the block gaps ``(n,)``.

        Not counted in ``oracle_calls`` and leaves the solver's trajectory untouched (for monitoring);
        ``gap`` is the sum of block gaps, ``primal`` is computed independently from the hinge terms."""
        gaps, hinge = self._full_pass()
        primal = 0.5 * self.lam * float(self.w @ self.w) + float(hinge.sum()) / self.n
        return {"primal": primal, "dual": self.dual_value(), "gap": float(gaps.sum()), "block_gaps": gaps}

    # -- loop (`Solver`) -------------------------------------------------------------------------
    limit_name = "max_passes"
    report_keys = ("primal", "dual", "gap", "passes", "oracle_calls", "cache_hit_rate", "time")
    # BCFW's gap between exact passes is the sum of the block gaps last seen, its primal that plus the dual; the
    # n-slack's, with searched separation, come from the violations found (`Solver._log`: logged as estimates)
    estimated_keys = ("primal", "gap")

    def _progress(self) -> float:
        return self.oracle_calls / self.n

    def fit(self, max_passes: Optional[float] = None, gap_tol: Optional[float] = None,
            time_budget: Optional[float] = None, *, exact: bool = True, callback=None,
            checkpoint=None, checkpoint_every: int = 1) -> list:
        """Call `step` until ``passes >= max_passes`` (effective passes from the start of training), the gap is
        ``<= gap_tol``, ``time_budget`` seconds of solver time are spent, or a report says ``converged`` (a solver's
        own stopping rule). With ``exact=True`` (default) only an exact gap stops the run (a certificate); an
        estimate at most ``0.8 gap_tol`` is confirmed by an exact pass (`_certify`), and ``exact=False`` also
        accepts the estimate (the heuristic path). Returns the list of step reports; ``callback(report)`` is called
        after each. The pass that certifies ``gap <= gap_tol`` leaves the iterate it certified in the model
        (``_hold_below``). A limit that stops the run short of ``gap_tol`` warns (`ConvergenceWarning`).
        ``checkpoint``: a file to resume from when it exists and to write atomically every ``checkpoint_every``
        steps and at the end (`Solver._fit`, the loop)."""
        return self._fit({"max_passes": max_passes, "gap_tol": gap_tol, "time_budget": time_budget},
                         callback=callback, exact=exact, checkpoint=checkpoint, checkpoint_every=checkpoint_every)

    def _certify(self) -> dict:
        """An exact gap pass counted as oracle calls (solvers with gap estimates override it)."""
        t0 = time.perf_counter()
        r = self.duality_gap()
        self.oracle_calls += self.n
        self.seconds += time.perf_counter() - t0
        return {"primal": r["primal"], "dual": r["dual"], "gap": r["gap"], "gap_exact": True,
                "passes": self.oracle_calls / self.n, "oracle_calls": self.oracle_calls, "time": self.seconds}

    def _log_extra(self, r: dict, step: int) -> None:
        if r.get("gap_exact"):
            self.writer.add_scalar(f"{self.tag}/exact_gap", r["gap"], step)
        finite = self.block_gaps[torch.isfinite(self.block_gaps)]
        if finite.numel():  # between exact passes the block gaps are those last seen: estimates
            name = "block_gaps" if r.get("gap_exact") else "block_gaps_estimate"
            self.writer.add_histogram(f"{self.tag}/{name}", finite.clamp_min(0), step)

    # -- state (`Solver`) ------------------------------------------------------------------------
    _state_tensors = ("z", "ell", "v", "block_gaps")
    _state_scalars = ("oracle_calls", "steps_done", "seconds")

    def _config(self) -> dict:
        """The settings of the objective that a state is bound to (`_state.check_config`)."""
        return {"lam": self.lam, "rescaling": rescaling_of(self.problem), "box": box_state(self.box)}

    def _data(self) -> dict:
        return self.problem.fingerprint_data()

    def _sealed(self) -> tuple:
        # l is recomputed from the blocks where the task loss is linear in them (`DualProblem.block_losses`) or from
        # stored labellings (n-slack); else (slack rescaling, trees) only its bounds are: sealed. z is checked
        # against constraints that describe the dual blocks exactly only for some problems (the feature table's
        # simplex); elsewhere (a chain's aggregated transition counts, trees, multi-label, slack rescaling) a z that
        # meets them can still lie outside, and a v recomputed to match would certify a dual above the optimum: sealed
        p = self.problem
        idx = next(iter(p.chunks(1)))
        sealed = () if p.block_losses(idx, self.z[idx]) is not None else ("ell",)
        return sealed if p.block_violation_exact else ("z", *sealed)

    def _extra_state(self) -> dict:
        return {"last_exact": None if self.last_exact is None else dict(self.last_exact)}

    def _checked_state(self, state: dict) -> dict:
        out = super()._checked_state(state)
        # a loaded state carries no certificate: the next exact pass makes one
        out["last_exact"] = None
        return out

    # the rounding a state's incremental updates leave in v and ell, relative to their scale (measured: below 1e-12
    # after hundreds of passes; a corrupted or edited entry is off by far more)
    consistency_rtol = 1e-8

    def _max_losses(self) -> torch.Tensor:
        """``max_y L_i(y)`` ``(n,)`` of every block (`DualProblem.max_loss`: the data's, computed once)."""
        if getattr(self, "_max_loss_memo", None) is None:
            p = self.problem
            self._max_loss_memo = torch.cat([p.max_loss(idx).to(torch.float64) for idx in p.chunks()])
        return self._max_loss_memo

    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """The identities between the state's tensors (Osokin et al., 2016, in marginal coordinates), recomputed
        without an oracle: ``v = w_0 + (1/(lam n)) sum_i Phi_i z_i`` (`DualProblem.accumulate`); ``0 <= l_i <=
        max_y L_i(y) / n``; where the problem has them, ``n l_i`` = the losses the blocks imply
        (`DualProblem.block_losses`) and each ``z_i`` a difference of marginals (`DualProblem.block_violation`)."""
        p, n = self.problem, self.n
        z, ell, v = c["z"], c["ell"], c["v"]
        kw = {"dtype": torch.float64, "device": p.device}
        v_rec = p.initial_w().to(torch.float64).clone()
        max_loss = self._max_losses()
        implied = torch.empty(p.n, **kw)  # p.n: the blocks held (a shard of torchssvm.distributed holds fewer than n)
        violation = torch.zeros(p.n, **kw)
        linear = described = True
        for idx in p.chunks():
            zi = z[idx]
            p.accumulate(v_rec, idx, zi, torch.full((idx.shape[0],), 1.0 / (self.lam * n), **kw))
            if linear:
                b = p.block_losses(idx, zi)
                linear = b is not None
                if linear:
                    implied[idx] = b
            if described:
                b = p.block_violation(idx, zi)
                described = b is not None
                if described:
                    violation[idx] = b
        scale = max(float(v.abs().max()), float(v_rec.abs().max())) if v.numel() else 0.0
        check_close("v", v, v_rec, scale, self.consistency_rtol, "w_0 + (1/(lam n)) sum_i Phi_i z_i of the blocks z")
        top = float(max_loss.max()) / n if n else 0.0
        check_range("ell", ell, 0.0, max_loss / n, tol=self.consistency_rtol * top,
                    what="l_i lies in [0, max_y L_i(y) / n]")
        if linear:
            check_close("ell", ell, implied / n, top, self.consistency_rtol, "the task losses the blocks z imply")
        if described:
            check_range("z", violation, 0.0, 0.0, tol=1e-9, what="the largest violation of block i's marginal "
                        "constraints: z_i = m(y_i) - mu_i, mu_i in the marginal polytope")

    @torch.no_grad()
    def _check_working_set(self, c: dict, labels: torch.Tensor, loss: torch.Tensor, alpha: torch.Tensor,
                           used: torch.Tensor, valid: torch.Tensor, name: str) -> None:
        """Labellings stored per block with their losses and dual weights (BCFW's atoms, the n-slack working sets:
        ``labels (n, C, width)``, ``loss`` and ``alpha (n, C)``, ``used (n, C)``) against the blocks: weights in
        [0, 1] and 0 on unused slots, slot 0 the truth, each used slot's labels shaped as the truth (padding where
        it pads) and in range, its loss ``L_i(y)`` recomputed (`DualProblem.task_loss`), and for the blocks whose
        weights are ``valid``: ``sum alpha = 1``, ``z_i = sum_y alpha_i(y) corner_i(y)`` and
        ``n l_i = sum_y alpha_i(y) L_i(y)``."""
        p, n, tol = self.problem, self.n, self.consistency_rtol
        check_range("alpha", alpha, 0.0, torch.where(used, 1.0, 0.0).to(alpha.dtype), tol=tol,
                    what="dual weights of the used slots in [0, 1], 0 on the others", name=name)
        truth = p.truth.to(labels.device).long()
        if not (bool(used[:, 0].all()) and torch.equal(labels[:, 0].long(), truth)):
            raise ValueError(f"{name}['labels'] slot 0 must hold each block's ground truth: the state is corrupt or "
                             "was edited")
        lab = torch.where(used.unsqueeze(2), labels.long(), truth.unsqueeze(1))  # unused slots: the truth
        bad = (lab < 0) != (truth.unsqueeze(1) < 0)
        if p.label_bound is not None:
            bad |= lab >= p.label_bound
        if bool(bad.any()):
            raise ValueError(f"{name}['labels'] holds labels out of range or off the truth's padding: the state is "
                             "corrupt or was edited")
        top = float(self._max_losses().max()) if n else 0.0
        check_range("alpha", torch.where(valid, alpha.sum(1), 1.0), 1.0, 1.0, tol=1e-9,
                    what="the sum of a block's weights", name=name)
        for idx in p.chunks():
            li = lab[idx]
            try:
                L = p.task_loss(idx, li)
                zr = sum(alpha[idx, s].unsqueeze(1) * p.corner(idx, li[:, s]) for s in range(li.shape[1]))
            except (IndexError, RuntimeError) as e:
                raise ValueError(f"{name}['labels'] are not labellings of these examples ({e})") from None
            ui, ok = used[idx], valid[idx]
            check_close("loss", torch.where(ui, loss[idx], 0.0), torch.where(ui, L, 0.0), top, tol,
                        "the task losses of the stored labellings", name)
            check_close("z", c["z"][idx][ok], zr[ok], max(1.0, top), tol,
                        f"sum_y alpha_i(y) corner_i(y) of {name}")
            check_close("ell", c["ell"][idx][ok], (alpha[idx] * loss[idx]).sum(1)[ok] / n, top / max(n, 1), tol,
                        f"sum_y alpha_i(y) L_i(y) / n of {name}")

    def _set_state(self, checked: dict) -> None:
        super()._set_state(checked)
        self._sync_w()
        self.problem.write_model(self.w)
