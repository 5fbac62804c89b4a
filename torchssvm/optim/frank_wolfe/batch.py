"""Batch Frank-Wolfe on the SSVM dual (Osokin et al., 2016, App. H Alg. 8; Lacoste-Julien et al., 2013, Alg. 2).

Every step calls the oracle on all n blocks at the current ``w`` (one effective pass, batched), which
gives the exact duality gap of that iterate, then takes the exactly line-searched step towards the
joint corner ``s``: ``gamma = clip(gap / (lam ||v - v_s||^2), 0, 1)`` (with a box, the numerator uses
the truncated ``w`` and the denominator untruncated ``v`` differences, as in Alg. 8).
"""

from __future__ import annotations

import time

import torch

from ..._validation import check_positive_int
from ..dual_solver import DualSolver


class FrankWolfe(DualSolver):
    """``FrankWolfe(model, dataset, lam)``; see `DualSolver` for the arguments.

    `step` reports the exact ``primal``, ``dual`` and ``gap`` of the iterate the pass was made at (the
    certificate FW gets for free) with ``gap_exact=True``, and moves to the next iterate.
    ``chunk`` is the number of blocks per batched oracle call."""

    tag = "fw"

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, chunk: int = 1024, box=None, writer=None,
                 structure=None, backend: str = "auto", rescaling: str = "margin"):
        super().__init__(model, dataset, lam, box=box, writer=writer, structure=structure, backend=backend,
                         rescaling=rescaling)
        self.chunk = check_positive_int("chunk", chunk)

    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        n, lam = self.n, self.lam
        corners, s_ell, gaps, hinge, v_s = self._corner_pass()
        v_s, gaps, hinge = self._reduce(v_s, gaps, hinge)
        self.oracle_calls += n
        self.block_gaps = gaps
        gap = float(gaps.sum())
        primal = 0.5 * lam * float(self.w @ self.w) + float(hinge.sum()) / n
        dual = self.dual_value()
        diff = self.v - v_s
        denom = lam * float(diff @ diff)
        gamma = min(max(gap / denom, 0.0), 1.0) if denom > 0 else (1.0 if gap > 0 else 0.0)
        if self._hold_below is not None and gap <= self._hold_below:
            gamma = 0.0
        if gamma > 0:
            self.z.mul_(1 - gamma).add_(corners, alpha=gamma)
            self.ell.mul_(1 - gamma).add_(s_ell, alpha=gamma)
            self.v.mul_(1 - gamma).add_(v_s, alpha=gamma)
            self._sync_w()
        self.steps_done += 1
        self.problem.write_model(self.w)
        self.seconds += time.perf_counter() - t0
        self._after_step()
        self.last_exact = {"primal": primal, "gap": gap, "passes": self.oracle_calls / n}
        r = {"primal": primal, "dual": dual, "gap": gap, "gap_exact": True, "step_size": gamma,
             "passes": self.oracle_calls / n, "oracle_calls": self.oracle_calls, "time": self.seconds}
        self._log(r)
        return r

    def _corner_pass(self):
        """The oracle on the problem's blocks, chunk by chunk: the corners ``s_i`` and their ``L_i(s_i) / n``, the
        block gaps and hinge terms at ``w`` (``(n,)`` each) and ``v_s = sum_i Phi_i s_i / (lam n)``."""
        p, n, lam = self.problem, self.n, self.lam
        corners = torch.empty_like(self.z)
        s_ell = torch.empty_like(self.ell)
        gaps = torch.empty_like(self.ell)
        hinge = torch.empty_like(self.ell)
        v_s = torch.zeros_like(self.v)
        done = 0
        for idx in p.chunks(self.chunk):
            theta = p.potentials(self.w, idx)
            labels, loss, H = p.oracle(theta, idx)
            H = H.clamp_min(0)
            corners[idx] = p.corner(idx, labels)
            s_ell[idx] = loss / n
            hinge[idx] = H
            gaps[idx] = (p.inner(theta, self.z[idx]) + H) / n - self.ell[idx]
            p.accumulate(v_s, idx, corners[idx], torch.full((idx.shape[0],), 1.0 / (lam * n), dtype=torch.float64,
                                                              device=p.device))
            done += idx.shape[0]
            self._tick("pass", done, p.n)
        return corners, s_ell, gaps, hinge, v_s

    def _reduce(self, v_s, gaps, hinge):
        """``v_s`` and the gaps and hinge terms of every block (a sharded solver sums and gathers its ranks')."""
        return v_s, gaps, hinge

    def _after_step(self) -> None:
        """Called after the move (a sharded solver checks its replicas)."""
