"""Stochastic subgradient descent on the primal SSVM (Pegasos schedule), the baseline of the BCFW papers.

Lacoste-Julien, Jaggi, Schmidt, Pletscher 2013 (Alg. 4 there): at iteration k pick i uniformly, call the
oracle at ``w`` and set ``w <- (1 - gamma) w + gamma psi_i(y*) / lam`` with ``gamma = 1 / (k + 1)``
(step ``1 / (lam (k + 1))`` on ``lam/2 ||w||^2 + H_i(w)``). Optional weighted averaging
``w_avg <- k / (k + 2) w_avg + 2 / (k + 2) w`` (their eq. 27). With a box, every iterate is projected.

SSG has no dual iterate, so it certifies nothing: reports carry the exact ``primal`` (one full oracle
pass every ``eval_every`` passes, not counted as oracle calls) and ``dual = gap = None``.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from ..._threads import one_thread, small_step
from .._state import box_state, check_close, check_range, checked_generator_state, require_keys
from ..dual_solver import _check_lam, parse_box
from ..problems import make_problem, rescaling_of
from ..solver import Solver


class SSG(Solver):
    """``SSG(model, dataset, lam, averaging=True, seed=0)``; `step` runs n iterations (one pass)."""

    tag = "ssg"

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, averaging: bool = True, eval_every: int = 1,
                 box=None, seed: int = 0, writer=None, structure=None, backend: str = "auto",
                 rescaling: str = "margin"):
        if not isinstance(eval_every, int) or isinstance(eval_every, bool) or eval_every < 0:
            raise ValueError(f"eval_every must be an int >= 0, got {eval_every!r}")
        self.problem = make_problem(model, dataset, structure, backend=backend, rescaling=rescaling)
        self.lam = _check_lam(lam)
        self.n = self.problem.n
        self.box = parse_box(box, self.problem)
        self.averaging, self.eval_every = bool(averaging), eval_every
        self.w = self.problem.initial_w().to(torch.float64)
        self.w_avg = self.w.clone()
        self.k = 0
        self.oracle_calls = 0
        self.steps_done = 0
        self.seconds = 0.0
        self.generator = torch.Generator().manual_seed(int(seed))
        self.writer = writer

    @property
    def output(self) -> torch.Tensor:
        """The returned iterate: the weighted average with ``averaging``, else the last one."""
        return self.w_avg if self.averaging else self.w

    def _project(self, w: torch.Tensor) -> None:
        if self.box is not None:
            torch.maximum(torch.minimum(w, self.box[1]), self.box[0], out=w)

    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        p, lam = self.problem, self.lam
        order = torch.randint(self.n, (self.n,), generator=self.generator)
        small = small_step(1, p.d, p.m, p.device)
        for done, i in enumerate(order.tolist(), 1):
            # one example a step, on one thread (`torchssvm._threads`); the progress hook outside
            with one_thread(small):
                idx = torch.tensor([i], device=p.device)
                labels, _, _ = p.oracle(p.potentials(self.w, idx), idx)
                gamma = 1.0 / (self.k + 1)
                self.w.mul_(1 - gamma)
                p.accumulate(self.w, idx, p.corner(idx, labels), torch.tensor([gamma / lam], dtype=torch.float64))
                self._project(self.w)
                if self.averaging:
                    self.w_avg.mul_(self.k / (self.k + 2)).add_(self.w, alpha=2 / (self.k + 2))
                self.k += 1
            self._tick("pass", done, self.n)
        self.oracle_calls += self.n
        self.steps_done += 1
        p.write_model(self.output)
        self.seconds += time.perf_counter() - t0
        primal = self.primal() if self.eval_every and self.steps_done % self.eval_every == 0 else None
        r = {"primal": primal, "dual": None, "gap": None, "gap_exact": False, "passes": self.oracle_calls / self.n,
             "oracle_calls": self.oracle_calls, "time": self.seconds}
        self._log(r)
        return r

    @torch.no_grad()
    def primal(self, w: Optional[torch.Tensor] = None) -> float:
        """Exact ``P(w)`` of the output iterate (or of ``w``) by a full oracle pass (not counted)."""
        return self.problem.primal(self.output if w is None else w, self.lam)

    # -- loop (`Solver`) -------------------------------------------------------------------------
    limit_name = "max_passes"
    limit_integer = True
    limit_relative = True  # fit(max_passes): this many more passes
    report_keys = ("primal", "passes", "oracle_calls", "time")

    def _progress(self) -> int:
        return self.steps_done

    def fit(self, max_passes: int, time_budget: Optional[float] = None, *, callback=None,
            checkpoint=None, checkpoint_every: int = 1) -> list:
        """``max_passes`` more calls of `step` (one pass each), or fewer when ``time_budget`` seconds of solver time
        are spent. Returns the reports; ``callback(report)`` after each. The loop is `Solver._fit` (``checkpoint``:
        resume from / write that file every ``checkpoint_every`` steps)."""
        return self._fit({"max_passes": max_passes, "time_budget": time_budget}, callback=callback,
                         checkpoint=checkpoint, checkpoint_every=checkpoint_every)

    def _config(self) -> dict:
        """The settings of the objective that a state is bound to (`_state.check_config`)."""
        return {"n": self.n, "lam": self.lam, "rescaling": rescaling_of(self.problem), "box": box_state(self.box),
                "averaging": self.averaging}

    # -- state (`Solver`) ------------------------------------------------------------------------
    _state_tensors = ("w", "w_avg")
    _state_scalars = ("k", "oracle_calls", "steps_done", "seconds")

    def _extra_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def _checked_state(self, state: dict) -> dict:
        require_keys(state, ("generator",))
        out = super()._checked_state(state)
        out["_generator"] = checked_generator_state(state)
        return out

    def _data(self) -> dict:
        return self.problem.fingerprint_data()

    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """What SSG's state implies without an oracle: one iteration per example of each pass (``k = oracle_calls
        = n steps_done``); finite iterates, inside the box where there is one; before any step (and without
        averaging, always) ``w_avg`` is the start. SSG certifies nothing (its reports' ``primal`` is a fresh pass
        at the loaded iterate), so an iterate that passes these checks gives true reports."""
        steps, n = c["steps_done"], self.n
        for key in ("k", "oracle_calls"):
            if c[key] != steps * n:
                raise ValueError(f"state_dict[{key!r}] = {c[key]} is not n steps_done = {steps * n} (n iterations per "
                                 "pass)")
        for key in ("w", "w_avg"):
            t = c[key]
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"state_dict[{key!r}] holds Inf: the state is corrupt")
            if self.box is not None:
                check_range(key, t, self.box[0].to(t), self.box[1].to(t), what="the box")
        start = self.problem.initial_w().to(c["w"])
        if steps == 0:
            check_close("w", c["w"], start, 0.0, 1.0, "the start (no step yet)")
        if steps == 0 or not self.averaging:
            check_close("w_avg", c["w_avg"], start, 0.0, 1.0, "the start (no average kept)")

    def _set_state(self, checked: dict) -> None:
        self.generator.set_state(checked.pop("_generator"))
        super()._set_state(checked)
        self.problem.write_model(self.output)
