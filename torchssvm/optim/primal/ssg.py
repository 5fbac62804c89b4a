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

from .._state import box_state, check_config, checked_generator_state, checked_scalars, checked_tensor, require_keys
from ..dual_solver import _check_lam, parse_box
from ..loop import check_limits
from ..problems import make_problem, rescaling_of


class SSG:
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
        for i in order.tolist():
            idx = torch.tensor([i], device=p.device)
            labels, _, _ = p.oracle(p.potentials(self.w, idx), idx)
            gamma = 1.0 / (self.k + 1)
            self.w.mul_(1 - gamma)
            p.accumulate(self.w, idx, p.corner(idx, labels), torch.tensor([gamma / lam], dtype=torch.float64))
            self._project(self.w)
            if self.averaging:
                self.w_avg.mul_(self.k / (self.k + 2)).add_(self.w, alpha=2 / (self.k + 2))
            self.k += 1
        self.oracle_calls += self.n
        self.steps_done += 1
        p.write_model(self.output)
        self.seconds += time.perf_counter() - t0
        primal = self.primal() if self.eval_every and self.steps_done % self.eval_every == 0 else None
        r = {"primal": primal, "dual": None, "gap": None, "gap_exact": False, "passes": self.oracle_calls / self.n,
             "oracle_calls": self.oracle_calls, "time": self.seconds}
        if self.writer is not None:
            for key in ("primal", "passes", "oracle_calls", "time"):
                if r[key] is not None:
                    self.writer.add_scalar(f"{self.tag}/{key}", r[key], self.steps_done)
        return r

    @torch.no_grad()
    def primal(self, w: Optional[torch.Tensor] = None) -> float:
        """Exact ``P(w)`` of the output iterate (or of ``w``) by a full oracle pass (not counted)."""
        return self.problem.primal(self.output if w is None else w, self.lam)

    def fit(self, max_passes: int) -> list:
        """``max_passes`` more calls of `step` (one pass each). Returns the reports."""
        check_limits(max_passes=max_passes, integer=("max_passes",))
        return [self.step() for _ in range(max_passes)]

    def _config(self) -> dict:
        """The settings of the objective that a state is bound to (`_state.check_config`)."""
        return {"n": self.n, "lam": self.lam, "rescaling": rescaling_of(self.problem), "box": box_state(self.box),
                "averaging": self.averaging}

    def state_dict(self) -> dict:
        return {"w": self.w.clone(), "w_avg": self.w_avg.clone(), "k": self.k, "oracle_calls": self.oracle_calls,
                "steps_done": self.steps_done, "seconds": self.seconds, "generator": self.generator.get_state(),
                **self._config()}

    def load_state_dict(self, s: dict) -> None:
        """Resume from `state_dict`: the run continues the same trajectory. A state of other sizes, or saved with
        another ``lam``, rescaling, box or ``averaging``, raises a ValueError and leaves the solver unchanged."""
        require_keys(s, ("w", "w_avg", "k", "oracle_calls", "steps_done", "seconds", "generator"))
        check_config(s, self._config())
        w, w_avg = (checked_tensor(s, k, self.w.shape, self.w) for k in ("w", "w_avg"))
        scalars = checked_scalars(s, {"k": int, "oracle_calls": int, "steps_done": int, "seconds": float})
        generator = checked_generator_state(s)
        self.w, self.w_avg = w, w_avg
        for k, value in scalars.items():
            setattr(self, k, value)
        self.generator.set_state(generator)
        self.problem.write_model(self.output)
