"""The epsilon-approximate regularization path of "Minding the gaps" (Osokin et al., 2016, Alg. 6 / 7).

Breakpoints ``lam_0 > lam_1 > ... > lam_J`` with weights ``w_j`` such that ``w_j`` is epsilon-approximate
(primal suboptimality <= its certified gap <= epsilon) for every ``lam`` in ``[lam_{j+1}, lam_j]``, and
``(lam_0 / lam) w_0`` for ``lam >= lam_0``. Corrections applied: ``lam_inf`` uses ``1 / (kappa
eps)`` (Alg. 6), and the induction stops when ``Delta <= tau`` (Alg. 7's branch is inverted in the paper).
Moving between breakpoints keeps the primal and rescales the duals (Prop. 1, `BCFW.rescale_lambda`), so
the gap grows by exactly ``(1 - rho) Delta`` and the step ``rho = 1 - tau / Delta`` brings it to epsilon.

`grid_search` is the paper's baseline: 31 values ``2^15 .. 2^-15`` solved to gap epsilon, warm-started
(keep the primal, rescale the duals) or cold.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Optional, Sequence

import torch

from .._validation import check_positive_float, check_real
from .dual_solver import exact_block_gaps
from .frank_wolfe.bcfw import BCFW
from .loop import check_limits
from .solver import ConvergenceWarning


class RegularizationPath:
    """The result of `regularization_path`.

    ``breakpoints``: list of dicts ``lam``, ``w`` (float64 ``(d,)``), ``gap`` (at ``lam``), ``gap_exact``,
    ``passes`` / ``oracle_calls`` / ``time`` (cumulative), and ``z`` / ``ell`` (the duals, when kept).
    ``covers_to``: the smallest lambda the path is valid for (0 when the induction ended with
    ``Delta <= tau``: the last ``w`` is epsilon-approximate for every smaller lambda). ``unfinished``: the
    breakpoint whose solve ran out of ``max_passes`` above epsilon (None if none did); it is not in
    ``breakpoints``, and the path covers down to its lambda with the breakpoint before it."""

    def __init__(self, problem, epsilon: float, kappa: float, heuristic: bool):
        self.problem, self.epsilon, self.kappa, self.heuristic = problem, epsilon, kappa, heuristic
        self.breakpoints: list = []
        self.covers_to: float = math.nan
        self.unfinished: Optional[dict] = None

    @property
    def lams(self) -> list:
        return [b["lam"] for b in self.breakpoints]

    def _piece(self, lam: float) -> int:
        lam = check_positive_float("lam", lam)
        if lam < self.covers_to:
            raise ValueError(f"lam={lam} is below the path's end {self.covers_to}")
        j = 0
        while j + 1 < len(self.breakpoints) and self.breakpoints[j + 1]["lam"] >= lam:
            j += 1
        return j

    def weights_at(self, lam: float) -> torch.Tensor:
        """The path's ``w`` at ``lam`` (``(lam_0 / lam) w_0`` above the first breakpoint)."""
        j = self._piece(lam)
        b = self.breakpoints[j]
        return b["w"] * (b["lam"] / lam) if j == 0 and lam > b["lam"] else b["w"].clone()

    def certify(self, lam: float) -> float:
        """The exact duality gap of `weights_at(lam)` at ``lam`` (one oracle pass): a certificate that
        the path's model is ``gap``-approximate there. Needs the duals (``keep_duals=True``)."""
        j = self._piece(lam)
        b = self.breakpoints[j]
        if b.get("z") is None:
            raise ValueError("certify needs the breakpoints' duals: run regularization_path(keep_duals=True)")
        if j == 0 and lam > b["lam"]:  # duals fixed, w = A alpha / lam
            z, ell = b["z"], b["ell"]
        else:  # Prop. 1: keep w, rescale the duals by rho = lam / lam_j
            rho = lam / b["lam"]
            z, ell = b["z"] * rho, b["ell"] * rho
        gaps, _ = exact_block_gaps(self.problem, self.weights_at(lam), z, ell)
        return float(gaps.sum())


@torch.no_grad()
def _initialize(solver: BCFW, kappa: float, epsilon: float) -> None:
    """Alg. 6: all dual mass on the max-loss labellings ``y~_i`` (the oracle at ``w = 0``), then
    ``lam_inf = (||psi~||^2 + (1/n) sum_i theta_i) / (kappa eps)`` with ``psi~ = (1/n) sum_i psi_i(y~_i)``
    and ``theta_i = max_y -<psi~, psi_i(y)>`` (a plain decode at ``w = psi~``); block gaps get the upper
    bounds ``theta_i / (n lam_inf) + lam_inf <w_i, w>`` of eq. (11)."""
    p, n = solver.problem, solver.n
    zero = torch.zeros(p.d, dtype=torch.float64, device=p.device)
    psi = torch.zeros_like(zero)
    labels_max = torch.empty(n, p.label_width, dtype=torch.long, device=p.device)
    for idx in p.chunks():
        labels, loss, _ = p.oracle(p.potentials(zero, idx), idx)
        labels_max[idx] = labels
        solver.z[idx] = p.corner(idx, labels)
        solver.ell[idx] = loss / n
        p.accumulate(psi, idx, solver.z[idx], torch.full((idx.shape[0],), 1.0 / n, dtype=torch.float64,
                                                          device=p.device))
    theta = torch.empty(n, dtype=torch.float64, device=p.device)
    inner_psi = torch.empty_like(theta)
    for idx in p.chunks():
        pot = p.potentials(psi, idx)
        y = p.decode(pot, idx)
        theta[idx] = -p.inner(pot, p.corner(idx, y))
        inner_psi[idx] = p.inner(pot, solver.z[idx])  # <psi~, Phi_i z_i>
    solver.oracle_calls += 2 * n
    lam_inf = (float(psi @ psi) + float(theta.sum()) / n) / (kappa * epsilon)
    if not lam_inf > 0:
        raise ValueError("every training example is already classified with zero loss at w = 0 and the "
                         "path is trivial (lam_inf = 0)")
    solver.lam = lam_inf
    solver.v = psi / lam_inf
    solver._sync_w()
    # lam_inf <w_i, w> = lam_inf <Phi_i z_i / (n lam_inf), psi~ / lam_inf> = <psi~, Phi_i z_i> / (n lam_inf)
    solver.block_gaps = theta / (n * lam_inf) + inner_psi / (n * lam_inf)
    solver.global_gap = float(solver.block_gaps.sum())
    if solver.atoms is not None:
        for i in range(n):
            slot = solver.atoms.insert(i, labels_max[i], float(solver.ell[i]) * n,
                                       torch.zeros(solver.atoms.labels.shape[1], dtype=torch.float64),
                                       cap=solver.cache_size, keep_active=True)
            solver.atoms.alpha[i].zero_()
            solver.atoms.alpha[i, slot] = 1.0
    solver.problem.write_model(solver.w)


def _record(path, solver: BCFW, gap: float, exact: bool, keep_duals: bool, t0: float) -> None:
    b = {"lam": solver.lam, "w": solver.w.clone(), "gap": gap, "gap_exact": exact,
         "passes": solver.oracle_calls / solver.n, "oracle_calls": solver.oracle_calls,
         "time": time.perf_counter() - t0}
    if keep_duals:
        b["z"], b["ell"] = solver.z.clone(), solver.ell.clone()
    path.breakpoints.append(b)


def regularization_path(model, dataset=None, *, epsilon: float = 0.1, kappa: Optional[float] = None,
                        lam_min: float = 1e-5,
                        heuristic: bool = False, max_passes: float = 1000, time_budget: Optional[float] = None,
                        keep_duals: bool = True, writer=None, structure=None, backend: str = "auto",
                        **solver_kwargs) -> RegularizationPath:
    """Alg. 6 / 7: the epsilon-approximate path from ``lam_inf`` down to ``lam_min``.

    Args:
        model, dataset, structure, backend: the problem (as for `BCFW`).
        epsilon: the path's accuracy (paper: 0.1).
        kappa: inner tolerance ``kappa eps`` per breakpoint; default 0.9 (the paper's), 0.7 for the heuristic
            path (the largest value the paper found accurate enough).
        heuristic: stop each inner solve on the stale gap estimate (App. K) instead of an exact gap:
            faster, and the guarantee is lost (check with `RegularizationPath.certify`). [C] also turns
            the refresh passes off (``gap_check_every=0``); then the estimates go stale (Gap Inf) and
            the path can be far from epsilon, so the default keeps them.
        max_passes: effective passes allowed per breakpoint.
        time_budget: total seconds for the whole path.
        keep_duals: keep each breakpoint's duals (``n x m`` float64 each) so `certify` works.
        solver_kwargs: for `BCFW` (default ``sampling="gap"``, as in the paper's path experiments).
    """
    if kappa is None:
        kappa = 0.7 if heuristic else 0.9
    kappa = check_real("kappa", kappa)
    if not (0 < kappa < 1):
        raise ValueError(f"kappa must be in (0, 1), got {kappa}")
    epsilon = check_positive_float("epsilon", epsilon)
    check_limits(time_budget=time_budget)
    lam_min = check_positive_float("lam_min", lam_min)
    if not (isinstance(max_passes, (int, float)) and not isinstance(max_passes, bool) and max_passes > 0):
        raise ValueError(f"max_passes must be a number > 0 (inf: no limit), got {max_passes!r}")
    if "box" in solver_kwargs:
        raise ValueError("box constraints are not supported on the regularization path (Prop. 1 assumes none)")
    solver_kwargs.setdefault("sampling", "gap")
    solver = BCFW(model, dataset, lam=1.0, writer=None, structure=structure, backend=backend, **solver_kwargs)
    path = RegularizationPath(solver.problem, epsilon, kappa, heuristic)
    t0 = time.perf_counter()
    _initialize(solver, kappa, epsilon)
    _record(path, solver, float(solver.block_gaps.sum()), False, keep_duals, t0)
    exact_gaps = True  # the bounds of Alg. 6 are valid upper bounds
    while True:
        delta = solver.ell - solver._block_inner() / solver.n
        if not exact_gaps:
            delta = delta.clamp_min(0)  # [C]'s conservative choice when the gaps are estimates
        Delta = float(delta.sum())
        tau = epsilon - float(solver.block_gaps.clamp_min(0).sum())
        if Delta <= tau:
            path.covers_to = 0.0
            break
        if tau <= 0:  # the last solve ran out of budget above epsilon: the path stops at its lam, covered by the
            # breakpoint before (the step to it brought that one's gap to exactly epsilon), not by its own weights
            failed = path.breakpoints.pop()
            path.unfinished = failed
            path.covers_to = failed["lam"]
            break
        lam_new = (1 - tau / Delta) * solver.lam
        if lam_new < lam_min:
            path.covers_to = lam_new
            break
        if time_budget is not None and time.perf_counter() - t0 > time_budget:
            path.covers_to = solver.lam
            break
        solver.rescale_lambda(lam_new)
        passes_before = solver.oracle_calls / solver.n
        with warnings.catch_warnings():  # a breakpoint short of its gap is recorded (unfinished), not warned
            warnings.simplefilter("ignore", ConvergenceWarning)
            history = solver.fit(max_passes=passes_before + max_passes, gap_tol=kappa * epsilon, exact=not heuristic)
        last = history[-1]
        if not heuristic and not last["gap_exact"]:
            last = solver._certify()
        exact_gaps = bool(last["gap_exact"])
        _record(path, solver, last["gap"], exact_gaps, keep_duals, t0)
        if writer is not None:
            k = len(path.breakpoints) - 1
            writer.add_scalar("path/log10_lambda", math.log10(solver.lam), k)
            # a heuristic breakpoint's gap is BCFW's estimate: never under the certified name
            writer.add_scalar("path/gap" if exact_gaps else "path/gap_estimate", last["gap"], k)
            writer.add_scalar("path/passes", solver.oracle_calls / solver.n, k)
    return path


def grid_search(model, dataset=None, *, lams: Optional[Sequence[float]] = None, epsilon: float = 0.1,
                warm_start: bool = True, max_passes: float = 1000, structure=None, backend: str = "auto",
                **solver_kwargs) -> list:
    """Solve to an exact gap ``<= epsilon`` on each of ``lams`` (default ``2^15 .. 2^-15``, decreasing),
    warm-started by `BCFW.rescale_lambda` or cold. Returns dicts ``lam``, ``w``, ``gap``, cumulative
    ``passes``, ``oracle_calls`` and ``time``."""
    lams = [2.0 ** k for k in range(15, -16, -1)] if lams is None else [float(x) for x in lams]
    if any(b >= a for a, b in zip(lams, lams[1:])):
        raise ValueError("lams must be strictly decreasing")
    solver_kwargs.setdefault("sampling", "gap")
    out, calls, seconds, solver, n = [], 0, 0.0, None, None
    for lam in lams:
        if solver is None or not warm_start:
            if solver is not None:
                calls += solver.oracle_calls
                seconds += solver.seconds
            solver = BCFW(model, dataset, lam=lam, structure=structure, backend=backend, **solver_kwargs)
            n = solver.n
        else:
            solver.rescale_lambda(lam)
        start = solver.oracle_calls / n
        with warnings.catch_warnings():  # each result reports its gap
            warnings.simplefilter("ignore", ConvergenceWarning)
            history = solver.fit(max_passes=start + max_passes, gap_tol=epsilon)
        last = history[-1] if history[-1]["gap_exact"] else solver._certify()
        out.append({"lam": lam, "w": solver.w.clone(), "gap": last["gap"],
                    "passes": (calls + solver.oracle_calls) / n, "oracle_calls": calls + solver.oracle_calls,
                    "time": seconds + solver.seconds})
    return out
